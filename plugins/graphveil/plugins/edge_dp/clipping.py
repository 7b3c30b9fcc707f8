"""Per-tuple clipping for edge-level DP with decoupled negatives (paper 2, Sec. 3.2, Eq. 3)."""

from __future__ import annotations

from typing import ClassVar

from graphveil.contract.clipper import ThresholdClipper
from graphveil.contract.profiles import PrivacyUnit, SensitivityKind
from graphveil.contract.sampler import TupleBatch


class PerTupleEdgeClipper(ThresholdClipper):
    """Clip every tuple's gradient to C: with decoupled negatives one relation moves the sum by ≤ C (paper 2, Eq. 3)."""

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.PER_TUPLE_EDGE
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.EDGE

    def thresholds(self, batch: TupleBatch) -> float:
        return self.clip_norm
