"""GAP (Sajadmanesh et al. 2023) with paper 4's GDP analysis (Thm 5.1, Cor. H.4 / H.5).

Stages (paper 4, Alg. 1):

1. ``gap_encoder`` — DP-MLP_X on the node features with a classification head, by per-node
   DP-SGD (group size 1); at edge level features and labels are public and it trains without
   noise (App. G). Releases H⁽⁰⁾ = row-normalised encoder outputs of every node.
2. ``gap_aggregates`` — PMA over L hops: H⁽ˡ⁾ = row-normalise(A·H⁽ˡ⁻¹⁾ + N(0, s²)) with
   s = σ · Δ, Δ the per-hop sensitivity of :mod:`~graphveil.plugins.gdp.levels` (2√D at node level
   on a graph of out-degree ≤ D — refused above D —, √(4D + k(k + 4)) at k-neighbor level on the
   raw graph capped by a secret keyed order, 1 per directed entry at edge level).
   Releases Z = [H⁽⁰⁾ ‖ … ‖ H⁽ᴸ⁾]; accounted as L Gaussian mechanisms at noise multiplier σ.
3. ``Train`` — DP-MLP_f, the run's model, on ``features: released:gap_aggregates`` by the run's
   per-node DP-SGD (non-private at edge level).

What the guarantee covers (GDP, Def. 4.2): the weights and the prediction of every node v ≠ r.
Row r of Z is NOT private (it holds node r's own encoder output); Z therefore never leaves the
site — it is read row by row by the per-node DP-SGD and by the prediction of its own node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import ConfigError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import Method, Plan, Release
from graphveil.plugins.gdp.common import (
    GdpRelease,
    aggregate,
    aggregation_edges,
    load_checked,
    node_data,
    plan_level,
    row_normalise,
    train_stage,
)
from graphveil.plugins.gdp.levels import GdpLevel
from graphveil.plugins.gdp.modules import FeatureEncoder
from graphveil.plugins.gdp.row_training import StageParams, fit_rows, stage_event

ENCODER = "gap_encoder"
AGGREGATES = "gap_aggregates"


class GapEncoder(GdpRelease):
    """Stage 1: DP-MLP_X pretrained on (X, y) of the training nodes; releases row-normalised H⁽⁰⁾.

    Its trained weights (encoder and pretraining head) are the output of the stage's DP-SGD, so
    the stage's event covers them as they are: they are the release's :meth:`shared_state` (a
    federated site sends them with the classifier; H⁽⁰⁾, which holds every node's own row, stays
    at the site). :meth:`start_from` starts the next release's training from given weights (the
    server's average) instead of the initialisation (``encoder_seed``, else drawn from the stage's
    generator). Departure from paper 4: GAP trains DP-MLP_X once, from scratch.
    """

    def __init__(self, level: GdpLevel, params: GapParams, *, seed: int | None) -> None:
        super().__init__(level, seed=seed, stream=1)
        self.params = params
        self.model: FeatureEncoder | None = None  # the trained DP-MLP_X, once released
        self._start: dict[str, torch.Tensor] | None = None

    @property
    def private_training(self) -> bool:
        return self.level.private and not self.level.edge_level

    def calibrated(self) -> bool:
        return self.private_training

    def sensitivity(self) -> float:
        return 2.0 * self.params.encoder_training.clip_norm  # one node's clipped gradient, replaced

    def event_at(self, noise_multiplier: float) -> Any:
        import dp_accounting

        if not self.private_training:
            return dp_accounting.NoOpDpEvent()
        return stage_event(int(self.train_nodes.numel()), self.params.encoder_training, noise_multiplier)

    def release(self, task: Any, noise: Any) -> torch.Tensor:
        data = node_data(task)
        p = self.params
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(p.encoder_seed if p.encoder_seed is not None
                              else int(torch.randint(2**62, (1,), generator=self.generator)))
            model = FeatureEncoder(data.num_features, data.num_classes, p.hidden, p.encoder_layers, p.encoder_dropout)
        if self._start is not None:
            load_checked(model, self._start, ENCODER)
        x, y = data.x, data.y

        def losses(model: Any, batch: Any) -> torch.Tensor:
            return F.cross_entropy(model(x[batch.nodes]), y[batch.nodes], reduction="none")

        fit_rows(model, losses, self.train_nodes, p.encoder_training, private=self.private_training,
                 noise_multiplier=self.sigma() if self.private_training else 0.0, noise=noise,
                 generator=self.generator)
        self.model = model
        with torch.no_grad():
            return row_normalise(model.embed(x))

    def shared_state(self) -> dict[str, torch.Tensor]:
        return {} if self.model is None else self.model.trainable_state()

    def start_from(self, state: Mapping[str, torch.Tensor]) -> None:
        self._start = {k: torch.as_tensor(v).detach().clone() for k, v in state.items()}


class Pma(GdpRelease):
    """Stage 2: L hops of perturbed aggregation over the (degree-bounded) graph."""

    def __init__(self, level: GdpLevel, hops: int, *, seed: int | None) -> None:
        super().__init__(level, seed=seed, stream=2)
        self.hops = hops

    def sensitivity(self) -> float:
        return self.level.aggregation_sensitivity()

    def event_at(self, noise_multiplier: float) -> Any:
        import dp_accounting

        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), self.hops)

    def release(self, task: Any, noise: Any) -> torch.Tensor:
        if ENCODER not in task.released:
            raise ConfigError(f"PMA aggregates the release {ENCODER!r}, which the plan has not run")
        h = task.released[ENCODER]
        edges = aggregation_edges(task, self.level, caps=True)  # k-neighbor: keyed cap at D
        self.bounded_edges = edges  # kept for inspection (tests: the bound holds)
        std = self.sigma() * self.sensitivity() if self.level.private else 0.0
        hops = [h]
        for _ in range(self.hops):
            s = aggregate(hops[-1], edges)
            if std:
                noise.add_([s], std)
            hops.append(row_normalise(s))
        return torch.cat(hops, dim=1)


class GapParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hops: int = Field(2, ge=1, description="L: aggregation hops (paper 4 tunes L ∈ {1, 2, 3}).")
    hidden: int = Field(64, gt=0, description="h: width of the encoder (paper 4: 64).")
    encoder_layers: int = Field(2, ge=1, description="Layers of DP-MLP_X before its head (paper 4: 2).")
    encoder_dropout: float = Field(0.0, ge=0, lt=1, description=(
        "Dropout of DP-MLP_X while it trains (paper 4, App. K: 0.5 non-private and at edge level, 0 "
        "otherwise, for every module; GAP's code gives the encoder the same rate as the classifier)."))
    encoder_seed: int | None = Field(None, description=(
        "Seed of DP-MLP_X's initialisation (public). A federation pins it so that every site's first "
        "round starts from the same encoder; later rounds start from the server's. Default: drawn from "
        "the stage's generator (the run's seed)."))
    encoder_training: StageParams = Field(default_factory=StageParams,
                                          description="Pretraining of DP-MLP_X (paper 4: 100 epochs, batch 64).")


class Gap(Method):
    """GAP as a staged plan: encoder release, PMA release, then the run's classifier training."""

    Params = GapParams

    def plan(self, config: Any, mechanisms: Sequence[tuple[str, Mechanism]]) -> Plan:
        level = plan_level(config, "gap", mechanisms, needs_degree_bound=True, reads=("features", AGGREGATES))
        return Plan((Release(ENCODER, GapEncoder(level, self.params, seed=config.seed)),
                     Release(AGGREGATES, Pma(level, self.params.hops, seed=config.seed)),
                     train_stage(level)))

