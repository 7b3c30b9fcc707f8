"""One optimizer step over a tuple batch: private (clip + noise) or the non-private baseline.

The DP step is paper 2's Eq. (3) / paper 1's Alg. 3 inner loop, with the clipper deciding the
per-tuple factors (standard clipping, or FREQ-CLIP, paper 1 Alg. 1)::

    g̃ = ( Σᵢ factorᵢ · g(Tᵢ)  +  N(0, σ²C² I) ) / b̄

where ``g(Tᵢ)`` is the gradient of tuple ``i``'s loss (computed without per-token gradients,
:mod:`graphveil.engine.per_tuple`), ``C = clipper.clip_norm`` and ``b̄`` is the EXPECTED batch
size (γ·m under Poisson sampling): dividing by the realised size would make the released
value depend on the batch size beyond the analysed sensitivity. An empty batch still releases
noise and steps. DP-Adam / DP-SGD is the torch optimizer applied to ``g̃`` (post-processing).

Entry points for a session: :func:`build_optimizer`, :class:`LossSpec`, :class:`GaussianNoise`
(re-exported), :func:`dp_step`, :func:`nonprivate_step` (same signature).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from graphveil.components import Clipper, Encoder, Model, TupleBatch
from graphveil.config import TrainingConfig
from graphveil.engine.losses import LossKind, tuple_losses
from graphveil.engine.noise import GaussianNoise
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.errors import PluginError

__all__ = [
    "GaussianNoise",
    "LossSpec",
    "StepMetrics",
    "batch_losses",
    "build_optimizer",
    "dp_step",
    "nonprivate_step",
]


@dataclass(frozen=True)
class LossSpec:
    """Which per-tuple loss, and its temperature (InfoNCE) or margin (hinge)."""

    kind: LossKind = "infonce"
    temperature: float = 0.05
    margin: float = 0.2

    @classmethod
    def from_config(cls, training: TrainingConfig) -> LossSpec:
        return cls(training.loss, training.temperature, training.margin)


@dataclass(frozen=True)
class StepMetrics:
    """What one step reports. ``nan`` where undefined (empty batch; norms in the baseline)."""

    loss: float
    batch_size: int
    clipped_fraction: float
    mean_grad_norm: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: ``nan`` becomes ``None``."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def build_optimizer(params: Iterable[torch.nn.Parameter], training: TrainingConfig) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` (DP-Adam on the privatised gradient) or ``SGD`` at ``training.lr``."""
    params = list(params)
    if not params:
        raise PluginError("the encoder has no trainable parameters to optimise")
    if training.optimizer == "adam":
        return torch.optim.Adam(params, lr=training.lr)
    return torch.optim.SGD(params, lr=training.lr)


