"""The task family: what is learned from the data, per example, and how it is evaluated.

A task owns the data view of one run: it splits the loaded dataset (``setup``), hands the
sampler the training side (``train_view``), turns a sampled batch into per-example losses of a
model (``losses``, one entry per clipping unit), and evaluates the trained model on the held-out
side (``evaluate``), reading only the released weights and, where the privacy unit allows it, a
target node's own data. Built-in tasks: ``relational`` (papers 1–2: tuples, zero-shot relation
prediction) and ``node_classification`` (paper 4's DP-MLP: accuracy on a random node split).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from pydantic import BaseModel

from graphveil.contract.model import Model
from graphveil.contract.options import NoParams
from graphveil.contract.units import PrivacyUnit


@runtime_checkable
class Batch(Protocol):
    """What every batch offers the engine: its number of clipping units (examples), and the
    sub-batch of some of them (micro-batching).

    ``select(index)`` returns a batch of the same kind holding examples ``index`` (a 1-D long
    tensor of positions in ``[0, size)``) in that order; ``groups`` (optional, as on
    :class:`NodeBatch` and :class:`SubgraphBatch`) maps the batch's model-input rows to its examples.
    """

    @property
    def size(self) -> int: ...

    def select(self, index: torch.Tensor) -> Any: ...


@dataclass
class NodeBatch:
    """A mini-batch of nodes: each node is one example (one clipping unit).

    Graph-shaped examples (rooted subgraphs, components) use
    :class:`graphveil.subgraph_batch.SubgraphBatch`.

    :param nodes: ``(b,)`` node indices (into the task's training view until lifted).
    """

    nodes: torch.Tensor

    def __post_init__(self) -> None:
        if self.nodes.dim() != 1:
            raise ValueError(f"nodes must be (b,), got {tuple(self.nodes.shape)}")

    @property
    def size(self) -> int:
        return int(self.nodes.numel())

    @property
    def groups(self) -> torch.Tensor:
        """Row → example map: row i of the model input belongs to example i."""
        return torch.arange(self.size)

    def select(self, index: torch.Tensor) -> NodeBatch:
        """The nodes at positions ``index`` (1-D long), in that order (micro-batching)."""
        return NodeBatch(nodes=self.nodes[index])


@dataclass(frozen=True)
class MetricColumn:
    """One column of a result table: key in the evaluation dict, header, format."""

    key: str
    header: str
    fmt: str = ".4f"


class Task(ABC):
    """Per-example losses for a batch and the evaluation protocol of one kind of learning.

    Subclasses set ``model_family`` ("encoder": the model embeds entities; "model": the model
    is called on the batch's inputs), ``metrics`` (the columns ``graphveil run`` prints; a task
    may widen them per run in :meth:`configure`) and ``protocols`` (the optional evaluation
    protocols of the ``evaluation`` section it runs; a run asking for another is refused).
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    model_family: ClassVar[str] = "model"
    metrics: tuple[MetricColumn, ...] = ()
    protocols: ClassVar[frozenset[str]] = frozenset()
    #: whether a logical batch may be split across data-parallel ranks (``graphveil run --nproc``):
    #: the batch has ``select`` and nothing in :meth:`losses` depends on which examples share a shard
    data_parallel: ClassVar[bool] = False

    #: artifacts released by the run's mechanisms, by mechanism name (set by the session)
    released: Mapping[str, Any] = MappingProxyType({})
    #: names of the artifacts the run's plan releases before training (set before :meth:`configure`)
    planned_releases: tuple[str, ...] = ()

    @property
    def reads_release(self) -> bool:
        """Whether training reads a release (the session then binds the sampler to it after the
        release ran, and the training stage must be noiseless). Default: no."""
        return False

    def configure(self, config: Any) -> None:  # noqa: B027 - optional hook, no-op by default
        """Read run-level options the task uses (e.g. the relational loss), before :meth:`setup`."""

    @abstractmethod
    def setup(self, data: Any, split: Any) -> None:
        """Split the loaded dataset (``split``: the run's :class:`~graphveil.run.config.SplitConfig`)."""

    @property
    @abstractmethod
    def train_view(self) -> Any:
        """What the sampler prepares on (the training side)."""

    @abstractmethod
    def num_units(self, unit: PrivacyUnit | None) -> int:
        """How many privacy units the training side holds (n in δ's default rule)."""

    def lift(self, batch: Any) -> Any:
        """Map a batch from training-view indices to the model's (default: unchanged)."""
        return batch

    def prepare_model(self, model: Model) -> None:
        """One-time model work on this data (default: ``model.prepare(dataset)``)."""
        model.prepare(self.dataset)

    @property
    def dataset(self) -> Any:
        """The whole loaded dataset (set by :meth:`setup`)."""
        return getattr(self, "_dataset", None)

    def scope(self) -> dict[str, Any]:
        """The split rule and the training side's sizes, for ``privacy.json`` (default: none)."""
        return {}

    @abstractmethod
    def losses(self, model: Model, batch: Any) -> torch.Tensor:
        """``(b,)`` per-example losses; example i depends only on batch example i's data."""

    @abstractmethod
    def evaluate(self, model: Model) -> dict[str, float]:
        """Metrics on the held-out side; reads only the model's (released) weights and eval data."""
