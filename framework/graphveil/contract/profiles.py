"""Profiles: what a sampler does, what a clipper bounds, what an accountant can analyse.

A DP claim is only as good as the match between what the code does and what the accountant
assumes (DESIGN.md, "The invariant"). Every sampler declares a :class:`SamplingKind`, every
clipper a :class:`SensitivityKind`, and every accountant the set of ``(sampling, sensitivity)``
pairs it can analyse; :mod:`graphveil.contract.invariant` refuses any other pair before data is read.
The privacy unit is a value of its own (:mod:`graphveil.contract.units`).

Once the graph is loaded, the sampler also reports a numeric :class:`SamplingProfile`
(γ, m, n, K, k_neg) that the accountant consumes; names state the assumed distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from graphveil.contract.units import PrivacyUnit

__all__ = ["ExampleStructure", "PrivacyUnit", "SamplingKind", "SamplingProfile", "SensitivityKind",
           "SensitivityProfile"]


class SamplingKind(StrEnum):
    #: Poisson(γ) positives + NEG-SAMPLE-WOR negatives (paper 1, Alg. 2 / Thm 3), degree capped to K.
    COUPLED_POISSON_WOR = "coupled_poisson_wor"
    #: Poisson(γ) positives + negatives drawn with replacement per tuple (not analysable at node level).
    COUPLED_POISSON_WR = "coupled_poisson_wr"
    #: Poisson(γ) positives, each tuple's negatives drawn independently of all data (paper 2, Sec. 3).
    POISSON_DECOUPLED = "poisson_decoupled"
    #: Plain Poisson(γ) over records.
    POISSON = "poisson"
    #: Fixed-size batches of b examples drawn uniformly without replacement, independently each
    #: step (dp_accounting's SampledWithoutReplacementDpEvent; analysed under replacement adjacency).
    UNIFORM_WOR = "uniform_wor"
    #: Disjoint partitions, one per step (paper 3).
    DISJOINT_PARTITIONS = "disjoint_partitions"
    FULL_BATCH = "full_batch"


class SensitivityKind(StrEnum):
    #: FREQ-CLIP (paper 1, Alg. 1) with |B⁻(u)| ≤ 1, its norm scaled so that the clipped sum
    #: moves by at most C per node even with recomputed frequencies (see entity_dp.clipping).
    FREQ_CLIP_NODE = "freq_clip_node"
    #: Standard per-tuple clipping at C under node-level DP: (|B⁺(u)| + 2|B⁻(u)|)·C (Eq. 2, Thm C.1).
    STANDARD_TUPLE_NODE = "standard_tuple_node"
    #: Per-tuple clipping at C under edge-level DP with decoupled negatives: C per edge.
    PER_TUPLE_EDGE = "per_tuple_edge"
    #: Per-example clipping at C where an example is one privacy unit's only contribution (a
    #: node's features and label in a feature-only model): C under add/remove, 2C under replacement.
    PER_EXAMPLE = "per_example"
    #: No clipping: no DP claim possible (non-private baseline).
    NONE = "none"


@dataclass(frozen=True)
class SamplingProfile:
    """Numbers the accountant needs about one sampler on one graph.

    :param kind: the distribution the sampler draws from.
    :param rate: γ, the Poisson rate of positive records.
    :param num_records: m, the number of positive records (edges after degree capping).
    :param num_nodes: n, the size of the node set negatives are drawn from.
    :param degree_cap: K, the maximum degree after capping (None if not capped).
    :param k_neg: negatives per positive.
    :param batch_size: b, the fixed batch size of ``UNIFORM_WOR`` (0 for Poisson sampling).
    :param examples_per_unit: G, the most examples one privacy unit can change (1 unless a
        unit's data lies in several examples, e.g. a node in the rooted subgraphs of many roots;
        ``None``: unbounded, which no accountant analyses).
    """

    kind: SamplingKind
    rate: float
    num_records: int
    num_nodes: int = 0
    degree_cap: int | None = None
    k_neg: int = 0
    batch_size: int = 0
    examples_per_unit: int | None = 1

    @property
    def expected_batch_size(self) -> float:
        """b̄ = γ·m, the expected number of positive records per step (DP steps divide by it)."""
        return self.rate * self.num_records


@dataclass(frozen=True)
class SensitivityProfile:
    """What a clipper bounds: the kind, the privacy unit and the clip norm C."""

    kind: SensitivityKind
    unit: PrivacyUnit
    clip_norm: float


class ExampleStructure(StrEnum):
    """How a model's forward keeps examples apart, so the engine can pick a per-example gradient.

    Declared at class level (``structure``) and read by the invariant check before data is read.
    """

    #: Each example owns its rows along dim 0 of every activation (MLP on node features, a text
    #: encoder over entity sequences): per-example gradients from one backward pass.
    ROWS = "rows"
    #: Each example is a root node with its own sampled computation subgraph (PyG ``Batch``).
    ROOT_SUBGRAPHS = "root_subgraphs"
    #: Examples are disjoint connected components (paper 3's graph splits, a PyG ``Batch``).
    COMPONENTS = "components"
    #: The forward mixes every node of one graph (full-graph GCN): no per-example gradient exists.
    WHOLE_GRAPH = "whole_graph"
