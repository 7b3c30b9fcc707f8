"""Per-node clipping for a feature-only model: one node's data reaches one example."""

from __future__ import annotations

from typing import Any, ClassVar

from graphveil.contract.clipper import ThresholdClipper
from graphveil.contract.profiles import PrivacyUnit, SensitivityKind
from graphveil.plugins.node_dp.units import NODE_GDP, RowWiseGdpUnits


class PerNodeClipper(RowWiseGdpUnits, ThresholdClipper):
    """Clip each node's gradient to C; replacing one node moves the clipped sum by at most 2C.

    Exact only for models whose example i reads node i's features and label alone (an MLP):
    a model that reads neighbours would let one node reach many examples.
    """

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.PER_EXAMPLE
    unit: ClassVar[PrivacyUnit] = NODE_GDP

    def thresholds(self, batch: Any) -> float:
        return self.clip_norm