def _anchor_positions(batch: TupleBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(entities (b, 2+k) with masked negatives filled, anchors_pos (b, k), mask (b, k))``.

    ``batch.anchors`` holds the entity ``wᵢⱼ`` (an end of ``eᵢ⁺``); negatives ``< 0`` are absent.
    """
    u, v = batch.positives[:, :1], batch.positives[:, 1:]
    mask = batch.negatives >= 0
    anchors = batch.anchors
    bad = mask & (anchors != u) & (anchors != v)
    if bool(bad.any()):
        i, j = (int(x) for x in bad.nonzero()[0])
        raise PluginError(
            f"sampler produced anchor {int(anchors[i, j])} for negative {j} of tuple {i}, which is "
            f"not an end of its positive relation {batch.positives[i].tolist()}"
        )
    anchors_pos = (anchors == v).long() & mask.long()
    negatives = torch.where(mask, batch.negatives, u.expand_as(batch.negatives))
    return torch.cat([batch.positives, negatives], 1), anchors_pos, mask


def batch_losses(encoder: Encoder, batch: TupleBatch, loss: LossSpec) -> torch.Tensor:
    """Per-tuple losses ``(b,)``; entities are embedded tuple-major, one sequence per occurrence."""
    entities, anchors_pos, mask = _anchor_positions(batch)
    b, width = entities.shape
    emb = encoder.embed(entities.reshape(-1)).reshape(b, width, -1)
    return tuple_losses(
        emb, anchors_pos, mask, kind=loss.kind, temperature=loss.temperature, margin=loss.margin
    )


#: Per-example losses of a batch: a task's ``losses(model, batch)``, or a :class:`LossSpec` for tuples.
Losses = LossSpec | Callable[[Any, Any], torch.Tensor]


def _loss_fn(loss: Losses) -> Callable[[Any, Any], torch.Tensor]:
    if isinstance(loss, LossSpec):
        return lambda model, batch: batch_losses(model, batch, loss)
    return loss


_ENGINES: weakref.WeakKeyDictionary[Model, tuple[tuple[int, ...], PerTupleGrad]] = weakref.WeakKeyDictionary()


def _engine_for(encoder: Model, params: list[torch.nn.Parameter]) -> PerTupleGrad:
    """One engine per encoder (rebuilt if its trainable set changes). The summed-gradient check
    of :class:`PerTupleGrad` (weight tying, functional use) runs on the engine's first step
    only: it tests the model's structure, which does not change between steps."""
    key = tuple(id(p) for p in params)
    cached = _ENGINES.get(encoder)
    if cached is not None and cached[0] == key:
        cached[1].verify = False
        return cached[1]
    engine = PerTupleGrad(encoder)
    _ENGINES[encoder] = (key, engine)
    return engine


def dp_step(
    encoder: Model,
    batch: Any,
    *,
    clipper: Clipper,
    noise_multiplier: float,
    expected_batch_size: float,
    optimizer: torch.optim.Optimizer,
    loss: Losses,
    noise: GaussianNoise,
) -> StepMetrics:
    """One DP step: per-tuple norms → ``clipper.factors`` → clipped sum + ``N(0, σ²C²)`` → ÷ b̄ → step.

    :param clipper: gives per-tuple factors in ``[0, 1]``; ``C = clipper.clip_norm`` sets the
        noise scale ``σ·C``.
    :param noise_multiplier: σ ≥ 0 (σ = 0 only for tests: no privacy).
    :param expected_batch_size: b̄ > 0, the expected number of tuples per step.
    :param optimizer: built by :func:`build_optimizer` over ``encoder.trainable_parameters()``.
    :param loss: per-example losses ``(b,)`` of a batch: a task's ``losses`` or a tuple :class:`LossSpec`.
    :raises PluginError: the clipper returned factors of the wrong shape or outside ``[0, 1]``.
    """
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    if not expected_batch_size > 0:
        raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size}")
    params = list(encoder.trainable_parameters())
    optimizer.zero_grad(set_to_none=True)
    b = batch.size
    engine = _engine_for(encoder, params)
    if b > 0:
        with engine.record(num_groups=b):
            losses = _loss_fn(loss)(encoder, batch)
        norms = engine.compute(losses.sum())
        factors = torch.as_tensor(clipper.factors(batch, norms.detach()), dtype=torch.float32)
        if factors.shape != (b,) or not bool(((factors >= 0) & (factors <= 1)).all()):
            raise PluginError(
                f"clipper {type(clipper).__name__} must return {b} factors in [0, 1], "
                f"got shape {tuple(factors.shape)}"
            )
        engine.accumulate(factors)
        metrics = StepMetrics(
            loss=float(losses.detach().mean()),
            batch_size=b,
            clipped_fraction=int((factors < 1).sum()) / b,
            mean_grad_norm=float(norms.mean()),
        )
    else:
        for p in params:
            p.grad = torch.zeros_like(p)
        metrics = StepMetrics(float("nan"), 0, float("nan"), float("nan"))
    std = noise_multiplier * float(clipper.clip_norm)
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            noise.add_([p.grad], std)
            p.grad.div_(expected_batch_size)
    optimizer.step()
    return metrics


def nonprivate_step(
    encoder: Model,
    batch: Any,
    *,
    clipper: Clipper | None = None,
    noise_multiplier: float = 0.0,
    expected_batch_size: float = 1.0,
    optimizer: torch.optim.Optimizer,
    loss: Losses,
    noise: GaussianNoise | None = None,
) -> StepMetrics:
    """Baseline with :func:`dp_step`'s signature: mean loss over the realised batch, backward, step.

    ``clipper``, ``noise_multiplier``, ``expected_batch_size`` and ``noise`` are ignored; an
    empty batch does not step (nothing is learned and nothing needs hiding).
    """
    optimizer.zero_grad(set_to_none=True)
    if batch.size == 0:
        return StepMetrics(float("nan"), 0, float("nan"), float("nan"))
    losses = _loss_fn(loss)(encoder, batch)
    losses.mean().backward()
    optimizer.step()
    return StepMetrics(float(losses.detach().mean()), batch.size, 0.0, float("nan"))
