"""``graphveil fed simulate``: many virtual sites on Flower's Simulation Engine (issue 28 point 1).

The slow tests run the real thing: the CLI in a process of its own, Flower's simulation runtime
on Ray sized to this machine's cores, the bundled app's ServerApp and ClientApp. Ten Cora sites
(DP-MLP, paper 4's node level) for two rounds, site 10 with a budget that holds one round and
not two: it trains round 1 and refuses round 2 while the others go on; each ledger holds exactly
its own spends, checked against dp-accounting. A relational run (edge level, tiny BERT + LoRA
on CiteSeer split by communities) shows the same command runs the relational task. The fast
tests check how a virtual node finds its site's node config and that bad input exits 2 with
nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from graphveil.apps.cli import main
from graphveil.connectors.flower.settings import SITES_ENV, site_node_config

BIN = Path(sys.executable).parent
SIGMA, DELTA, LOCAL_STEPS, ROUNDS, SITES = 1.0, 1e-4, 3, 2, 10
UNIT = "node/replacement/D=168/predictions"
#: DP-MLP on Cora at paper 4's node level, small enough for ten sites on two cores.
NODE_CONFIG: dict = {
    "name": "sim-dp-mlp", "seed": 0,
    "data": {"source": "planetoid", "name": "cora"},
    "task": {"name": "node_classification"},
    "model": {"name": "mlp", "hidden": 16, "layers": 2, "seed": 0},
    "sampler": {"name": "node_uniform_wor", "batch_size": 32},
    "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
    "accountant": {"name": "node_rdp"},
    "training": {"lr": 0.01},
    "privacy": {"noise_multiplier": SIGMA, "unit": UNIT},
    "federation": {"local-steps": LOCAL_STEPS},
    "site": {"epsilon-budget": 50.0, "delta": DELTA, "privacy-unit": "node", "degree-bound": 168,
             "share-epsilon": True},
}
#: Edge-level relational fine-tuning: tiny BERT (built from its config, nothing downloaded) + LoRA.
RELATIONAL_CONFIG: dict = {
    "data": {"source": "citeseer", "split": {"train_fraction": 0.7, "seed": 3}},
    "sampler": {"name": "edge_poisson_decoupled", "batch_size": 16, "k_neg": 2},
    "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
    "accountant": {"name": "edge_rdp"},
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 16, "lora_layers": 1, "lora_rank": 2},
    "training": {"loss": "infonce", "optimizer": "adam", "lr": 0.002},
    "privacy": {"noise_multiplier": SIGMA},
    "federation": {"local-steps": 2},
    "site": {"epsilon-budget": 20.0, "delta": 1e-5, "privacy-unit": "edge", "min-records": 100,
             "prepared-cache": "off", "share-epsilon": True},
}


def _write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------ how a virtual node finds its site


def _listing(tmp_path: Path, names: list[str]) -> Path:
    listing = {}
    for i, name in enumerate(names):
        toml = tmp_path / f"{name}.toml"
        toml.write_text(f'site-name = "{name}"\nepsilon-budget = {i + 1}.0\n', encoding="utf-8")
        listing[str(i)] = str(toml)
    path = tmp_path / "sites.json"
    path.write_text(json.dumps(listing), encoding="utf-8")
    return path


def test_a_virtual_node_reads_the_node_config_of_its_own_partition(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(SITES_ENV, str(_listing(tmp_path, ["site-1", "site-2", "site-3"])))
    for pid, name in enumerate(["site-1", "site-2", "site-3"]):
        config = site_node_config({"partition-id": pid, "num-partitions": 3})
        assert config == {"site-name": name, "epsilon-budget": pid + 1.0}


def test_a_deployed_node_config_is_never_replaced(tmp_path, monkeypatch) -> None:
    """A SuperNode's own node config (it names its site) stays what its operator wrote, even with
    the variable set, and so does a simulated node's without it."""
    monkeypatch.setenv(SITES_ENV, str(_listing(tmp_path, ["site-1"])))
    deployed = {"site-name": "bank-a", "partition-id": 0, "num-partitions": 1}
    assert site_node_config(deployed) is deployed
    monkeypatch.delenv(SITES_ENV)
    simulated = {"partition-id": 0, "num-partitions": 1}
    assert site_node_config(simulated) is simulated


def test_a_partition_the_listing_lacks_is_a_clear_error(tmp_path, monkeypatch) -> None:
    from graphveil.contract.errors import ConfigError

    monkeypatch.setenv(SITES_ENV, str(_listing(tmp_path, ["site-1"])))
    with pytest.raises(ConfigError, match="no node config for simulated partition 4"):
        site_node_config({"partition-id": 4, "num-partitions": 5})


