"""DP-SAGE (Daigavane et al. 2021) as paper 4 runs it: node-level DP-SGD of GraphSAGE on rooted
subgraphs, then output perturbation at inference (GAP's strategy) so the predictions are private.

Stages:

1. ``Train`` — the run's sampler ``root_subgraphs`` (b of n training roots, each with its
   L-hop subgraph of the graph, whose out-degree must be ≤ D: refused otherwise), clipper ``per_node_clip`` (one root's
   gradient to C), accountant ``rooted_rdp`` (hypergeometric mixture over the G = 1 + 2Σ_{i≤L} Dⁱ
   roots one replaced node reaches), model ``sage``.
2. ``dp_sage_outputs`` — after training: every node's class scores from the trained model on the
   bounded graph, each row clipped to ℓ2 norm c, plus N(0, s²) with s = σ·scale·Δ,
   Δ = 2c·√G (one replaced node changes the scores of at most G nodes, each row by ≤ 2c; the
   replaced node's own row, which GDP does not cover, is counted too). Accounted as one
   Gaussian at noise multiplier σ·scale, in the same budget as the steps.

Evaluation reads only the released scores (task ``rooted_node_classification`` with
``predictions: released:dp_sage_outputs``). Paper 4 gives no clip norm or noise split for the
outputs; c and the scale are parameters here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import ConfigError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import MODEL_KEY, Method, Plan, Release, Train
from graphveil.contract.units import UnitKind
from graphveil.plugins.gdp.common import GdpRelease, plan_level
from graphveil.plugins.gdp.levels import GdpLevel
from graphveil.plugins.gdp.rooted import changed_examples

OUTPUTS = "dp_sage_outputs"


class DpSageParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    output_clip: float = Field(1.0, gt=0, description="c: every node's score vector is scaled to ℓ2 norm ≤ c.")
    output_noise_scale: float = Field(1.0, gt=0, description=(
        "The outputs' noise multiplier is σ·scale (σ: the run's shared noise multiplier); > 1 spends "
        "less of the budget on the outputs and more on training."))


class SageOutputs(GdpRelease):
    """Stage 2: clipped class scores of every node on the bounded graph, plus Gaussian noise."""

    def __init__(self, level: GdpLevel, params: DpSageParams, hops: int, *, seed: int | None) -> None:
        super().__init__(level, seed=seed, stream=3)
        self.params, self.hops = params, hops

    def sensitivity(self) -> float:
        if not self.level.private:
            return math.nan
        return 2.0 * self.params.output_clip * math.sqrt(changed_examples(self.level.unit.degree_bound, self.hops))

    def event_at(self, noise_multiplier: float) -> Any:
        import dp_accounting

        if not self.level.private:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.GaussianDpEvent(noise_multiplier * self.params.output_noise_scale)

    def release(self, task: Any, noise: Any) -> torch.Tensor:
        model = task.released.get(MODEL_KEY)
        if model is None:
            raise ConfigError(f"release {OUTPUTS!r} reads the trained model: it must come after the Train stage")
        layers = len(model.convs)
        if layers != self.hops:
            raise ConfigError(f"release {OUTPUTS!r} was sized for {self.hops} layers, the model has {layers}")
        scores = task.scores(model)
        if not self.level.private:
            return scores
        c = self.params.output_clip
        scores = scores * (c / scores.norm(dim=1, keepdim=True).clamp(min=c))
        noise.add_([scores], self.sigma() * self.params.output_noise_scale * self.sensitivity())
        return scores


class DpSage(Method):
    """DP-SGD of GraphSAGE on rooted subgraphs, then perturbed outputs (paper 4's DP-SAGE baseline)."""

    Params = DpSageParams

    def plan(self, config: Any, mechanisms: Sequence[tuple[str, Mechanism]]) -> Plan:
        level = plan_level(config, "dp_sage", mechanisms, needs_degree_bound=True, reads=("predictions", OUTPUTS))
        if level.private and level.unit.kind is not UnitKind.NODE:
            raise ConfigError(f"method 'dp_sage' is analysed at node level only (paper 4 runs it for node GDP), "
                              f"got privacy.unit {level.unit.value!r}")
        if config.network.name != "sage":
            raise ConfigError(f"method 'dp_sage' trains model 'sage', got {config.network.name!r}")
        from graphveil.plugins.gdp.rooted import RootSubgraphParams
        from graphveil.plugins.node_classification.sage import SAGEParams

        hops = SAGEParams(**config.network.params).layers
        if config.sampler.name != "root_subgraphs" or RootSubgraphParams(**config.sampler.params).num_hops != hops:
            raise ConfigError(f"method 'dp_sage' samples each root's subgraph with as many hops as the model has "
                              f"layers ({hops}): use sampler root_subgraphs with num_hops: {hops}")
        return Plan((Train(), Release(OUTPUTS, SageOutputs(level, self.params, hops, seed=config.seed))))
