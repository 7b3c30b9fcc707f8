"""``run_sweep``: one complete run per (ε, seed), one table row per ε with mean ± 95 % CI."""

from __future__ import annotations

import json
import math

import pytest
from _toy import toy_nodes
from scipy import stats

from graphveil.run.config import config_from_dict
from graphveil.run.runner import mean_ci95, run_sweep


def test_mean_ci95_is_the_student_t_interval() -> None:
    values = [0.61, 0.64, 0.66, 0.63, 0.65]
    mean, half = mean_ci95(values)
    lo, hi = stats.t.interval(0.95, len(values) - 1, loc=sum(values) / 5, scale=stats.sem(values))
    assert mean == pytest.approx((lo + hi) / 2) and half == pytest.approx((hi - lo) / 2)
    assert math.isnan(mean_ci95([0.5])[1])


def test_a_sweep_runs_every_cell_and_summarises_each_epsilon(tmp_path) -> None:
    raw = {
        "name": "sweep-toy",
        "data": {"source": "planetoid", "split": {"kind": "random_node", "test_fraction": 0.2}},
        "task": {"name": "node_classification"},
        "model": {"name": "mlp", "hidden": 8, "layers": 2},
        "sampler": {"name": "node_uniform_wor", "batch_size": 16},
        "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
        "accountant": {"name": "node_rdp"},
        "training": {"epochs": 2, "optimizer": "adam", "lr": 0.01},
        "privacy": {"target_epsilon": 8},
        "output": {"dir": str(tmp_path / "sweep"), "progress": False},
        "sweep": {"target_epsilon": [4, None], "seeds": [0, 1]},
    }
    result = run_sweep(config_from_dict(raw), graph=toy_nodes())
    cells = [json.loads(line) for line in (result["run_dir"] / "results.jsonl").read_text().splitlines()]
    assert [(c["target_epsilon"], c["seed"]) for c in cells] == [(4.0, 0), (4.0, 1), (None, 0), (None, 1)]
    assert all(c["epsilon"] <= 4.0 for c in cells[:2]) and all(c["epsilon"] == "inf" for c in cells[2:])
    assert {c["name"] for c in cells} == {"sweep-toy-eps4-seed0", "sweep-toy-eps4-seed1",
                                          "sweep-toy-nonprivate-seed0", "sweep-toy-nonprivate-seed1"}
    for c in cells:  # every cell is a complete run directory with its own privacy report
        label = "nonprivate" if c["target_epsilon"] is None else "eps4"
        report = json.loads((result["run_dir"] / label / f"seed{c['seed']}" / "privacy.json").read_text())
        assert report["private"] is (c["target_epsilon"] is not None)
    # seeds really differ: the split key moves with the seed
    assert cells[0]["test_accuracy"] != cells[1]["test_accuracy"] or cells[0]["val_accuracy"] != cells[1]["val_accuracy"]
    rows = result["rows"]
    mean, half = rows[0]["test_accuracy"]
    expected = mean_ci95([cells[0]["test_accuracy"], cells[1]["test_accuracy"]])
    assert (mean, half) == pytest.approx(expected)
    table = result["table"]
    assert "ε = 4" in table and "non-private" in table and "test acc (%)" in table and "±" in table
