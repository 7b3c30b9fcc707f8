"""The non-private baseline's clipper: no clipping at all."""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from graphveil.contract.clipper import Clipper
from graphveil.contract.profiles import PrivacyUnit, SensitivityKind
from graphveil.contract.sampler import TupleBatch


class NoClip(Clipper):
    """No clipping (every factor 1): bounds no sensitivity, so only a non-private run may use it."""

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.NONE
    #: No privacy unit: the run makes no DP claim (the session ignores ``None`` when comparing units).
    unit: ClassVar[PrivacyUnit | None] = None  # type: ignore[assignment]

    def __init__(self, params: object | None = None) -> None:
        self.params = params
        self.clip_norm = math.inf

    def factors(self, batch: TupleBatch, norms: torch.Tensor) -> torch.Tensor:
        if norms.shape != (batch.size,):
            raise ValueError(f"expected {batch.size} per-tuple norms, got shape {tuple(norms.shape)}")
        return torch.ones_like(norms)
