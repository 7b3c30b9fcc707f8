"""A DP-SGD stage inside a release: train a row-wise module on per-node examples.

GAP's feature encoder and DPDGC's DP-Emb are trained before the run's own :class:`Train`
stage and released (their outputs feed later stages), so each is a mechanism whose release
runs a whole DP-SGD loop with the engine's :func:`~graphveil.engine.dp_step.dp_step` (per-node
clipping to C, one noise draw of std σC per step) and whose accounting event is that loop:
``SelfComposedDpEvent(node_step_event(n, b, σ, group), T)`` — the same per-step event as the
``node_rdp`` accountant (:func:`~graphveil.plugins.node_dp.accountant.node_step_event`).

Sampling: b of the n training nodes without replacement, fresh every step, drawn from the
session's generator; T = ceil(epochs · n / b) steps. Without privacy (a non-private run, or a
stage that reads nothing the unit protects) the stage trains full-batch, as paper 4 does
("we train without mini-batching whenever the training does not involve a DP-optimizer").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.model import Model
from graphveil.contract.task import NodeBatch


class StageParams(BaseModel):
    """Training of one module (paper 4, App. K: 100 epochs, batch 64 on Cora, lr 1e-3, DP-Adam)."""

    model_config = ConfigDict(extra="forbid")
    epochs: float = Field(100, gt=0, description="Passes over the training nodes.")
    batch_size: int = Field(64, gt=0, description="b: nodes per DP-SGD step (capped at the training nodes).")
    lr: float = Field(1e-3, gt=0, description="Learning rate.")
    optimizer: Literal["adam", "sgd"] = Field("adam", description="DP-Adam or DP-SGD.")
    clip_norm: float = Field(1.0, gt=0, allow_inf_nan=False, description="C: per-node gradient norm bound.")


def planned_steps(num_nodes: int, params: StageParams, *, private: bool) -> int:
    """T: ceil(epochs · n / b) DP-SGD steps, or ceil(epochs) full-batch steps without privacy."""
    if not private:
        return max(1, math.ceil(params.epochs))
    b = min(params.batch_size, num_nodes)
    return max(1, math.ceil(params.epochs * num_nodes / b))


def stage_event(num_nodes: int, params: StageParams, noise_multiplier: float, group: int = 1) -> Any:
    """The accounting event of a private stage: T composed per-node steps (see module note)."""
    import dp_accounting

    from graphveil.plugins.node_dp.accountant import node_step_event

    b = min(params.batch_size, num_nodes)
    steps = planned_steps(num_nodes, params, private=True)
    return dp_accounting.SelfComposedDpEvent(node_step_event(num_nodes, b, noise_multiplier, group), steps)


def fit_rows(model: Model, losses: Callable[[Model, NodeBatch], torch.Tensor], nodes: torch.Tensor,
             params: StageParams, *, private: bool, noise_multiplier: float, noise: Any,
             generator: torch.Generator, after_step: Callable[[], None] | None = None) -> float:
    """Train ``model`` on the training ``nodes``; returns the mean loss of the last step.

    ``losses(model, NodeBatch(node ids))`` gives one loss per node. ``after_step`` runs after
    every optimizer step (DPDGC's projection of W⁽ᴬ⁾ onto rows of norm c). Privately each step
    is :func:`~graphveil.engine.dp_step.dp_step` with per-node clipping at ``params.clip_norm``.
    """
    from graphveil.engine.dp_step import dp_step, nonprivate_step
    from graphveil.plugins.node_dp.clipping import PerNodeClipper

    n = int(nodes.numel())
    b = min(params.batch_size, n)
    trainable = list(model.trainable_parameters())
    optimizer = (torch.optim.Adam(trainable, lr=params.lr) if params.optimizer == "adam"
                 else torch.optim.SGD(trainable, lr=params.lr))
    clipper = PerNodeClipper(PerNodeClipper.Params(clip_norm=params.clip_norm))

    def lifted(model: Model, batch: NodeBatch) -> torch.Tensor:
        return losses(model, NodeBatch(nodes[batch.nodes]))

    loss = float("nan")
    model.train()
    for _ in range(planned_steps(n, params, private=private)):
        if private:
            batch = NodeBatch(torch.randperm(n, generator=generator)[:b])
            metrics = dp_step(model, batch, clipper=clipper, noise_multiplier=noise_multiplier,
                              expected_batch_size=b, optimizer=optimizer, loss=lifted, noise=noise)
        else:
            metrics = nonprivate_step(model, NodeBatch(torch.arange(n)), optimizer=optimizer, loss=lifted)
        if after_step is not None:
            after_step()
        loss = metrics.loss
    model.eval()
    return loss
