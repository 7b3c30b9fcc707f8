"""DPDGC, paper 4's decoupled graph convolution (Sec. 5.2, Alg. 2, Thms 5.3, 5.4, G.1).

Stages:

1. ``dpdgc_embedding`` — one release with two parts:
   a. DP-Emb: Ŷ = SELU(A W⁽ᴬ⁾ + b) R on node i's adjacency row A_i (R random and fixed),
      trained by per-node DP-SGD; after EVERY step the rows of W⁽ᴬ⁾ are set to norm c by a
      projection on the parameter itself (:meth:`AdjacencyEmbedding.project`; a public
      implementation assigns into a fresh ``state_dict()``, which does nothing). One unit
      changes up to g rows of A, hence g examples: g = 1 / 2 (edge / undirected edge),
      2D + 1 (node, on a graph of out-degree ≤ D — refused above D), k + 1 (k-neighbor, raw graph);
      :func:`~graphveil.plugins.node_dp.accountant.node_step_event` with that group.
   b. Z = A W⁽ᴬ⁾ + b + N(0, s²), s = σ · Δ_Z with Δ_Z = c·{1, √2, √(2D), √k}
      (:meth:`GdpLevel.embedding_sensitivity`), then row-normalised (Alg. 2, line 15).
   Accounted as the composition of (a) and the Gaussian (b). The artifact is [X ‖ Z].
   R is public (``projection_seed``, else the stage's generator); W⁽ᴬ⁾ has a row per node of
   the graph, so DP-Emb shares no weights across graphs (federated sites share R only).
2. ``Train`` — the LINKX-style classifier (model ``linkx``) on ``features:
   released:dpdgc_embedding`` by the run's per-node DP-SGD (non-private at edge level).

As in GAP, row r of the artifact is the replaced node's own data (its features, its Z row): the
artifact stays at the site and is read row by row (DP-SGD, the prediction of its own node).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import ConfigError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import Method, Plan, Release
from graphveil.plugins.gdp.common import (
    GdpRelease,
    aggregation_edges,
    node_data,
    plan_level,
    row_normalise,
    train_stage,
)
from graphveil.plugins.gdp.levels import GdpLevel
from graphveil.plugins.gdp.modules import AdjacencyEmbedding
from graphveil.plugins.gdp.row_training import StageParams, fit_rows, stage_event

EMBEDDING = "dpdgc_embedding"


class DpdgcParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(64, gt=0, description="h: width of W⁽ᴬ⁾ and of the released Z (paper 4: 64).")
    row_norm: float = Field(1.0, gt=0, allow_inf_nan=False, description=(
        "c: norm of every row of W⁽ᴬ⁾. The noise on Z scales with c too; paper 4 reports better "
        "utility with c = 1e-8 (App. K), where Z is then dominated by the bias b."))
    noise_scale: float = Field(1.0, gt=0, allow_inf_nan=False, description=(
        "DP-Emb's training and the Z release use noise multiplier σ · noise_scale, σ the run's "
        "calibrated multiplier: the share of the budget the graph part gets. At node level the "
        "group of 2D + 1 rows makes DP-Emb expensive; a large scale with few epochs leaves the "
        "budget to the classifier."))
    projection_seed: int | None = Field(None, description=(
        "Seed of DP-Emb's fixed random projection R (public). A federation pins it so that every "
        "site and round trains its embedding against the same R, and the shared classifier reads "
        "embeddings aligned to it. Default: drawn from the stage's generator (the run's seed)."))
    embedding_training: StageParams = Field(default_factory=StageParams, description=(
        "DP-Emb's training. With a group of g > 1 changed rows no sampling amplification is "
        "claimed, so a full batch (batch_size ≥ training nodes) gives the most signal per unit of noise."))


class DpEmbedding(GdpRelease):
    """Stage 1: train DP-Emb, then release [X ‖ row-normalise(A W⁽ᴬ⁾ + b + N)]."""

    def __init__(self, level: GdpLevel, params: DpdgcParams, *, seed: int | None) -> None:
        super().__init__(level, seed=seed, stream=3)
        self.params = params
        self.model: AdjacencyEmbedding | None = None  # kept for inspection (tests: the constraint holds)

    def sensitivity(self) -> float:
        return self.level.embedding_sensitivity(self.params.row_norm)

    def group(self) -> int:
        return self.level.changed_rows()

    def sigma(self) -> float:
        return super().sigma() * self.params.noise_scale

    def event_at(self, noise_multiplier: float) -> Any:
        import dp_accounting

        scaled = noise_multiplier * self.params.noise_scale
        training = stage_event(int(self.train_nodes.numel()), self.params.embedding_training,
                               scaled, group=self.group())
        return dp_accounting.ComposedDpEvent([training, dp_accounting.GaussianDpEvent(scaled)])

    def release(self, task: Any, noise: Any) -> torch.Tensor:
        data = node_data(task)
        p = self.params
        n = data.num_nodes
        edges = aggregation_edges(task, self.level, caps=False)  # DP-Emb's bounds need no cap
        # row i of A: node i's in-neighbours (edges j → i), as a sparse (n, n) matrix
        adjacency = torch.sparse_coo_tensor(torch.stack([edges[1], edges[0]]), torch.ones(edges.shape[1]),
                                            (n, n), check_invariants=True).coalesce()
        # R is public and data-independent: from projection_seed (one R for every site and round
        # of a federation), else from the stage's generator
        projection = (self.generator if p.projection_seed is None
                      else torch.Generator().manual_seed(p.projection_seed))
        model = AdjacencyEmbedding(n, data.num_classes, p.hidden, p.row_norm, projection)
        y = data.y

        def losses(model: Any, batch: Any) -> torch.Tensor:
            rows = torch.index_select(adjacency, 0, batch.nodes).to_dense()
            return F.cross_entropy(model(rows), y[batch.nodes], reduction="none")

        fit_rows(model, losses, self.train_nodes, p.embedding_training, private=self.level.private,
                 noise_multiplier=self.sigma(), noise=noise, generator=self.generator,
                 after_step=model.project)
        self.model = model
        with torch.no_grad():
            z = torch.sparse.mm(adjacency, model.linear.weight.t()).contiguous()
            if self.level.private:
                noise.add_([z], self.sigma() * self.sensitivity())
            z = row_normalise(z + model.linear.bias)
        return torch.cat([data.x.to(torch.float32), z], dim=1)


class Dpdgc(Method):
    """DPDGC as a staged plan: the DP-Emb release, then the run's LINKX classifier training."""

    Params = DpdgcParams

    def plan(self, config: Any, mechanisms: Sequence[tuple[str, Mechanism]]) -> Plan:
        level = plan_level(config, "dpdgc", mechanisms, needs_degree_bound=False, reads=("features", EMBEDDING))
        width = config.network.params.get("embedding_width")
        if width is not None and width != self.params.hidden:
            raise ConfigError(f"model.embedding_width ({width}) must equal method.hidden ({self.params.hidden}): "
                              "the classifier splits [X ‖ Z] at that width")
        return Plan((Release(EMBEDDING, DpEmbedding(level, self.params, seed=config.seed)), train_stage(level)))
