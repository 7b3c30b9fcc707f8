"""Split kinds planetoid_full (PyG's Planetoid(split="full")) and two_graphs (train on A, evaluate on B)."""

from __future__ import annotations

import json
import lzma
from importlib import resources
from pathlib import Path

import pytest
import torch
import yaml

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.host import PluginHost
from graphveil.data import (
    NodeGraph,
    RelationalGraph,
    load_data,
    planetoid_full_split,
)
from graphveil.data.node_graph import node_graph_from_pyg
from graphveil.data.two_graphs import TwoGraphs, join_graphs
from graphveil.plugins.node_classification.task import NodeClassification
from graphveil.plugins.relational.task import RelationalTask
from graphveil.plugins.standard.sources.planetoid import load_planetoid
from graphveil.run.config import DataConfig, config_from_dict, load_config
from graphveil.run.session import TrainingSession

# ----------------------------------------------------------------------------------- planetoid_full


@pytest.fixture(scope="module")
def pyg_cora(tmp_path_factory: pytest.TempPathFactory):
    """PyG's own reading of the bundled raw files (decompressed; nothing is downloaded)."""
    from torch_geometric.io import read_planetoid_data

    raw = tmp_path_factory.mktemp("cora-raw")
    folder = resources.files("graphveil.data").joinpath("bundled", "planetoid", "Cora")
    for f in folder.iterdir():
        if f.name.startswith("ind.cora.") and f.name.endswith(".xz"):
            (raw / f.name.removesuffix(".xz")).write_bytes(lzma.decompress(f.read_bytes()))
    return read_planetoid_data(str(raw), "cora")


def nodes(mask: torch.Tensor) -> torch.Tensor:
    return mask.nonzero().flatten()


@pytest.mark.parametrize("preprocess", ["dp_gnn", "none"])  # dp-gnn removes no Cora node
def test_planetoid_full_is_pygs_full_split_on_cora(pyg_cora, preprocess: str) -> None:
    split = planetoid_full_split(load_planetoid("cora", preprocess=preprocess))
    assert (split.train.numel(), split.val.numel(), split.test.numel()) == (1208, 500, 1000)
    # PyG's public split: 140 / 500 / 1000; "full" trains on every node outside val and test
    assert (int(pyg_cora.train_mask.sum()), int(pyg_cora.val_mask.sum()), int(pyg_cora.test_mask.sum())) == (140, 500, 1000)
    assert torch.equal(split.val, nodes(pyg_cora.val_mask)) and torch.equal(split.test, nodes(pyg_cora.test_mask))
    assert torch.equal(split.train, nodes(~(pyg_cora.val_mask | pyg_cora.test_mask)))
    assert bool(torch.isin(nodes(pyg_cora.train_mask), split.train).all())


def test_the_public_split_travels_with_the_node_ids() -> None:
    graph = load_planetoid("cora")
    assert graph.public_split is not None and len(graph.public_split.train) == 140
    assert graph.public_split.val[:2] == ("140", "141")
    # a subgraph keeping every val/test node (here: dropping 100 training nodes) keeps the split exact
    public = set(graph.public_split.val) | set(graph.public_split.test)
    keep = torch.tensor([i for i, nid in enumerate(graph.node_ids) if nid in public or i >= 1000])
    sub = graph.subgraph(keep)
    split = planetoid_full_split(sub)
    assert [sub.node_ids[i] for i in split.test.tolist()] == sorted(graph.public_split.test, key=int)
    assert split.val.numel() == 500 and split.train.numel() == sub.num_nodes - 1500


def test_planetoid_full_refuses_what_it_cannot_keep_exact() -> None:
    cfg = DataConfig.model_validate({"source": "planetoid", "max_entities": 1700, "split": {"kind": "planetoid_full"}})
    task = NodeClassification()
    with pytest.raises(ConfigError, match=r"planetoid_full: 1000 of the 1000 public test nodes of cora\[:1700\] are "
                                          r"not in the loaded graph .*set data\.preprocess: none"):
        task.setup(load_data(cfg), cfg.split)
    toy = NodeGraph("toy", torch.eye(3), torch.tensor([0, 1, 0]), torch.tensor([[0, 1], [1, 0]]),
                    ["a", "b", "c"], ["x", "y"])
    with pytest.raises(ConfigError, match=r"toy carries no public split"):
        planetoid_full_split(toy)


