"""The coupled-sampling RDP accountant for entity-level DP (paper 1, Thm 3 / Thm C.1)."""

from __future__ import annotations

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
from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
from graphveil.privacy import RdpAccountantBase, RdpParams

_THEOREMS = {
    SensitivityKind.FREQ_CLIP_NODE: ("Thm 3, Eq. (3)", thm3_rdp),
    SensitivityKind.STANDARD_TUPLE_NODE: ("Thm C.1, Eq. (47)", thmc1_rdp),
}


def _count(name: str, value: object, minimum: int) -> int:
    """``value`` as an int ≥ ``minimum`` (integral floats accepted), else :class:`PrivacyError`."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or int(value) != value or value < minimum:  # type: ignore[arg-type]
        raise PrivacyError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)  # type: ignore[arg-type]


class CoupledRdpAccountant(RdpAccountantBase):
    """Node-level RDP of Poisson positives + NEG-SAMPLE-WOR negatives (Thm 3 / Thm C.1).

    FREQ-CLIP (sensitivity C per node, Prop. 4.1) is analysed by Theorem 3, Eq. (3); standard
    per-tuple clipping (sensitivity (|B⁺(u)| + 2|B⁻(u)|)·C, Eq. 2) by Theorem C.1, Eq. (47).
    The numbers (γ, m, n, K, k_neg) come from the sampler's profile after degree capping.
    """

    Params = RdpParams
    mechanism: ClassVar[str] = "coupled_rdp"
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.NODE
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.COUPLED_POISSON_WOR, SensitivityKind.FREQ_CLIP_NODE),
        (SamplingKind.COUPLED_POISSON_WOR, SensitivityKind.STANDARD_TUPLE_NODE),
    })

    #: nodes of the binomial window in :meth:`rough_per_step_rdp`
    ROUGH_NODES: ClassVar[int] = 32

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._numbers: dict[str, Any] | None = None
        self._analysis: SensitivityKind | None = None

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Check the pair and the numbers; choose Thm 3 (FREQ-CLIP) or Thm C.1 (standard clipping).

        :raises ProfileMismatchError: for a pair outside :attr:`supports` or a non-node unit.
        :raises PrivacyError: for numbers the theorems do not cover (K < 1, γ ∉ (0, 1], …).
        """
        self.check_pair(sampling, sensitivity)
        gamma, m, n, K, k_neg = (sampling.rate, sampling.num_records, sampling.num_nodes,
                                 sampling.degree_cap, sampling.k_neg)
        if K is None:
            raise PrivacyError("coupled accounting needs a degree cap K >= 1, got none (degree_cap=None)")
        K = _count("degree cap K", K, 1)
        k_neg = _count("k_neg", k_neg, 0)
        m = _count("number of records m", m, 1)
        n = _count("number of nodes n", n, 1)
        if not (isinstance(gamma, (int, float, np.floating)) and 0 < gamma <= 1):
            raise PrivacyError(f"sampling rate gamma must be in (0, 1], got {gamma!r}")
        if k_neg * gamma * m > n:
            raise PrivacyError(
                f"k_neg*gamma*m = {k_neg}*{gamma:g}*{m} = {k_neg * gamma * m:g} exceeds n = {n}: "
                "the expected number of negatives drawn without replacement exceeds the node set"
            )
        if not (sensitivity.clip_norm > 0 and math.isfinite(sensitivity.clip_norm)):
            raise PrivacyError(f"clip norm C must be a finite number > 0, got {sensitivity.clip_norm!r}")
        theorem, _ = _THEOREMS[sensitivity.kind]
        self._numbers = {"gamma": float(gamma), "m": int(m), "n": int(n), "K": int(K), "k_neg": int(k_neg)}
        self._analysis = sensitivity.kind
        self._set_profile({
            "sampling": sampling.kind.value, "sensitivity": sensitivity.kind.value,
            "theorem": theorem, **self._numbers,
        })

    def per_step_rdp(self, noise_multiplier: float, orders: Sequence[float] | None = None) -> np.ndarray:
        if self._numbers is None or self._analysis is None:
            raise PrivacyError(f"accountant {self.mechanism!r} is not bound to a sampling profile yet")
        _, analysis = _THEOREMS[self._analysis]
        return analysis(self._step_orders(orders), sigma=noise_multiplier, **self._numbers)

    def rough_per_step_rdp(self, noise_multiplier: float, orders: Sequence[float]) -> np.ndarray:
        """The bound with at most :data:`ROUGH_NODES` nodes of the binomial window (the chord
        bound between them; ~5x cheaper at the paper's and the demo's settings, within 0.5 % of
        the curve): what :meth:`calibrate` aims with before the exact curve decides."""
        if self._numbers is None or self._analysis is None:
            raise PrivacyError(f"accountant {self.mechanism!r} is not bound to a sampling profile yet")
        _, analysis = _THEOREMS[self._analysis]
        return analysis(self._step_orders(orders), sigma=noise_multiplier, max_nodes=self.ROUGH_NODES,
                        **self._numbers)


class CoupledRdpFreqAccountant(CoupledRdpAccountant):
    """Node-level RDP of FREQ-CLIP with NEG-SAMPLE-WOR negatives only (Thm 3, Eq. 3)."""

    mechanism: ClassVar[str] = "coupled_rdp_freq"
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.COUPLED_POISSON_WOR, SensitivityKind.FREQ_CLIP_NODE),
    })


class CoupledRdpStandardAccountant(CoupledRdpAccountant):
    """Node-level RDP of standard per-tuple clipping with NEG-SAMPLE-WOR negatives only (Thm C.1, Eq. 47)."""

    mechanism: ClassVar[str] = "coupled_rdp_standard"
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.COUPLED_POISSON_WOR, SensitivityKind.STANDARD_TUPLE_NODE),
    })
