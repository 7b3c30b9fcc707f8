"""``graphveil demo --task node``: paper 4's GDP rows on bundled Cora, the shared demo folder."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
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