def test_the_node_task_runs_planetoid_full_and_says_so() -> None:
    cfg = DataConfig.model_validate({"source": "planetoid", "split": {"kind": "planetoid_full"}})
    task = NodeClassification()
    task.setup(load_data(cfg), cfg.split)
    assert task.num_units(None) == 1208 and task.scope()["split"]["rule"].startswith("planetoid_full")
    with pytest.raises(ConfigError, match=r"uses data\.split\.kind: random_node or planetoid_full, got 'transfer'"):
        task.setup(load_data(cfg), DataConfig().split)
    with pytest.raises(ConfigError, match=r"uses data\.split\.kind: transfer or two_graphs, got 'planetoid_full'"):
        RelationalTask().setup(load_data(cfg).to_relational(), cfg.split)


# ----------------------------------------------------------------------------------------- two_graphs


def graph_b(folder: Path, n: int = 40) -> tuple[Path, Path]:
    """A small text graph B: a cycle on ids q0..q{n-1} (ids are per graph: they could repeat A's)."""
    texts, edges = folder / "b_texts.csv", folder / "b.csv"
    texts.write_text("id,text\n" + "".join(f"q{i},note {i} on graphs and privacy noise\n" for i in range(n)))
    edges.write_text("source,target\n" + "".join(f"q{i},q{(i + 1) % n}\n" for i in range(n)))
    return edges, texts


def two_graph_config(folder: Path) -> dict:
    edges, texts = graph_b(folder)
    return {
        "name": "two-graphs", "seed": 1,
        "data": {"source": "citeseer", "max_entities": 300,
                 "split": {"kind": "two_graphs",
                           "eval_data": {"source": "edge_list", "path": str(edges), "entities": str(texts)}}},
        "sampler": {"name": "entity_poisson_wor", "batch_size": 8, "k_neg": 2, "degree_cap": 4},
        "clipper": {"name": "standard_clip", "clip_norm": 1.0},
        "accountant": {"name": "coupled_rdp_standard"},
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 12, "lora_layers": 1, "seed": 5},
        "training": {"steps": 2, "lr": 0.01},
        "privacy": {"noise_multiplier": 1.0},
        "evaluation": {"batch_size": 8},
        "output": {"progress": False, "dir": str(folder / "run")},
    }


@pytest.mark.slow
def test_two_graphs_trains_on_a_and_evaluates_on_b(tmp_path: Path) -> None:
    from graphveil.run.runner import run_training

    result = run_training(config_from_dict(two_graph_config(tmp_path)))
    session = result["session"]
    a, b = session.task.train_graph, session.task.test_graph
    assert isinstance(session.graph, TwoGraphs) and a.name == "citeseer[:300]" and b.name == "b"
    assert (a.num_nodes, b.num_nodes, b.num_edges) == (300, 40, 40)
    assert session.graph.entity_ids[:1] == ["A:" + a.entity_ids[0]] and session.graph.entity_ids[300] == "B:q0"
    assert torch.equal(session.task.test_nodes, torch.arange(300, 340))
    assert session.num_units == 300  # node-level: graph A's entities, all of them
    assert result["row"]["num_relations"] == 40 and 0 <= result["row"]["mrr"] <= 1
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert report["dataset"]["split"]["eval_graph"] == "b" and "does not cover" in report["dataset"]["split"]["rule"]
    again = load_config(tmp_path / "run" / "config.resolved.yaml")  # the resolved config reads back
    assert again.data.split.kind == "two_graphs" and again.data.split.eval_data.source == "edge_list"


def test_two_graphs_loads_b_through_the_same_sources(tmp_path: Path) -> None:
    cfg = config_from_dict(two_graph_config(tmp_path)).data
    union = load_data(cfg)
    assert isinstance(union, TwoGraphs) and union.num_nodes == 340 and union.num_edges == union.train.num_edges + 40
    assert union.texts[300] == "note 0 on graphs and privacy noise" and union.labels is None
    assert bool((union.edges[union.train.num_edges:] >= 300).all())
    task = RelationalTask()
    task.setup(union, cfg.split)
    assert task.train_view is union.train and task.dataset is union
    with pytest.raises(ConfigError, match=r"two_graphs: the dataset holds no graph B"):
        RelationalTask().setup(union.train, cfg.split)
    with pytest.raises(ConfigError, match=r"uses data\.split\.kind: random_node or planetoid_full, got 'two_graphs'"):
        NodeClassification().setup(load_planetoid("cora"), cfg.split)


