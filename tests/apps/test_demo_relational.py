"""``graphveil demo`` (relational): settings, ``--set`` on every row, paired Δ vs base in results."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from graphveil.apps import comparison, demo
from graphveil.apps.cli import build_parser, main
from graphveil.contract.errors import ConfigError

KEYS = [key for key, _, _ in demo.ROWS]


def by_key(configs):
    return dict(zip(KEYS, (cfg for _, cfg in configs), strict=True))


def test_default_rows_and_settings_match_the_cli() -> None:
    parser = build_parser()
    action = next(a for a in parser._subparsers._group_actions[0].choices["demo"]._actions if a.dest == "setting")
    assert set(action.choices) == set(demo.SETTINGS) and action.default is None  # None: picked by the graph
    assert set(demo.READS) == set(demo.SETTINGS)
    rows = by_key(demo.demo_configs(progress=False))
    assert rows["base"].training.steps == 0 and rows["nonprivate"].training.steps > 0
    assert rows["base"].encoder.name == "frozen_head" and rows["base"].data.source == "planetoid"
    assert [r.privacy.enabled for r in rows.values()] == [False, False, True, True, True]
    lora = by_key(demo.demo_configs(progress=False, setting="citeseer-minilm-lora"))
    assert lora["nonprivate"].encoder.name == "hf_lora" and lora["edge"].data.source == "citeseer"


def test_set_reaches_every_row_and_row_specific_options_only_their_rows(tmp_path: Path) -> None:
    overrides = ["evaluation.batch_size=64", "training.steps=7", "training.lr=0.01",
                 "sampler.degree_cap=3", "clipper.clip_norm=0.5", "privacy.target_epsilon=4",
                 "privacy.delta=1e-6", "encoder.head=residual", "encoder.rank=8"]
    configs = demo.demo_configs(root=tmp_path, progress=False, overrides=overrides)
    rows = by_key(configs)
    for key, cfg in rows.items():
        assert cfg.evaluation.batch_size == 64 and cfg.training.lr == 0.01
        assert cfg.encoder.params["head"] == "residual" and cfg.encoder.params["rank"] == 8
        assert cfg.training.steps == (0 if key == "base" else 7)  # the base row stays untrained
        assert cfg.output.dir == tmp_path / key
    for key in ("base", "nonprivate", "entity_standard", "entity_freq"):
        assert rows[key].sampler.params["degree_cap"] == 3
    assert "degree_cap" not in rows["edge"].sampler.params
    for key in ("entity_standard", "entity_freq", "edge"):
        assert rows[key].clipper.params["clip_norm"] == 0.5
        assert rows[key].privacy.target_epsilon == 4 and rows[key].privacy.delta == 1e-6
    assert not rows["base"].privacy.enabled and not rows["nonprivate"].privacy.enabled
    labels = [label for label, _ in configs]
    assert labels[2:] == ["entity-level ε=4, standard clipping", "entity-level ε=4, FREQ-CLIP", "edge-level ε=4"]


def test_set_data_source_drops_the_bundled_source_options(tmp_path: Path) -> None:
    edges, entities = write_user_graph(tmp_path)
    rows = by_key(demo.demo_configs(progress=False, overrides=[
        "data.source=edge_list", f"data.path={edges}", f"data.entities={entities}",
        "data.source_col=a", "data.target_col=b", "data.text_col=title", "encoder.model=tiny-bert"]))
    for cfg in rows.values():
        assert cfg.data.source == "edge_list" and cfg.data.params["source_col"] == "a"
        assert "name" not in cfg.data.params  # planetoid's option went with the bundled source
        assert cfg.data.split.train_fraction == 0.7


@pytest.mark.parametrize(("overrides", "message"), [
    (["bogus.x=1"], "demo row 'base'.*bogus"),
    (["encoder.nope=1"], "nope"),
    (["training.steps"], "expected KEY=VALUE"),
    (["sampler.nope=1"], "'sampler.nope=1': no row has that option"),
    (["data.source=edge_list"], "data.path"),
])
def test_a_bad_set_is_a_clear_error(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        demo.demo_configs(progress=False, overrides=overrides)


def test_a_bad_set_exits_2_before_any_row_runs(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(comparison, "run_training", lambda *a, **k: pytest.fail("a row ran"))
    assert main(["demo", "--set", "encoder.nope=1", "--output", str(tmp_path / "out")]) == 2
    assert "nope" in capsys.readouterr().err and not (tmp_path / "out").exists()
    assert main(["demo", "--task", "node", "--setting", "cora-features", "--output", str(tmp_path / "o")]) == 2
    assert "relational demo's encoder" in capsys.readouterr().err and not (tmp_path / "o").exists()


def test_paired_fields_and_gain_kept() -> None:
    base = torch.tensor([1.0, 2.0, 4.0, 1.0])
    better = torch.tensor([1.0, 1.0, 2.0, 1.0])
    nonprivate = demo.paired_row_fields("nonprivate", better, base, None, seed=0)
    gain = (0.0 + 0.5 + 0.25 + 0.0) / 4
    assert nonprivate["mrr_delta"] == pytest.approx(gain) and "gain_kept" not in nonprivate
    assert nonprivate["mrr_delta_text"].startswith(f"{gain:+.4f} [")
    half = torch.tensor([1.0, 2.0, 2.0, 1.0])
    private = demo.paired_row_fields("edge", half, base, gain, seed=0)
    assert private["gain_kept"] == pytest.approx(0.25 / 4 / gain)
    assert demo.paired_row_fields("base", base, base, None, seed=0) == {}
    no_gain = demo.paired_row_fields("edge", half, base, -0.1, seed=0)
    assert "gain_kept" in no_gain and no_gain["gain_kept"] is None


def write_user_graph(root: Path) -> tuple[Path, Path]:
    """A user's graph as an edge list with its own column names and an entity table with titles."""
    gen = torch.Generator().manual_seed(3)
    n, words = 90, "graph privacy noise model entity budget relation text".split()
    edges = root / "edges.csv"
    with edges.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b"])
        for _ in range(400):
            u, v = torch.randint(0, n, (2,), generator=gen).tolist()
            if u != v:
                w.writerow([f"x{u}", f"x{v}"])
    entities = root / "entities.csv"
    with entities.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "title"])
        for i in range(n):
            w.writerow([f"x{i}", " ".join(words[(i * j) % len(words)] for j in range(1, 3 + i % 4))])
    return edges, entities


