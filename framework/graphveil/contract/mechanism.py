"""The mechanism family: one-shot releases with a declared sensitivity and an accounting event.

A mechanism releases a value computed from the private data once (noisy aggregation of
neighbour embeddings, a noisy embedding table, randomized response on adjacency entries,
perturbed outputs). It declares, before data is read, the privacy unit its sensitivity is
stated for; :meth:`Mechanism.release` returns the artifact and :meth:`Mechanism.event` the
``dp_accounting`` event the run's accountant composes with the DP-SGD steps.

Noise scale: a mechanism either fixes its own noise (its params) or is :meth:`calibrated`
— it leaves the noise unset and takes the run's shared noise multiplier σ (std σ · sensitivity),
which the session calibrates so that the whole plan (releases and steps) meets the target ε.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from graphveil.contract.errors import ConfigError
from graphveil.contract.options import NoParams
from graphveil.contract.units import PrivacyUnit

if TYPE_CHECKING:  # dp_accounting is imported where events are built: it costs seconds at start-up
    import dp_accounting
    import torch


class Mechanism(ABC):
    """A one-shot release: ``release`` once, then ``event`` describes it to the accountant.

    Subclasses set ``unit`` (the privacy unit the sensitivity is stated for) and implement
    :meth:`sensitivity` (ℓ2 for Gaussian, ℓ1 for Laplace; ``inf`` if unbounded), :meth:`release`
    and :meth:`event`.
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    unit: ClassVar[PrivacyUnit]

    #: the run's shared σ, set by the session before :meth:`release` for a calibrated mechanism
    noise_multiplier: float | None = None

    def calibrated(self) -> bool:
        """True if this release takes the run's shared σ (default: it fixes its own noise)."""
        return False

    def event_at(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """The event of this release if the run's shared σ were ``noise_multiplier``: :meth:`event`
        for a mechanism with its own noise; for a calibrated one (default) the Gaussian,
        ``GaussianDpEvent(σ)`` — noise std σ · sensitivity."""
        if not self.calibrated():
            return self.event()
        import dp_accounting

        return dp_accounting.GaussianDpEvent(noise_multiplier)

    def bind(self, task: Any) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called once the data is loaded and split, before σ is calibrated: a release whose
        event depends on data sizes that are public under its unit (the number of training nodes
        under replacement adjacency, for a DP-SGD stage) reads them here."""

    def shared_state(self) -> dict[str, torch.Tensor]:
        """Weights this release trained that may leave with the run's model (a federated site
        sends them to the server): only weights its :meth:`event` covers as they are — the output
        of a DP-SGD stage, not an artifact computed from the data after it (GAP's encoder weights,
        not its aggregates). Empty before :meth:`release` and for a release that trains nothing
        (default)."""
        return {}

    def start_from(self, state: Mapping[str, torch.Tensor]) -> None:
        """Start the next :meth:`release` from ``state`` (the keys and shapes :meth:`shared_state`
        gives; a federated round: the server's average) instead of the release's own
        initialisation. The event does not change: DP-SGD's guarantee holds from any start that is
        public or itself the output of accounted releases (adaptive composition). Default: a release that shares no
        weights accepts none."""
        if state:
            raise ConfigError(f"{type(self).__name__} trains no weights to start from; got keys "
                              f"{sorted(state)[:3]}")

    @abstractmethod
    def sensitivity(self) -> float:
        """How far the released statistic can move when one privacy unit changes."""

    @abstractmethod
    def release(self, task: Any, noise: Any) -> Any:
        """Compute and release the artifact from the task's data (``task.dataset``, its split).

        ``noise`` is the run's :class:`~graphveil.engine.noise.GaussianNoise` (OS CSPRNG):
        ``noise.add_([tensor], std)`` adds N(0, std²) in place. The artifact is what the task
        may read afterwards (``task.released[name]``); nothing else of the data leaves.
        """

    @abstractmethod
    def event(self) -> dp_accounting.DpEvent:
        """The accounting event of one release (e.g. ``GaussianDpEvent(σ / sensitivity)``)."""
