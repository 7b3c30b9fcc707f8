"""Flower's tools run the GraphVeil way: their environment, saved connections, runs.

Everything here drives Flower through its own executables (``flwr``, ``flower-superlink``,
``flower-supernode``) found next to this interpreter, with :data:`FLOWER_ENV` set, so the
operator's commands, the tests and the benchmarks talk to a SuperLink exactly as a person
would with ``flwr``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

from graphveil.contract.errors import ConfigError, GraphVeilError

#: Environment every Flower process gets from these helpers (unless already set): no
#: telemetry, no update check, no ``uv sync`` of app dependencies at run time.
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


class FlowerError(GraphVeilError):
    """A Flower command failed or a federation run did not complete."""


def flower_env() -> dict[str, str]:
    """This process's environment with :data:`FLOWER_ENV` filled in where unset."""
    env = dict(os.environ)
    for key, value in FLOWER_ENV.items():
        env.setdefault(key, value)
    return env


def executable(name: str) -> str:
    """Path of a Flower tool; the one installed next to this interpreter (graphveil's environment) first."""
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.is_file() else shutil.which(name)
    if found is None:
        raise FlowerError(f"{name} not found: install flwr (pip install 'flwr>=1.41,<1.42')")
    return found


def existing_file(path: str | None, what: str) -> str:
    """``path`` made absolute, or :class:`ConfigError` naming ``what`` (a Flower process reads it later)."""
    if path is None or not Path(path).is_file():
        raise ConfigError(f"{what}: {path} is not a file")
    return str(Path(path).resolve())


def write_connection(name: str, address: str, ca: str | None, *, default: bool = False,
                     flwr_home: Path | None = None) -> Path:
    """Add a SuperLink connection to Flower's ``config.toml`` (``$FLWR_HOME``, default ``~/.flwr``)."""
    import tomli_w

    home = flwr_home or Path(os.environ.get("FLWR_HOME", Path.home() / ".flwr"))
    path = home / "config.toml"
    raw: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    links = raw.setdefault("superlink", {})
    entry: dict[str, Any] = {"address": address}
    if ca is None:
        entry["insecure"] = True
    else:
        entry["root-certificates"] = existing_file(ca, "--ca")
    links[name] = entry
    if default or "default" not in links:
        links["default"] = name
    home.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.partial")
    tmp.write_text(tomli_w.dumps(raw), encoding="utf-8")
    tmp.replace(path)
    return path


def _flwr_json(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run a ``flwr … --format json`` command; :class:`FlowerError` with flwr's own message if it failed."""
    proc = subprocess.run(argv, capture_output=True, text=True, env=flower_env(), timeout=timeout)
    # flwr prints JSON on stdout; keep only from the first "{" (it may print notes before).
    out = proc.stdout[proc.stdout.find("{"):] if "{" in proc.stdout else ""
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        data = {}
    if proc.returncode != 0 or not data.get("success", False):
        detail = (data.get("error-message") or proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise FlowerError(f"{' '.join(argv[1:3])} failed (exit {proc.returncode}): {detail}")
    return data


def start_run(app: Path, connection: str | None, run_config: list[str], timeout: float = 120.0) -> int:
    """``flwr run APP [CONNECTION] -c ...``; returns the run id."""
    argv = [executable("flwr"), "run", str(app)]
    if connection:
        argv.append(connection)
    for item in run_config:
        argv += ["--run-config", item]
    argv += ["--format", "json"]
    return int(_flwr_json(argv, timeout)["run-id"])


def run_status(run_id: int, connection: str | None, timeout: float = 60.0) -> dict[str, Any]:
    """``flwr list --run-id RUN_ID``: the run's row (``status`` is ``finished:completed`` when done)."""
    argv = [executable("flwr"), "list"]
    if connection:
        argv.append(connection)
    argv += ["--run-id", str(run_id), "--format", "json"]
    return _flwr_json(argv, timeout)["runs"][0]


def wait_for_run(run_id: int, connection: str | None, timeout: float, poll: float = 2.0,
                 max_poll: float = 30.0) -> dict[str, Any]:
    """Poll until the run's status is ``finished:*``; raise :class:`FlowerError` after ``timeout`` s.

    Each poll is a ``flwr list`` process (~1.8 s of CPU: Python and Flower's imports), so the wait
    between polls grows with the run's age — ``poll`` s at first, a tenth of the time waited so
    far later, at most ``max_poll`` s: a fixed 2 s kept most of a core busy for the whole run,
    taken from the training it waits for when both share a machine."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        status = run_status(run_id, connection)
        if str(status.get("status", "")).startswith("finished"):
            return status
        now = time.monotonic()
        if now > deadline:
            raise FlowerError(f"run {run_id} still {status.get('status')!r} after {timeout:.0f} s")
        time.sleep(min(max_poll, max(poll, 0.1 * (now - started)), max(0.0, deadline - now) + 0.01))
