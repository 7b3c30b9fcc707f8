"""``graphveil demo --task node``: paper 4's GDP rows on bundled Cora, the shared demo folder."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import yaml
from _paths import REPO

from graphveil.apps import comparison, demo, demo_node
from graphveil.apps.cli import build_parser, main
from graphveil.contract.host import default_host
from graphveil.run.config import load_config
from graphveil.run.runner import sweep_cell


def _bench_gdp():
    spec = importlib.util.spec_from_file_location("bench_gdp", REPO / "bench" / "gdp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_task_defaults_to_relational() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).task == "relational"
    assert parser.parse_args(["demo", "--task", "node", "--quick"]).task == "node"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--task", "graph"])


def test_rows_are_the_benchmarks_cells_but_for_the_changes_they_name(tmp_path: Path) -> None:
    """Each demo row is bench/gdp.py's seed-0 cell of the same (setting, method), built from the
    example YAML there and from inline settings here; only the row's listed changes differ."""
    bench = _bench_gdp()
    host = default_host()
    by_row = {(s, m): (config, overrides, eps) for s, m, config, overrides, eps, _ in bench.ROWS}
    configs = demo_node.node_demo_configs(root=tmp_path, progress=False, host=host)
    assert [label for label, _, _ in configs] == [r.label for r in demo_node.ROWS]
    assert len({cfg.output.dir for _, cfg, _ in configs}) == len(configs)
    for row, (_, cfg, changes) in zip(demo_node.ROWS, configs, strict=True):
        config, overrides, eps = by_row[(row.setting, row.method)]
        assert eps == row.epsilon
        base = load_config(bench.EXAMPLES / config, ["data.name=cora", *overrides])
        expected = sweep_cell(base, eps, demo_node.SEED, tmp_path, host).model_dump(mode="json")
        got = cfg.model_dump(mode="json")
        for path in row.changes:  # the demo's own changes, named in the table
            keys, value = path.split("=", 1)[0].split("."), float(path.split("=", 1)[1])
            old, new = expected, got
            for k in keys[:-1]:
                old, new = old[k], new[k]
            assert new[keys[-1]] == value != old[keys[-1]]
            assert f"{keys[-1]} {old[keys[-1]]:g}→{value:g}" in changes
            new[keys[-1]] = old[keys[-1]]
        for side in (expected, got):
            del side["name"], side["output"]
        assert got == expected, row.label
        assert (changes == "–") == (not row.changes)
        if row.epsilon == 16.0:  # the node-level rows are the ones cut to fit in ten minutes
            assert cfg.training.epochs < 100


def test_every_row_states_the_unit_of_its_guarantee(tmp_path: Path) -> None:
    from graphveil.run.runner import planned_unit

    host = default_host()
    units = {label: planned_unit(cfg, host) for label, cfg, _ in demo_node.node_demo_configs(
        root=tmp_path, progress=False, host=host)}
    assert units["non-private GAP"] is None and units["non-private MLP"] is None
    assert units["edge ε=1 GAP"] == units["edge ε=1 DPDGC"] == "edge/replacement/predictions"
    assert units["node ε=16 DP-MLP"] == "node/replacement/predictions"
    assert units["node ε=16 GAP"] == units["node ε=16 DP-SAGE"] == "node/replacement/D=168/predictions"
    assert ("unit", "unit", "") in demo_node.COLUMNS


def test_quick_uses_one_epoch_per_stage_where_the_stage_exists(tmp_path: Path) -> None:
    for row, (_, cfg, changes) in zip(demo_node.ROWS, demo_node.node_demo_configs(True, tmp_path, False),
                                      strict=True):
        assert cfg.training.epochs == 1 and changes.startswith("quick")
        for stage in ("encoder_training", "embedding_training"):
            if stage in row.base.get("method", {}):
                assert cfg.method.params[stage]["epochs"] == 1


def test_an_existing_output_folder_is_refused_before_anything_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(comparison, "run_training", lambda *a, **k: pytest.fail("a row ran"))
    (tmp_path / "out").mkdir()
    assert main(["demo", "--task", "node", "--quick", "--output", str(tmp_path / "out")]) == 2
    assert "already exists" in capsys.readouterr().err


