"""``graphveil privacy epsilon|calibrate`` for graph methods (``--config`` / ``--method``), without data.

* ε from the CLI equals ε in ``privacy.json`` of a real ``graphveil run`` of the same config on
  bundled Cora, for GAP, DPDGC (node and edge level), DP-MLP, RandEdge+SAGE and DP-GCN (σ given,
  and one calibrated σ): the CLI goes through the session's own assemble/bind/calibrate code;
* ``--method NAME`` is the bundled example's wiring (same components, same ε);
* nothing beyond public sizes is read: a component that reads data is refused by name;
* bad input exits 2 with one line naming the problem.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from _paths import REPO

from graphveil.apps.cli_privacy import METHOD_CONFIGS, main
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.units import PrivacyUnit
from graphveil.run.config import config_from_dict
from graphveil.run.planning import NotPublicError, PublicSizes, PublicTask, planned_account

ROOT = REPO
EXAMPLES = ROOT / "examples"
#: bundled Cora: training nodes of the random_node split (seed 0) and of planetoid_full; undirected edges
CORA_TRAIN, CORA_FULL_TRAIN, CORA_EDGES = 2030, 1208, 5278
EXAMPLE_OF = {"gap": "gap_cora.yaml", "dpdgc": "dpdgc_cora.yaml", "rand_edge_sage": "rand_edge_sage_cora.yaml",
              "dp_mlp": "dp_mlp_cora.yaml", "dp_gcn": "dp_gcn_cora.yaml", "dp_sage": "dp_sage_cora.yaml"}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


def _json(capsys: pytest.CaptureFixture[str], host: PluginHost, *argv: str) -> dict:
    assert main(["privacy", *argv, "--json"], host=host) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))


# ------------------------------------------------------------------ the CLI against real runs

TINY = ["--set", "sweep=null", "--set", "seed=1", "--set", "model.hidden=8"]
#: (example, run overrides, public sizes as CLI flags); every run a few steps on bundled Cora
RUNS: dict[str, tuple[str, list[str], list[str]]] = {
    "gap": ("gap_cora.yaml", [
        "training.epochs=null", "training.steps=3", "method.hidden=8", "method.encoder_training.epochs=0.1",
        "privacy.target_epsilon=null", "privacy.noise_multiplier=1.3"], ["--nodes", str(CORA_TRAIN)]),
    "dpdgc-node": ("dpdgc_cora.yaml", [
        "training.epochs=null", "training.steps=2", "method.hidden=8", "model.embedding_width=8",
        "method.embedding_training.epochs=0.05", "method.embedding_training.batch_size=64",
        "privacy.target_epsilon=null", "privacy.noise_multiplier=40"], ["--nodes", str(CORA_TRAIN)]),
    "dpdgc-edge": ("dpdgc_cora.yaml", [
        "training.epochs=null", "training.steps=2", "method.hidden=8", "model.embedding_width=8",
        "method.embedding_training.epochs=0.05", "method.embedding_training.batch_size=64",
        "privacy.target_epsilon=null", "privacy.noise_multiplier=2.5", "privacy.unit=edge/replacement/predictions"],
        ["--nodes", str(CORA_TRAIN), "--edges", str(CORA_EDGES)]),
    "dp_mlp": ("dp_mlp_cora.yaml", [
        "training.epochs=null", "training.steps=4", "privacy.target_epsilon=null", "privacy.noise_multiplier=0.9"],
        ["--nodes", str(CORA_TRAIN)]),
    "rand_edge_sage": ("rand_edge_sage_cora.yaml", ["training.steps=1", "privacy.target_epsilon=8"],
                       ["--nodes", str(CORA_TRAIN), "--edges", str(CORA_EDGES)]),
    "dp_sage": ("dp_sage_cora.yaml", [
        "training.epochs=null", "training.steps=3", "privacy.target_epsilon=null", "privacy.noise_multiplier=30"],
        ["--nodes", str(CORA_TRAIN)]),
    "dp_gcn-calibrated": ("dp_gcn_cora.yaml", [
        "training.epochs=null", "training.steps=20", "accountant.orders=[2, 4, 8, 16, 32, 64]"],
        ["--nodes", str(CORA_FULL_TRAIN)]),
    "dp_gcn": ("dp_gcn_cora.yaml", [
        "training.epochs=null", "training.steps=5", "privacy.target_epsilon=null", "privacy.noise_multiplier=2"],
        ["--nodes", str(CORA_FULL_TRAIN)]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(RUNS))
def test_cli_epsilon_equals_the_privacy_json_of_a_real_run(case: str, host: PluginHost, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from graphveil.apps.cli import main as graphveil

    example, overrides, sizes = RUNS[case]
    config = str(EXAMPLES / example)
    sets = [*TINY, *(a for o in overrides for a in ("--set", o))]
    torch.set_num_threads(1)
    out = tmp_path / "run"
    assert graphveil(["run", config, *sets, "--output", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    run = json.loads((out / "privacy.json").read_text())
    assert run["dataset"]["nodes"] == int(sizes[1])  # the public size the CLI is given is the run's

    cli = _json(capsys, host, "epsilon", "--config", config, *sizes, *sets)
    assert _close(cli["epsilon"], run["epsilon"]), (cli["epsilon"], run["epsilon"])
    assert _close(cli["noise_multiplier"], run["noise_multiplier"])
    assert (cli["delta"], cli["delta_rule"], cli["num_units"]) == (run["delta"], run["delta_rule"], run["num_units"])
    assert cli["releases"] == run["releases"] and cli["unit"] == run["unit"]
    assert cli["steps"] == run["steps"] and cli["training"] == run["training"]
    assert cli["sampling_profile"] == run["sampling_profile"]
    if case == "dp_gcn-calibrated":  # calibrate to the run's ε gives the run's σ back (same bisection)
        target = yaml.safe_load((EXAMPLES / example).read_text())["privacy"]["target_epsilon"]
        again = _json(capsys, host, "calibrate", "--config", config, *sizes, *sets, "--target-epsilon", str(target))
        assert _close(again["sigma"], run["noise_multiplier"]) and again["epsilon"] <= target + 1e-9


# ------------------------------------------------------------------ --method is the example's wiring

SECTIONS = ("method", "task", "model", "sampler", "clipper", "accountant")


@pytest.mark.parametrize("name", list(METHOD_CONFIGS))
def test_method_configs_wire_the_bundled_examples_components(name: str) -> None:
    example = yaml.safe_load((EXAMPLES / EXAMPLE_OF[name]).read_text())
    wiring = METHOD_CONFIGS[name]
    for section in SECTIONS:
        assert wiring[section]["name"] == example.get(section, {"name": "dp_sgd"})["name"], section
    for key in ("features", "graph"):
        assert wiring["task"].get(key) == example["task"].get(key)
    assert wiring["privacy"].get("unit") == example["privacy"].get("unit")
    assert set(wiring["training"]) == set(example["training"]) & {"steps", "epochs"}


#: --method NAME flags that match the example's non-default options, and a short run
METHOD_VS_CONFIG = {
    "gap": (["--nodes", str(CORA_TRAIN), "--sigma", "1.1", "--steps", "7",
             "--set", "method.encoder_training.epochs=0.2"], []),
    "dpdgc": (["--nodes", str(CORA_TRAIN), "--sigma", "30", "--steps", "5",
               "--set", "method.embedding_training.epochs=2"],
              ["--set", "method.embedding_training.batch_size=2030", "--set", "method.noise_scale=1000"]),
    "rand_edge_sage": (["--nodes", str(CORA_TRAIN), "--edges", str(CORA_EDGES)], ["--set", "privacy.target_epsilon=1"]),
    "dp_mlp": (["--nodes", str(CORA_TRAIN), "--sigma", "1.2", "--epochs", "3"], []),
    "dp_gcn": (["--nodes", str(CORA_FULL_TRAIN), "--sigma", "4", "--steps", "50"], ["--delta", "1e-5"]),
    "dp_sage": (["--nodes", str(CORA_TRAIN), "--sigma", "30", "--steps", "20"], []),
}


@pytest.mark.parametrize("name", list(METHOD_VS_CONFIG))
def test_method_flag_gives_the_example_configs_epsilon(name: str, host: PluginHost,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    common, method_only = METHOD_VS_CONFIG[name]
    by_method = _json(capsys, host, "epsilon", "--method", name, *common, *method_only)
    by_config = _json(capsys, host, "epsilon", "--config", str(EXAMPLES / EXAMPLE_OF[name]), *common)
    for key in ("epsilon", "noise_multiplier", "delta", "steps", "accounted_steps", "releases", "unit",
                "sampling_profile", "parts"):
        assert by_method[key] == by_config[key], key
    assert by_method["method"] == name and by_method["config"] is None


def test_flags_set_the_run_config(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, host, "epsilon", "--method", "gap", "--nodes", "500", "--batch-size", "50",
                "--epochs", "2", "--unit", "k_neighbor/replacement/k=3/D=10/predictions", "--sigma", "2",
                "--delta", "1e-7", "--set", "method.hops=3", "--set", "method.encoder_training.epochs=1")
    assert out["unit"] == PrivacyUnit.parse("k_neighbor/replacement/k=3/D=10/predictions").value
    assert out["sampling_profile"]["batch_size"] == 50 and out["sampling_profile"]["num_records"] == 500
    assert out["steps"] == out["accounted_steps"] == math.ceil(2 * 500 / 50)
    assert (out["delta"], out["delta_rule"]) == (1e-7, "explicit")
    parts = {p["name"]: p for p in out["parts"]}
    assert set(parts) == {"gap_encoder", "gap_aggregates", "training"}
    assert parts["gap_aggregates"]["sensitivity"] == pytest.approx(math.sqrt(4 * 10 + 3 * (3 + 4)))  # keyed cap
    hops2 = _json(capsys, host, "epsilon", "--method", "gap", "--nodes", "500", "--batch-size", "50",
                  "--epochs", "2", "--unit", "k_neighbor/replacement/k=3/D=10/predictions", "--sigma", "2",
                  "--delta", "1e-7", "--set", "method.hops=2", "--set", "method.encoder_training.epochs=1")
    assert hops2["epsilon"] < out["epsilon"]  # one hop fewer costs less


def test_table_names_method_unit_sizes_sigma_delta_epsilon_and_parts(host: PluginHost,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "calibrate", "--method", "dp_gcn", "--nodes", "1208", "--steps", "30",
                 "--target-epsilon", "4", "--delta", "1e-5"], host=host) == 0
    text = capsys.readouterr().out
    for word in ("dp_gcn", "graph/replacement", "1208 training nodes", "σ", "δ", "ε", "target ε", "training"):
        assert word in text, word
    assert not text.lstrip().startswith("{")


def test_a_release_with_its_own_noise_reports_no_sigma(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, host, "calibrate", "--method", "rand_edge_sage", "--nodes", "2030", "--edges", "5278",
                "--target-epsilon", "2")
    assert out["sigma_used"] is False and out["noise_multiplier"] == 0.0
    assert out["epsilon"] == 2.0 and out["accounted_steps"] == 0 and out["num_units"] == 5278


# ------------------------------------------------------------------ public sizes only


class _Peek(Mechanism):
    """A release whose event depends on the features: not computable from public sizes."""

    unit = PrivacyUnit.parse("node/replacement/predictions")

    def __init__(self, params: Any = None) -> None:
        self.params = params

    def calibrated(self) -> bool:
        return True

    def bind(self, task: Any) -> None:
        self.width = task.dataset.x.shape[1]

    def sensitivity(self) -> float:
        return 1.0

    def release(self, task: Any, noise: Any) -> Any:
        return None

    def event(self) -> Any:
        raise AssertionError("not reached")


class _PeekPlugin:
    @hookimpl
    def graphveil_mechanisms(self):
        return {"peek": _Peek}


def test_anything_beyond_public_sizes_is_refused_by_name() -> None:
    host = PluginHost()
    host.register(_PeekPlugin(), "peek")
    raw = yaml.safe_load((EXAMPLES / "dp_mlp_cora.yaml").read_text())
    raw.pop("sweep")
    raw["mechanisms"] = [{"name": "peek"}]
    with pytest.raises(NotPublicError, match="'x' of the graph"):
        planned_account(config_from_dict(raw), PublicSizes(nodes=100), host=host)


def test_the_stand_in_runs_the_tasks_own_code_on_public_sizes(host: PluginHost) -> None:
    from graphveil.plugins.dp_gcn.task import SplitNodeClassification
    from graphveil.plugins.node_classification.task import NodeClassification

    task = PublicTask(NodeClassification(), PublicSizes(nodes=7, edges=11))
    assert torch.equal(task.train_view, torch.arange(7))
    assert task.num_units(PrivacyUnit.parse("edge/replacement/predictions")) == 22  # both directions stored
    assert task.num_units(PrivacyUnit.parse("undirected_edge/replacement/predictions")) == 11
    assert task.num_units(PrivacyUnit.parse("node/replacement/predictions")) == 7
    assert task.params.features == "raw"  # options are public
    for read in (lambda: task.dataset.x, lambda: task.split.test, lambda: task.features(),
                 lambda: task.dataset.edge_index[0], lambda: task.train_graph.edge_index):
        with pytest.raises(NotPublicError):
            read()
    with pytest.raises(NotPublicError, match="--edges"):
        PublicTask(NodeClassification(), PublicSizes(nodes=7)).num_units(PrivacyUnit.parse("edge/replacement/predictions"))
    split = PublicTask(SplitNodeClassification(), PublicSizes(nodes=5))
    assert len(split.train_view.node_ids) == 5 and split.num_units(None) == 5


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("argv", "names"), [
    (["epsilon", "--method", "no_such_method", "--nodes", "100", "--sigma", "1"], "unknown method 'no_such_method'"),
    (["epsilon", "--method", "gap", "--sigma", "1"], "--nodes"),
    (["epsilon", "--config", str(EXAMPLES / "gap_cora.yaml"), "--sigma", "1"], "--nodes"),
    (["epsilon", "--method", "rand_edge_sage", "--nodes", "100", "--edges", "500",
      "--unit", "node/replacement/D=100/predictions", "--set", "privacy.target_epsilon=1"], "protects edges only"),
    (["epsilon", "--method", "gap", "--nodes", "100", "--sigma", "1", "--unit", "edge/add_remove"], "privacy.unit"),
    (["epsilon", "--method", "dp_mlp", "--nodes", "100", "--sigma", "1", "--unit", "edge/add_remove"], "privacy.unit"),
    (["epsilon", "--method", "dp_gcn", "--nodes", "100", "--sigma", "1", "--unit", "node/replacement/predictions"],
     "privacy.unit"),
    (["epsilon", "--method", "rand_edge_sage", "--nodes", "100", "--set", "privacy.target_epsilon=1"], "--edges"),
    (["epsilon", "--method", "rand_edge_sage", "--nodes", "100", "--edges", "500", "--sigma", "1"], "shared σ"),
    (["epsilon", "--method", "gap", "--nodes", "100"], "--sigma"),
    (["epsilon", "--method", "gap", "--nodes", "10", "--sigma", "1"], "batch_size 64 exceeds the 10 training nodes"),
    (["epsilon", "--method", "gap", "--nodes", "0", "--sigma", "1"], "--nodes"),
    (["epsilon", "--method", "gap", "--nodes", "100", "--sigma", "-1"], "--sigma"),
    (["calibrate", "--method", "gap", "--nodes", "100", "--target-epsilon", "0"], "--target-epsilon"),
    (["epsilon", "--method", "gap", "--nodes", "100", "--sigma", "1", "--delta", "2"], "--delta"),
    (["epsilon", "--method", "gap", "--nodes", "100", "--sigma", "1", "--steps", "3", "--epochs", "2"], "--epochs"),
    (["epsilon", "--method", "gap", "--nodes", "100", "--sigma", "1", "--set", "method.hops=0"], "method.hops"),
    (["epsilon", "--method", "gap", "--nodes", "100", "--sigma", "1", "--k-neg", "4"], "--k-neg"),
    (["epsilon", "--method", "gap", "--config", str(EXAMPLES / "gap_cora.yaml"), "--nodes", "100"], "--config"),
    (["epsilon", "--config", str(EXAMPLES / "no_such.yaml"), "--nodes", "100"], "no such config file"),
    (["epsilon", "--nodes", "100", "--sigma", "1"], "--method"),
    (["epsilon", "--method", "entity", "--unit", "edge/add_remove", "--nodes", "5000", "--edges", "20000",
      "--degree-cap", "3", "--k-neg", "2", "--sampling-rate", "1e-3", "--steps", "1", "--sigma", "1"], "--unit"),
    (["epsilon", "--method", "edge", "--sigma", "1", "--steps", "1", "--delta", "1e-5"], "--sampling-rate"),
    (["epsilon", "--method", "edge", "--sampling-rate", "0.1", "--steps", "1", "--delta", "1e-5"], "--sigma"),
])
def test_bad_input_exits_2_with_one_line_naming_the_problem(argv: list[str], names: str, host: PluginHost,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", *argv, "--json"], host=host) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    message = captured.err.strip()
    assert message.startswith("graphveil: error: ") and "\n" not in message
    assert names in message, message


def test_the_graphveil_command_runs_it_without_data() -> None:
    import os
    import subprocess
    import sys

    code = ("import sys, graphveil.data, graphveil.data.loaders\n"
            "def refuse(*a, **k): raise SystemExit('data was read')\n"
            "graphveil.data.load_data = graphveil.data.loaders.load_data = refuse\n"
            "from graphveil.apps.cli import main\n"
            "sys.exit(main(['privacy', 'epsilon', '--config', sys.argv[1], '--nodes', '2030', '--sigma', '1.5',"
            " '--steps', '10', '--set', 'method.encoder_training.epochs=0.5', '--json']))\n")
    done = subprocess.run([sys.executable, "-c", code, str(EXAMPLES / "gap_cora.yaml")], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["method"] == "gap" and out["releases"] == ["gap_encoder", "gap_aggregates"] and out["epsilon"] > 0
