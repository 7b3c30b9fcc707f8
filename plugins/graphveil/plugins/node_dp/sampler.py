"""Fixed-size node batches drawn uniformly without replacement, independently at every step."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind, SamplingProfile
from graphveil.contract.task import NodeBatch
from graphveil.plugins.node_classification.sampler import WithoutReplacementSampler
from graphveil.plugins.node_dp.units import NODE_GDP, RowWiseGdpUnits


class UniformNodeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int | None = Field(64, gt=0, description=(
        "b: nodes per step (paper 4 uses 64 on Cora). null: every training node at every step "
        "(full batch; paper 4 trains so whenever no DP optimizer is involved)."))


class UniformNodeSampler(RowWiseGdpUnits, WithoutReplacementSampler):
    """b training nodes uniformly without replacement per step, fresh each step (sampled-WOR Gaussian).

    The batch size is fixed and public, which is what the replace-one analysis of the
    sampled-without-replacement Gaussian (Wang, Balle & Kasiviswanathan 2019, Thm 27) assumes.
    """

    Params = UniformNodeParams
    name: ClassVar[str] = "node_uniform_wor"
    unit: ClassVar[PrivacyUnit] = NODE_GDP

    def prepare(self, view: torch.Tensor, generator: torch.Generator, records: Any = None) -> SamplingProfile:
        """``view``: the training nodes (their count n is public under replacement adjacency)."""
        n = int(view.numel())
        b = n if self.params.batch_size is None else self.params.batch_size
        if b > n:
            raise PrivacyError(f"sampler batch_size {b} exceeds the {n} training nodes")
        self._n = n
        self._profile = SamplingProfile(SamplingKind.UNIFORM_WOR, rate=b / n, num_records=n, batch_size=b)
        return self._profile

    def sample(self, generator: torch.Generator) -> NodeBatch:
        return NodeBatch(self.draw(generator))
