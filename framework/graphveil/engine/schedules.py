"""Learning-rate schedules over a session's planned steps: warm-up, then constant, linear or cosine.

Step ``t`` (0-based, one per optimizer step) of ``T`` planned steps with ``W = ⌈warmup·T⌉``
warm-up steps trains at ``lr · factor(t)``::

    t < W          (t + 1) / W                      linear warm-up from 0 (no step at rate 0)
    t ≥ W          constant: 1
                   linear:   1 − p                  p = (t − W) / (T − W) ∈ [0, 1)
                   cosine:   (1 + cos πp) / 2

The decay reaches 0 at ``t = T``, the end of the plan (the last planned step trains at
``lr/(T − W)`` for linear), as ``transformers.get_linear_schedule_with_warmup`` /
``get_cosine_schedule_with_warmup`` decay; steps beyond the plan stay at the final value
(0 for linear and cosine). The schedule is post-processing: it reads only the step index.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

__all__ = ["LrSchedule", "ScheduleKind", "lr_factor", "warmup_steps"]

ScheduleKind = Literal["constant", "linear", "cosine"]


def warmup_steps(warmup: float, total: int) -> int:
    """``W = ⌈warmup · T⌉`` (≤ T since warmup < 1); the product is rounded to 1e-9 first so that
    e.g. 0.1 · 30 gives 3 warm-up steps, not 4."""
    if not 0 <= warmup < 1:
        raise ValueError(f"warmup must be in [0, 1), got {warmup!r}")
    return math.ceil(round(warmup * total, 9)) if total > 0 else 0


def lr_factor(kind: ScheduleKind, step: int, total: int, warmup: float = 0.0) -> float:
    """The multiplier of the base learning rate at 0-based ``step`` of ``total`` planned steps."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if kind not in ("constant", "linear", "cosine"):
        raise ValueError(f"unknown schedule {kind!r} (constant, linear, cosine)")
    w = warmup_steps(warmup, total)
    if step < w:
        return (step + 1) / w
    if kind == "constant":
        return 1.0
    if total <= w:  # every planned step was warm-up: a step beyond the plan is past the decay
        return 0.0
    p = min(1.0, (step - w) / (total - w))
    return 1.0 - p if kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * p))


class LrSchedule:
    """Sets every parameter group's rate to ``base · lr_factor(step)`` before an optimizer step.

    :param optimizer: whose groups' current rates are the base rates.
    :param kind: ``constant``, ``linear`` or ``cosine``.
    :param total: the planned optimizer steps ``T`` (the schedule spans them).
    :param warmup: fraction of ``T`` with linear warm-up, in ``[0, 1)``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, kind: ScheduleKind, total: int,
                 warmup: float = 0.0) -> None:
        if total < 0:
            raise ValueError(f"total must be >= 0, got {total}")
        lr_factor(kind, 0, total, warmup)  # validates kind and warmup
        self.optimizer, self.kind, self.total, self.warmup = optimizer, kind, total, warmup
        self.base_lrs = [float(g["lr"]) for g in optimizer.param_groups]

    def set_step(self, step: int) -> float:
        """Set the rates for 0-based ``step``; returns the first group's rate."""
        factor = lr_factor(self.kind, step, self.total, self.warmup)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor
        return self.base_lrs[0] * factor
