"""One optimizer step over a tuple batch: private (clip + noise) or the non-private baseline.

The DP step is paper 2's Eq. (3) / paper 1's Alg. 3 inner loop, with the clipper deciding the
per-tuple factors (standard clipping, or FREQ-CLIP, paper 1 Alg. 1)::

    g̃ = ( Σᵢ factorᵢ · g(Tᵢ)  +  N(0, σ²C² I) ) / b̄

where ``g(Tᵢ)`` is the gradient of tuple ``i``'s loss (computed without per-token gradients,
:mod:`graphveil.engine.per_tuple`), ``C = clipper.clip_norm`` and ``b̄`` is the EXPECTED batch
size (γ·m under Poisson sampling): dividing by the realised size would make the released
value depend on the batch size beyond the analysed sensitivity. An empty batch still releases
noise and steps. DP-Adam / DP-SGD is the torch optimizer applied to ``g̃`` (post-processing).

Non-finite examples. An example whose loss or gradient norm is not finite (an overflow its data
causes under the given weights) contributes 0 to the sum — a vector within every clipping bound,
so the sensitivity is unchanged — and is counted in :attr:`StepMetrics.nonfinite`; the step never
raises on it. Whether an example overflows depends only on that example (no layer mixes
examples), so on neighbouring datasets the same examples are left out except those of the
changed unit. The sum is then recomputed over the finite examples (0·NaN is NaN).

Micro-batching (``micro_batch_size=m``; ``training.micro_batch_size`` in a run, where the
sampler's batch is the logical batch) bounds the memory of the forward/backward, not the
released value: the batch is split with ``batch.select(index)`` (:class:`~graphveil.contract.task.Batch`) into
consecutive chunks of ``m`` examples; each chunk is recorded and differentiated on its own and
its per-example records are kept (per-example gradients of book-keeping layers, inputs and
output gradients of ghost layers — the rest of its autograd graph is freed); the clipper then
sees the WHOLE batch and all norms (FREQ-CLIP's node frequencies are batch statistics), the
weighted sum is accumulated chunk by chunk, and ONE noise draw is added. With σ = 0 the result
equals the whole-batch step up to float rounding.

Data parallel (``group``, :mod:`graphveil.engine.data_parallel`): every rank holds the same
logical batch (one sampling draw, so the accounting is unchanged) and differentiates its
contiguous shard; the norms and losses are gathered, so the clipper and the metrics see the whole
batch (the non-finite count too); each rank accumulates its shard's clipped sum, rank 0 alone adds
the noise, and one all-reduce sums them (Opacus' ``DistributedDPOptimizer``). The result equals
the one-process step up to the order of float additions.

Devices and dtypes: everything follows the model's parameters (norms and factors on their
device, float32 — float64 for a float64 model —, noise drawn on the CPU source then moved to
each gradient's device and dtype by :class:`GaussianNoise`).

Entry points for a session: :func:`build_optimizer`, :class:`GaussianNoise`
(re-exported), :func:`dp_step`, :func:`nonprivate_step` (same signature).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch

from graphveil.contract.clipper import Clipper
from graphveil.contract.errors import PluginError
from graphveil.contract.model import Model
from graphveil.contract.task import Batch
from graphveil.engine.data_parallel import DataParallel
from graphveil.engine.grad_samplers import threads_for
from graphveil.engine.noise import GaussianNoise
from graphveil.engine.per_tuple import PerTupleGrad

__all__ = [
    "GaussianNoise",
    "StepMetrics",
    "add_noise",
    "build_optimizer",
    "dp_step",
    "nonprivate_step",
]


@dataclass(frozen=True)
class StepMetrics:
    """What one step reports. ``nan`` where undefined (empty batch; norms in the baseline)."""

    loss: float
    batch_size: int
    clipped_fraction: float
    mean_grad_norm: float
    #: examples left out because their loss or gradient norm was not finite (site log only)
    nonfinite: int = 0

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: ``nan`` becomes ``None``."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def build_optimizer(params: Iterable[torch.nn.Parameter], training: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adam`` (DP-Adam on the privatised gradient) or ``SGD`` at ``training.lr``.

    With ``training.weight_decay = λ > 0``: ``AdamW(weight_decay=λ)`` (decoupled decay) instead
    of Adam, ``SGD(weight_decay=λ)`` (without momentum the same decoupled ``θ·(1 − ηλ)``). The
    decay reads only the parameters: post-processing of the released gradient.
    """
    params = list(params)
    if not params:
        raise PluginError("the encoder has no trainable parameters to optimise")
    decay = training.weight_decay
    if training.optimizer == "adam":
        if decay > 0:
            return torch.optim.AdamW(params, lr=training.lr, weight_decay=decay)
        return torch.optim.Adam(params, lr=training.lr)
    return torch.optim.SGD(params, lr=training.lr, weight_decay=decay)


