"""The privacy unit as a value: what two neighbouring datasets differ in.

A DP claim is "for any two datasets that differ in one *unit*". Papers 1–4 use different units:
a directed edge entry or an undirected relation (paper 2, edge-level), an entity with all its
relations (paper 1, node-level, add/remove), a node replaced with its features, label and
out-edges under an out-degree bound D (paper 4, node-level GDP), only k of its adjacency
entries (paper 4, k-neighbor GDP), or a whole graph (paper 3's unit is one document graph).
Two components agree on the unit only if *all* of it agrees, so the unit is one frozen value
compared as a whole in one place (:func:`graphveil.contract.invariant.check_units`).

``PrivacyUnit.EDGE`` and ``PrivacyUnit.NODE`` are the units of the relational methods (add/remove
adjacency); their :attr:`~PrivacyUnit.value` labels ("edge", "node") are what ledgers and
site settings store, so existing ledgers keep their binding.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar


class UnitKind(StrEnum):
    #: One directed entry of the adjacency (a relation as one record; paper 2).
    EDGE = "edge"
    #: One undirected edge (both entries of the symmetric adjacency).
    UNDIRECTED_EDGE = "undirected_edge"
    #: One entity/node with everything attached to it: features, label, all its relations.
    NODE = "node"
    #: One node's features and label plus at most k entries of its adjacency row (paper 4, Def. 4.1).
    K_NEIGHBOR = "k_neighbor"
    #: One whole graph of a collection (paper 3's document graphs).
    GRAPH = "graph"


class Adjacency(StrEnum):
    #: D' = D with one unit added or removed (n changes; paper 1, Opacus' default).
    ADD_REMOVE = "add_remove"
    #: D' = D with one unit replaced by another (n public and fixed; paper 4's GDP).
    REPLACEMENT = "replacement"


@dataclass(frozen=True)
class PrivacyUnit:
    """What neighbouring datasets differ in.

    :param kind: edge entry, undirected edge, node, k-neighbor or graph.
    :param adjacency: add/remove or replacement.
    :param degree_bound: D, the out-degree bound the analysis assumes (node-level GNNs), or None.
    :param k: adjacency entries of the replaced node that may change (k-neighbor only).
    :param protects_predictions: the guarantee also covers released predictions (GDP,
        paper 4 Def. 4.2), not only the trained weights.
    """

    kind: UnitKind
    adjacency: Adjacency = Adjacency.ADD_REMOVE
    degree_bound: int | None = None
    k: int | None = None
    protects_predictions: bool = False

    EDGE: ClassVar[PrivacyUnit]
    NODE: ClassVar[PrivacyUnit]

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", UnitKind(self.kind))
        object.__setattr__(self, "adjacency", Adjacency(self.adjacency))
        if (self.k is not None) != (self.kind is UnitKind.K_NEIGHBOR):
            raise ValueError("k is set exactly for the k_neighbor unit")
        if self.k is not None and self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if self.degree_bound is not None and self.degree_bound < 1:
            raise ValueError(f"degree_bound must be >= 1, got {self.degree_bound}")

    @property
    def value(self) -> str:
        """Canonical label, e.g. ``node``, ``node/replacement/D=100``, ``k_neighbor/replacement/k=5``.

        The two relational units keep their historic labels ``edge`` and ``node``.
        """
        parts = [self.kind.value]
        if self.adjacency is not Adjacency.ADD_REMOVE:
            parts.append(self.adjacency.value)
        if self.degree_bound is not None:
            parts.append(f"D={self.degree_bound}")
        if self.k is not None:
            parts.append(f"k={self.k}")
        if self.protects_predictions:
            parts.append("predictions")
        return "/".join(parts)

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, label: str) -> PrivacyUnit:
        """Inverse of :attr:`value`.

        :raises ValueError: naming the part that is not understood.
        """
        kind, *rest = label.strip().split("/")
        fields: dict[str, object] = {"kind": UnitKind(kind)}
        for part in rest:
            if part in Adjacency.__members__.values():
                fields["adjacency"] = Adjacency(part)
            elif part.startswith("D="):
                fields["degree_bound"] = int(part[2:])
            elif part.startswith("k="):
                fields["k"] = int(part[2:])
            elif part == "predictions":
                fields["protects_predictions"] = True
            else:
                raise ValueError(f"privacy unit {label!r}: cannot read {part!r}")
        return cls(**fields)  # type: ignore[arg-type]


PrivacyUnit.EDGE = PrivacyUnit(UnitKind.EDGE)
PrivacyUnit.NODE = PrivacyUnit(UnitKind.NODE)


class ClaimsUnit:
    """A component whose analysis is stated for a privacy unit (class attribute ``unit``)."""

    unit: ClassVar[PrivacyUnit]

    @classmethod
    def accepts_unit(cls, unit: PrivacyUnit) -> bool:
        """Whether this component's analysis also holds for ``unit`` when a run states its unit
        (``privacy.unit``); the session then records ``unit`` on the instance. Default: only its
        own unit. Override only with the argument why in the docstring."""
        return unit == cls.unit