def test_the_table_runs_on_a_users_graph_with_set(tmp_path: Path, capsys) -> None:
    """A tiny real demo on an edge list: every row reads the user's graph, and results.jsonl has
    one object per row with the metrics, their intervals, the paired Δ vs base, ε, σ and time."""
    edges, entities = write_user_graph(tmp_path)
    out = tmp_path / "demo"
    sets = ["data.source=edge_list", f"data.path={edges}", f"data.entities={entities}",
            "data.source_col=a", "data.target_col=b", "data.text_col=title",
            "encoder.model=tiny-bert", "encoder.max_length=8", "training.steps=2",
            "sampler.batch_size=8", "sampler.k_neg=2", "evaluation.batch_size=16"]
    argv = ["demo", "--output", str(out), "--no-progress"]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["run"] for r in rows] == KEYS
    for r in rows:
        resolved = yaml.safe_load((out / r["run"] / "config.resolved.yaml").read_text())
        assert resolved["data"]["source"] == "edge_list" and resolved["data"]["path"] == str(edges)
        assert resolved["encoder"]["model"] == "tiny-bert"
        assert resolved["training"]["steps"] == (0 if r["run"] == "base" else 2)
        for key in ("prec1", "mrr", "prec1_ci", "mrr_ci", "epsilon", "sigma", "seconds"):
            assert key in r, key
        assert r["mrr_ci"][0] <= r["mrr"] <= r["mrr_ci"][1]
        if r["run"] != "base":
            lo, hi = r["mrr_delta_ci"]
            assert lo <= r["mrr_delta"] <= hi and "prec1_delta_ci" in r
        private = r["run"] not in ("base", "nonprivate")
        if private:
            assert r["sigma"] > 0 and 0 < r["epsilon"] <= 10.0 * (1 + 1e-6)
        else:  # no noise: σ null; non-private training has no guarantee (∞); the base row ran no mechanism
            assert r["sigma"] is None and r["epsilon"] == ("inf" if r["run"] == "nonprivate" else None)
        assert ("gain_kept" in r) == private
    table = (out / "table.md").read_text()
    assert "with --set data.source=edge_list" in table
    # no --setting: the text graph picked the text setting (MiniLM + LoRA's encoder), and said so
    picked = "citeseer-minilm-lora (picked for graph 'edges': entity texts, no features)"
    assert f"demo setting: {picked}" in printed
    assert "GraphVeil demo (relational, citeseer-minilm-lora)" in printed
    assert "Setting citeseer-minilm-lora: picked for graph 'edges'" in table.splitlines()[-1]
    assert all(yaml.safe_load((out / key / "config.resolved.yaml").read_text())["encoder"]["name"]
               == "hf_lora" for key in KEYS)
    assert "Cora" not in table.splitlines()[0]  # the caption does not name the bundled graph it replaced
    assert "ΔMRR vs base" in printed