#: Per-example losses of a batch: a task's ``losses(model, batch)`` (shape ``(b,)``).
Losses = Callable[[Any, Any], torch.Tensor]


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


def _record(engine: PerTupleGrad, batch: Any):
    """Record with the batch's row → example map if it has one, else equal blocks."""
    groups = getattr(batch, "groups", None)
    if groups is None:
        return engine.record(num_groups=batch.size)
    return engine.record(num_groups=batch.size, groups=groups)


def _check_micro_batch_size(micro_batch_size: int | None) -> None:
    if micro_batch_size is not None and (
        isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1
    ):
        raise ValueError(f"micro_batch_size must be an int >= 1 or None, got {micro_batch_size!r}")


def _micro_batches(batch: Any, b: int, micro_batch_size: int | None) -> list[Any]:
    """The batch itself, or consecutive chunks of ``micro_batch_size`` examples via ``select``."""
    if micro_batch_size is None or micro_batch_size >= b:
        return [batch]
    if not isinstance(batch, Batch):
        raise PluginError(
            f"micro_batch_size={micro_batch_size} needs a batch with select(index); "
            f"{type(batch).__name__} has none"
        )
    parts = []
    for start in range(0, b, micro_batch_size):
        part = batch.select(torch.arange(start, min(start + micro_batch_size, b)))
        if part.size != min(micro_batch_size, b - start):
            raise PluginError(f"{type(batch).__name__}.select returned {part.size} examples, expected "
                              f"{min(micro_batch_size, b - start)}")
        parts.append(part)
    return parts


def _select(batch: Any, start: int, stop: int) -> Any:
    """Examples ``start..stop-1`` of ``batch`` (a data-parallel rank's shard)."""
    if not isinstance(batch, Batch):
        raise PluginError(f"a data-parallel step needs a batch with select(index); {type(batch).__name__} has none")
    return batch.select(torch.arange(start, stop))


def _fingerprint(batch: Any) -> int:
    """A cheap digest of a batch's integer tensors, compared across data-parallel ranks."""
    total = 0
    for value in vars(batch).values() if hasattr(batch, "__dict__") else ():
        if isinstance(value, torch.Tensor) and not value.is_floating_point() and value.numel():
            weights = torch.arange(1, value.numel() + 1, device=value.device) % 1009
            total += int((value.reshape(-1).to(torch.int64) * weights).sum())
    return total


def _per_example(engine: PerTupleGrad, encoder: Model, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                 micro_batch_size: int | None) -> tuple[torch.Tensor, torch.Tensor, list[Any]]:
    """Per-example gradient norms and losses of ``batch`` (chunk by chunk), and each chunk's
    records, kept until the whole batch's factors are known."""
    parts, part_norms, part_losses = [], [], []
    for part in _micro_batches(batch, batch.size, micro_batch_size):
        with _record(engine, part):
            losses = loss_fn(encoder, part)
        part_norms.append(engine.compute(losses.sum()))
        part_losses.append(losses.detach())
        parts.append(engine.pop_records())
    return torch.cat(part_norms), torch.cat(part_losses), parts


def _accumulate(engine: PerTupleGrad, parts: list[Any], factors: torch.Tensor) -> None:
    """``p.grad = Σᵢ factorsᵢ·g(Eᵢ)`` over the chunks' records."""
    start = 0
    for records in parts:
        stop = start + records.num_examples
        engine.accumulate(factors[start:stop], records, add=start > 0)
        start = stop


