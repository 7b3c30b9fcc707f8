"""``graphveil sweep`` and ``graphveil report``: a real tiny sweep through the CLI, then its report.

The sweep is a DP-MLP on the bundled Cora (4 steps, a 6-order RDP grid so that σ calibrates in
well under a second); the relational path is checked on one tiny private run of the tiny BERT.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image
import pytest
import yaml
from scipy import stats

from graphveil.apps.cli import main
from graphveil.apps.cli_report import build_report
from graphveil.apps.cli_sweep import parse_epsilons, parse_seeds
from graphveil.apps.report_accounting import RunAccounting, steps_grid, targets_grid
from graphveil.apps.report_data import ReportError, load_source
from graphveil.contract.errors import ConfigError
from graphveil.contract.host import default_host

#: the module's sweep (fixture ``swept``) runs once: its tests run on one xdist worker
pytestmark = pytest.mark.xdist_group("report-sweep")

ORDERS = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
NODE = {
    "name": "mlp-tiny",
    "data": {"source": "planetoid", "name": "cora",
             "split": {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.15, "seed": 0}},
    "task": {"name": "node_classification"},
    "model": {"name": "mlp", "hidden": 8, "layers": 2},
    "sampler": {"name": "node_uniform_wor", "batch_size": 64},
    "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
    "accountant": {"name": "node_rdp", "orders": ORDERS},
    "training": {"steps": 4, "optimizer": "adam", "lr": 0.01},
    "privacy": {"target_epsilon": 8},
    "sweep": {"target_epsilon": [99], "seeds": [7]},  # replaced by graphveil sweep's flags
}
RELATIONAL = {
    "name": "rel-tiny",
    "data": {"source": "citeseer", "max_entities": 500, "split": {"train_fraction": 0.6, "seed": 0}},
    "sampler": {"name": "entity_poisson_wor", "batch_size": 12, "k_neg": 2, "degree_cap": 4},
    "clipper": {"name": "freq_clip", "clip_norm": 1.0},
    "accountant": {"name": "coupled_rdp_freq", "orders": ORDERS},
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 16, "lora_layers": 1},
    "training": {"steps": 3, "lr": 0.01},
    "privacy": {"target_epsilon": 4.0},
    "evaluation": {"batch_size": 64},
    "seed": 0,
}


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """A real sweep through the CLI: ε ∈ {2, 8} × seeds {0, 1} plus the non-private baseline."""
    root = tmp_path_factory.mktemp("sweep")
    config = _write(root / "mlp.yaml", NODE)
    code = main(["sweep", str(config), "--epsilons", "2,8", "--seeds", "2", "--output", str(root / "out"),
                 "--no-progress"])
    assert code == 0
    return root / "out"


@pytest.fixture(scope="module")
def reported(swept: Path) -> dict:
    """The sweep's report, through the CLI (files) and build_report (the figure objects)."""
    assert main(["report", str(swept), "--no-progress"]) == 0
    return build_report([swept], swept.parent / "again", host=default_host())


