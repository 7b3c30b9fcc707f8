"""The coupled-sampling RDP accountant for entity-level DP (paper 1, Thm 3 / Thm C.1)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from graphveil.errors import PrivacyError, ProfileMismatchError
from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
from graphveil.privacy import RdpAccountantBase
from graphveil.profiles import PrivacyUnit, SamplingKind, SamplingProfile, SensitivityKind, SensitivityProfile

_THEOREMS = {
    SensitivityKind.FREQ_CLIP_NODE: ("Thm 3, Eq. (3)", thm3_rdp),
    SensitivityKind.STANDARD_TUPLE_NODE: ("Thm C.1, Eq. (47)", thmc1_rdp),
}


class CoupledRdpAccountant(RdpAccountantBase):
    """Node-level RDP of Poisson positives + NEG-SAMPLE-WOR negatives (Thm 3 / Thm C.1).

    FREQ-CLIP (sensitivity C per node, Prop. 4.1) is analysed by Theorem 3, Eq. (3); standard
    per-tuple clipping (sensitivity (|B⁺(u)| + 2|B⁻(u)|)·C, Eq. 2) by Theorem C.1, Eq. (47).
    The numbers (γ, m, n, K, k_neg) come from the sampler's profile after degree capping.
    """

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        orders: list[float] | None = Field(
            None, description="RDP orders α > 1 (default: graphveil.privacy.DEFAULT_ORDERS)."
        )

    mechanism: ClassVar[str] = "coupled_rdp"
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.NODE
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.COUPLED_POISSON_WOR, SensitivityKind.FREQ_CLIP_NODE),
        (SamplingKind.COUPLED_POISSON_WOR, SensitivityKind.STANDARD_TUPLE_NODE),
    })

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._numbers: dict[str, Any] | None = None

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Check the pair and the numbers; choose Thm 3 (FREQ-CLIP) or Thm C.1 (standard clipping).

        :raises ProfileMismatchError: for a pair outside :attr:`supports` or a non-node unit.
        :raises PrivacyError: for numbers the theorems do not cover (K < 1, γ ∉ (0, 1], …).
        """
        pair = (sampling.kind, sensitivity.kind)
        if pair not in self.supports or sensitivity.unit is not PrivacyUnit.NODE:
            options = ", ".join(sorted(f"({a.value}, {b.value})" for a, b in self.supports))
            raise ProfileMismatchError(
                f"accountant {self.mechanism!r} cannot analyse sampling {sampling.kind.value} with "
                f"sensitivity {sensitivity.kind.value} ({sensitivity.unit.value}-level); it analyses: {options}"
            )
        gamma, m, n, K, k_neg = (sampling.rate, sampling.num_records, sampling.num_nodes,
                                 sampling.degree_cap, sampling.k_neg)
        if K is None or isinstance(K, bool) or int(K) != K or K < 1:
            raise PrivacyError(f"coupled accounting needs a degree cap K >= 1, got K={K!r}")
        if isinstance(k_neg, bool) or int(k_neg) != k_neg or k_neg < 0:
            raise PrivacyError(f"k_neg must be an integer >= 0, got {k_neg!r}")
        if not (isinstance(gamma, (int, float)) and 0 < gamma <= 1):
            raise PrivacyError(f"sampling rate gamma must be in (0, 1], got {gamma!r}")
        if int(m) != m or m < 1:
            raise PrivacyError(f"number of records m must be an integer >= 1, got {m!r}")
        if int(n) != n or n < 1:
            raise PrivacyError(f"number of nodes n must be an integer >= 1, got {n!r}")
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

    def per_step_rdp(self, noise_multiplier: float) -> np.ndarray:
        if self._numbers is None:
            raise PrivacyError(f"accountant {self.mechanism!r} is not bound to a sampling profile yet")
        _, analysis = _THEOREMS[self._analysis]
        return analysis(self.orders, sigma=noise_multiplier, **self._numbers)
