"""Per-split clipping: each split's gradient scaled to norm at most C (really, on the sum released)."""

from __future__ import annotations

from typing import Any, ClassVar

from graphveil.contract.clipper import ThresholdClipper
from graphveil.contract.profiles import PrivacyUnit, SensitivityKind
from graphveil.plugins.dp_gcn.units import SPLIT_REPLACE, SplitUnits


class PerSplitClipper(SplitUnits, ThresholdClipper):
    """Clip each split's gradient to C; replacing one split moves the clipped sum by at most 2C.

    The engine computes every split's gradient g(Sᵢ) from one backward pass and releases
    Σᵢ min(1, C/‖g(Sᵢ)‖)·g(Sᵢ) + N(0, σ²C²): the factors scale what is summed, so the bound
    holds for the released value (paper 3's public code clips cloned gradients with
    ``clip_grad_norm_``, which reads ``.grad`` of its arguments and so leaves the clones as
    they were). Exact only when split i's loss reads split i's rows alone, which the
    ``components`` structure and :class:`~graphveil.subgraph_batch.SubgraphBatch` guarantee.
    """

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.PER_EXAMPLE
    unit: ClassVar[PrivacyUnit] = SPLIT_REPLACE

    def thresholds(self, batch: Any) -> float:
        return self.clip_norm
