"""The small entity and relation tables the parquet and SQL source tests read (no tests here)."""

from __future__ import annotations

import csv
from pathlib import Path

import torch

from graphveil.data import RelationalGraph

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