def test_the_clientapp_of_a_virtual_node_trains_as_its_site_into_its_ledger(
        tmp_path, monkeypatch, fresh_fake_sessions) -> None:
    """``handle_train`` with the node config Flower's simulation gives (a partition id only) trains
    as the site the listing names: its name in the reply, its spend in its own ledger only."""
    from _fed_support import RUN_CONFIG, FakeSession, site_context, train_content
    from _fed_support import node_config as make_node_config

    from graphveil.connectors.flower import records
    from graphveil.connectors.flower.site import handle_train
    from graphveil.ledger import PrivacyLedger

    sites = [make_node_config(tmp_path, name) for name in ("bank-a", "bank-b")]
    listing = {}
    for i, values in enumerate(sites):
        toml = tmp_path / f"{values['site-name']}.toml"
        toml.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()), encoding="utf-8")
        listing[str(i)] = str(toml)
    (tmp_path / "sites.json").write_text(json.dumps(listing), encoding="utf-8")
    monkeypatch.setenv(SITES_ENV, str(tmp_path / "sites.json"))
    context = site_context(7, {"partition-id": 1, "num-partitions": 2}, RUN_CONFIG)
    reply = handle_train(train_content(), context, session_factory=FakeSession)
    assert reply[records.SITE]["status"] == records.TRAINED and reply[records.SITE]["site-name"] == "bank-b"
    entries = {}
    for values in sites:
        with PrivacyLedger(values["ledger"], create=False) as ledger:
            entries[values["site-name"]] = [(e.site, e.status) for e in ledger.entries()]
    assert entries == {"bank-a": [], "bank-b": [("bank-b", "released")]}


# ------------------------------------------------------------------------------ bad input: exit 2, nothing written