def test_a_failing_row_leaves_no_demo_folder(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def fail_second(cfg, **kwargs):
        calls.append(cfg.name)
        if len(calls) == 2:
            raise RuntimeError("row failed")
        return {"row": {"name": cfg.name, "test_accuracy": 0.5}, "table": "t\nrow", "session": None}

    monkeypatch.setattr(comparison, "run_training", fail_second)
    with pytest.raises(RuntimeError, match="row failed"):
        demo.run_demo(quick=True, output=tmp_path / "out", progress=False, task="node")
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


def test_markdown_table_cells() -> None:
    cols = [("name", "run", ""), ("acc", "acc", ".2%"), ("epsilon", "ε", ".3f")]
    rows = [{"name": "a", "acc": 0.5, "epsilon": math.inf}, {"name": "b", "acc": float("nan"), "epsilon": 1.0}]
    assert comparison.markdown_table(rows, cols).splitlines() == [
        "| run | acc | ε |", "|---|---|---|", "| a | 50.00% | ∞ |", "| b | - | 1.000 |"]


@pytest.mark.slow
def test_quick_node_demo_writes_every_row(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    assert main(["demo", "--task", "node", "--quick", "--output", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows] == [r.label for r in demo_node.ROWS]
    for spec, r in zip(demo_node.ROWS, rows, strict=True):
        assert 0.0 <= r["test_accuracy"] <= 1.0 and 0.0 < r["majority_accuracy"] < 1.0
        if spec.epsilon is None:
            assert r["epsilon"] == "inf"
        else:
            assert math.isfinite(r["epsilon"]) and 0 < r["epsilon"] <= spec.epsilon * (1 + 1e-6)
            assert r["noise_multiplier"] > 0
        assert r["changes"].startswith("quick")
        assert (out / spec.key / "evaluation.json").is_file()
    table_md = (out / "table.md").read_text()
    assert all(f"| {spec.label} |" in table_md for spec in demo_node.ROWS)
    assert (out / "table.txt").read_text().strip() in printed
    assert not any(p.name.endswith(".partial") for p in tmp_path.rglob("*"))


def test_changes_are_named_by_stage() -> None:
    raw = {"training": {"epochs": 100, "lr": 0.001}, "method": {"encoder_training": {"epochs": 100, "lr": 0.001}}}
    both = demo_node.faster("method.encoder_training", "training")
    assert demo_node.changes_text(both, raw) == "encoder + classifier: epochs 100→20, lr 0.001→0.003"
    assert demo_node.changes_text(["training.epochs=50"], raw) == "classifier: epochs 100→50"
    assert demo_node.changes_text([], raw) == "–"


# ------------------------------------------------------------------ the owner's node graph (--set data.…)


def write_pyg(path: Path, x, y, edge_index) -> Path:
    """A torch.save'd torch_geometric Data with x, y and edge_index and no masks, as an owner hands it over."""
    import torch
    from torch_geometric.data import Data

    torch.save(Data(x=x, y=y, edge_index=edge_index, num_nodes=x.shape[0]), path)
    return path


def cora_part(path: Path, nodes: int = 300) -> Path:
    """The first ``nodes`` nodes of bundled Cora (and the edges among them) as a pyg file."""
    import torch

    from graphveil.data import load_data

    cora = load_data(load_config(REPO / "examples" / "dp_mlp_cora.yaml").data)
    part = cora.subgraph(torch.arange(nodes))
    return write_pyg(path, part.x, part.y, part.edge_index)


def _no_row_may_run(monkeypatch) -> None:
    monkeypatch.setattr(comparison, "run_training", lambda *a, **k: pytest.fail("a row ran"))


def _demo(out: Path, *sets: str) -> list[str]:
    return ["demo", "--task", "node", "--quick", "--no-progress", "--output", str(out),
            *(f"--set={s}" for s in sets)]


def test_set_reaches_every_row_and_drops_the_bundled_source_options(tmp_path: Path) -> None:
    configs = demo_node.node_demo_configs(True, tmp_path, False, overrides=[
        "data.source=pyg", f"data.path={tmp_path / 'g.pt'}", "model.hidden=16", "training.lr=0.01"])
    assert len(configs) == len(demo_node.ROWS)
    for _, cfg, _ in configs:
        assert cfg.data.source == "pyg" and cfg.data.params == {"path": str(tmp_path / "g.pt")}  # as written
        assert cfg.data.split.kind == "random_node"  # the demo's split: no masks needed
        assert cfg.model.params["hidden"] == 16 and cfg.training.lr == 0.01
        assert cfg.training.epochs == 1  # --quick and --set together


@pytest.mark.parametrize(("sets", "message"), [
    (["nope.x=1"], "'nope.x=1': no row has that section"),
    (["model.nope=1"], "demo row 'non-private MLP'.*nope"),
    (["training.epochs"], "expected KEY=VALUE"),
])
def test_a_bad_set_exits_2_before_any_row_runs(tmp_path: Path, monkeypatch, capsys, sets, message) -> None:
    import re

    _no_row_may_run(monkeypatch)
    assert main(_demo(tmp_path / "out", *sets)) == 2
    assert re.search(message, capsys.readouterr().err) and list(tmp_path.iterdir()) == []


def test_a_graph_the_node_demo_cannot_read_exits_2_and_writes_nothing(tmp_path: Path, monkeypatch,
                                                                      capsys) -> None:
    """Missing file; a graph without features and labels; too few labelled classes on the
    training side; a node out-degree above the node-level rows' D: each refused with exit 2
    before any row runs, and no demo folder (nor its .partial) is left."""
    import torch

    from graphveil.data.node_split import node_sides

    _no_row_may_run(monkeypatch)
    out = tmp_path / "out"
    missing = tmp_path / "missing.pt"
    assert main(_demo(out, "data.source=pyg", f"data.path={missing}")) == 2
    assert f"{missing}: no such file" in capsys.readouterr().err

    edges = tmp_path / "edges.csv"
    edges.write_text("source,target\na,b\nb,c\n")
    (tmp_path / "nodes.csv").write_text("id,text\na,x\nb,y\nc,z\n")
    assert main(_demo(out, "data.source=edge_list", f"data.path={edges}",
                      f"data.entities={tmp_path / 'nodes.csv'}")) == 2
    assert "gave a relational graph" in capsys.readouterr().err

    n = 200
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, 8, generator=gen) + 0.1
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    ring = torch.cat([ring, ring.flip(0)], 1)
    sides = node_sides([str(i) for i in range(n)], 0.1, 0.15, demo_node.SEED)
    one_class = write_pyg(tmp_path / "one.pt", x, (sides > 0).long(), ring)  # every training node class 0
    assert main(_demo(out, "data.source=pyg", f"data.path={one_class}")) == 2
    err = capsys.readouterr().err
    assert "graph 'one' has 200 labelled nodes; the random_node split trains on" in err
    assert "of 1 class (node classification needs at least two)" in err

    star = torch.stack([torch.zeros(n - 1, dtype=torch.long), torch.arange(1, n)])  # node 0: degree 199
    hub = write_pyg(tmp_path / "hub.pt", x, torch.arange(n) % 3, torch.cat([star, star.flip(0)], 1))
    assert main(_demo(out, "data.source=pyg", f"data.path={hub}")) == 2
    err = capsys.readouterr().err
    assert "out-degree up to 199, above the degree bound of the node-level rows 'node ε=16 GAP'" in err
    assert "'node ε=16 DP-MLP'" not in err and "(D=168," in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edges.csv", "hub.pt", "nodes.csv", "one.pt"]


@pytest.mark.slow
def test_quick_node_demo_on_an_owners_pyg_graph_runs_every_row(tmp_path: Path, capsys) -> None:
    """The owner's graph (part of Cora saved as a pyg Data without masks) under every row of the
    table, each row's run reading that file, split by the demo's random_node split."""
    path = cora_part(tmp_path / "owner.pt")
    out = tmp_path / "demo"
    assert main(_demo(out, "data.source=pyg", f"data.path={path}")) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows] == [r.label for r in demo_node.ROWS]
    for spec, r in zip(demo_node.ROWS, rows, strict=True):
        resolved = yaml.safe_load((out / spec.key / "config.resolved.yaml").read_text())
        assert resolved["data"] == {**resolved["data"], "source": "pyg", "path": str(path)}
        assert "name" not in resolved["data"] and resolved["data"]["split"]["kind"] == "random_node"
        evaluation = json.loads((out / spec.key / "evaluation.json").read_text())
        assert 0.0 <= r["test_accuracy"] <= 1.0 and evaluation  # every row trained and was evaluated
        if spec.epsilon is not None:
            assert math.isfinite(r["epsilon"]) and 0 < r["epsilon"] <= spec.epsilon * (1 + 1e-6)
    assert "GraphVeil demo (node classification, paper 4's GDP methods): NodeGraph('owner', nodes=300" in printed
    assert (out / "table.md").read_text().startswith("node classification on graph 'owner'")
