"""A real federation on loopback: SuperLink + three SuperNodes as processes, TLS and node auth on.

Everything is started through the deploy/ scripts (certificates, site keys, key registration,
the SuperLink and SuperNode entrypoints) and the ``graphveil fed`` CLI, exactly as a deployment
does. Each site holds its own partition of the CiteSeer text graph; the encoder is tiny-bert.
Site 3's budget allows one round only, so it refuses round 2 and the run finishes with the
others. Every process the tests start is stopped by its process-group id at the end.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from graphveil.connectors.flower.loopback import (
    APP,
    BIN,
    LoopbackFederation,
    write_node_config,
)

pytestmark = [pytest.mark.federation, pytest.mark.slow]

ROUNDS, LOCAL_STEPS, DELTA = 2, 3, 1e-5
SITES = ("site-1", "site-2", "site-3")
RUN_CONFIG = {
    "num-server-rounds": ROUNDS, "local-steps": LOCAL_STEPS, "min-sites": 3, "round-timeout": 600.0,
    "task.encoder.model": "tiny-bert", "task.encoder.max_length": 16, "task.sampler.batch_size": 32,
    "task.privacy.noise_multiplier": 1.0, "task.evaluation.batch_size": 64,
}


@dataclass
class Federation:
    loop: LoopbackFederation
    run_dir: Path
    seconds: float
    budgets: dict[str, float]
    node_configs: dict[str, Path]

    @property
    def root(self) -> Path:
        return self.loop.root


def _site_session(node_config: Path, seed: int = 0):
    """A session configured exactly as the site builds it (for the independent checks)."""
    from graphveil.connectors.flower.settings import (
        FederationSettings,
        SiteSettings,
        site_run_config,
    )
    from graphveil.run.session import TrainingSession

    fed = FederationSettings.from_run_config(_app_run_config())
    session = TrainingSession(site_run_config(fed, SiteSettings.from_toml(node_config), seed=seed))
    session.prepare()
    return session


def _app_run_config() -> dict:
    import tomllib

    from flwr.common.config import flatten_dict

    raw = tomllib.loads((APP / "pyproject.toml").read_text())
    return {**flatten_dict(raw["tool"]["flwr"]["app"]["config"]), **RUN_CONFIG}


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> Federation:
    from graphveil.connectors.flower.partition import write_partition
    from graphveil.data import load_bundled_citeseer

    root = tmp_path_factory.mktemp("federation")
    loop = LoopbackFederation(root)
    loop.env["OMP_NUM_THREADS"] = "1"
    try:
        loop.make_credentials([*SITES, "intruder"])
        parts = write_partition(load_bundled_citeseer(), len(SITES), root / "data", seed=0)
        node_configs = {
            name: write_node_config(root / f"{name}.toml", {
                "site-name": name, "data-source": "edge_list", "data-path": str(edges),
                "data-entities": str(entities), "epsilon-budget": 50.0, "delta": DELTA,
                "privacy-unit": "edge", "min-records": 64, "share-epsilon": True, "share-utility-metrics": True,
                "ledger": str(root / "ledgers" / f"{name}.sqlite"), "seed": 1, "threads": 1})
            for name, (edges, entities) in zip(SITES, parts, strict=True)
        }
        # Site 3 may spend exactly one round: ε after LOCAL_STEPS steps, as its own accountant says.
        one_round = _site_session(node_configs["site-3"]).projected_epsilon(LOCAL_STEPS)
        budgets = {"site-1": 50.0, "site-2": 50.0, "site-3": one_round * (1 + 1e-6)}
        text = node_configs["site-3"].read_text().replace("epsilon-budget = 50.0", f"epsilon-budget = {budgets['site-3']!r}")
        node_configs["site-3"].write_text(text)

        loop.start_server()
        loop.register(SITES)
        for name in SITES:
            loop.init_ledger(node_configs[name])
            loop.start_site(name, node_configs[name])
        loop.wait_online(len(SITES))
        run_dir, seconds, _ = loop.run({**RUN_CONFIG, "output-dir": str(root / "server-out")})
        (root / "timing.json").write_text(json.dumps({"run_seconds": seconds}))
        print(f"\nloopback federation: {ROUNDS} rounds x {len(SITES)} sites in {seconds:.1f} s")
        yield Federation(loop, run_dir, seconds, budgets, node_configs)
    finally:
        loop.stop()


def _rounds(fed: Federation) -> list[dict]:
    return [json.loads(line) for line in (fed.run_dir / "rounds.jsonl").read_text().splitlines()]


def test_rounds_complete_and_the_spent_site_refuses(federation: Federation) -> None:
    rounds = _rounds(federation)
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    assert all(r["aggregated"] for r in rounds)
    statuses = [{s["site"]: s["status"] for s in r["sites"]} for r in rounds]
    assert statuses[0] == {n: "trained" for n in SITES}
    assert statuses[1] == {"site-1": "trained", "site-2": "trained", "site-3": "refused"}
    (refusal,) = [s for s in rounds[1]["sites"] if s["site"] == "site-3"]
    assert "past its budget" in refusal["reason"]
    summary = json.loads((federation.run_dir / "summary.json").read_text())
    assert summary["rounds"] == ROUNDS and summary["sites"]["site-3"]["status"] == "refused"


def test_global_adapter_changes(federation: Federation) -> None:
    from safetensors.torch import load_file

    from graphveil.connectors.flower.server import build_encoder
    from graphveil.connectors.flower.settings import FederationSettings

    encoder = build_encoder(FederationSettings.from_run_config(_app_run_config()))
    encoder.save(federation.root / "initial-adapter")
    initial = load_file(federation.root / "initial-adapter" / "adapter_model.safetensors")
    final = load_file(federation.run_dir / "adapter" / "adapter_model.safetensors")
    assert set(final) == set(initial) and final
    assert (federation.run_dir / "adapter" / "adapter_config.json").is_file()
    changed = [k for k in final if not torch.allclose(final[k], initial[k], atol=1e-7)]
    assert changed, "no adapter tensor changed in two rounds"
    assert any("lora_B" in k for k in changed)  # lora_B starts at zero


def test_each_ledger_matches_the_accountant_and_stays_within_budget(federation: Federation) -> None:
    from graphveil.ledger import PrivacyLedger

    trained_rounds = {"site-1": ROUNDS, "site-2": ROUNDS, "site-3": 1}
    for name in SITES:
        cfg_path = federation.node_configs[name]
        with PrivacyLedger(federation.root / "ledgers" / f"{name}.sqlite", create=False) as ledger:
            entries = ledger.entries()
            spent = ledger.spent_epsilon()
            assert [e.status for e in entries if e.status != "refused"] == ["released"] * trained_rounds[name]
            assert ledger.total_steps() == LOCAL_STEPS * trained_rounds[name]
        # independent: a fresh accountant of the same site, all its steps at once
        session = _site_session(cfg_path)
        session.accountant.step(noise_multiplier=session.noise_multiplier, num_steps=LOCAL_STEPS * trained_rounds[name])
        assert spent == pytest.approx(session.accountant.get_epsilon(DELTA), rel=1e-9)
        assert spent <= federation.budgets[name]
        # and the server was told the same number in the site's last trained reply
        last = [s for r in _rounds(federation) for s in r["sites"] if s["site"] == name and s["status"] == "trained"][-1]
        assert last["metrics"]["epsilon"] == pytest.approx(spent, rel=1e-12)
    with PrivacyLedger(federation.root / "ledgers" / "site-3.sqlite", create=False) as ledger:
        assert [e.status for e in ledger.entries()] == ["released", "refused"]


def test_the_server_witnessed_each_ledger_head_and_each_ledger_holds_them(federation: Federation) -> None:
    """Every reply carried its site's ledger head; the ServerApp kept them in the witness file next
    to the run folders, and ``graphveil budget verify --witness`` at each site finds them all."""
    from graphveil.ledger import PrivacyLedger
    from graphveil.ledger.witness import Witness

    path = federation.root / "server-out" / "ledger-witness.jsonl"
    witness = Witness(path)
    assert witness.sites().keys() == set(SITES) and not any(s["flagged"] for s in witness.sites().values())
    for name in SITES:
        ledger_path = federation.root / "ledgers" / f"{name}.sqlite"
        with PrivacyLedger(ledger_path) as ledger:
            head = ledger.witness_head()
        # one checkpoint per round: site-3 released round 1 and refused round 2 (a refuse row)
        assert [(o.seq, o.head) for o in witness.observations(name)][-1] == (ROUNDS, head.head)
        assert [o.seq for o in witness.observations(name)] == list(range(1, ROUNDS + 1))
        federation.loop.command([BIN / "graphveil", "budget", "verify", "--ledger", ledger_path, "--witness", path])


def test_server_received_only_adapters_and_scalars(federation: Federation) -> None:
    from graphveil.connectors.flower import records

    audit = [json.loads(line) for line in (federation.run_dir / "received.jsonl").read_text().splitlines()]
    assert len(audit) == ROUNDS * len(SITES)
    encoder_keys = None
    for line in audit:
        content = line["content"]
        assert set(content) <= {records.ARRAYS, records.METRICS, records.SITE}
        site = content[records.SITE]["values"]
        assert set(site) <= set(records.SITE_KEYS) and site["site-name"] in SITES
        metrics = set(content[records.METRICS]["values"])
        if site["status"] == "trained":
            keys = set(content[records.ARRAYS]["arrays"])
            assert all(".lora_A." in k or ".lora_B." in k for k in keys)
            encoder_keys = encoder_keys or keys
            assert keys == encoder_keys
            assert metrics == set(records.PRIVACY_METRICS) | set(records.UTILITY_METRICS)
        else:
            assert records.ARRAYS not in content and metrics == set(records.REFUSAL_METRICS)


def test_unregistered_supernode_is_rejected(federation: Federation) -> None:
    loop = federation.loop
    config = federation.root / "intruder.toml"
    shutil.copy(federation.node_configs["site-1"], config)
    config.write_text(config.read_text().replace("site-1.sqlite", "intruder.sqlite"))
    loop.init_ledger(config)  # a ledger of its own, so its SuperNode gets as far as the SuperLink
    ledger = (federation.root / "ledgers" / "intruder.sqlite").read_bytes()
    proc = loop.start_site("intruder", config, "--max-retries", "1")
    code = proc.wait(timeout=120)
    assert code != 0
    assert "Failed to activate SuperNode" in loop.log("intruder")
    assert "No SuperNode found with the given public key" in loop.log("superlink")
    assert len(loop.online()) == len(SITES)
    assert (federation.root / "ledgers" / "intruder.sqlite").read_bytes() == ledger  # never used


def test_fewer_sites_than_min_sites_fail_the_run_after_sites_timeout(federation: Federation) -> None:
    """Flower 1.41's FedAvg polls for min_available_nodes forever; with three SuperNodes online and
    min-sites = 4, the ServerApp gives up after sites-timeout, the run is marked failed, and the
    error names min-sites and the number connected. No site is asked anything."""
    import time

    before = {n: (federation.root / "ledgers" / f"{n}.sqlite").stat().st_mtime for n in SITES}
    started = time.monotonic()
    run_dir, _, status = federation.loop.run(
        {**RUN_CONFIG, "min-sites": 4, "sites-timeout": 5.0, "output-dir": str(federation.root / "short-out")},
        timeout=300, check=False)
    assert status["status"] == "finished:failed"
    assert time.monotonic() - started < 240  # ended, did not wait for the 300 s run timeout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds"] == 0
    assert "3 site(s) connected" in summary["error"] and "min-sites = 4" in summary["error"]
    assert "fewer than min-sites = 4" in federation.loop.run_log(status["run-id"])  # the ServerApp's log
    assert not (run_dir / "rounds.jsonl").exists()
    assert {n: (federation.root / "ledgers" / f"{n}.sqlite").stat().st_mtime for n in SITES} == before


# ------------------------------------------------------------------ the guard's fork server
_SENT = re.compile(r"task sent to fork server (\d+)")


def _group(pgid: int) -> dict[int, str]:
    """Live (non-zombie) processes of process group ``pgid``: pid -> command line."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            out[int(entry.name)] = cmdline
    return out


