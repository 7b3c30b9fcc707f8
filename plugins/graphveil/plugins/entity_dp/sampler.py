"""Samplers for entity-level (node) DP relational learning (paper 1, Alg. 2 and Alg. 3).

Both samplers first cap every node's degree to K (:func:`cap_degrees`, Alg. 3 "Initialize"),
set γ = b/|Ē|, then draw positives by Poisson(γ) sampling of Ē (Alg. 3 line 3). They differ
in how the negatives are drawn:

* :class:`PoissonWORSampler` — NEG-SAMPLE-WOR (Alg. 2): l·k_neg *distinct* nodes from V, so
  every node is a negative at most once per batch (|B⁻(u)| ≤ 1, Sec. 4.1) and the negative
  draw depends on the positives only through their number l (cardinality-dependent coupled
  sampling, Def. 4.1 and Thm 3).
* :class:`PoissonWithReplacementNegSampler` — each negative uniform over V independently;
  a node may be a negative of many tuples, so FREQ-CLIP's constant sensitivity (Prop. 4.1)
  does not hold and no node-level accountant analyses it. It exists for non-private runs
  and so the invariant check has a real mismatched sampler to refuse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, Field

from graphveil.contract.errors import ConfigError, PrivacyError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind
from graphveil.plugins.entity_dp.degree_cap import cap_degrees
from graphveil.sampling import PoissonTupleParams, PoissonTupleSampler, sample_without_replacement

if TYPE_CHECKING:
    from graphveil.data.graph import RelationalGraph


class DegreeCappedParams(PoissonTupleParams):
    """Options of the node-level samplers."""

    degree_cap: int = Field(default=5, ge=1, description="maximal node degree K after random edge dropping")


class _DegreeCappedPoissonSampler(PoissonTupleSampler):
    """Poisson(γ = b/|Ē|) positives over the degree-capped edge set Ē (paper 1, Alg. 3)."""

    Params: ClassVar[type[BaseModel]] = DegreeCappedParams
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.NODE

    def _records(self, graph: RelationalGraph, generator: torch.Generator) -> torch.Tensor:
        return cap_degrees(graph.edges, graph.num_nodes, self.params.degree_cap, generator)

    def _degree_cap(self) -> int | None:
        return int(self.params.degree_cap)

    def preprocessing_params(self) -> dict[str, Any] | None:
        """Ē is drawn at random once per (graph, K) and must then be reused (records store)."""
        return {"degree_cap": int(self.params.degree_cap)}

    def check_records(self, graph: RelationalGraph, records: torch.Tensor) -> torch.Tensor:
        """Stored Ē: relations of ``graph`` (see the base class) with every degree ≤ K."""
        records = super().check_records(graph, records)
        K = int(self.params.degree_cap)
        degrees = torch.bincount(records.reshape(-1), minlength=graph.num_nodes)
        if records.numel() and int(degrees.max()) > K:
            worst = int(degrees.argmax())
            raise PrivacyError(
                f"stored records for graph {graph.name!r}: entity {graph.entity_ids[worst]!r} has "
                f"degree {int(degrees[worst])} > degree cap K={K}; the store belongs to another cap"
            )
        return records


class PoissonWORSampler(_DegreeCappedPoissonSampler):
    """Degree cap K, Poisson(γ) positives, NEG-SAMPLE-WOR negatives (paper 1, Alg. 2/3, Thm 3).

    A batch of l positives gets l·k_neg distinct nodes drawn uniformly without replacement
    from V, in random order; slot (i, j) is paired with a random end of eᵢ⁺ (Alg. 2 line 3).
    :meth:`prepare` refuses k_neg·b > n. Because l ~ Binomial(|Ē|, γ) is random, l·k_neg > n
    can still happen (negligibly often when k_neg·b is well below n); then all n nodes are
    used once and the missing negatives are ``-1`` in both ``negatives`` and ``anchors``, so
    |B⁻(u)| ≤ 1 still holds. Losses must mask ``-1`` slots; the accountant's
    Γₗ = 1 - (1-γ)^K (1 - l·k_neg/n) must clamp (1 - l·k_neg/n) at 0 for such l.
    """

    sampling_kind: ClassVar[SamplingKind] = SamplingKind.COUPLED_POISSON_WOR

    def _validate(self, num_records: int, num_nodes: int) -> None:
        b, k = self.params.batch_size, self.params.k_neg
        if k * b > num_nodes:
            raise ConfigError(
                f"sampler.k_neg * sampler.batch_size = {k} * {b} = {k * b} exceeds the {num_nodes} "
                "nodes NEG-SAMPLE-WOR draws distinct negatives from (paper 1, Alg. 2); "
                "lower k_neg or batch_size"
            )

    def _negatives(self, count: int, generator: torch.Generator) -> torch.Tensor:
        n, k = self.profile.num_nodes, self.params.k_neg
        wanted = count * k
        drawn = sample_without_replacement(n, min(wanted, n), generator)
        if wanted > n:
            drawn = torch.cat([drawn, torch.full((wanted - n,), -1, dtype=torch.long)])
        return drawn.view(count, k)


class PoissonWithReplacementNegSampler(_DegreeCappedPoissonSampler):
    """Degree cap K, Poisson(γ) positives, negatives drawn with replacement (no node-level DP analysis).

    Every negative is uniform over V and independent of all others, so a node can be the
    negative of many tuples in one batch: |B⁻(u)| is unbounded and FREQ-CLIP's sensitivity C
    (paper 1, Prop. 4.1) fails. Declared as ``coupled_poisson_wr`` so accountants refuse it.
    """

    sampling_kind: ClassVar[SamplingKind] = SamplingKind.COUPLED_POISSON_WR
