"""End to end through the CLI: a tiny private run, bad input, the plugin listing, the quick demo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _toy import TINY

from graphveil.apps.cli import main


def write_config(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_private_run_writes_complete_run_directory(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    code = main(["run", str(write_config(tmp_path, TINY)), "--output", str(out), "--no-progress"])
    assert code == 0
    assert "PREC@1" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [
        "adapter", "config.resolved.yaml", "evaluation.json", "metrics.jsonl", "privacy.json"]
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["accountant"] == "coupled_rdp_freq" and privacy["steps"] == 4
    assert 0 < privacy["epsilon"] <= 8.0 + 1e-9
    assert privacy["noise_multiplier"] > 0
    # issue 6: CSPRNG noise, fresh sampling seed, δ by the default rule; no noise seed written
    assert privacy["noise"] == "csprng-4sum" and privacy["sampling_seed"] == "fresh"
    assert privacy["delta_rule"] != "explicit" and privacy["delta"] < 1 / privacy["num_units"]
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert resolved["seed"] is None and resolved["privacy"]["research_noise_seed"] is None
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "step" in x]
    assert [x["step"] for x in steps] == [1, 2, 3, 4]
    assert all(a["epsilon"] < b["epsilon"] for a, b in zip(steps, steps[1:], strict=False))
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert 0 <= evaluation["prec1"] <= evaluation["mrr"] <= 1
    assert not (tmp_path / "run.partial").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"privacy": {"target_epsilon": -1}}, "privacy.target_epsilon"),
        ({"privacy": {"target_epsilon": 1, "delta": 2}}, "privacy.delta"),
        ({"sampler": {"name": "entity_poisson_wor", "batch_size": 12, "k_neg": 2, "degree_cap": 0}}, "degree_cap"),
        ({"clipper": {"name": "freq_clip", "clip_norm": 0}}, "clip_norm"),
        ({"data": {"source": "edge_list", "path": "/nope/edges.csv", "entities": "/nope/e.csv"}}, "/nope/"),
        ({"accountant": {"name": "edge_rdp"}}, "edge_rdp"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, capsys, change, message) -> None:
    out = tmp_path / "run"
    code = main(["run", str(write_config(tmp_path, {**TINY, **change})), "--output", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert not out.exists() and not (tmp_path / "run.partial").exists()


def test_override_error_names_field(tmp_path: Path, capsys) -> None:
    code = main(["run", str(write_config(tmp_path, TINY)), "--set", "training.steps=-3"])
    assert code == 2
    assert "training.steps" in capsys.readouterr().err


def test_plugins_lists_components_with_plugin(capsys) -> None:
    from graphveil.contract.host import FAMILIES

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    for line in ("freq_clip", "[entity_dp]", "coupled_rdp_freq", "hf_lora", "[edge_dp]"):
        assert line in out
    headers = [line for line in out.splitlines() if not line.startswith(" ")]
    assert headers == [f"{family}s:" for family in FAMILIES]


def test_run_with_a_sweep_section_calls_run_sweep(tmp_path: Path, capsys, monkeypatch) -> None:
    import graphveil.run.runner as runner

    calls = []
    monkeypatch.setattr(runner, "run_sweep",
                        lambda config, host=None: calls.append(config) or {"table": "SWEEP", "run_dir": "d"})
    monkeypatch.setattr(runner, "run_training", lambda *a, **k: pytest.fail("a sweep ran run_training"))
    sweep = {**TINY, "sweep": {"target_epsilon": [1.0, None], "seeds": [0, 1]}}
    assert main(["run", str(write_config(tmp_path, sweep)), "--no-progress"]) == 0
    assert capsys.readouterr().out == "SWEEP\nsweep directory: d\n"
    assert len(calls) == 1 and calls[0].sweep.seeds == [0, 1]


@pytest.mark.slow
def test_quick_demo_prints_table(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--quick", "--output", str(tmp_path / "demo"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "FREQ-CLIP" in out and "edge-level" in out and "base encoder" in out
    rows = [json.loads(x) for x in (tmp_path / "demo" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 5
    private = [r for r in rows if "ε=" in r["name"]]
    assert all(r["epsilon"] <= 10.0 + 1e-9 for r in private)


def test_privacy_commands_through_the_main_cli(capsys) -> None:
    data = ["--method", "entity", "--clipping", "freq", "--nodes", "1000", "--edges", "5000",
            "--degree-cap", "5", "--k-neg", "4", "--sampling-rate", "0.01", "--steps", "100",
            "--delta", "1e-5", "--json"]
    assert main(["privacy", "epsilon", *data, "--sigma", "1.0"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epsilon"] > 0 and out["alpha"] > 1 and len(out["rdp"]) > 10
    assert main(["privacy", "calibrate", *data, "--target-epsilon", str(out["epsilon"])]) == 0
    calibrated = json.loads(capsys.readouterr().out)
    assert calibrated["epsilon"] <= out["epsilon"] * (1 + 1e-9)
    assert abs(calibrated["sigma"] - 1.0) < 0.01
    assert main(["privacy", "epsilon", *data, "--sigma", "1.0", "--delta", "1.5"]) == 2
    assert "1.5" in capsys.readouterr().err
