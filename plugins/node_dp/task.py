"""Node classification on a random node split: cross-entropy per node, accuracy on held-out nodes."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from graphveil.components import Model
from graphveil.data.node_graph import NodeGraph
from graphveil.data.node_split import random_node_split
from graphveil.errors import ConfigError
from graphveil.tasks import MetricColumn, NodeBatch, Task
from graphveil.units import PrivacyUnit


class NodeClassification(Task):
    """Per-node cross-entropy on the training nodes; accuracy on validation and test nodes.

    The model sees a node's own features only (``model(x[nodes])``). Evaluation reports test
    and validation accuracy and the majority-class accuracy on the test nodes (the baseline
    a model must beat; computed from training labels, which are private, so it is reported
    as a reference point for the table only and not released by a site).
    """

    model_family: ClassVar[str] = "model"
    metrics: ClassVar[tuple[MetricColumn, ...]] = (
        MetricColumn("test_accuracy", "test acc"), MetricColumn("val_accuracy", "val acc"),
    )

    def __init__(self, params: Any = None) -> None:
        self.params = params

    def setup(self, data: Any, split: Any) -> None:
        if not isinstance(data, NodeGraph):
            raise ConfigError(f"task 'node_classification' needs node features and labels; the data "
                              f"source gave {type(data).__name__} (use e.g. data.source: planetoid)")
        if split.kind != "random_node":
            raise ConfigError(f"task 'node_classification' uses data.split.kind: random_node, got {split.kind!r}")
        self._dataset = data
        self.split = random_node_split(data, split.val_fraction, split.test_fraction, split.seed)
        self.split_fractions = (split.val_fraction, split.test_fraction)

    @property
    def train_view(self) -> torch.Tensor:
        return self.split.train

    def num_units(self, unit: PrivacyUnit | None) -> int:
        return int(self.split.train.numel())

    def scope(self) -> dict[str, Any]:
        val, test = self.split_fractions
        return {"split": {"rule": "keyed per node id (HMAC-SHA256 of data.split.seed)",
                          "val_fraction": val, "test_fraction": test},
                "nodes": int(self.split.train.numel()), "dataset_nodes": self.dataset.num_nodes}

    def lift(self, batch: NodeBatch) -> NodeBatch:
        return NodeBatch(self.split.train[batch.nodes])

    def _device(self, model: Model) -> torch.device:
        return next(model.parameters()).device

    def losses(self, model: Model, batch: NodeBatch) -> torch.Tensor:
        device = self._device(model)
        nodes = batch.nodes.to(device)
        x, y = self.dataset.x.to(device), self.dataset.y.to(device)
        return F.cross_entropy(model(x[nodes]), y[nodes], reduction="none")

    @torch.no_grad()
    def evaluate(self, model: Model) -> dict[str, float]:
        device = self._device(model)
        x, y = self.dataset.x.to(device), self.dataset.y.to(device)
        model.eval()
        try:
            pred = model(x).argmax(dim=1)
        finally:
            model.train()
        out = {}
        for name, idx in (("test", self.split.test), ("val", self.split.val)):
            idx = idx.to(device)
            out[f"{name}_accuracy"] = float((pred[idx] == y[idx]).float().mean()) if idx.numel() else float("nan")
        majority = int(torch.bincount(y[self.split.train.to(device)]).argmax())
        out["majority_accuracy"] = float((y[self.split.test.to(device)] == majority).float().mean())
        return out
