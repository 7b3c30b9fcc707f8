"""One-shot releases under paper 4's node-level GDP unit: the noisy feature matrix.

The feature half of paper 4's DP-Emb idea (Sec. 5.2, Eq. (2)): rather than training on the raw
features, release a noisy copy once, account for it, and let everything after it read only the
copy (post-processing).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import ConfigError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.units import PrivacyUnit
from graphveil.plugins.node_dp.units import NODE_GDP


class NoisyFeaturesParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    noise_std: float | None = Field(None, gt=0, allow_inf_nan=False, description=(
        "s: std of the Gaussian noise added to every entry of the row-clipped features "
        "(noise multiplier s/2 relative to the replace-one sensitivity 2). Unset: calibrated "
        "with the run, s = 2σ for the run's shared noise multiplier σ."))


class NoisyFeatures(Mechanism):
    """Every node's features clipped to ℓ2 norm ≤ 1, plus N(0, s²) per entry, released once.

    The release is ``X̃ = clip(X) + N`` with ``clip(x)ᵢ = xᵢ / max(1, ‖xᵢ‖₂)`` row by row and
    ``N`` an ``(n, F)`` matrix of i.i.d. ``N(0, s²)`` entries (paper 4, Eq. (2), with the
    features in place of the row-normalised ``A·W⁽ᴬ⁾``; the same noise law as its PMA, Eq. (1)).

    Sensitivity 2 under node replacement (:data:`~graphveil.plugins.node_dp.units.NODE_GDP`):
    neighbouring datasets replace one node r (features, label, edges). ``X̃`` depends on the
    features alone and row by row, so every row i ≠ r is identical and only row r moves, by
    ``‖clip(x_r) − clip(x'_r)‖₂ ≤ ‖clip(x_r)‖₂ + ‖clip(x'_r)‖₂ ≤ 1 + 1 = 2`` (triangle
    inequality; tight for ``x'_r = −x_r`` of norm ≥ 1, the case (3) bound in the proof of
    paper 4, Thm 5.1). The node count n is public under replacement, so the matrix shape
    reveals nothing. Unlike the paper's ``Z∖r`` argument (Thm 5.3), row r is released and
    counted: it feeds training, where r may be a training node.

    Accounting: the Gaussian mechanism with noise multiplier ``s / 2``
    (``GaussianDpEvent(s / 2)``), RDP ``α·2²/(2s²) = 2α/s²`` at every order α.
    """

    Params = NoisyFeaturesParams
    unit: ClassVar[PrivacyUnit] = NODE_GDP
    #: ℓ2 norm every feature row is clipped to before the noise
    ROW_NORM: ClassVar[float] = 1.0

    def __init__(self, params: NoisyFeaturesParams | None = None) -> None:
        self.params = params if params is not None else NoisyFeaturesParams()

    def calibrated(self) -> bool:
        """Without ``noise_std`` the release takes the run's σ: s = σ · sensitivity."""
        return self.params.noise_std is None

    def noise_std(self) -> float:
        """s: the fixed ``noise_std``, or σ · 2 once the session has set the shared σ."""
        if self.params.noise_std is not None:
            return self.params.noise_std
        if self.noise_multiplier is None:
            raise ConfigError("mechanism 'noisy_features' has no noise_std and was not calibrated with a run")
        return self.noise_multiplier * self.sensitivity()

    def sensitivity(self) -> float:
        """ℓ2 sensitivity of ``clip(X)`` under node replacement: 2 (one row, two unit balls)."""
        return 2.0 * self.ROW_NORM

    def release(self, task: Any, noise: Any) -> torch.Tensor:
        """``(n, F)`` float32: the clipped features of every node of ``task.dataset`` plus noise.

        Every node (training, validation and test) gets its row, so evaluation can read the
        release too. The dataset is not modified.
        """
        x = getattr(task.dataset, "x", None)
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ConfigError(f"mechanism 'noisy_features' needs an (n, F) node feature matrix; the task's "
                              f"data is {type(task.dataset).__name__}")
        released = clip_rows(x.detach().to(torch.float32), self.ROW_NORM)  # a fresh tensor, never x itself
        noise.add_([released], self.noise_std())
        return released

    def event(self) -> Any:
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.noise_std() / self.sensitivity())


def clip_rows(x: torch.Tensor, max_norm: float) -> torch.Tensor:
    """A copy of ``x`` with every row scaled to ℓ2 norm ≤ ``max_norm`` (rows within it unchanged).

    >>> clip_rows(torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]]), 1.0)
    tensor([[0.6000, 0.8000],
            [0.3000, 0.4000],
            [0.0000, 0.0000]])
    """
    norms = x.norm(dim=1, keepdim=True)
    return x * (max_norm / norms.clamp_min(max_norm))