def _simulate(capsys, *args: str) -> tuple[int, str]:
    code = main(["fed", "simulate", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("change", "args", "message"), [
    ({}, ["--sites", "0"], "--sites 0: a simulation needs at least 1 site"),
    ({}, ["--sites", "2", "--rounds", "0"], "--rounds 0: at least 1 round"),
    ({}, ["--sites", "2", "--cpus-per-site", "0"], "--cpus-per-site 0: give a number in (0,"),
    ({"site": {"delta": DELTA, "privacy-unit": "node", "degree-bound": 168}}, ["--sites", "2"],
     "node config of site-1 (site, sites.site-1): epsilon-budget"),
    ({"sites": {"site-3": {"epsilon-budget": 1.0}}}, ["--sites", "2"],
     "sites.site-3: no such site (the sites are site-1 … site-2)"),
    ({"federation": {"output-dir": "/tmp/x"}}, ["--sites", "2"], "federation.output-dir: a simulation writes under --out"),
    ({"privacy": {"noise_multiplier": SIGMA, "unit": UNIT, "delta": 1e-5}, "federation": {"locl-steps": 3}},
     ["--sites", "2"], "locl-steps"),
    ({}, ["--sites", "3000"], "--sites 3000 --partition random: number of sites must be in 1..2708"),
    ({}, ["--sites", "300", "--partition", "label-skew", "--alpha", "0.01"], "without nodes"),
])
def test_bad_input_exits_2_naming_the_problem_and_writes_nothing(tmp_path, capsys, change, args, message) -> None:
    config = _write(tmp_path / "sim.yaml", {**NODE_CONFIG, **change})
    out = tmp_path / "out"
    code, err = _simulate(capsys, str(config), *args, "--out", str(out))
    assert code == 2 and message in err, err
    assert not out.exists()


def test_a_missing_config_or_an_unknown_partition_exits_2(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, err = _simulate(capsys, str(tmp_path / "nope.yaml"), "--sites", "3", "--out", str(out))
    assert code == 2 and "nope.yaml: no such simulation config file" in err
    config = _write(tmp_path / "sim.yaml", NODE_CONFIG)
    with pytest.raises(SystemExit) as exc:  # argparse's own refusal of an unknown choice
        main(["fed", "simulate", str(config), "--sites", "3", "--partition", "by-colour", "--out", str(out)])
    assert exc.value.code == 2 and "invalid choice: 'by-colour'" in capsys.readouterr().err
    assert not out.exists()


def test_resources_per_site_become_flowers_client_resources_on_a_small_ray() -> None:
    from graphveil.connectors.flower.simulation import OBJECT_STORE_BYTES, Resources

    cores = len(os.sched_getaffinity(0))
    resources = Resources.checked(cores / 2, 0.0, sites=10)
    config = resources.backend_config()
    assert config["client_resources"] == {"num_cpus": cores / 2, "num_gpus": 0.0}
    assert config["init_args"]["num_cpus"] == cores and config["init_args"]["num_gpus"] == 0
    assert config["init_args"]["include_dashboard"] is False
    assert config["init_args"]["object_store_memory"] == OBJECT_STORE_BYTES
    assert resources.concurrent_sites == 2
    assert Resources.checked(cores, 0.0, sites=10).concurrent_sites == 1
    one = Resources.checked(1.0, 0.0, sites=1)  # Ray never gets more cores than the sites can use
    assert one.total_cpus == 1 and one.backend_config()["init_args"]["num_cpus"] == 1
    assert one.concurrent_sites == 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a CUDA GPU")
def test_a_gpu_share_without_a_gpu_exits_2(tmp_path, capsys) -> None:
    config = _write(tmp_path / "sim.yaml", NODE_CONFIG)
    code, err = _simulate(capsys, str(config), "--sites", "2", "--gpus-per-site", "0.5", "--out", str(tmp_path / "o"))
    assert code == 2 and "--gpus-per-site 0.5: this machine has 0 CUDA GPU(s)" in err
    assert not (tmp_path / "o").exists()


def test_the_shipped_example_plans_ten_sites_without_writing(tmp_path) -> None:
    """examples/simulation/dp_mlp_cora.yaml (not a `graphveil run` config, so outside the folder
    tests/run/test_examples.py loads): the task, ten node configs and the split all check out."""
    from _paths import REPO

    from graphveil.connectors.flower.simulation import plan

    p = plan(REPO / "examples" / "simulation" / "dp_mlp_cora.yaml", sites=10, rounds=2, out=tmp_path / "out")
    assert p.task_kind == "node_classification" and len(p.parts) == 10
    assert [c["epsilon-budget"] for c in p.node_configs] == [50.0] * 9 + [12.0]
    assert p.app_config["num-server-rounds"] == 2 and p.app_config["min-sites"] == 10
    assert not (tmp_path / "out").exists()


def test_an_output_folder_in_use_is_refused(tmp_path, capsys) -> None:
    config = _write(tmp_path / "sim.yaml", NODE_CONFIG)
    out = tmp_path / "out"
    out.mkdir()
    (out / "ledger.sqlite").write_text("a site's ledger")
    code, err = _simulate(capsys, str(config), "--sites", "2", "--out", str(out))
    assert code == 2 and "exists and is not an empty folder" in err
    assert [p.name for p in out.iterdir()] == ["ledger.sqlite"]


# ------------------------------------------------------------------------------ the real simulation (Ray)


def _run_cli(config: Path, out: Path, *args: str) -> tuple[dict, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    started = time.monotonic()
    proc = subprocess.run([str(BIN / "graphveil"), "fed", "simulate", str(config), *args, "--out", str(out),
                           "--json"], env=env, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - started
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(proc.stdout[proc.stdout.index("{"):]), seconds


def _node_session(node_config: Path, config: Path):
    """Site ``node_config``'s session (its graph read), as its ClientApp builds it."""
    from graphveil.connectors.flower.settings import (
        FederationSettings,
        SiteSettings,
        site_run_config,
    )
    from graphveil.connectors.flower.site import _real_session

    site = SiteSettings.from_toml(node_config)
    fed = FederationSettings.from_run_config(_app_config(config))
    session = _real_session(site_run_config(fed, site, seed=0))
    session.prepare_accounting()
    return session


def _app_config(config: Path) -> dict:
    from graphveil.connectors.flower.simulation import SimulationConfig, _federation

    sim = SimulationConfig.load(config)
    return {k: v for k, v in _federation(sim, SITES, ROUNDS, Path("/unused")).to_run_config().items()
            if v is not None}


def _site10_budget(tmp_path: Path, config: Path) -> float:
    """A budget between site 10's ε after one round and after two: its part of Cora, split as the
    simulation splits it (same function, same seed), read by the session its ClientApp builds."""
    from graphveil.connectors.flower.partition import write_node_graph
    from graphveil.connectors.flower.simulation import plan

    p = plan(config, sites=SITES, rounds=ROUNDS, out=tmp_path / "probe-out")
    graph = write_node_graph(p.parts[-1], tmp_path / "probe")
    values = {**p.node_configs[-1], "data-path": str(graph), "ledger": str(tmp_path / "probe" / "l.sqlite")}
    toml = tmp_path / "probe" / "node-config.toml"
    toml.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in values.items()), encoding="utf-8")
    session = _node_session(toml, config)
    one, two = session.projected_epsilon(LOCAL_STEPS), session.projected_epsilon(ROUNDS * LOCAL_STEPS)
    assert one < two
    return (one + two) / 2


@pytest.fixture(scope="module")
def node_simulation(tmp_path_factory):
    root = tmp_path_factory.mktemp("simulation")
    config = _write(root / "sim.yaml", NODE_CONFIG)
    budget = _site10_budget(root, config)
    config = _write(root / "sim.yaml", {**NODE_CONFIG, "sites": {"site-10": {"epsilon-budget": budget}}})
    summary, seconds = _run_cli(config, root / "out", "--sites", str(SITES), "--rounds", str(ROUNDS),
                                "--cpus-per-site", "1")
    print(f"\nsimulation: {SITES} sites × {ROUNDS} rounds in {seconds:.1f} s (CLI wall), "
          f"{summary['seconds']:.1f} s in Flower's simulation runtime")
    return root, config, summary, budget


def _rounds(summary: dict) -> list[dict]:
    return [json.loads(line) for line in (Path(summary["server-run"]) / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.simulation
def test_ten_virtual_sites_finish_two_rounds_and_the_small_budget_refuses_alone(node_simulation) -> None:
    root, _, summary, _ = node_simulation
    assert summary["status"] == "completed" and summary["sites"] == SITES
    assert summary["resources"]["concurrent-sites"] == min(len(os.sched_getaffinity(0)), SITES)
    rounds = _rounds(summary)
    assert [r["round"] for r in rounds] == [1, 2] and all(r["aggregated"] for r in rounds)
    names = [f"site-{i}" for i in range(1, SITES + 1)]
    status = [{s["site"]: s["status"] for s in r["sites"]} for r in rounds]
    assert status[0] == dict.fromkeys(names, "trained")
    assert status[1] == {**dict.fromkeys(names[:-1], "trained"), "site-10": "refused"}
    server = json.loads((Path(summary["server-run"]) / "summary.json").read_text())
    assert server["status"] == "completed" and server["rounds-aggregated"] == ROUNDS
    assert (Path(summary["server-run"]) / "adapter" / "model.pt").is_file()


@pytest.mark.slow
@pytest.mark.simulation
def test_each_ledger_holds_exactly_its_own_spends(node_simulation) -> None:
    """Each site's ledger: its own name and the run's id on every entry, one entry per round it was
    asked (released, or refused for site 10's second round), the steps it trained, and ε as
    dp-accounting composes DP-MLP's steps on the site's own part (b of n without replacement,
    replace-one, Gaussian σ/2); site 10 refused round 2 with its budget unspent."""
    import dp_accounting

    from graphveil.ledger import PrivacyLedger
    from graphveil.privacy import DEFAULT_ORDERS

    root, config, summary, budget = node_simulation
    for i in range(1, SITES + 1):
        name = f"site-{i}"
        folder = root / "out" / "sites" / name
        with PrivacyLedger(folder / "ledger.sqlite", create=False) as ledger:
            assert ledger.verify().ok and ledger.meta()["unit"] == UNIT
            entries, spent, steps = ledger.entries(), ledger.spent_epsilon(), ledger.total_steps()
        assert {(e.site, e.run) for e in entries} == {(name, str(summary["run-id"]))}
        assert [e.round for e in entries] == [1, 2]
        trained = ROUNDS if i < SITES else 1
        assert [e.status for e in entries] == ["released"] * trained + ["refused"] * (ROUNDS - trained)
        assert steps == trained * LOCAL_STEPS
        session = _node_session(folder / "node-config.toml", config)
        n, b = session.sampling_profile.num_records, session.sampling_profile.batch_size
        acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_ORDERS),
                                              dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(SIGMA / 2)),
                    trained * LOCAL_STEPS)
        assert spent == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)
        assert summary["site-ledgers"][name]["epsilon"] == pytest.approx(spent, rel=1e-12)
        if i == SITES:
            assert spent < budget < session.projected_epsilon(ROUNDS * LOCAL_STEPS)


@pytest.mark.slow
@pytest.mark.simulation
def test_the_relational_task_runs_on_the_same_command(tmp_path) -> None:
    config = _write(tmp_path / "sim.yaml", RELATIONAL_CONFIG)
    summary, _ = _run_cli(config, tmp_path / "out", "--sites", "2", "--rounds", "1", "--partition", "communities")
    assert summary["status"] == "completed" and summary["task-kind"] == "relational"
    site = tmp_path / "out" / "sites" / "site-1"
    assert (site / "edges.tsv").is_file()
    assert yaml.safe_load((site / "site-config.yaml").read_text()) == {"data": {"split": RELATIONAL_CONFIG["data"]["split"]}}
    assert f'site-config = "{site / "site-config.yaml"}"' in (site / "node-config.toml").read_text()
    ledgers = summary["site-ledgers"]
    assert {n: s["entries"] for n, s in ledgers.items()} == {"site-1": ["released"], "site-2": ["released"]}
    assert all(s["steps"] == 2 and s["epsilon"] > 0 for s in ledgers.values())
    (record,) = _rounds(summary)
    assert record["aggregated"] and {s["status"] for s in record["sites"]} == {"trained"}
    assert (Path(summary["server-run"]) / "adapter").is_dir()
