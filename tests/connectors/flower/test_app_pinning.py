"""App pinning at the site: a SuperNode runs only the GraphVeil app (FAB) its site approved.

A real SuperLink and one real SuperNode on loopback (TLS and node authentication on, started by
the deploy/ entrypoints). First the approved GraphVeil app runs one round. Then a modified app
with the same publisher and name (``flwr run`` accepts it: the Control API authenticates nothing)
ships a ClientApp that, at import and when called, writes a marker file with the site's node
config and deletes the site's ledger. The site's guard refuses its FAB before unpacking it: the
marker never appears, the ledger is byte-for-byte intact, the site log names the refusal and
the server receives an error reply.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphveil.connectors.flower.bundle import app_hash
from graphveil.connectors.flower.guard import BUNDLED, parse_approved
from graphveil.connectors.flower.loopback import (
    APP,
    BIN,
    CONNECTION,
    LoopbackFederation,
    toml_value,
    write_node_config,
)

pytestmark = [pytest.mark.federation, pytest.mark.slow]

SITE = "site-1"
RUN_CONFIG = {
    "num-server-rounds": 1, "local-steps": 2, "min-sites": 1, "round-timeout": 300.0,
    "task.encoder.model": "tiny-bert", "task.encoder.max_length": 16, "task.sampler.batch_size": 16,
    "task.privacy.noise_multiplier": 1.0, "task.evaluation.batch_size": 64,
}

EVIL_CLIENT_APP = '''\
"""A modified ClientApp: exfiltrate the node config, delete the ledger."""
import json
from pathlib import Path

from flwr.clientapp import ClientApp

MARKER = Path({marker!r})
LEDGER = Path({ledger!r})
MARKER.write_text("imported")   # runs as soon as the module is imported
app = ClientApp()


@app.train()
def train(msg, context):
    MARKER.write_text(json.dumps(dict(context.node_config)))
    LEDGER.unlink()
    return msg.create_reply(msg.content)
'''


@dataclass
class Pinning:
    loop: LoopbackFederation
    ledger: Path
    marker: Path
    ledger_after_good_run: str
    good: dict
    evil: dict
    evil_hash: str
    seconds: dict
    flwr_ls_via_fleet_port: subprocess.CompletedProcess
    flwr_ls_via_control_port: subprocess.CompletedProcess
    raw_status: dict


def _post(loop: LoopbackFederation, port: int, path: str) -> int:
    """HTTP status of an empty protobuf POST to the SuperLink side at ``port``."""
    import httpx

    res = httpx.post(f"https://127.0.0.1:{port}{path}", content=b"", verify=str(loop.certs / "ca.crt"),
                     headers={"content-type": "application/protobuf"}, timeout=30)
    return res.status_code


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(loop: LoopbackFederation, app: Path, out: Path, timeout: float = 600) -> dict:
    from graphveil.connectors.flower.control import start_run, wait_for_run

    overrides = " ".join(f"{k}={toml_value(v)}" for k, v in {**RUN_CONFIG, "output-dir": str(out)}.items())
    saved = dict(os.environ)
    os.environ.update(loop.env)  # FLWR_HOME with the loopback connection
    try:
        run_id = start_run(app, CONNECTION, [overrides])
        status = wait_for_run(run_id, CONNECTION, timeout)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    rounds = out / f"run-{run_id}" / "rounds.jsonl"
    return {"run-id": run_id, "status": status.get("status"),
            "rounds": [json.loads(x) for x in rounds.read_text().splitlines()] if rounds.is_file() else []}


@pytest.fixture(scope="module")
def pinning(tmp_path_factory) -> Pinning:
    from graphveil.connectors.flower.partition import write_partition
    from graphveil.data import load_bundled_citeseer

    root = tmp_path_factory.mktemp("pinning")
    loop = LoopbackFederation(root)
    loop.env["OMP_NUM_THREADS"] = "1"
    ledger, marker = root / "ledgers" / f"{SITE}.sqlite", root / "evil-ran.txt"
    seconds: dict[str, float] = {}
    try:
        loop.make_credentials([SITE])
        ((edges, entities),) = write_partition(load_bundled_citeseer(), 1, root / "data", seed=0)
        # approved-apps unset: the site approves exactly the app bundled with its GraphVeil.
        node_config = write_node_config(root / f"{SITE}.toml", {
            "site-name": SITE, "data-source": "edge_list", "data-path": str(edges),
            "data-entities": str(entities), "epsilon-budget": 50.0, "delta": 1e-5, "privacy-unit": "edge", "min-records": 64,
            "ledger": str(ledger), "seed": 1, "threads": 1})
        loop.start_server()
        # The Control API through the public (Fleet) port: flwr ls and a raw Control call.
        loop.command([BIN / "graphveil", "fed", "connect", "--name", "via-fleet-port", "--superlink",
                      f"127.0.0.1:{loop.port}", "--ca", loop.certs / "ca.crt"])
        via_fleet = subprocess.run([BIN / "flwr", "ls", "via-fleet-port", "--format", "json"], env=loop.env,
                                   capture_output=True, text=True, timeout=120)
        via_control = subprocess.run([BIN / "flwr", "ls", CONNECTION, "--format", "json"], env=loop.env,
                                     capture_output=True, text=True, timeout=120)
        raw = {port: _post(loop, port, "/v1/control/list-nodes") for port in (loop.port, loop.control_port)}
        raw["runtime"] = _post(loop, loop.port, "/v1/runtime/acquire-task")
        loop.register([SITE])
        loop.init_ledger(node_config)
        loop.start_site(SITE, node_config)
        loop.wait_online(1)

        t = time.monotonic()
        good = _run(loop, APP, root / "server-out")
        seconds["approved run"] = time.monotonic() - t
        ledger_after_good_run = _sha(ledger) if ledger.is_file() else ""

        evil_app = root / "evil" / "app"  # same folder name, publisher and project name
        shutil.copytree(APP, evil_app, ignore=shutil.ignore_patterns("__pycache__"))
        (evil_app / "graphveil_fed" / "client_app.py").write_text(
            EVIL_CLIENT_APP.format(marker=str(marker), ledger=str(ledger)))
        t = time.monotonic()
        evil = _run(loop, evil_app, root / "server-out")
        seconds["modified run"] = time.monotonic() - t
        print(f"\napp pinning: approved run {seconds['approved run']:.1f} s, "
              f"modified run refused in {seconds['modified run']:.1f} s")
        yield Pinning(loop, ledger, marker, ledger_after_good_run, good, evil, app_hash(evil_app), seconds,
                      via_fleet, via_control, raw)
    finally:
        loop.stop()


def test_the_approved_app_runs(pinning: Pinning) -> None:
    assert pinning.good["status"] == "finished:completed", pinning.loop.log(SITE)[-3000:]
    (round1,) = pinning.good["rounds"]
    assert [s["status"] for s in round1["sites"]] == ["trained"]
    assert pinning.ledger_after_good_run, "the approved run wrote no ledger"
    assert f"approved (FAB sha256 {app_hash()})" in pinning.loop.log(SITE)


def test_a_modified_app_is_refused_before_any_of_its_code_runs(pinning: Pinning) -> None:
    assert not pinning.marker.exists(), f"the modified ClientApp ran: {pinning.marker.read_text()}"
    assert pinning.ledger.is_file() and _sha(pinning.ledger) == pinning.ledger_after_good_run
    site_log = pinning.loop.log(SITE)
    assert f"REFUSED app graphveil/graphveil-fed 0.1.0: FAB sha256 {pinning.evil_hash}" in site_log
    assert pinning.evil_hash != app_hash()
    # The server saw a failed reply, not an update.
    statuses = [s for r in pinning.evil["rounds"] for s in r["sites"]]
    assert all(s["status"] != "trained" for s in statuses)
    assert any("app not approved by this site" in s.get("reason", "") for s in statuses), pinning.evil


def test_approved_apps_values(tmp_path: Path) -> None:
    bundled = app_hash()
    assert parse_approved(None) == parse_approved(BUNDLED) == {bundled}
    other = "ab" * 32
    assert parse_approved(f"{other.upper()}, {BUNDLED}") == {other, bundled}
    listing = tmp_path / "approved.txt"
    listing.write_text(f"# approved GraphVeil releases\n{other}  # 0.1.0\n")
    assert parse_approved(str(listing)) == {other}
    assert parse_approved("") == frozenset()
    for bad in ("abc", "relative/path.txt", str(tmp_path / "missing.txt")):
        with pytest.raises(ValueError):
            parse_approved(bad)


def test_the_control_api_is_not_reachable_on_the_fleet_port(pinning: Pinning) -> None:
    # flwr against the public port fails; against the operator-only SuperLink port it works.
    # (flwr --format json exits 0 either way and says "success".)
    via_fleet, via_control = (json.loads(p.stdout[p.stdout.find("{"):]) for p in
                              (pinning.flwr_ls_via_fleet_port, pinning.flwr_ls_via_control_port))
    assert via_fleet["success"] is False and "404 Not Found" in via_fleet["error-message"], via_fleet
    assert via_control["success"] is True, via_control
    assert pinning.raw_status[pinning.loop.port] == 404
    assert pinning.raw_status[pinning.loop.control_port] == 200  # unauthenticated Control call answered
    assert pinning.raw_status["runtime"] == 404  # the ServerApp's Runtime API is not exposed either
    # ...while the site joined, trained and was refused through the gateway (tests above).


def test_server_binds_the_superlink_to_loopback_by_default(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main

    for name in ("ca.crt", "server.pem", "server.key"):
        (tmp_path / name).write_text("x")
    assert main(["fed", "server", "--ca", str(tmp_path / "ca.crt"), "--cert", str(tmp_path / "server.pem"),
                 "--key", str(tmp_path / "server.key"), "--dry-run"]) == 0
    gateway, superlink = capsys.readouterr().out.strip().splitlines()
    assert "graphveil.connectors.flower.gateway --host 0.0.0.0 --port 8000 --upstream https://127.0.0.1:8001" in gateway
    assert "flower-superlink" in superlink and "--host 127.0.0.1 --port 8001" in superlink
    assert "--enable-supernode-auth" in superlink
