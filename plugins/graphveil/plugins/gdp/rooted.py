"""Rooted computation subgraphs under node-level GDP: how many examples one node reaches, and
the sampler that draws roots (DP-SAGE, Daigavane et al. 2021, as paper 4 runs it).

Each example is a training node (the root) with its ``L``-hop in-neighbourhood
(:func:`graphveil.subgraph_batch.rooted_subgraphs`: the nodes with a path of length ≤ L to the
root, and every edge between them) on a graph of out-degree ≤ D. A larger graph is refused,
never capped: a cap would change edges that do not touch the replaced node, which the count
below excludes (:class:`graphveil.transforms.OutDegreeBound`). Node u lies in the subgraph of
root v only if a path u → … → v of length ≤ L exists; with out-degree ≤ D there are at most
N_L = Σ_{i=0}^{L} Dⁱ such roots (u itself included).

Replacing node r (paper 4's node level: its features, label and edges in both directions)
changes example v only if r lies in v's subgraph before or after: every changed edge touches
r, so a subgraph without r keeps its nodes and edges. Before, r reaches at most N_L roots,
after at most N_L, r itself in both, so

    G = 2·N_L − 1 = 1 + 2·Σ_{i=1}^{L} Dⁱ

examples change (for L = 1: 2D + 1, DPDGC's group at node level). Each changed example moves
its clipped gradient by ≤ 2C; the accountant (:mod:`~graphveil.plugins.gdp.rooted_accountant`)
analyses how many of them a batch holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind, SamplingProfile
from graphveil.contract.task import NodeBatch
from graphveil.contract.units import Adjacency, UnitKind
from graphveil.plugins.node_classification.sampler import WithoutReplacementSampler
from graphveil.plugins.node_dp.units import NODE_GDP


def reached_roots(degree_bound: int, hops: int) -> int:
    """N_L = Σ_{i=0}^{L} Dⁱ: roots whose L-hop subgraph can hold one node (itself included)."""
    if degree_bound < 1 or hops < 0:
        raise PrivacyError(f"need D >= 1 and L >= 0, got D={degree_bound}, L={hops}")
    return sum(degree_bound**i for i in range(hops + 1))


def changed_examples(degree_bound: int, hops: int) -> int:
    """G = 2·N_L − 1: rooted examples one replaced node can change (see the module docstring)."""
    return 2 * reached_roots(degree_bound, hops) - 1


class NodeLevelWithBound:
    """Mixin: accepts paper 4's node level with an out-degree bound (``node/replacement/D=…/predictions``).

    Other levels are refused: k-neighbor and edge units would need their own count of changed
    examples, which is not analysed here."""

    @classmethod
    def accepts_unit(cls, unit: PrivacyUnit) -> bool:
        return (unit.kind is UnitKind.NODE and unit.adjacency is Adjacency.REPLACEMENT
                and unit.protects_predictions and unit.degree_bound is not None)


@dataclass
class RootBatch(NodeBatch):
    """Positions of b roots in the training nodes, and the hops of their subgraphs (the task lifts it)."""

    num_hops: int = 2

    def select(self, index: torch.Tensor) -> RootBatch:
        return RootBatch(self.nodes[index], self.num_hops)


class RootSubgraphParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(64, gt=0, description="b: roots per step, uniformly without replacement (paper 4: 64).")
    num_hops: int = Field(2, ge=0, description=(
        "L: hops of each root's computation subgraph (use the model's layers; a node reaches at most "
        "Σ_{i≤L} Dⁱ roots)."))


class RootSubgraphSampler(NodeLevelWithBound, WithoutReplacementSampler):
    """b training roots uniformly without replacement per step; each example is a root's L-hop subgraph.

    The profile states G (:func:`changed_examples` of the run's D and L), the most examples one
    replaced node changes, for the accountant's hypergeometric analysis.
    """

    Params = RootSubgraphParams
    name: ClassVar[str] = "root_subgraphs"
    unit: ClassVar[PrivacyUnit] = NODE_GDP  # replaced by the run's unit (with D) in a private run

    def prepare(self, view: torch.Tensor, generator: torch.Generator, records: Any = None) -> SamplingProfile:
        """``view``: the training nodes (their count n is public under replacement adjacency).

        G is ``None`` (unbounded) when the unit states no out-degree bound D — a non-private run;
        an accountant refuses such a profile.

        :raises PrivacyError: if b > n.
        """
        n, b = int(view.numel()), self.params.batch_size
        if b > n:
            raise PrivacyError(f"sampler batch_size {b} exceeds the {n} training nodes")
        bound, hops = self.unit.degree_bound, self.params.num_hops
        group = 1 if hops == 0 else (None if bound is None else changed_examples(bound, hops))
        self._profile = SamplingProfile(SamplingKind.UNIFORM_WOR, rate=b / n, num_records=n, batch_size=b,
                                        examples_per_unit=group)
        return self._profile

    def sample(self, generator: torch.Generator) -> RootBatch:
        return RootBatch(self.draw(generator), self.params.num_hops)
