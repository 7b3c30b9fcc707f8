"""Data sources as plugins: the data section's options, validated against the source's Params."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import ConfigError
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost, default_host
from graphveil.data import NodeGraph, RelationalGraph, create_data_source, load_data, load_graph
from graphveil.run.config import DataConfig, RunConfig, config_from_dict, load_config
from graphveil.run.session import TrainingSession

BUILTIN = {"citeseer", "citeseer_tape", "edge_list", "parquet", "planetoid", "pyg", "sql", "synthetic", "twitch"}
# The run config of the node-classification example, exactly.
EXAMPLE_DATA = yaml.safe_load(
    "data: {source: planetoid, name: cora, split: {kind: random_node, val_fraction: 0.1, test_fraction: 0.15, seed: 0}}"
)["data"]
COMPONENTS = {
    "task": {"name": "node_classification"},
    "sampler": {"name": "node_uniform_wor", "batch_size": 64},
    "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
    "accountant": {"name": "node_rdp"},
    "model": {"name": "mlp"},
}


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({**COMPONENTS, "data": data}))
    return path


def assembled(config: RunConfig, host: PluginHost | None = None) -> TrainingSession:
    """The run of ``config`` assembled (nothing read): its data options are checked here."""
    session = TrainingSession(config, host=host)
    session.assemble()
    return session


def test_builtin_sources_come_from_the_standard_plugin() -> None:
    infos = {c.name: c for c in default_host().components("data_source")}
    assert BUILTIN <= set(infos)
    assert all(infos[name].plugin == "standard" and issubclass(infos[name].factory, DataSource) for name in BUILTIN)
    host = PluginHost(autoload=False)
    host.register("graphveil.plugins.standard", "standard")
    assert {c.name for c in host.components("data_source")} == BUILTIN


def test_the_example_data_section_validates_and_loads_bundled_cora(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, EXAMPLE_DATA))
    assert cfg.data.source == "planetoid" and cfg.data.split.kind == "random_node" and cfg.data.split.seed == 0
    assert cfg.data.params == {"name": "cora"}  # as written
    session = assembled(cfg)
    assert session.data_options.params.model_dump() == {"name": "cora", "path": None, "preprocess": "dp_gnn",
                                                        "check_sha256": True}
    graph = session.load_data()
    assert isinstance(graph, NodeGraph)
    assert (graph.num_nodes, graph.num_edges, graph.num_features, graph.num_classes) == (2708, 10556, 1433, 7)
    assert "dropped_isolated_nodes" in graph.notes  # dp_gnn preprocessing ran (the default)
    raw = load_data(DataConfig.model_validate({**EXAMPLE_DATA, "preprocess": "none"}))
    assert "dropped_isolated_nodes" not in raw.notes


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, {"source": "edge_list", "path": "e.csv", "entities": "t.csv",
                                       "source_col": "id_1", "target_col": "id_2"}))
    session = assembled(cfg)
    options = session.data_options.params
    assert options.path == Path("e.csv") and options.label_col is None and options.id_col == "id"
    dumped = session.resolved_config()
    assert dumped["data"] == {"source": "edge_list", "split": dumped["data"]["split"], "max_entities": None, "classes": None,
                              "path": "e.csv", "entities": "t.csv", "source_col": "id_1", "target_col": "id_2",
                              "id_col": "id", "text_col": "text", "label_col": None, "features_col": None, "feature_cols": None, "features_table": None, "num_features": None}
    again = assembled(config_from_dict(dumped))
    assert again.data_options == session.data_options
    assert again.resolved_config() == dumped


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ({"source": "planetoid", "name": "pubmed"}, r"run\.yaml: data: data\.name: Input should be 'cora' or 'citeseer' \(got 'pubmed'\)"),
        ({"source": "planetoid", "name": "citeseer"}, r"run\.yaml: data: data\.path is required for Planetoid 'citeseer': only cora is bundled"),
        ({"source": "planetoid", "preprocess": "gcn"}, r"data\.preprocess: Input should be 'dp_gnn' or 'none' \(got 'gcn'\)"),
        ({"source": "planetoid", "bogus": 1}, r"data\.bogus: not an option of source 'planetoid' \(its options: name, path, preprocess, check_sha256\)"),
        ({"source": "planetoid", "entities": "t.csv"}, r"data\.entities applies only to sources 'edge_list', 'parquet' \(source is 'planetoid'\)"),
        ({"source": "citeseer", "path": "x"}, r"data\.path applies only to sources 'citeseer_tape', 'edge_list', 'parquet', 'planetoid', 'pyg', 'twitch' \(source is 'citeseer'\)"),
        ({"source": "edge_list", "path": "e.csv"}, r"data\.entities is required for source 'edge_list'"),
        ({"source": "pyg"}, r"data\.path is required for source 'pyg'"),
        ({"source": "planetoid", "split": {"kind": "random_node", "val_fraction": 0.5, "test_fraction": 0.5}},
         r"data\.split: data\.split\.val_fraction \+ data\.split\.test_fraction must be < 1"),
        ({"source": "planetoid", "max_entities": 0}, r"data\.max_entities: Input should be greater than 0"),
    ],
)
def test_option_errors_name_the_file_and_the_key(tmp_path: Path, data: dict, pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern):  # the section's shape at load, the source's options at assemble
        assembled(load_config(write(tmp_path, data)))


def test_unknown_source_lists_the_available_ones_before_reading() -> None:
    cfg = DataConfig(source="planetiod", name="cora")  # maybe a run-host plugin: checked at assembly
    with pytest.raises(ConfigError, match=r"data\.source: unknown data source 'planetiod'; available: "
                                          r"citeseer, citeseer_tape, edge_list, parquet, planetoid, pyg"):
        create_data_source(cfg)
    with pytest.raises(ConfigError, match=r"unknown data source 'planetiod'"):
        load_data(cfg)


class _Tiny(DataSource):
    """A path graph of `size` nodes (a test plugin)."""

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        size: int = Field(3, ge=2)

    def load(self) -> NodeGraph:
        n = self.params.size
        ei = torch.tensor([[i, i + 1] for i in range(n - 1)]).t()
        return NodeGraph("tiny", torch.eye(n), torch.arange(n) % 2, torch.cat([ei, ei.flip(0)], dim=1),
                         [f"t{i}" for i in range(n)], ["even", "odd"])


class _TinyPlugin:
    @hookimpl
    def graphveil_data_sources(self):
        return {"tiny": _Tiny}


def test_a_third_party_source_on_the_run_host() -> None:
    host = PluginHost(autoload=False)
    host.register("graphveil.plugins.standard", "standard")
    host.register(_TinyPlugin(), "tiny_plugin")
    cfg = RunConfig.model_validate({**COMPONENTS, "data": {"source": "tiny", "size": 5, "max_entities": 4}})
    graph = load_data(cfg.data, host)
    assert graph.node_ids == ["t0", "t1", "t2", "t3"] and graph.notes["max_entities_dropped_edges"] == 1
    with pytest.raises(ConfigError, match=r"data\.size: Input should be greater than or equal to 2 \(got 1\)"):
        load_data(DataConfig(source="tiny", size=1), host)
    with pytest.raises(ConfigError, match=r"data\.sise: not an option of source 'tiny' \(its options: size\)"):
        create_data_source(DataConfig(source="tiny", sise=4), host)


def test_a_source_of_the_run_host_is_checked_by_its_own_options_when_the_run_is_assembled(tmp_path: Path) -> None:
    host = PluginHost(autoload=False)  # not the default host: the installed plugins know no 'tiny'
    host.register("graphveil.plugins.standard", "standard")
    host.register("graphveil.plugins.node_dp", "node_dp")  # the run's task, model, sampler, clipper, accountant
    host.register(_TinyPlugin(), "tiny_plugin")
    path = write(tmp_path, {"source": "tiny"})
    cfg = load_config(path)  # the config checks the shape only
    assert cfg.data.params == {}
    session = assembled(cfg, host)
    assert type(session.data_options.params) is _Tiny.Params and session.data_options.params.size == 3  # its default
    assert session.resolved_config()["data"]["size"] == 3
    assert session.load_data().node_ids == ["t0", "t1", "t2"]  # read with the validated options
    # tiny's own schema refuses a bad option when the run is assembled, naming the file and the key
    with pytest.raises(ConfigError, match=r"^" + re.escape(str(path)) + r": data: data\.size: Input should be "
                                          r"greater than or equal to 2 \(got 1\)$"):
        assembled(load_config(path, ["data.size=1"]), host)
    with pytest.raises(ConfigError, match=r"run\.yaml: data: data\.sise: not an option of source 'tiny' \(its options: size\)"):
        assembled(load_config(path, ["data.sise=4"]), host)
    # the same config on the installed plugins' host: its sources are all the run knows
    with pytest.raises(ConfigError, match=r"run\.yaml: data: data\.source: unknown data source 'tiny'; available: citeseer"):
        assembled(cfg)


@pytest.mark.slow  # a fresh interpreter importing GraphVeil
def test_reading_a_config_neither_imports_nor_builds_the_plugin_host(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = write(tmp_path, {"source": "nowhere_registered", "size": 0, "path": 3})  # any options: not checked yet
    code = ("import sys\n"
            "from graphveil.run.config import load_config\n"
            f"cfg = load_config({str(path)!r}, ['data.max_entities=5'])\n"
            "assert cfg.data.params == {'size': 0, 'path': 3}, cfg.data.params\n"
            "loaded = sorted(m for m in sys.modules if m == 'pluggy' or m.startswith(('graphveil.contract.host', "
            "'graphveil.plugins', 'graphveil.data', 'graphveil.connectors')))\n"
            "print(loaded)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_load_graph_gives_relational_graphs_for_node_sources() -> None:
    cfg = DataConfig.model_validate({**EXAMPLE_DATA, "max_entities": 1000})
    node = load_data(cfg)
    assert isinstance(node, NodeGraph) and node.node_ids == [str(i) for i in range(1000)]
    full = load_data(DataConfig.model_validate(EXAMPLE_DATA))
    kept = int(((full.edge_index < 1000).all(dim=0)).sum()) // 2
    assert node.num_undirected_edges == kept and node.notes["max_entities_dropped_edges"] == 5278 - kept
    rel = load_graph(cfg)
    assert isinstance(rel, RelationalGraph) and rel.num_edges == kept
    assert bool((rel.edges[:, 0] < rel.edges[:, 1]).all()) and rel.features.shape == (1000, 1433)
    assert torch.equal(rel.labels, node.y) and rel.entity_ids == node.node_ids
