"""ε and σ of a planned run from public sizes alone: the run's own code, no data read.

``graphveil privacy epsilon|calibrate --config RUN.yaml --nodes N`` (or ``--method NAME``)
accounts a run before any data exists at the accountant's side. It builds the run exactly as
``graphveil run`` does — :meth:`TrainingSession.assemble <graphveil.run.session.TrainingSession.assemble>`
(same host, same ``method.plan()``, same sampler, clipper, accountant and model, same
``check_run`` / ``check_units`` / ``check_structure`` refusals) — and then runs
:meth:`TrainingSession.bind_accounting <graphveil.run.session.TrainingSession.bind_accounting>`, the
session's own step between splitting the data and the first release (the releases' ``bind``, the
sampler's ``prepare``, the planned steps, the clipper and accountant ``bind``, δ, σ calibration),
with a :class:`PublicTask` in place of the split data.

A :class:`PublicTask` is the run's task after ``setup`` as far as public numbers describe it:

* ``split.train`` — the n training nodes, as ``arange(n)`` (under replacement adjacency their
  count is public; which nodes they are does not enter any accounting event);
* ``train_graph`` — the training graph with n nodes (synthetic ids, no features, labels or edges);
* ``dataset`` — the whole graph, known only by its number of undirected edges when one is given
  (``edge_index`` has the shape ``(2, 2·edges)`` of a graph stored in both directions, and no
  entries), for the default δ of edge-level units.

Every other attribute is looked up on the real task: its options and class-level declarations,
and its methods and properties, which then run on the stand-ins above (``train_view``,
``num_units``, …) — so the number the sampler prepares on and the n of δ's default rule come from
the task's own code. Anything a component reads beyond these public numbers (features, labels,
edges) raises :class:`NotPublicError`, a one-line :class:`~graphveil.contract.errors.ConfigError` naming
what was read: such a run cannot be accounted without its data.

The account itself (:func:`planned_account`) composes on the bound accountant what the run will:
every release's ``event_at(σ)`` and the planned private steps at σ, in the plan's order. A run of
the same config on data with these sizes reports the same ε in its ``privacy.json``.
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from graphveil.contract.errors import ConfigError
from graphveil.contract.method import Release, Train

if TYPE_CHECKING:
    from graphveil.contract.host import PluginHost
    from graphveil.run.config import RunConfig


class NotPublicError(ConfigError):
    """The run reads something of the data that the public sizes do not give."""


@dataclass(frozen=True)
class PublicSizes:
    """What ``graphveil privacy`` knows of the data.

    :param nodes: n, the number of training nodes (public under replacement adjacency).
    :param edges: the number of undirected edges of the whole graph (each stored in both
        directions), needed only where the default δ counts edges (edge-level units).
    """

    nodes: int
    edges: int | None = None

    def __post_init__(self) -> None:
        for name, value, least in (("nodes", self.nodes, 1), ("edges", self.edges, 1)):
            if value is not None and (isinstance(value, bool) or int(value) != value or value < least):
                raise ConfigError(f"--{name} must be an integer >= {least}, got {value!r}")


class _Public:
    """Base of the stand-ins: a non-dunder attribute that is not defined is not public."""

    _label = "the data"

    def _missing(self, name: str) -> NotPublicError:
        return NotPublicError(
            f"the run reads {name!r} of {self._label}, which public sizes do not give: `graphveil privacy` "
            "accounts a run from its number of training nodes (--nodes) and edges (--edges) only, so this "
            "run cannot be accounted without its data (relational runs: --method entity|edge)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._missing(name)


class _SizeOnly(_Public):
    """A tensor known only by its shape (``edge_index`` of :class:`PublicGraph`)."""

    def __init__(self, label: str, shape: tuple[int, ...]) -> None:
        self._label = label
        self.shape = torch.Size(shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def __getitem__(self, index: Any) -> Any:
        raise self._missing("entries")


class PublicGraph(_Public):
    """A graph known by its sizes: ``num_nodes`` (and synthetic ``node_ids``) and/or the shape of
    ``edge_index``; features, labels and the edges themselves are not public."""

    def __init__(self, label: str, *, num_nodes: int | None = None, num_edges: int | None = None) -> None:
        self._label = label
        self._num_nodes = num_nodes
        self._num_edges = num_edges
        self._ids: list[str] | None = None

    @property
    def num_nodes(self) -> int:
        if self._num_nodes is None:
            raise NotPublicError(f"the run reads the number of nodes of {self._label}, which `graphveil "
                                 "privacy` is not given (--nodes counts training nodes)")
        return self._num_nodes

    def __len__(self) -> int:
        return self.num_nodes

    def numel(self) -> int:
        return self.num_nodes

    @property
    def node_ids(self) -> list[str]:
        """``n`` distinct synthetic ids (a sampler that keys on ids gets ids of the right count)."""
        if self._ids is None:
            self._ids = [f"public:{i}" for i in range(self.num_nodes)]
        return self._ids

    @property
    def edge_index(self) -> _SizeOnly:
        if self._num_edges is None:
            raise NotPublicError(f"the run reads the edges of {self._label} (e.g. the default δ of an edge-level "
                                 "unit counts them): give --edges (undirected edges of the graph) or --delta")
        return _SizeOnly(f"{self._label}.edge_index", (2, 2 * self._num_edges))

    @property
    def num_edges(self) -> int:
        return int(self.edge_index.shape[1])


class PublicSplit(_Public):
    """The node split with only its training side, ``train = arange(n)``."""

    _label = "the node split"

    def __init__(self, nodes: int) -> None:
        self.train = torch.arange(nodes)


class PublicTask(_Public):
    """The run's (assembled, not set-up) task with the data it would split replaced by public sizes.

    :param task: the task the session assembled; its options and code are used, never its data.
    :param sizes: the public numbers.
    """

    def __init__(self, task: Any, sizes: PublicSizes) -> None:
        self._task = task
        self._config_state = dict(vars(task))  # options set before setup: public (the run config)
        self._label = f"the data of task {type(task).__name__}"
        self.sizes = sizes
        self.split = PublicSplit(sizes.nodes)
        self.train_graph = PublicGraph("the training graph", num_nodes=sizes.nodes)
        self.dataset = PublicGraph("the graph", num_edges=sizes.edges)
        self.released: Mapping[str, Any] = types.MappingProxyType({})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_task", "_config_state"):
            raise AttributeError(name)
        if name in self._config_state:
            return self._config_state[name]
        cls = type(self._task)
        try:
            member = inspect.getattr_static(cls, name)
        except AttributeError:
            raise self._missing(name) from None
        if isinstance(member, property):
            return member.fget(self)  # the task's own code, on the public stand-ins
        if isinstance(member, staticmethod | classmethod):
            return getattr(cls, name)
        if inspect.isfunction(member):
            return types.MethodType(member, self)
        return member


def planned_account(config: RunConfig, sizes: PublicSizes, *, host: PluginHost | None = None) -> dict[str, Any]:
    """ε, δ and σ of ``config`` run on data of ``sizes``, and each part's ε alone.

    The session assembles and binds the run (see the module note); then the bound accountant
    composes, in the plan's order, every release's ``event_at(σ)`` and — when the plan trains
    privately — the planned steps at σ, which is what the run composes as it goes.

    :raises GraphVeilError: on any refusal of the run (mismatched components, a unit the method
        does not accept, a target no σ meets) or on data the run would read beyond public sizes.
    """
    from graphveil.run.session import TrainingSession

    if not config.privacy.enabled:
        raise ConfigError("privacy.enabled is false: a non-private run makes no claim, so there is no ε to account")
    session = TrainingSession(config, host=host)
    session.assemble()
    session.bind_accounting(PublicTask(session.task, sizes))
    accountant, plan = session.accountant, session.plan
    sigma, delta = session.noise_multiplier, session.delta
    trains = plan.train_stage is not None
    private_steps = session.planned_steps if session.trains_privately else 0
    takes_sigma = session.trains_privately or any(r.mechanism.calibrated() for r in plan.releases)

    def compose(stage: Any) -> bool:
        if isinstance(stage, Release):
            accountant.compose_event(stage.mechanism.event_at(sigma), stage.name)
            return True
        if isinstance(stage, Train) and private_steps:
            accountant.step(noise_multiplier=sigma, num_steps=private_steps)
            return True
        return False

    if config.privacy.noise_multiplier is not None and not takes_sigma:
        raise ConfigError(
            f"privacy.noise_multiplier (--sigma) is set, but nothing in the plan of method {config.method.name!r} "
            "takes the run's shared σ (no private training stage, no calibrated release): leave it unset "
            "and give the releases' own parameters (e.g. privacy.target_epsilon, randomized response's ε)")
    empty = accountant.state_dict()
    parts = []
    for stage in plan.stages:  # each part alone, from the same bound accountant
        accountant.load_state_dict(empty)
        if not compose(stage):
            continue
        if isinstance(stage, Release):
            mechanism = stage.mechanism
            parts.append({"name": stage.name, "stage": "release", "mechanism": type(mechanism).__name__,
                          "calibrated": mechanism.calibrated(), "sensitivity": _number(mechanism.sensitivity()),
                          "epsilon_alone": accountant.get_epsilon(delta)})
        else:
            parts.append({"name": "training", "stage": "train", "steps": private_steps,
                          "epsilon_alone": accountant.get_epsilon(delta)})
    accountant.load_state_dict(empty)
    for stage in plan.stages:  # the whole run, in the order the session composes it
        compose(stage)
    report = accountant.report(delta)
    return {
        "method": config.method.name,
        "unit": getattr(session.unit, "value", None),
        "nodes": sizes.nodes,
        "edges": sizes.edges,
        "sampler": config.sampler.name, "clipper": config.clipper.name, "accountant": config.accountant.name,
        "sampling_profile": {k: (v.value if hasattr(v, "value") else v)
                             for k, v in vars(session.sampling_profile).items()},
        "training": session._training_mode(),
        # the run's steps (privacy.json "steps"); accounted_steps: those with DP-SGD noise
        "steps": session.planned_steps if trains else 0,
        "accounted_steps": private_steps,
        "noise_multiplier": sigma,
        "sigma_used": takes_sigma,
        "delta": delta,
        "delta_rule": session.delta_rule,
        "num_units": session.num_units,
        "epsilon": report["epsilon"],
        "alpha": report.get("alpha"),
        "releases": list(report.get("releases", [])),
        "parts": parts,
        "accountant_report": {k: report[k] for k in ("mechanism", "profile", "history") if k in report},
    }


def _number(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None

