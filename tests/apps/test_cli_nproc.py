"""``graphveil run --nproc N`` (issue 28.2): data-parallel DP-SGD through torchrun, rank 0 writes.

The slow test runs the CLI's tiny private relational run (FREQ-CLIP: the clipper reads batch
statistics) once in one process and once in two gloo processes with the same sampling seed and
``privacy.research_noise_seed``; the adapters must agree to float tolerance and ε must be the
same. SGD keeps the update linear in the noise, so noise added on both ranks (twice the
variance) or a missing all-reduce moves the weights far beyond the tolerance.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _paths import REPO
from _toy import TINY

from graphveil.apps.cli import main

SEEDED = {**TINY, "seed": 3, "training": {"steps": 3, "optimizer": "sgd", "lr": 2.0},
          "privacy": {"target_epsilon": 8.0, "research_noise_seed": 7}}


def write_config(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def adapter(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run / "adapter" / "adapter_model.safetensors")


@pytest.mark.slow
def test_two_processes_train_what_one_process_trains(tmp_path: Path, capfd) -> None:
    config = write_config(tmp_path, SEEDED)
    assert main(["run", str(config), "--output", str(tmp_path / "one"), "--no-progress"]) == 0
    assert main(["run", str(config), "--output", str(tmp_path / "two"), "--no-progress", "--nproc", "2"]) == 0
    one, two = tmp_path / "one", tmp_path / "two"
    # rank 1 wrote nothing: the folder holds the config and the two run directories only
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "run.yaml", "two"]
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    a, b = adapter(one), adapter(two)
    assert a.keys() == b.keys()
    for key in a:
        assert (a[key] - b[key]).abs().max() <= 1e-5 + 1e-4 * a[key].abs().max(), key
    # the steps moved the weights far beyond that tolerance (LoRA's B starts at 0)
    assert max(float(a[k].abs().max()) for k in a if "lora_B" in k) > 1e-2
    p1, p2 = (json.loads((run / "privacy.json").read_text()) for run in (one, two))
    assert p1["epsilon"] == p2["epsilon"] and p1["steps"] == p2["steps"] == 3
    assert p1["noise_multiplier"] == p2["noise_multiplier"] > 0
    steps = [[json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in x]
             for run in (one, two)]
    assert [s["batch_size"] for s in steps[0]] == [s["batch_size"] for s in steps[1]]
    assert [s["step"] for s in steps[1]] == [1, 2, 3]  # one line per step: rank 0's
    assert "2 processes" in capfd.readouterr().out  # rank 0's line, through torchrun


@pytest.mark.parametrize(
    ("config", "args", "message"),
    [
        (TINY, ["--nproc", "0"], "--nproc 0"),
        ({**TINY, "privacy": {"enabled": False}}, ["--nproc", "2"], "trains without privacy"),
        ({k: v for k, v in yaml.safe_load((REPO / "examples" / "dp_mlp_cora.yaml").read_text()).items()
          if k != "sweep"}, ["--nproc", "2"], "does not split its batches"),
        ({**TINY, "sweep": {"target_epsilon": [4.0], "seeds": [1]}}, ["--nproc", "2"], "sweep"),
    ],
    ids=["zero", "nonprivate", "node-method", "sweep"],
)
def test_runs_that_cannot_be_split_exit_2_and_write_nothing(tmp_path: Path, capsys, config, args,
                                                            message) -> None:
    out = tmp_path / "run"
    code = main(["run", str(write_config(tmp_path, config)), "--output", str(out), "--no-progress", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.yaml"]


def test_an_existing_output_is_refused_before_launching(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    out.mkdir()
    code = main(["run", str(write_config(tmp_path, TINY)), "--output", str(out), "--nproc", "2"])
    assert code == 2 and "already exists" in capsys.readouterr().err
    assert list(out.iterdir()) == []