def _resum_finite(engine: PerTupleGrad, encoder: Model, batch: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                  factors: torch.Tensor, bad: torch.Tensor, micro_batch_size: int | None) -> None:
    """Recompute the clipped sum over the finite examples only.

    A factor of 0 does not remove a NaN from a sum (0·NaN = NaN), so the examples with a
    non-finite loss or norm are left out by running the finite ones again (their gradients do
    not depend on the others) at the factors already chosen. Should a rerun turn up new
    non-finite examples, they are left out too; with none left the sum is 0.
    """
    keep = (~bad).nonzero().reshape(-1)
    while keep.numel():
        sub = batch.select(keep)
        norms, losses, parts = _per_example(engine, encoder, sub, loss_fn, micro_batch_size)
        again = ~(torch.isfinite(norms) & torch.isfinite(losses))
        if not bool(again.any()):
            _accumulate(engine, parts, factors[keep])
            return
        keep = keep[~again]
    for p in engine.parameters:
        p.grad = torch.zeros_like(p)


def dp_step(
    encoder: Model,
    batch: Any,
    *,
    clipper: Clipper,
    noise_multiplier: float,
    expected_batch_size: float,
    optimizer: torch.optim.Optimizer,
    loss: Losses,
    noise: GaussianNoise | None,
    micro_batch_size: int | None = None,
    group: DataParallel | None = None,
) -> StepMetrics:
    """One DP step: per-tuple norms → ``clipper.factors`` → clipped sum + ``N(0, σ²C²)`` → ÷ b̄ → step.

    :param clipper: gives per-tuple factors in ``[0, 1]``; ``C = clipper.clip_norm`` sets the
        noise scale ``σ·C``.
    :param noise_multiplier: σ ≥ 0 (σ = 0 only for tests: no privacy).
    :param expected_batch_size: b̄ > 0, the expected number of tuples per step.
    :param optimizer: built by :func:`build_optimizer` over ``encoder.trainable_parameters()``.
    :param loss: per-example losses ``(b,)`` of a batch: a task's ``losses``.
    :param micro_batch_size: if set (≥ 1) and below the batch size, run the forward/backward
        on chunks of this many examples (the batch must be a :class:`~graphveil.contract.task.Batch`); the
        clipper still sees the whole batch and one noise draw is added (module note).
    :param group: data-parallel ranks (:mod:`graphveil.engine.data_parallel`): every rank passes
        the same logical batch and differentiates its shard; the norms and losses are gathered
        so the clipper sees the whole batch, the clipped sums are all-reduced, and the noise is
        drawn on rank 0 only (``noise`` may be ``None`` on the others).
    :raises PluginError: the clipper returned factors of the wrong shape or outside ``[0, 1]``;
        micro-batching was asked for a batch without ``select``.
    """
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier}")
    if not expected_batch_size > 0:
        raise ValueError(f"expected_batch_size must be > 0, got {expected_batch_size}")
    _check_micro_batch_size(micro_batch_size)
    params = list(encoder.trainable_parameters())
    optimizer.zero_grad(set_to_none=True)
    b = batch.size
    engine = _engine_for(encoder, params)
    start, stop = (0, b) if group is None else group.shard(b)
    if group is not None:
        group.check_same_batch(b, _fingerprint(batch))
    if b > 0:
        mine = batch if (start, stop) == (0, b) else _select(batch, start, stop)
        norms, losses, parts = _per_example(engine, encoder, mine, loss, micro_batch_size) if stop > start \
            else (torch.zeros(0), torch.zeros(0), [])
        if group is not None:  # the clipper sees every example's norm, as in one process
            dtype = norms.dtype
            both = torch.stack([norms.detach(), losses.detach().to(dtype)]).to(torch.float64)
            norms, losses = group.gather_examples(both, start, b).to(dtype)
        # A non-finite loss or gradient norm is that example's own (nothing mixes examples): it
        # contributes 0 — a vector inside every clipping bound — and the step goes on, so no
        # bit of what the data did to the numerics leaves as an error (module note).
        bad = ~(torch.isfinite(norms) & torch.isfinite(losses))
        factors = torch.as_tensor(clipper.factors(batch, torch.where(bad, 0.0, norms.detach())),
                                  dtype=norms.dtype, device=norms.device)
        if factors.shape != (b,) or not bool(((factors >= 0) & (factors <= 1)).all()):
            raise PluginError(
                f"clipper {type(clipper).__name__} must return {b} factors in [0, 1], "
                f"got shape {tuple(factors.shape)}"
            )
        factors = torch.where(bad, 0.0, factors)
        if stop > start:
            _accumulate(engine, parts, factors[start:stop])
            if bool(bad[start:stop].any()):
                _resum_finite(engine, encoder, mine, loss, factors[start:stop], bad[start:stop], micro_batch_size)
        finite = losses[~bad]
        metrics = StepMetrics(
            loss=float(finite.mean()) if finite.numel() else float("nan"),
            batch_size=b,
            clipped_fraction=int((factors < 1).sum()) / b,
            mean_grad_norm=float(norms[~bad].mean()) if finite.numel() else float("nan"),
            nonfinite=int(bad.sum()),
        )
    else:
        metrics = StepMetrics(float("nan"), 0, float("nan"), float("nan"))
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    # Opacus' DistributedDPOptimizer: the noise is drawn once, on rank 0, then summed with the
    # other ranks' clipped sums; noise on every rank would release W times its variance.
    if group is None or group.rank == 0:
        if noise is None:
            raise ValueError("dp_step needs a GaussianNoise (on rank 0 of a data-parallel group)")
        add_noise(grads, noise, noise_multiplier * float(clipper.clip_norm))
    if group is not None:
        group.sum_(grads)
    with torch.no_grad():
        for p in params:
            p.grad.div_(expected_batch_size)
    optimizer.step()
    return metrics


