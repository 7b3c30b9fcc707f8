"""The node-classification task's predictions: a row-wise model predicts in chunks of rows
(issue 28), which must give exactly what one pass over every node gives."""

from __future__ import annotations

import pytest
import torch

from graphveil.data.node_graph import NodeGraph
from graphveil.plugins.node_classification import task as node_task
from graphveil.plugins.node_classification.task import NodeClassification
from graphveil.run.config import DataConfig


@pytest.mark.parametrize("rows", [1, 7, 64, 10_000])
def test_chunked_predictions_are_one_pass_over_every_node(monkeypatch: pytest.MonkeyPatch, rows: int) -> None:
    gen = torch.Generator().manual_seed(0)
    n, f, c = 101, 6, 4
    x, y = torch.randn(n, f, generator=gen), torch.randint(0, c, (n,), generator=gen)
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    graph = NodeGraph("toy", x, y, torch.cat([ring, ring.flip(0)], dim=1), [str(i) for i in range(n)],
                      [f"c{k}" for k in range(c)])
    task = NodeClassification()
    task.setup(graph, DataConfig.model_validate({"source": "planetoid", "split": {"kind": "random_node"}}).split)
    model = torch.nn.Sequential(torch.nn.Linear(f, 16), torch.nn.Tanh(), torch.nn.Linear(16, c))
    monkeypatch.setattr(node_task, "PREDICT_ROWS", rows)
    got = task.predicted(model)
    assert got.shape == (n,) and torch.equal(got, model(x).argmax(dim=1))
    assert model.training  # evaluation mode is left again
    acc = task.evaluate(model)["test_accuracy"]
    want = float((model(x).argmax(1)[task.split.test] == y[task.split.test]).float().mean())
    assert acc == want