def test_every_task_was_forked_by_the_fork_server(federation: Federation) -> None:
    """Each site started one fork server, and every task (every approved FAB check) ran in a
    process it forked after its imports were done: none got a fresh process, so no round
    imported torch beside its training."""
    for name in SITES:
        log = federation.loop.log(name)
        servers = re.findall(r"fork server (\d+) started", log)
        assert len(servers) == 1, f"{name}: {servers}"
        sent = [int(m.group(1)) for m in _SENT.finditer(log)]
        assert sent and set(sent) == {int(servers[0])}, f"{name}: {sent}"
        assert "task given a fresh ClientApp process" not in log
        forked = re.findall(r"ClientApp process (\d+) forked for a task", log)
        assert len(forked) == len(sent) == log.count("approved (FAB sha256"), name
        assert len(set(forked)) == len(forked), f"{name}: a process ran two tasks: {forked}"
        imported = log.index(f"fork server {servers[0]}: imports done in")
        assert all(log.index(f"ClientApp process {pid} forked") > imported for pid in forked)


def test_no_fork_server_outlives_its_supernode(federation: Federation) -> None:
    """Runs last: stops site-1's SuperNode (SIGTERM to it alone) and SIGKILLs site-2's guard
    executor; the fork servers must exit by themselves (nothing signals their group)."""
    import os
    import signal
    import time

    procs = {n: federation.loop.processes[n] for n in ("site-1", "site-2")}
    for proc in procs.values():
        assert any("guard forkserver" in c for c in _group(proc.pid).values()), _group(proc.pid)
    (executor,) = [p for p, c in _group(procs["site-2"].pid).items() if "guard executor" in c]
    os.kill(procs["site-1"].pid, signal.SIGTERM)
    os.kill(executor, signal.SIGKILL)
    procs["site-1"].wait(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        left = {**_group(procs["site-1"].pid),
                **{p: c for p, c in _group(procs["site-2"].pid).items() if "guard forkserver" in c}}
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"still running after their SuperNode/executor stopped: {left}"