def _no_row_may_run(monkeypatch) -> None:
    monkeypatch.setattr(comparison, "run_training", lambda *a, **k: pytest.fail("a row ran"))


def test_a_setting_that_does_not_fit_the_graph_exits_2_before_any_row(tmp_path: Path, monkeypatch,
                                                                       capsys) -> None:
    """An explicit --setting whose encoder reads what the graph lacks: refused naming what the
    graph has, before any row runs, and no demo folder (nor its .partial) is left."""
    _no_row_may_run(monkeypatch)
    edges, entities = write_user_graph(tmp_path)
    sets = ["data.source=edge_list", f"data.path={edges}", f"data.entities={entities}",
            "data.source_col=a", "data.target_col=b", "data.text_col=title"]
    out = tmp_path / "out"
    argv = ["demo", "--setting", "cora-features", "--output", str(out)]
    assert main([*argv, *(f"--set={s}" for s in sets)]) == 2
    err = capsys.readouterr().err
    assert "demo --setting cora-features: its encoder (frozen_head, model 'features') reads entity features" in err
    assert "graph 'edges' has entity texts, no features; use --setting citeseer-minilm-lora" in err
    # bundled Cora has features and no texts: the text setting does not fit it
    assert main(["demo", "--setting", "citeseer-minilm-lora", "--output", str(out),
                 "--set", "data.source=planetoid", "--set", "data.name=cora"]) == 2
    assert "reads entity texts, but graph 'cora' has entity features, no texts" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edges.csv", "entities.csv"]


def test_the_setting_is_picked_by_what_the_entities_carry() -> None:
    def graph(texts, features):
        return SimpleNamespace(name="g", texts=texts, features=features)

    x = torch.ones(2, 3)
    assert demo.pick_setting(graph(None, x))[0] == "cora-features"
    assert demo.pick_setting(graph(["a", "b"], x)) == (
        "cora-features", "picked for graph 'g': entity texts and features")
    assert demo.pick_setting(graph(["a", "b"], None)) == (
        "citeseer-minilm-lora", "picked for graph 'g': entity texts, no features")
    with pytest.raises(ConfigError, match="'g' has neither entity texts nor entity features"):
        demo.pick_setting(graph(None, None))


def test_a_missing_file_exits_2_and_writes_nothing(tmp_path: Path, monkeypatch, capsys) -> None:
    _no_row_may_run(monkeypatch)
    _, entities = write_user_graph(tmp_path)
    missing = tmp_path / "nope.csv"
    assert main(["demo", "--output", str(tmp_path / "out"), "--set", "data.source=edge_list",
                 "--set", f"data.path={missing}", "--set", f"data.entities={entities}",
                 "--set", "data.text_col=title"]) == 2
    assert str(missing) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edges.csv", "entities.csv"]
