"""Pieces shared by ``bench/dp_step_speed.py`` and ``bench/full_finetune_speed.py``.

* :class:`NoNoise` / :class:`RandnNoise` — measuring devices that replace the secure noise draw
  (NOT private): nothing, or ``torch.randn`` (the cost of a fast non-cryptographic draw), so the
  engine's own cost can be read apart from the CSPRNG's.
* :func:`timed` and the per-phase breakdowns of one step done with the public API — the
  non-private step (forward, backward, Adam) and the DP step (forward recording, backward +
  per-tuple norms, clipping factors, clipped weighted sums, noise, Adam) — and
  :func:`phase_table`, their markdown table.

Imported by the benches as a sibling module (``bench/`` is the script's directory).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from graphveil.engine.dp_step import GaussianNoise, add_noise

Series = dict[str, list[float]]
PHASES = ("forward", "backward", "backward+norms", "factors", "clipped sums", "noise", "adam")


class NoNoise(GaussianNoise):
    """Adds nothing (NOT private): isolates the engine's cost from the noise draw."""

    def add_(self, tensors, std) -> None:
        pass


class RandnNoise(GaussianNoise):
    """Adds ``std · torch.randn`` (NOT private: torch's generator is not cryptographic); the
    cost of the noise at ``torch.randn`` speed, for the goals measured apart from the CSPRNG."""

    def add_(self, tensors, std) -> None:
        with torch.no_grad():
            for t in tensors:
                t.add_(torch.randn_like(t), alpha=std)


def _synchronize() -> None:
    """Wait for queued CUDA work, if any was started (a phase on the GPU ends when its kernels do)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(series: Series | None, name: str, fn: Callable[[], Any]) -> Any:
    """``fn()``; its wall time appended to ``series[name]`` (nothing kept if ``series`` is None)."""
    t0 = time.perf_counter()
    result = fn()
    _synchronize()
    if series is not None:
        series.setdefault(name, []).append(time.perf_counter() - t0)
    return result


def nonprivate_phases(series: Series, encoder, batch, loss, optimizer) -> None:
    """One non-private step (mean loss, backward, Adam), phase by phase."""
    from graphveil.plugins.relational.losses import batch_losses

    optimizer.zero_grad(set_to_none=True)
    losses = timed(series, "forward", lambda: batch_losses(encoder, batch, loss))
    timed(series, "backward", lambda: losses.mean().backward())
    timed(series, "adam", optimizer.step)


def dp_phases(series: Series, encoder, engine, batch, loss, clipper, noise, std: float, optimizer) -> None:
    """One DP step with the engine's public API (as :func:`graphveil.engine.dp_step.dp_step`
    does it, without micro-batches), phase by phase; divides by the realised batch size."""
    from graphveil.plugins.relational.losses import batch_losses

    params = engine.parameters
    optimizer.zero_grad(set_to_none=True)

    def forward():
        with engine.record(num_groups=batch.size):
            return batch_losses(encoder, batch, loss)

    losses = timed(series, "forward", forward)
    norms = timed(series, "backward+norms", lambda: engine.compute(losses.sum()))
    factors = timed(series, "factors", lambda: clipper.factors(batch, norms))
    timed(series, "clipped sums", lambda: engine.accumulate(factors))
    timed(series, "noise", lambda: add_noise([p.grad for p in params], noise, std))
    for p in params:
        p.grad.div_(batch.size)
    timed(series, "adam", optimizer.step)


def medians(out: dict[str, Series]) -> dict[str, dict[str, float]]:
    return {k: {name: statistics.median(v) for name, v in series.items()} for k, series in out.items()}


def phase_table(phases: dict[str, dict[str, float]]) -> str:
    """Markdown: one row per step kind, one column per phase that some row has, and the total."""
    names = [n for n in PHASES if any(n in ph for ph in phases.values())]
    names += sorted({n for ph in phases.values() for n in ph} - set(names))
    lines = ["| step | " + " | ".join(names) + " | total |", "|---|" + "---:|" * (len(names) + 1)]
    for kind, ph in phases.items():
        cells = [f"{ph[n]:.3f}" if n in ph else "" for n in names]
        lines.append(f"| {kind} | " + " | ".join(cells) + f" | {sum(ph.values()):.3f} |")
    return "\n".join(lines)
