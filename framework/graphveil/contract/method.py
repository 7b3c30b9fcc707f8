"""The method family: a plugin that returns a staged plan, run by the session against one accountant.

A method says what a run does, in order: one-shot releases (:class:`Release`), the DP-SGD
training of the run's model (:class:`Train`), and non-private post-processing
(:class:`PostProcess`) that reads only what was released. The session (``graphveil.run.session``)
runs the stages in order, composes every release and every step in ONE accountant and keeps
ONE store of released artifacts (``task.released``); evaluation reads only that store and the
model.

One budget for the whole plan: before anything is released the session calibrates the run's
noise multiplier σ so that all stages together meet the target ε. A release whose mechanism
leaves its noise unset (:meth:`~graphveil.contract.mechanism.Mechanism.calibrated`) takes that shared
σ (noise std σ · sensitivity); the others bring their own noise and count at their fixed cost.

The built-in ``dp_sgd`` method (``plugins/graphveil/plugins/standard/methods.py``) is the plan of a run config's
``mechanisms: [...]`` followed by training; a plugin method returns any other plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from graphveil.contract.errors import ConfigError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.options import NoParams


@dataclass(frozen=True)
class Release:
    """Run ``mechanism`` once on the private data; its artifact is stored as ``released[name]``."""

    name: str
    mechanism: Mechanism


@dataclass(frozen=True)
class Train:
    """DP-SGD on the run's model with the run's sampler, clipper and accountant (plain SGD when
    ``privacy.enabled`` is false). Stages before it run when the session is prepared, stages
    after it when the trained model is evaluated.

    ``private=False`` trains without clipping or noise in a private run: only for a stage that
    reads nothing the run's unit protects (e.g. under edge-level GDP, node features and labels
    are public and a row-wise model reads no edge). ``reason`` must say why; it is written to
    the privacy report.
    """

    private: bool = True
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.private and not self.reason.strip():
            raise ConfigError("Train(private=False) needs a reason: why the stage reads nothing the unit protects")


@dataclass(frozen=True)
class PostProcess:
    """Non-private work on released artifacts only: ``run(released)`` → ``released[name]``.

    ``released`` is a read-only mapping of every artifact released so far (after training it
    also holds ``"model"``, the trained model, itself a DP release). No private data is passed,
    so whatever ``run`` computes is post-processing and costs no privacy.
    """

    name: str
    run: Callable[[Mapping[str, Any]], Any]


Stage = Release | Train | PostProcess

#: key of the trained model in the released store, for stages after :class:`Train`
MODEL_KEY = "model"


@dataclass(frozen=True)
class Plan:
    """The stages of a method, in order; at most one :class:`Train` (checked on construction)."""

    stages: tuple[Stage, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        names: set[str] = set()
        trains = 0
        for i, stage in enumerate(self.stages):
            if isinstance(stage, Train):
                trains += 1
                continue
            if not isinstance(stage, Release | PostProcess):
                raise ConfigError(f"plan stage {i} is {type(stage).__name__}, not Release, Train or PostProcess")
            if isinstance(stage, Release) and not isinstance(stage.mechanism, Mechanism):
                raise ConfigError(f"release {stage.name!r}: {type(stage.mechanism).__name__} is not a Mechanism")
            if not stage.name or stage.name in names or stage.name == MODEL_KEY:
                why = "is empty" if not stage.name else ("is reserved for the trained model"
                                                          if stage.name == MODEL_KEY else "is used twice")
                raise ConfigError(f"plan stage {i}: artifact name {stage.name!r} {why}; releases would collide")
            names.add(stage.name)
        if trains > 1:
            raise ConfigError(f"a plan has at most one Train stage, got {trains}")

    @property
    def releases(self) -> list[Release]:
        return [s for s in self.stages if isinstance(s, Release)]

    def artifacts_before_training(self) -> tuple[str, ...]:
        """Names of the artifacts released or post-processed before the :class:`Train` stage."""
        return tuple(s.name for s in self.before_training() if isinstance(s, Release | PostProcess))

    @property
    def trains(self) -> bool:
        return self.train_stage is not None

    @property
    def train_stage(self) -> Train | None:
        return next((s for s in self.stages if isinstance(s, Train)), None)

    def before_training(self) -> Sequence[Stage]:
        """The stages up to the :class:`Train` stage (all of them if there is none)."""
        for i, stage in enumerate(self.stages):
            if isinstance(stage, Train):
                return self.stages[:i]
        return self.stages

    def after_training(self) -> Sequence[Stage]:
        """The stages after the :class:`Train` stage (none if there is no such stage)."""
        for i, stage in enumerate(self.stages):
            if isinstance(stage, Train):
                return self.stages[i + 1:]
        return ()


class Method(ABC):
    """Returns the run's :class:`Plan`. Declares nothing itself: every release's mechanism
    declares its unit, and the invariant compares those with the run's (before data is read).
    A method whose mechanisms depend on the unit (paper 4's GDP levels) reads the run's stated
    unit, ``config.privacy.privacy_unit``."""

    Params: ClassVar[type[BaseModel]] = NoParams

    def __init__(self, params: BaseModel | None = None) -> None:
        self.params = params if params is not None else self.Params()

    @abstractmethod
    def plan(self, config: Any, mechanisms: Sequence[tuple[str, Mechanism]]) -> Plan:
        """The stages of this run. ``config`` is the run's :class:`graphveil.run.config.RunConfig`
        (the contract does not import the run layer); ``mechanisms`` are the run config's
        ``mechanisms`` section, built by the host (name, instance), for methods that place them."""