def _cells(swept: Path) -> list[dict]:
    return [json.loads(line) for line in (swept / "results.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_sweep_runs_every_cell_with_the_flags_settings(swept: Path) -> None:
    cells = _cells(swept)
    assert [(c["target_epsilon"], c["seed"]) for c in cells] == [
        (2.0, 0), (2.0, 1), (8.0, 0), (8.0, 1), (None, 0), (None, 1)]  # the file's own sweep is replaced
    assert all(c["epsilon"] <= c["target_epsilon"] + 1e-9 for c in cells[:4])
    assert not (swept.parent / "out.partial").exists()


@pytest.mark.slow
def test_report_writes_valid_pngs_embedded_in_the_markdown(swept: Path, reported: dict) -> None:
    report = swept / "report"
    text = (report / "report.md").read_text()
    for name in ("utility_vs_epsilon.png", "epsilon_vs_steps.png", "sigma_vs_epsilon.png"):
        assert f"]({name})" in text
        pixels = matplotlib.image.imread(report / name)
        assert pixels.shape[0] >= 500 and pixels.shape[1] >= 900  # README-sized, really a PNG
        assert pixels.std() > 0.01  # not blank
    assert "test acc (%)" in text and "node_rdp" in text and "node/replacement/predictions" in text


@pytest.mark.slow
def test_table_ci_is_the_student_t_interval_over_seeds(swept: Path, reported: dict) -> None:
    cells = _cells(swept)
    for eps in (2.0, 8.0, None):
        values = [100 * c["test_accuracy"] for c in cells if c["target_epsilon"] == eps]
        mean = sum(values) / 2
        # t quantile × standard error; two equal values (it happens: fresh noise, a tiny test
        # set) have no spread, a half-width of 0 (scipy's t.interval gives NaN at scale 0)
        half = stats.t.ppf(0.975, 1) * stats.sem(values)
        setting = "non-private" if eps is None else f"ε = {eps:g}"
        line = next(r for r in reported["table"].splitlines() if f"| {setting} |" in r)
        assert f"| 2 | {mean:.2f} ± {half:.2f} |" in line, line
        if eps is not None:  # the claim: the largest ε of the row's runs, and the run's δ, σ range
            claimed = max(c["epsilon"] for c in cells if c["target_epsilon"] == eps)
            assert f"| {claimed:.3f} | 1e-05 |" in line


@pytest.mark.slow
def test_utility_figure_has_one_line_with_a_point_per_epsilon_and_the_baseline_band(reported: dict) -> None:
    ax = reported["figures"]["utility"].axes[0]
    (line,) = ax.containers  # one errorbar series: the private runs
    assert list(line.lines[0].get_xdata()) == [2.0, 8.0]
    rows = {r.target_epsilon: r for r in reported["rows"] if r.kind == "private"}
    assert list(line.lines[0].get_ydata()) == pytest.approx([100 * rows[e].stats["test_accuracy"][0] for e in (2.0, 8.0)])
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("non-private" in x for x in labels) and any("majority class" in x for x in labels)
    assert ax.get_xscale() == "log" and "ε" in ax.get_xlabel() and "%" in ax.get_ylabel()


@pytest.mark.slow
def test_epsilon_vs_steps_is_monotone_and_ends_at_the_runs_claim(swept: Path, reported: dict) -> None:
    ax = reported["figures"]["steps"].axes[0]
    curves = [ln for ln in ax.get_lines() if ln.get_linestyle() != "None"]
    assert len(curves) == 2  # one per target ε
    for curve, data in zip(curves, reported["curves"]["steps"], strict=True):
        ys = list(curve.get_ydata())
        assert all(a < b for a, b in zip(ys, ys[1:], strict=False))
        privacy = json.loads((Path(data["run_dir"]) / "privacy.json").read_text())
        assert list(curve.get_xdata())[-1] == privacy["steps"] == 4
        assert ys[-1] == pytest.approx(privacy["epsilon"], rel=1e-9)


@pytest.mark.slow
def test_sigma_vs_target_epsilon_is_decreasing_and_meets_the_runs(reported: dict) -> None:
    (curve,) = reported["curves"]["sigma"]  # node_rdp is the one accountant of this sampler/clipper
    assert curve["accountant"] == "node_rdp" and curve["targets"] == [1.0, 2.0, 8.0, 16.0]
    assert all(a > b for a, b in zip(curve["sigma"], curve["sigma"][1:], strict=False))
    for eps, sigma in curve["runs"]:  # each run's σ is the curve's value at its target
        assert sigma == pytest.approx(curve["sigma"][curve["targets"].index(eps)], rel=1e-9)
    ax = reported["figures"]["sigma"].axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"


@pytest.mark.slow
def test_a_stopped_sweep_resumes_from_its_complete_cells(swept: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    partial = tmp_path / "out.partial"
    shutil.copytree(swept, partial)  # as if stopped: results not written, one cell unfinished
    (partial / "results.jsonl").unlink()
    (partial / "table.txt").unlink()
    shutil.rmtree(partial / "report", ignore_errors=True)
    shutil.rmtree(partial / "eps8" / "seed1")
    kept = (partial / "eps2" / "seed0" / "evaluation.json").read_text()
    config = _write(tmp_path / "mlp.yaml", NODE)
    args = ["sweep", str(config), "--epsilons", "2,8", "--seeds", "2", "--output", str(out), "--no-progress"]
    assert main(args) == 0
    assert "resuming" in capsys.readouterr().out
    assert (out / "eps2" / "seed0" / "evaluation.json").read_text() == kept  # read, not run again
    cells = _cells(out)
    assert len(cells) == 6 and (out / "eps8" / "seed1" / "privacy.json").is_file()
    # a resumed sweep with other settings is refused, naming the field
    shutil.move(out, partial)
    code = main([*args, "--set", "training.lr=0.5"])
    assert code == 2 and "differs in: training" in capsys.readouterr().err


@pytest.mark.slow
def test_relational_run_is_reaccounted_from_its_recorded_profile(tmp_path: Path) -> None:
    out = tmp_path / "rel"
    assert main(["run", str(_write(tmp_path / "rel.yaml", RELATIONAL)), "--output", str(out), "--no-progress"]) == 0
    (cell,) = load_source(out).cells
    accounting = RunAccounting.of(cell, default_host())
    assert not accounting._public  # degree capping reads the data: the recorded profile is used
    eps = [accounting.epsilon_after(t) for t in (1, 2, 3)]
    assert eps[0] < eps[1] < eps[2] == pytest.approx(cell.privacy["epsilon"], rel=1e-9)
    # the curve the report draws: one accountant stepped from t to t, the same ε as fresh ones
    assert accounting.epsilons_after([1, 2, 3]) == pytest.approx(eps, rel=1e-12)
    assert accounting.epsilons_after([2, 3]) == pytest.approx(eps[1:], rel=1e-12)
    with pytest.raises(ValueError, match="increasing"):
        accounting.epsilons_after([2, 2])
    names = accounting.applicable_accountants()
    assert {"coupled_rdp", "coupled_rdp_freq"} <= set(names) and "edge_rdp" not in names
    sigmas = [accounting.calibrate(e) for e in (2.0, 4.0, 8.0)]
    assert sigmas[0] > sigmas[1] > sigmas[2]
    assert sigmas[1] == pytest.approx(cell.privacy["noise_multiplier"], rel=1e-9)
    report = build_report([out], tmp_path / "report", host=default_host())
    assert report["metric"] == "mrr" and "PREC@1" in report["table"]


def test_a_run_whose_claim_the_accountant_does_not_reproduce_is_refused(tmp_path: Path) -> None:
    """Tamper with a recorded ε: the curves would not describe the run, so none is drawn."""
    from graphveil.run.config import config_from_dict
    from graphveil.run.planning import PublicSizes, planned_account

    raw = {k: v for k, v in NODE.items() if k not in ("data", "sweep")}
    raw["privacy"] = {"noise_multiplier": 1.3, "delta": 1e-5}
    planned = planned_account(config_from_dict(raw), PublicSizes(nodes=500), host=default_host())
    run = tmp_path / "run"
    run.mkdir()
    privacy = {"private": True, "noise_multiplier": 1.3, "delta": 1e-5, "steps": 4, "accountant": "node_rdp",
               "training": "dp_sgd", "epsilon": planned["epsilon"], "num_units": 500, "releases": [],
               "dataset": {"nodes": 500}, "unit": "node/replacement/predictions"}
    (run / "config.resolved.yaml").write_text(yaml.safe_dump({**raw, "data": NODE["data"]}))
    (run / "evaluation.json").write_text(json.dumps({"test_accuracy": 0.5}))
    (run / "privacy.json").write_text(json.dumps(privacy))
    (cell,) = load_source(run).cells
    accounting = RunAccounting.of(cell, default_host())
    assert accounting.epsilon_after(4) == pytest.approx(planned["epsilon"], rel=1e-12)
    assert accounting.epsilons_after([1, 4]) == pytest.approx([accounting.epsilon_after(1), planned["epsilon"]], rel=1e-12)
    privacy["epsilon"] = planned["epsilon"] * 0.9
    (run / "privacy.json").write_text(json.dumps(privacy))
    (cell,) = load_source(run).cells
    with pytest.raises(ReportError, match="privacy.json claims"):
        RunAccounting.of(cell, default_host())


@pytest.mark.parametrize(("text", "expected"), [("1,2,4", [1.0, 2.0, 4.0]), (" 0.5 , 16", [0.5, 16.0])])
def test_parse_epsilons(text: str, expected: list[float]) -> None:
    assert parse_epsilons(text) == expected


@pytest.mark.parametrize(("text", "message"), [("0,1", "> 0"), ("1,x", "'x' is not a number"), ("inf", "> 0"),
                                               ("2,2", "twice")])
def test_parse_epsilons_refuses(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_epsilons(text)


def test_parse_seeds_count_or_list() -> None:
    assert parse_seeds("3") == [0, 1, 2] and parse_seeds("4,0,9") == [4, 0, 9]
    for bad in ("0", "a", "1,1", "-1,2"):
        with pytest.raises(ConfigError, match="--seeds"):
            parse_seeds(bad)


def test_grids() -> None:
    assert steps_grid(5) == [1, 2, 3, 4, 5]
    grid = steps_grid(1000, points=10)
    assert grid[0] == 1 and grid[-1] == 1000 and 8 <= len(grid) <= 10
    assert grid[:4] == [1, 6, 32, 178]  # geometric near the start: 1000^(k/4)
    assert targets_grid([4.0, 1.0, 16.0]) == [0.5, 1.0, 4.0, 16.0, 32.0]


def _cli_error(args: list[str], capsys) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_report_bad_input_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    assert "no such directory" in _cli_error(["report", str(tmp_path / "nope")], capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "neither a sweep folder" in _cli_error(["report", str(empty)], capsys)
    (empty / "results.jsonl").write_text("\n")
    assert "holds no results" in _cli_error(["report", str(empty)], capsys)
    (empty / "results.jsonl").write_text('{"run": "base", "mrr": 0.3}\n')
    assert "not a sweep cell" in _cli_error(["report", str(empty)], capsys)
    (tmp_path / "stopped.partial").mkdir()
    assert "unfinished sweep" in _cli_error(["report", str(tmp_path / "stopped")], capsys)
    assert not (empty / "report").exists()


def test_sweep_bad_flags_exit_2(tmp_path: Path, capsys) -> None:
    config = _write(tmp_path / "mlp.yaml", NODE)
    assert "--epsilons" in _cli_error(["sweep", str(config), "--epsilons", "-1", "--seeds", "1"], capsys)
    assert "--seeds" in _cli_error(["sweep", str(config), "--epsilons", "1", "--seeds", "x"], capsys)


def test_sweep_refuses_a_bad_data_option_before_its_folder_opens(tmp_path: Path, capsys) -> None:
    config = _write(tmp_path / "mlp.yaml", NODE)
    out = tmp_path / "out"
    err = _cli_error(["sweep", str(config), "--epsilons", "1", "--seeds", "1", "--output", str(out),
                      "--set", "data.name=pubmed"], capsys)
    assert f"{config}: data: data.name: Input should be 'cora' or 'citeseer' (got 'pubmed')" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.yaml"]  # no out, no out.partial to resume


@pytest.mark.slow
def test_report_refuses_mixed_metrics_and_unknown_metric(swept: Path, tmp_path: Path, capsys) -> None:
    rel = tmp_path / "rel"
    raw = {**RELATIONAL, "training": {"steps": 1, "lr": 0.01}}
    assert main(["run", str(_write(tmp_path / "rel.yaml", raw)), "--output", str(rel), "--no-progress"]) == 0
    capsys.readouterr()
    err = _cli_error(["report", str(swept), str(rel), "--output", str(tmp_path / "r")], capsys)
    assert "no common metric" in err and "test_accuracy" in err and "mrr" in err
    err = _cli_error(["report", str(swept), "--metric", "mrr", "--output", str(tmp_path / "r")], capsys)
    assert "--metric 'mrr'" in err and "test_accuracy" in err
    assert not (tmp_path / "r").exists()
    not_a_report = tmp_path / "busy"
    not_a_report.mkdir()
    (not_a_report / "notes.txt").write_text("mine")
    assert "not an earlier report" in _cli_error(["report", str(swept), "--output", str(not_a_report)], capsys)
    assert (not_a_report / "notes.txt").read_text() == "mine"


def test_a_nonprivate_run_without_steps_is_the_base_line(tmp_path: Path) -> None:
    from graphveil.apps.cli_report import utility_series
    from graphveil.apps.report_data import BASE, NONPRIVATE, Cell, Source, summarise

    def cell(kind_steps: int, private: bool, mrr: float, seed: int) -> Cell:
        privacy = {"private": private, "steps": kind_steps, "epsilon": 4.0 if private else "inf"}
        kind = "private" if private else (BASE if kind_steps == 0 else NONPRIVATE)
        return Cell(tmp_path, kind, 4.0 if private else None, seed, {"mrr": mrr}, privacy, {})

    source = Source(tmp_path, "demo", [cell(0, False, 0.30, 0), cell(30, False, 0.40, 0), cell(30, False, 0.44, 1),
                                       cell(30, True, 0.35, 0), cell(30, True, 0.37, 1)],
                    [("mrr", "MRR", ".4f")])
    rows = summarise([source], ["mrr"])
    assert [(r.kind, r.n) for r in rows] == [(BASE, 1), (NONPRIVATE, 2), ("private", 2)]
    series, levels = utility_series([source], rows, "mrr", 1.0)
    assert series[0].x == [4.0] and series[0].y == pytest.approx([0.36])
    base = next(lv for lv in levels if "base" in lv.label)
    assert base.style == "dotted" and base.value == pytest.approx(0.30)
    band = next(lv for lv in levels if "non-private" in lv.label)
    assert band.style == "band" and band.value == pytest.approx(0.42)
    assert band.half == pytest.approx(stats.t.ppf(0.975, 1) * stats.sem([0.40, 0.44]))
