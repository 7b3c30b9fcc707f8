"""A real federation on this machine's loopback, started through the deploy/ scripts.

Used by the loopback federation test and the federation benchmark (from a source checkout:
the scripts live in ``deploy/scripts``). It does what an operator and the sites do, with the
same scripts and CLI: make the CA/server certificate and site key pairs, start the SuperLink
(TLS and SuperNode authentication on), save a flwr connection, register the site keys, create
each site's ledger (``graphveil budget init``), start each site's SuperNode, and run the app
with ``graphveil fed run``.

Every process is started in its own session and stopped by its process-group id (so the
SuperExec and app processes Flower spawns stop with it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[4]
SCRIPTS = REPO / "deploy" / "scripts"
APP = Path(__file__).resolve().parent / "app"
BIN = Path(sys.executable).parent
CONNECTION = "loopback"


def free_port() -> int:
    """A TCP port nothing listens on right now (bind to port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def toml_value(value: Any) -> str:
    """A scalar as TOML (strings quoted, booleans lower-case), for node configs and ``--run-config``."""
    return json.dumps(value) if isinstance(value, str | bool) else repr(value)


def write_app(target: Path, config: Mapping[str, Any]) -> Path:
    """A copy of the bundled Flower app at ``target`` whose task (``task.*`` of
    ``[tool.flwr.app.config]``) is the one in ``config`` — e.g. a node-classification task, whose
    sections a run's ``--run-config`` could neither remove from the bundled relational task nor
    add (Flower overrides only keys the app defines). The bundled federation keys stay, ``config``'s
    replace them. Its FAB has another hash than the bundled app's: sites approve it explicitly
    (``approved-apps``)."""
    import tomllib

    from flwr.common.config import flatten_dict

    shutil.copytree(APP, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pyproject = target / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    bundled = flatten_dict(tomllib.loads(text)["tool"]["flwr"]["app"]["config"])
    values = {**{k: v for k, v in bundled.items() if not k.startswith("task.")}, **config}
    head = text[:text.index("[tool.flwr.app.config]")]
    body = "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())
    pyproject.write_text(f"{head}[tool.flwr.app.config]\n{body}", encoding="utf-8")
    return target


def write_node_config(path: Path, values: Mapping[str, Any]) -> Path:
    path.write_text("".join(f"{k} = {toml_value(v)}\n" for k, v in values.items()), encoding="utf-8")
    return path


class LoopbackFederation:
    """SuperLink + SuperNodes as local processes under ``root`` (logs in ``root/logs``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.logs = self.root / "logs"
        self.certs = self.root / "certs"
        self.keys = self.root / "keys"
        self.port = 0  # the public Fleet gateway
        self.control_port = 0  # the SuperLink itself (Control API), operator only
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = {
            **os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "FLWR_HOME": str(self.root / "flwr-home"), "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        }

    # ------------------------------------------------------------------------------ processes
    def __enter__(self) -> LoopbackFederation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def command(self, argv: Iterable[Any], timeout: float = 120) -> subprocess.CompletedProcess:
        argv = [str(a) for a in argv]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def start(self, name: str, argv: Iterable[Any], env: Mapping[str, str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen([str(a) for a in argv], env={**self.env, **env}, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.processes[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        """Stop every started process group: SIGTERM, then SIGKILL for what is left."""
        for proc in self.processes.values():
            _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # Flower's SuperExec and app processes too
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    # ------------------------------------------------------------------------------ set-up
    def make_credentials(self, site_names: Iterable[str]) -> None:
        """CA + server certificate for localhost, and one key pair per name."""
        self.command([SCRIPTS / "make-certs.sh", self.certs, "DNS:localhost", "IP:127.0.0.1"])
        for name in site_names:
            self.command([SCRIPTS / "make-site-key.sh", self.keys, name])

    def start_server(self, timeout: float = 60) -> None:
        # Sites dial the Fleet gateway (self.port); flwr uses the SuperLink's own port (control_port).
        self.port, self.control_port = free_port(), free_port()
        proc = self.start("superlink", [SCRIPTS / "superlink-entrypoint.sh"], {
            "GV_CERTS_DIR": str(self.certs), "GV_HOST": "127.0.0.1", "GV_PORT": str(self.port),
            "GV_CONTROL_PORT": str(self.control_port), "GV_DATABASE": str(self.root / "superlink.db")})
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the SuperLink exited with {proc.returncode}:\n{self.log('superlink')[-3000:]}")
            with socket.socket() as s, socket.socket() as c:
                if s.connect_ex(("127.0.0.1", self.port)) == 0 and c.connect_ex(("127.0.0.1", self.control_port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the SuperLink does not listen on {self.port} after {timeout} s")
            time.sleep(0.3)
        self.command([BIN / "graphveil", "fed", "connect", "--name", CONNECTION, "--superlink",
                      f"127.0.0.1:{self.control_port}", "--ca", self.certs / "ca.crt", "--default"])

    def register(self, site_names: Iterable[str]) -> None:
        self.command([SCRIPTS / "register-sites.sh", CONNECTION, *(self.keys / f"{n}.pub" for n in site_names)])

    def init_ledger(self, node_config: Path) -> None:
        """The site operator's one-time step: ``graphveil budget init`` for the node config's
        ``ledger`` (and ``ledger-anchor``), bound to its ``site-name``."""
        import tomllib

        values = tomllib.loads(Path(node_config).read_text(encoding="utf-8"))
        argv = [BIN / "graphveil", "budget", "init", "--ledger", values["ledger"], "--site", values["site-name"]]
        if "ledger-anchor" in values:
            argv += ["--anchor", values["ledger-anchor"]]
        self.command(argv)

    def start_site(self, name: str, node_config: Path, *extra: str, key: str | None = None,
                   process_name: str | None = None) -> subprocess.Popen:
        return self.start(process_name or name, [SCRIPTS / "supernode-entrypoint.sh", *extra], {
            "GV_SUPERLINK": f"127.0.0.1:{self.port}", "GV_NODE_CONFIG": str(node_config),
            "GV_CA": str(self.certs / "ca.crt"), "GV_SITE_KEY": str(self.keys / f"{key or name}.key"),
            "GV_HOST": "127.0.0.1", "GV_PORT": str(free_port())})

    def online(self) -> list[dict[str, Any]]:
        out = self.command([BIN / "flwr", "supernode", "list", CONNECTION, "--format", "json"]).stdout
        return [n for n in json.loads(out[out.find("{"):])["nodes"] if n["status"] == "online"]

    def run_log(self, run_id: int | str) -> str:
        """What the run's apps logged (the ServerApp's log lines), as ``flwr log --show`` prints it."""
        proc = self.command([BIN / "flwr", "log", str(run_id), CONNECTION, "--show"])
        return proc.stdout + proc.stderr

    def wait_online(self, count: int, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while len(self.online()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} SuperNodes online after {timeout} s")
            time.sleep(1)

    # ------------------------------------------------------------------------------ runs
    def run(self, run_config: Mapping[str, Any], timeout: float = 900,
            check: bool = True, app: Path = APP) -> tuple[Path, float, dict[str, Any]]:
        """``graphveil fed run --wait``; returns (server run folder, seconds, Flower's run status).

        ``check=False`` returns a run that finished but failed (its status says ``finished:failed``)
        instead of raising."""
        overrides = " ".join(f"{k}={toml_value(v)}" for k, v in run_config.items())
        started = time.monotonic()
        proc = subprocess.run(
            [str(BIN / "graphveil"), "fed", "run", "--connection", CONNECTION, "--app", str(app),
             "--run-config", overrides, "--wait", "--timeout", str(timeout), "--json"],
            env=self.env, capture_output=True, text=True, timeout=timeout + 120)
        seconds = time.monotonic() - started
        if proc.returncode != 0 and (check or not proc.stdout.strip().startswith("{")):
            logs = "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.processes)
            raise RuntimeError(f"federation run failed:\n{proc.stdout}\n{proc.stderr}\n{logs}")
        status = json.loads(proc.stdout)
        output = Path(run_config.get("output-dir", "graphveil-fed"))
        return output / f"run-{status['run-id']}", seconds, status


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
