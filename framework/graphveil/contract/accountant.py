"""The accountant family: tracks the privacy loss of the steps and releases a run makes.

An accountant declares the (sampling, sensitivity) pairs it can analyse (``supports``) and, where
it matters, the model structures (``structures``); the invariant refuses any other run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel

from graphveil.contract.options import NoParams
from graphveil.contract.profiles import (
    ExampleStructure,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.contract.units import ClaimsUnit


class Accountant(ClaimsUnit, ABC):
    """Tracks privacy loss of repeated noisy steps over a sampled batch.

    ``supports`` lists the (sampling, sensitivity) pairs this accountant can analyse; a run
    with any other pair is refused before data is read. Mirrors opacus' accountant interface:
    keyword-only :meth:`step`, :meth:`get_epsilon`, and a state dict that refuses state from a
    different mechanism.
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    mechanism: ClassVar[str]
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]]
    #: model structures whose per-example gradients this analysis covers (None: any); e.g. a
    #: per-node analysis holds only if a node's example reads its own row alone
    structures: ClassVar[frozenset[ExampleStructure] | None] = None

    @abstractmethod
    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Attach the numeric profiles of this run (raises on a mismatched kind)."""

    def check_pair(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Refuse a (sampling, sensitivity) pair outside :attr:`supports` or of another unit.

        :raises ProfileMismatchError: naming the pair and what this accountant analyses.
        """
        from graphveil.contract.invariant import check_profiles

        check_profiles(self, sampling, sensitivity)

    def compose_event(self, event: Any, name: str) -> None:
        """Compose a one-shot release (a ``dp_accounting`` event); default: cannot.

        :raises PrivacyError: this accountant analyses DP-SGD steps only.
        """
        from graphveil.contract.errors import PrivacyError

        raise PrivacyError(f"accountant {self.mechanism!r} cannot compose one-shot releases "
                           f"(mechanism {name!r}); use an RDP accountant")

    @abstractmethod
    def step(self, *, noise_multiplier: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` steps at noise multiplier σ."""

    @abstractmethod
    def get_epsilon(self, delta: float) -> float:
        """ε spent so far at the given δ."""

    @abstractmethod
    def report(self, delta: float) -> dict[str, Any]:
        """ε, δ and the evidence (e.g. optimal α and the RDP curve) as JSON-able values."""

    @abstractmethod
    def calibrate(self, *, target_epsilon: float, delta: float, num_steps: int,
                  releases: Any = None) -> float:
        """Smallest σ (conservative end of a bisection) reaching ``target_epsilon`` in ``num_steps``.

        ``releases``: ``None``, or ``σ → [(name, dp_accounting event)]``, the plan's one-shot
        releases that count against the same target (the session passes it only when the plan
        has releases; an accountant that cannot compose them raises :class:`PrivacyError`).
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