def test_graph_b_options_are_checked_on_the_run_host_before_reading(tmp_path: Path) -> None:
    cfg = config_from_dict(two_graph_config(tmp_path)).data
    host = PluginHost(autoload=False)
    host.register("graphveil.plugins.standard", "standard")
    eval_data = cfg.split.eval_data.model_copy(update={"source": "tiny"})
    bad = cfg.model_copy(update={"split": cfg.split.model_copy(update={"eval_data": eval_data})})
    with pytest.raises(ConfigError, match=r"data\.split\.eval_data\.source: unknown data source 'tiny'; available: "):
        load_data(bad, host)


@pytest.mark.parametrize(
    ("split", "pattern"),
    [
        ({"kind": "two_graphs"}, r"data\.split: data\.split\.kind two_graphs needs data\.split\.eval_data"),
        ({"kind": "transfer", "eval_data": {"source": "citeseer"}},
         r"data\.split\.eval_data applies only to data\.split\.kind two_graphs \(kind is 'transfer'\)"),
        ({"kind": "two_graphs", "eval_data": {"source": "citeseer", "split": {"train_fraction": 0.3}}},
         r"data\.split\.eval_data\.split: graph B is evaluated whole"),
        ({"kind": "two_graphs", "eval_data": {"source": "edge_list", "path": "b.csv"}},
         r"run\.yaml: data\.split\.eval_data: data\.split\.eval_data\.entities is required for source 'edge_list'"),
        ({"kind": "planetoid_ful"}, r"data\.split\.kind: Input should be 'transfer', 'random_node', 'planetoid_full' or 'two_graphs'"),
    ],
)
def test_split_config_errors(tmp_path: Path, split: dict, pattern: str) -> None:
    raw = two_graph_config(tmp_path)
    raw["data"]["split"] = split
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=pattern):  # the shape at load, graph B's source options at assemble
        TrainingSession(load_config(path)).assemble()


def test_join_needs_an_input_both_graphs_share() -> None:
    a = RelationalGraph("a", ["1", "2"], torch.tensor([[0, 1]]), texts=["x", "y"])
    b = RelationalGraph("b", ["1", "2"], torch.tensor([[0, 1]]), features=torch.ones(2, 3))
    with pytest.raises(DataError, match=r"graph A 'a' has texts, graph B 'b' has 3 features; one encoder embeds both"):
        join_graphs(a, b)
    empty = RelationalGraph("e", ["1"], torch.zeros(0, 2, dtype=torch.long), texts=["z"])
    with pytest.raises(DataError, match=r"graph B \(data\.split\.eval_data\) 'e' has no relations to evaluate on"):
        join_graphs(a, empty)
    both = join_graphs(a, RelationalGraph("c", ["1", "3"], torch.tensor([[0, 1]]), texts=["u", "v"]))
    assert both.entity_ids == ["A:1", "A:2", "B:1", "B:3"] and both.edges.tolist() == [[0, 1], [2, 3]]
    assert repr(both) == "RelationalGraph('a+c', nodes=4, edges=2, text)"


def test_the_transfer_split_gives_the_task_each_sides_positions_in_the_dataset() -> None:
    """The relational task's train_nodes / test_nodes come from the split's mask (issue 28: no
    lookup by id): entity i of a side is the dataset's entity train_nodes[i], features and all."""
    from graphveil.data.split import split_key, split_position
    from graphveil.data.synthetic import block_csbm

    data = block_csbm(300, 900, num_classes=3, num_features=4, generator=torch.Generator().manual_seed(1))
    graph = node_graph_from_pyg(data, name="csbm", node_ids=[f"n{(i * 37) % 1000}" for i in range(300)])
    task = RelationalTask()
    cfg = DataConfig(source="planetoid", split={"kind": "transfer", "train_fraction": 0.6, "seed": 3})
    task.setup(graph, cfg.split)
    rel = graph.to_relational()
    for side, where in ((task.train_graph, task.train_nodes), (task.test_graph, task.test_nodes)):
        assert side.entity_ids == [rel.entity_ids[i] for i in where.tolist()]
        assert torch.equal(side.features, rel.features[where])
    on_train = [split_position(split_key(3), e) < 0.6 for e in rel.entity_ids]
    assert task.train_nodes.tolist() == [i for i, t in enumerate(on_train) if t]
    assert task.test_nodes.tolist() == [i for i, t in enumerate(on_train) if not t]
