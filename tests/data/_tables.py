"""The small entity and relation tables the parquet and SQL source tests read, the small node
graph (IDS, LABELS, X, EDGES) the node-source tests write in every format, and a data section's
options checked as a run's assembly checks them (no tests here)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from graphveil.contract.host import default_host
from graphveil.data import NodeGraph, RelationalGraph
from graphveil.data.loaders import check_data_options
from graphveil.run.config import DataConfig

ENTITIES = [("a", "alpha paper", "ml"), ("b", " beta, with a comma", "db"), ("c", "gamma", ""),
            ("d", "delta", "ml"), ("e", "epsilon \"quoted\"", "db")]
RELATIONS = [("a", "b"), ("b", "c"), ("c", "a"), ("b", "a"), ("d", "d"), ("a", "d"), ("e", "c"), ("c", "e"), (" a", "e ")]  # ids are stripped


def write_csv(folder: Path, entities=ENTITIES, relations=RELATIONS) -> tuple[Path, Path]:
    ent, rel = folder / "entities.csv", folder / "relations.csv"
    with ent.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "text", "label"])
        w.writerows(entities)
    with rel.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["src", "dst"])
        w.writerows(relations)
    return rel, ent


def same_graph(a: RelationalGraph, b: RelationalGraph) -> None:
    """The two loads gave the same graph: ids, texts, edges, labels, notes and name."""
    assert a.entity_ids == b.entity_ids and a.texts == b.texts
    assert a.edges.dtype == b.edges.dtype == torch.int64 and torch.equal(a.edges, b.edges)
    assert a.label_names == b.label_names and torch.equal(a.labels, b.labels)
    assert a.notes == b.notes and a.name == b.name


# ------------------------------------------------------------------------------ node graph

IDS = ["n0", "n1", "n2", "n3", "n4", "007"]  # "007": an id that is not an integer's decimal
LABELS = ["cat", "dog", "cat", None, "dog", "cat"]  # n3 unlabelled
X = np.arange(18, dtype=np.float32).reshape(6, 3) / 7 - 1
EDGES = [("n0", "n1"), ("n1", "n2"), ("n2", "n3"), ("n3", "n4"), ("n4", "007"), ("n1", "n0"), ("n2", "n2")]


def check_graph(graph: object, x: np.ndarray = X) -> NodeGraph:
    """The graph of IDS / LABELS / EDGES with features ``x``, its nodes in any order (a database
    table is read in id order)."""
    assert isinstance(graph, NodeGraph)
    assert sorted(graph.node_ids) == sorted(IDS) and graph.class_names == ["cat", "dog"]
    order = [IDS.index(i) for i in graph.node_ids]
    assert graph.y.tolist() == [[0, 1, 0, -1, 1, 0][k] for k in order]
    assert torch.equal(graph.x, torch.from_numpy(x[order]))
    pairs = {(graph.node_ids[u], graph.node_ids[v]) for u, v in graph.edge_index.t().tolist()}
    undirected = {frozenset(e) for e in EDGES if e[0] != e[1]}
    assert {frozenset(p) for p in pairs} == undirected and len(pairs) == 2 * len(undirected)
    assert graph.notes["dropped_self_loops"] == 1 and graph.notes["dropped_duplicate_edges"] == 0
    return graph


def data_options(**section: Any) -> BaseModel:
    """The data section ``section``'s source options, validated as a run's assembly validates them
    (:func:`~graphveil.data.loaders.check_data_options`, the installed plugins' host).

    :raises ConfigError: naming the ``data.*`` key.
    """
    return check_data_options(DataConfig(**section), default_host()).params
