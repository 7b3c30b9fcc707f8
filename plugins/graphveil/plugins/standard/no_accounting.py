"""The non-private baseline's accountant: counts steps and claims nothing (ε = ∞)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from graphveil.contract.accountant import Accountant
from graphveil.contract.errors import PrivacyError, ProfileMismatchError
from graphveil.contract.options import NoParams
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.privacy import check_steps, validate_delta


class NoAccountant(Accountant):
    """No accounting for non-private runs: any sampler with no clipping, ε = ∞."""

    Params = NoParams
    mechanism: ClassVar[str] = "no_accounting"
    unit: ClassVar[PrivacyUnit | None] = None  # type: ignore[assignment]  # no privacy unit is claimed
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset(
        (kind, SensitivityKind.NONE) for kind in SamplingKind
    )

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else NoParams()
        self._steps = 0

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        if (sampling.kind, sensitivity.kind) not in self.supports:
            raise ProfileMismatchError(
                f"accountant {self.mechanism!r} only pairs with an unclipped sampler (sensitivity "
                f"{SensitivityKind.NONE.value}), got sensitivity {sensitivity.kind.value}"
            )

    def step(self, *, noise_multiplier: float, num_steps: int = 1) -> None:
        if not (isinstance(noise_multiplier, (int, float)) and noise_multiplier >= 0):
            raise PrivacyError(f"noise multiplier must be a number >= 0, got {noise_multiplier!r}")
        self._steps += check_steps(num_steps)

    def get_epsilon(self, delta: float) -> float:
        validate_delta(delta)
        return math.inf

    def report(self, delta: float) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "unit": None, "epsilon": math.inf,
                "delta": validate_delta(delta), "alpha": None, "rdp": [], "steps": self._steps,
                "noise_multiplier": None}

    def calibrate(self, *, target_epsilon: float, delta: float, num_steps: int, releases: Any = None) -> float:
        raise PrivacyError(
            f"accountant {self.mechanism!r} makes no privacy claim, so no noise level meets "
            f"target ε={target_epsilon!r}; pick a DP accountant or set privacy.enabled: false"
        )

    def state_dict(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "steps": self._steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("mechanism") != self.mechanism:
            raise PrivacyError(
                f"cannot load state of mechanism {state.get('mechanism')!r} into accountant {self.mechanism!r}"
            )
        self._steps = check_steps(state.get("steps", 0))

    def __len__(self) -> int:
        return self._steps
