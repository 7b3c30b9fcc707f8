"""The partition CLI writes per-site node graphs (graph.pt) a site reads back exactly, and reports the cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from graphveil.connectors.flower.partition import load_source, main
from graphveil.data.partition import partition_graph


def _load_weights_only(path: Path):
    """``torch.load`` with ``weights_only=True`` and only PyG's data classes allowed: no code runs."""
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    with torch.serialization.safe_globals([Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage,
                                           EdgeStorage]):
        return torch.load(path, weights_only=True)


@pytest.mark.slow
def test_cora_parts_load_back_weights_only_with_every_class_and_the_cut_is_reported(tmp_path: Path, capsys) -> None:
    assert main(["--sites", "3", "--out", str(tmp_path), "--graph", "cora", "--by", "communities"]) == 0
    out, err = capsys.readouterr()
    summary = json.loads(err.strip().splitlines()[-1])
    cora = load_source(source="planetoid", name="cora")
    split = partition_graph(cora, 3, kind="communities", seed=0)
    assert summary == split.summary() | {"cut_fraction": round(split.cut_fraction, 6)}
    assert summary["cut_edges"] > 0
    paths = [Path(p) for p in out.split()]
    assert paths == [tmp_path / f"site-{i}" / "graph.pt" for i in (1, 2, 3)]
    kept = 0
    for i, path in enumerate(paths):
        data = _load_weights_only(path)  # a plain PyG Data
        part = cora.subgraph(split.nodes(i))
        assert torch.equal(data.x, part.x) and torch.equal(data.y, part.y)
        assert torch.equal(data.edge_index, part.edge_index)
        assert data.label_names == cora.class_names  # all sites agree on the classes
        assert data.node_ids == part.node_ids  # the whole graph's ids of the part
        kept += data.edge_index.shape[1] // 2
    assert kept == cora.num_undirected_edges - summary["cut_edges"]


def test_a_bad_request_exits_2_and_writes_nothing(tmp_path: Path, capsys) -> None:
    assert main(["--sites", "3", "--out", str(tmp_path / "x"), "--graph", "cora", "--by", "labels",
                 "--alpha", "-1"]) == 2
    assert "alpha" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
