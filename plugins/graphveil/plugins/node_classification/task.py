"""Node classification on a random node split: cross-entropy per node, accuracy on held-out nodes."""

from __future__ import annotations

import copy
import re
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator

from graphveil.contract.errors import ConfigError
from graphveil.contract.model import Model
from graphveil.contract.task import MetricColumn, NodeBatch, Task
from graphveil.contract.units import PrivacyUnit, UnitKind
from graphveil.data.node_graph import NodeGraph
from graphveil.data.node_split import planetoid_full_split, random_node_split

RAW = "raw"
#: rows per forward pass when a row-wise model predicts every node
PREDICT_ROWS = 2**16
RELEASED = "released:"
_MECHANISM_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class NodeClassificationParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    features: str = Field(RAW, description=(
        "Node features the model reads: 'raw' (the dataset's x) or 'released:<mechanism>' (the "
        "matrix that mechanism of the run's `mechanisms` list released, e.g. "
        "'released:noisy_features'); then training and evaluation never read the raw features."))

    graph: str | None = Field(None, description=(
        "For a whole-graph model (forward(x, edge_index), e.g. 'sage_full'): the edges it reads, "
        "'raw' (the dataset's) or 'released:<name>' (a release's edge_index, e.g. RandEdge's). "
        "Unset: the model reads rows only."))

    @field_validator("graph")
    @classmethod
    def _graph(cls, v: str | None) -> str | None:
        if v is not None and v != RAW and not (v.startswith(RELEASED) and _MECHANISM_NAME.match(v.removeprefix(RELEASED))):
            raise ValueError("must be 'raw' or 'released:<name>', e.g. 'released:rand_edge'")
        return v

    @field_validator("features")
    @classmethod
    def _features(cls, v: str) -> str:
        if v != RAW and not (v.startswith(RELEASED) and _MECHANISM_NAME.match(v.removeprefix(RELEASED))):
            raise ValueError("must be 'raw' or 'released:<mechanism name>', e.g. 'released:noisy_features'")
        return v

    @property
    def release(self) -> str | None:
        """The mechanism whose release is read, or None for the raw features."""
        return None if self.features == RAW else self.features.removeprefix(RELEASED)


