"""Paper 4's GDP levels as numbers: what one privacy unit can move in GAP and DPDGC.

Notation of the paper: ``A_ir = 1`` is an edge r → i, node r's out-neighbours are
N(r) = {i : A_ir = 1}, the out-degree is a column sum of A (bounded by D at node level), and
row i of ``A·H`` aggregates node i's in-neighbours. In PyG terms (messages flow
``edge_index[0] → edge_index[1]``) a node's out-degree is its count in ``edge_index[0]``.

Units (all with replacement adjacency and predictions covered, paper 4 Def. 4.2):

* ``edge``: one directed adjacency entry — the paper's edge GDP. On an undirected graph stored
  in both directions this protects one direction only.
* ``undirected_edge``: both entries of an undirected edge (GraphVeil's default for undirected
  graphs): two rows of A change, so every sensitivity below gains a factor √2.
* ``node/…/D=…``: one node replaced (features, label, edges both ways) between two graphs whose
  out-degree is at most D — paper 4's class (Thms 5.1, 5.3: "both A, A' have out-degree bounded
  by D"). Nothing is capped: a graph above D is refused before anything runs
  (:func:`~graphveil.plugins.gdp.common.check_out_degree_class`): no cap of the raw graph is
  known to keep these sensitivities (replacing r may add unboundedly many in-edges j → r, and
  capping j's out-degree then trades one of j's other edges for each j; capping in-degrees
  first lets r's out-edges displace others: :class:`graphveil.transforms.OutDegreeBound`).
* ``k_neighbor/…/k=…``: one node's features and label and at most k entries of its row and k
  of its column of A (Def. 4.1), on the raw graph. GAP caps the out-degree at D first by the
  secret keyed order of :class:`~graphveil.transforms.OutDegreeBound`, whose stability lemma
  gives the hop sensitivity √(4D + k(k + 4)) (not paper 4's 2√D, which holds inside the
  class only: each changed in-entry j → r may trade one other edge of j). DPDGC caps nothing
  (its D-free bounds hold on any graph).

Sensitivities (``nan`` in a non-private run, which states no unit; rows other than the replaced
node r, paper 4 Thms 5.1, 5.3, 5.4, G.1, G.2):

============================  ===========  ============  ==============  =================
quantity                      edge         undirected    node (D)        k-neighbor
============================  ===========  ============  ==============  =================
PMA hop A·H, ‖H_i‖ = 1        1            √2            2√D             √(4D + k(k + 4))
DP-Emb A·W, ‖W_j‖ ≤ c         c            c√2           c√(2D)          c√k
rows of A changed (DP-Emb)    1            2             2D + 1          k + 1
============================  ===========  ============  ==============  =================

The last row is the group size of DP-Emb's DP-SGD (its example i reads row i of A). Paper 4
(Alg. 2, App. C) uses D + 1 at node level; its own proof of Thm 5.3 counts up to 2D rows
i ∈ N(r) △ N'(r) whose entry r changes, plus row r itself, so GraphVeil uses 2D + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from graphveil.contract.errors import ConfigError
from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind

_KINDS = (UnitKind.EDGE, UnitKind.UNDIRECTED_EDGE, UnitKind.NODE, UnitKind.K_NEIGHBOR)


@dataclass(frozen=True)
class GdpLevel:
    """The run's GDP unit, or ``None`` for a non-private run (no noise, no bound needed), and
    the method it is for (named in refusals)."""

    unit: PrivacyUnit | None
    method: str = "this method"

    @classmethod
    def of(cls, unit: PrivacyUnit | None, *, method: str, needs_degree_bound: bool) -> GdpLevel:
        """Check ``unit`` is a GDP level this method analyses.

        :param needs_degree_bound: the method's sensitivity at node / k-neighbor level needs D.
        :raises ConfigError: naming what is missing.
        """
        if unit is None:
            return cls(None, method)
        if unit.kind not in _KINDS or unit.adjacency is not Adjacency.REPLACEMENT or not unit.protects_predictions:
            raise ConfigError(
                f"method {method!r} gives paper 4's graph DP: privacy.unit must be one of "
                "'edge/replacement/predictions', 'undirected_edge/replacement/predictions', "
                "'node/replacement/D=<D>/predictions', 'k_neighbor/replacement/k=<k>/predictions' "
                f"(with /D=<D> where needed), got {unit.value!r}")
        if unit.kind is UnitKind.NODE and unit.degree_bound is None:
            raise ConfigError(f"method {method!r} at node level needs the out-degree bound: add /D=<D> "
                              f"to privacy.unit (paper 4 uses D=100), got {unit.value!r}")
        if unit.kind is UnitKind.K_NEIGHBOR and needs_degree_bound and unit.degree_bound is None:
            raise ConfigError(f"method {method!r} at k-neighbor level needs the out-degree bound too (it caps "
                              f"the graph's out-degree at D; its aggregation's sensitivity is √(4D + k(k + 4))): "
                              f"add /D=<D>, got {unit.value!r}")
        return cls(unit, method)

    @property
    def private(self) -> bool:
        return self.unit is not None

    @property
    def edge_level(self) -> bool:
        """Edges only are protected: node features and labels are public."""
        return self.unit is not None and self.unit.kind in (UnitKind.EDGE, UnitKind.UNDIRECTED_EDGE)

    @property
    def degree_bound(self) -> int | None:
        """The unit's D at node and k-neighbor level (None at edge level and without a unit)."""
        return None if self.unit is None or self.edge_level else self.unit.degree_bound

    @property
    def out_degree_class(self) -> int | None:
        """Node level: the D every graph of the guarantee has; the owner's graph is checked
        against it and refused above it, never capped (module docstring). None otherwise."""
        return self.degree_bound if self.unit is not None and self.unit.kind is UnitKind.NODE else None

    def out_degree_cap(self, *, caps: bool) -> int | None:
        """k-neighbor level: the D to cap the raw graph at by the keyed
        :class:`~graphveil.transforms.OutDegreeBound`, for a method whose sensitivity there
        assumes the cap (``caps``: GAP's PMA); None otherwise (node level caps nothing)."""
        if not caps or self.unit is None or self.unit.kind is not UnitKind.K_NEIGHBOR:
            return None
        return self.unit.degree_bound

    def _edge_entries(self) -> int:
        return 2 if self.unit.kind is UnitKind.UNDIRECTED_EDGE else 1

    def aggregation_sensitivity(self) -> float:
        """ℓ2 change of the rows ≠ r of ``A·H`` for row-normalised H (one PMA hop): 2√D inside
        the node level's class, √(4D + k(k + 4)) on the keyed out-degree cap at k-neighbor level
        (:class:`~graphveil.transforms.OutDegreeBound`'s lemma)."""
        if self.unit is None:
            return math.nan
        if self.edge_level:
            return math.sqrt(self._edge_entries())
        d = self.unit.degree_bound
        if self.unit.kind is UnitKind.K_NEIGHBOR:
            return math.sqrt(4 * d + self.unit.k * (self.unit.k + 4))
        return 2.0 * math.sqrt(d)

    def embedding_sensitivity(self, c: float) -> float:
        """ℓ2 change of the rows ≠ r of ``A·W`` for W with rows of norm ≤ c (DP-Emb's Z)."""
        if self.unit is None:
            return math.nan
        if self.edge_level:
            return c * math.sqrt(self._edge_entries())
        if self.unit.kind is UnitKind.NODE:
            return c * math.sqrt(2 * self.unit.degree_bound)
        return c * math.sqrt(self.unit.k)

    def changed_rows(self) -> int:
        """Rows of A (DP-Emb examples) one unit changes: the group size of DP-Emb's DP-SGD."""
        if self.unit is None:
            raise ConfigError("a non-private run has no unit, so no group of changed rows")
        if self.edge_level:
            return self._edge_entries()
        if self.unit.kind is UnitKind.NODE:
            return 2 * self.unit.degree_bound + 1
        return self.unit.k + 1