#: Rough operations per noise coordinate (four 53-bit uniforms, two float64 Box–Muller terms), for
#: :func:`~graphveil.engine.grad_samplers.threads_for`.
_NOISE_WORK = 64


def add_noise(grads: list[torch.Tensor], noise: GaussianNoise, std: float) -> None:
    """Add ``N(0, std²)`` to every coordinate of ``grads`` in place, one draw per tensor.

    The draws of all tensors share torch's threads (:meth:`GaussianNoise.add_`), except that
    noise for few coordinates in all (LoRA: tens of thousands) runs on one intra-op thread:
    its small operations gain nothing from a second thread, and on a loaded machine each
    parallel region could wait for a descheduled thread (measured on 2 shared cores: a LoRA
    step's draw took a median 11 ms and up to 0.25 s on 2 threads, 2 ms on one).
    """
    with torch.no_grad(), threads_for(_NOISE_WORK * sum(g.numel() for g in grads)):
        noise.add_(grads, std)


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
    micro_batch_size: int | None = None,
) -> StepMetrics:
    """Baseline with :func:`dp_step`'s signature: mean loss over the realised batch, backward, step.

    ``clipper``, ``noise_multiplier``, ``expected_batch_size`` and ``noise`` are ignored; an
    empty batch does not step (nothing is learned and nothing needs hiding). With
    ``micro_batch_size`` the gradient of the mean is accumulated chunk by chunk (``Σ ℓ / b``).
    """
    _check_micro_batch_size(micro_batch_size)
    optimizer.zero_grad(set_to_none=True)
    b = batch.size
    if b == 0:
        return StepMetrics(float("nan"), 0, float("nan"), float("nan"))
    if micro_batch_size is None or micro_batch_size >= b:
        losses = loss(encoder, batch)
        losses.mean().backward()
    else:
        parts = []
        for part in _micro_batches(batch, b, micro_batch_size):
            part_losses = loss(encoder, part)
            (part_losses.sum() / b).backward()
            parts.append(part_losses.detach())
        losses = torch.cat(parts)
    optimizer.step()
    return StepMetrics(float(losses.detach().mean()), b, 0.0, float("nan"))