class NodeClassification(Task):
    """Per-node cross-entropy on the training nodes; accuracy on validation and test nodes.

    The model sees a node's own features only (``model(x[nodes])``), where ``x`` is the raw
    feature matrix or, with ``features: released:<mechanism>``, that mechanism's released
    ``(n, F')`` matrix: training, evaluation and the model's sizing then read only the release
    (post-processing of a DP output), never ``dataset.x``. Labels are always the dataset's.
    Evaluation reports test and validation accuracy and the majority-class accuracy on the test
    nodes (the baseline a model must beat; computed from training labels, which are private, so
    it is reported as a reference point for the table only and not released by a site).
    """

    Params = NodeClassificationParams
    model_family: ClassVar[str] = "model"
    metrics: ClassVar[tuple[MetricColumn, ...]] = (
        MetricColumn("test_accuracy", "test acc"), MetricColumn("val_accuracy", "val acc"),
    )

    def __init__(self, params: NodeClassificationParams | None = None) -> None:
        self.params = params if params is not None else NodeClassificationParams()

    def configure(self, config: Any) -> None:
        """Refuse, before data is read, a ``features`` artifact the run's plan does not release before training."""
        graph = self.params.graph
        if graph is not None and graph != RAW and graph.removeprefix(RELEASED) not in self.planned_releases:
            raise ConfigError(f"task.graph: {graph!r} reads a release the run does not make before training "
                              f"(releases: {list(self.planned_releases) or 'none'})")
        name = self.params.release
        planned = list(self.planned_releases)
        if name is not None and name not in planned:
            raise ConfigError(f"task.features: {self.params.features!r} reads the release of mechanism "
                              f"{name!r}, but the run releases {planned or 'nothing'} before training; add "
                              f"{{name: {name}, ...}} to `mechanisms`")

    def setup(self, data: Any, split: Any) -> None:
        if not isinstance(data, NodeGraph):
            raise ConfigError(f"task 'node_classification' needs node features and labels; the data "
                              f"source gave {type(data).__name__} (use e.g. data.source: planetoid)")
        if split.kind not in ("random_node", "planetoid_full"):
            raise ConfigError(f"task 'node_classification' uses data.split.kind: random_node or "
                              f"planetoid_full, got {split.kind!r}")
        self._dataset = data
        if split.kind == "planetoid_full":  # the published split, by node id
            self.split = planetoid_full_split(data)
            self._split_scope = {"rule": "planetoid_full: the public Planetoid split's validation and "
                                         "test nodes, every other node trains (by node id)"}
            return
        self.split = random_node_split(data, split.val_fraction, split.test_fraction, split.seed)
        self._split_scope = {"rule": "keyed per node id (HMAC-SHA256 of data.split.seed)",
                             "val_fraction": split.val_fraction, "test_fraction": split.test_fraction}

    @property
    def train_view(self) -> torch.Tensor:
        return self.split.train

    def num_units(self, unit: PrivacyUnit | None) -> int:
        """n for the default δ: training nodes; adjacency entries (edge) or undirected edges
        (undirected_edge) at paper 4's edge level, whose δ is below 1/#edges."""
        kind = getattr(unit, "kind", None)
        if kind is UnitKind.EDGE:
            return int(self.dataset.edge_index.shape[1])
        if kind is UnitKind.UNDIRECTED_EDGE:
            return int(self.dataset.edge_index.shape[1]) // 2
        return int(self.split.train.numel())

    def scope(self) -> dict[str, Any]:
        return {"split": dict(self._split_scope),
                "nodes": int(self.split.train.numel()), "dataset_nodes": self.dataset.num_nodes,
                "features": self.params.features}

    def features(self) -> torch.Tensor:
        """``(n, F)`` features the model reads: ``dataset.x``, or the named release alone.

        :raises ConfigError: if the release is missing (not run yet) or not an ``(n, F')`` tensor.
        """
        name = self.params.release
        if name is None:
            return self.dataset.x
        if name not in self.released:
            raise ConfigError(f"task.features: mechanism {name!r} has released nothing yet "
                              f"(released: {sorted(self.released) or 'none'})")
        x = self.released[name]
        n = self.dataset.num_nodes
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[0] != n or not x.is_floating_point():
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ConfigError(f"task.features: mechanism {name!r} released {got}, not an ({n}, F) "
                              "float feature matrix")
        return x

    def prepare_model(self, model: Model) -> None:
        """Size the model on the dataset, with ``x`` replaced by the release when reading one
        (so a release of another width sizes the input layer, and the raw ``x`` is not read)."""
        if self.params.release is None:
            model.prepare(self.dataset)
            return
        view = copy.copy(self.dataset)  # shallow: ids, labels and edges shared, no re-validation
        view.x = self.features()
        model.prepare(view)

    def lift(self, batch: NodeBatch) -> NodeBatch:
        return NodeBatch(self.split.train[batch.nodes])

    def _device(self, model: Model) -> torch.device:
        return next(model.parameters()).device

    def edges(self) -> torch.Tensor | None:
        """The ``(2, E)`` edges a whole-graph model reads (``graph``), or None for a row-wise model."""
        graph = self.params.graph
        if graph is None:
            return None
        if graph == RAW:
            return self.dataset.edge_index
        name = graph.removeprefix(RELEASED)
        edges = self.released.get(name)
        if not isinstance(edges, torch.Tensor) or edges.dim() != 2 or edges.shape[0] != 2:
            raise ConfigError(f"task.graph: {name!r} released {type(edges).__name__}, not a (2, E) edge_index")
        return edges

    def _logits(self, model: Model, x: torch.Tensor, nodes: torch.Tensor | None) -> torch.Tensor:
        edges = self.edges()
        if edges is None:
            return model(x if nodes is None else x[nodes])
        out = model(x, edges.to(x.device))
        return out if nodes is None else out[nodes]

    def losses(self, model: Model, batch: NodeBatch) -> torch.Tensor:
        device = self._device(model)
        nodes = batch.nodes.to(device)
        x, y = self.features().to(device), self.dataset.y.to(device)
        return F.cross_entropy(self._logits(model, x, nodes), y[nodes], reduction="none")

    @torch.no_grad()
    def predicted(self, model: Model) -> torch.Tensor:
        """``(n,)`` predicted class of every node, on the CPU (the model in eval mode)."""
        x = self.features().to(self._device(model))
        model.eval()
        try:
            if self.edges() is not None:
                return self._logits(model, x, None).argmax(dim=1).cpu()
            # a row-wise model, PREDICT_ROWS rows at a time: activations stay in cache (issue 28:
            # 1.6x faster at 10^6 nodes than one pass), the same predictions
            return torch.cat([model(x[i:i + PREDICT_ROWS]).argmax(dim=1).cpu()
                              for i in range(0, x.shape[0], PREDICT_ROWS)])
        finally:
            model.train()

    def evaluate(self, model: Model) -> dict[str, float]:
        pred, y = self.predicted(model), self.dataset.y.cpu()
        out = {}
        for name, idx in (("test", self.split.test), ("val", self.split.val)):
            out[f"{name}_accuracy"] = float((pred[idx] == y[idx]).float().mean()) if idx.numel() else float("nan")
        majority = int(torch.bincount(y[self.split.train]).argmax())
        out["majority_accuracy"] = float((y[self.split.test] == majority).float().mean())
        return out
