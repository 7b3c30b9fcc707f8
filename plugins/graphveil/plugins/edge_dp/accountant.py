"""Edge-level RDP accountant: the Poisson-subsampled Gaussian, analysed by dp-accounting."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.privacy import RdpAccountantBase, RdpParams

_log = logging.getLogger(__name__)


class EdgeRdpAccountant(RdpAccountantBase):
    """Edge-level RDP of Poisson(γ) positives with per-tuple clipping (dp-accounting's analysis).

    With negatives drawn independently of the data (paper 2, Sec. 3) adding or removing one edge
    changes one tuple, so each step is the Poisson-subsampled Gaussian mechanism with
    sensitivity C; its RDP comes from ``dp_accounting.rdp.RdpAccountant`` (Mironov et al. 2019).
    """

    Params = RdpParams
    mechanism: ClassVar[str] = "edge_rdp"
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.EDGE
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.POISSON_DECOUPLED, SensitivityKind.PER_TUPLE_EDGE),
        (SamplingKind.POISSON, SensitivityKind.PER_TUPLE_EDGE),
    })

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._rate: float | None = None

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Check the pair and the rate γ ∈ (0, 1].

        :raises ProfileMismatchError: for a pair outside :attr:`supports` or a non-edge unit.
        :raises PrivacyError: for a rate outside (0, 1] or a bad clip norm.
        """
        self.check_pair(sampling, sensitivity)
        try:
            rate = float(sampling.rate)
        except (TypeError, ValueError):
            rate = math.nan
        if not 0 < rate <= 1:
            raise PrivacyError(f"sampling rate gamma must be in (0, 1], got {sampling.rate!r}")
        if not (sensitivity.clip_norm > 0 and math.isfinite(sensitivity.clip_norm)):
            raise PrivacyError(f"clip norm C must be a finite number > 0, got {sensitivity.clip_norm!r}")
        self._rate = rate
        self._set_profile({"sampling": sampling.kind.value, "sensitivity": sensitivity.kind.value, "gamma": rate})

    def per_step_rdp(self, noise_multiplier: float, orders: Sequence[float] | None = None) -> np.ndarray:
        import dp_accounting  # here, not at import: it costs seconds of CLI start-up

        if self._rate is None:
            raise PrivacyError(f"accountant {self.mechanism!r} is not bound to a sampling profile yet")
        accountant = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in self._step_orders(orders)])
        event = dp_accounting.PoissonSampledDpEvent(self._rate, dp_accounting.GaussianDpEvent(noise_multiplier))
        # dp-accounting logs one warning per fractional order whose series does not converge
        # and sets it to inf (excluded from ε: conservative). Say it once, not per order and σ.
        absl = logging.getLogger("absl")
        level = absl.level
        absl.setLevel(logging.ERROR)
        try:
            accountant.compose(event, 1)
        finally:
            absl.setLevel(level)
        rdp = np.asarray(accountant.rdp, dtype=float)
        skipped = int(np.isinf(rdp).sum())
        if skipped:
            _log.debug("dp-accounting could not evaluate %d of %d orders at q=%.3g, sigma=%.4g; "
                       "they are excluded (conservative)", skipped, rdp.size, self._rate, noise_multiplier)
        return rdp
