"""``graphveil budget`` and ``graphveil fed``: the privacy ledger and Flower process helpers.

``graphveil fed server`` and ``graphveil fed site`` check their inputs, then *become*
``flower-superlink`` / ``flower-supernode`` (``exec``: same PID, signals reach Flower) with TLS
and SuperNode authentication always on. ``graphveil fed run`` wraps ``flwr run`` and can wait
for the run to finish. The Flower app itself lives in ``graphveil.connectors.flower``; this
module never imports it (framework never imports connectors) and only locates its folder.

A site's node config (:class:`SiteSettings`) is defined here so the CLI can check it before
Flower starts, and the ClientApp reads it with the same model.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from graphveil.config import PositiveFinite, Probability
from graphveil.errors import ConfigError, GraphVeilError

#: Environment every Flower process gets from these helpers (unless already set): no
#: telemetry, no update check, no ``uv sync`` of app dependencies at run time.
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


class FlowerError(GraphVeilError):
    """A Flower command failed or a federation run did not complete."""


# --------------------------------------------------------------------------------------------
# A site's node config
# --------------------------------------------------------------------------------------------


class SiteSettings(BaseModel):
    """What a data owner sets for its SuperNode (``--node-config site.toml``).

    Keys use Flower's dashed style. Of these, only ``site-name``, ``epsilon-budget`` and ``delta``
    are ever reported to the server (see deploy/RUNBOOK.md, "What leaves the site").
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    site_name: str = Field(alias="site-name", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                           description="Name the site reports to the server.")
    data_source: Literal["edge_list", "citeseer_tape", "pyg", "citeseer"] = Field(
        "edge_list", alias="data-source", description="Loader for the site's graph (see data.source).")
    data_path: Path | None = Field(None, alias="data-path",
                                   description="Edge file (edge_list), folder (citeseer_tape) or .pt file (pyg).")
    data_entities: Path | None = Field(None, alias="data-entities", description="Entity table (edge_list).")
    epsilon_budget: PositiveFinite = Field(alias="epsilon-budget",
                                  description="Total ε this site will ever release, across rounds and runs.")
    delta: Probability | None = Field(None, description="δ of the budget; default 1/|Ē| of the site's training graph.")
    ledger: Path = Field(description="The site's privacy ledger (SQLite), kept across runs.")
    site_config: Path | None = Field(None, alias="site-config",
                                     description="Optional YAML overriding sections of the run's task (e.g. data.split).")
    min_noise_multiplier: PositiveFinite | None = Field(
        None, alias="min-noise-multiplier", description="Refuse rounds asking for a smaller σ.")
    share_utility_metrics: bool = Field(
        True, alias="share-utility-metrics",
        description="Report tuples used and held-out MRR (not privatized) to the server.")
    seed: int | None = Field(None, description="Reproducible per-round seeds (testing); default: fresh OS randomness.")
    threads: int | None = Field(None, gt=0, description="torch threads for local training.")

    @field_validator("data_path", "data_entities", "ledger", "site_config")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        # The ClientApp runs in a working directory of Flower's choosing.
        if v is not None and not v.is_absolute():
            raise ValueError("must be an absolute path")
        return v

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "node config") -> SiteSettings:
        """Validate a (flat) node config; errors name the source, the key and the value."""
        try:
            settings = cls.model_validate(dict(values))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"])
            if first["type"] == "extra_forbidden":  # loc is then the key as given
                known = ", ".join(sorted(f.alias or n for n, f in cls.model_fields.items()))
                raise ConfigError(f"{source}: unknown key {field!r} (known: {known})") from exc
            info = cls.model_fields.get(field)
            key = info.alias if info is not None and info.alias else field
            if first["type"] == "missing":
                raise ConfigError(f"{source}: {key}: required key is missing") from exc
            msg = first["msg"].removeprefix("Value error, ")
            raise ConfigError(f"{source}: {key}: {msg} (got {first.get('input')!r})") from exc
        if settings.data_source != "citeseer" and settings.data_path is None:
            raise ConfigError(f"{source}: data-path is required for data-source {settings.data_source!r}")
        if settings.data_source == "edge_list" and settings.data_entities is None:
            raise ConfigError(f"{source}: data-entities is required for data-source 'edge_list'")
        return settings

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> SiteSettings:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such node config file")
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
        return cls.from_mapping(_flatten(raw), str(path))

    def check_files(self) -> None:
        """Refuse missing data files or an unwritable ledger folder (before Flower starts)."""
        for key, value in (("data-path", self.data_path), ("data-entities", self.data_entities),
                           ("site-config", self.site_config)):
            if value is not None and not value.exists():
                raise ConfigError(f"node config: {key}: {value} does not exist")
        folder = self.ledger.parent
        if self.ledger.exists() and not self.ledger.is_file():
            raise ConfigError(f"node config: ledger: {self.ledger} is not a file")
        if folder.exists() and not os.access(folder, os.W_OK):
            raise ConfigError(f"node config: ledger: folder {folder} is not writable")

    def data_section(self) -> dict[str, Any]:
        """The ``data`` fields of a run config for this site's graph."""
        out: dict[str, Any] = {"source": self.data_source}
        if self.data_path is not None:
            out["path"] = str(self.data_path)
        if self.data_entities is not None:
            out["entities"] = str(self.data_entities)
        return out


def _flatten(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


# --------------------------------------------------------------------------------------------
# budget show
# --------------------------------------------------------------------------------------------


def cmd_budget_show(args: argparse.Namespace) -> int:
    from graphveil.ledger import PrivacyLedger, format_summary

    with PrivacyLedger(args.ledger, create=False) as ledger:
        summary, entries = ledger.summary(), ledger.entries()
    if args.json:
        print(json.dumps({"summary": summary, "entries": [e.as_dict() for e in entries]}, indent=2))
    else:
        print(format_summary(summary, entries))
    return 0


# --------------------------------------------------------------------------------------------
# fed: Flower processes
# --------------------------------------------------------------------------------------------


def _flower_env() -> dict[str, str]:
    env = dict(os.environ)
    for key, value in FLOWER_ENV.items():
        env.setdefault(key, value)
    return env


def _executable(name: str) -> str:
    # Prefer the tool installed next to this interpreter (the same environment as graphveil).
    local = Path(sys.executable).with_name(name)
    found = str(local) if local.is_file() else shutil.which(name)
    if found is None:
        raise FlowerError(f"{name} not found: install flwr (pip install 'flwr>=1.41,<1.42')")
    return found


def _existing(path: str | None, what: str) -> str:
    if path is None or not Path(path).is_file():
        raise ConfigError(f"{what}: {path} is not a file")
    return str(Path(path).resolve())


def _become(argv: list[str], dry_run: bool) -> int:
    if dry_run:
        print(" ".join(_quote(a) for a in argv))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, _flower_env())
    return 0  # pragma: no cover


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def server_command(args: argparse.Namespace) -> list[str]:
    """``flower-superlink`` with TLS and SuperNode authentication on."""
    ca = _existing(args.ca, "--ca")
    cert = _existing(args.cert, "--cert")
    key = _existing(args.key, "--key")
    argv = [
        _executable("flower-superlink"),
        "--ssl-ca-certfile", ca, "--ssl-certfile", cert, "--ssl-keyfile", key,
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host", args.host, "--port", str(args.port),
    ]
    if args.database:
        Path(args.database).parent.mkdir(parents=True, exist_ok=True)
        argv += ["--database", str(args.database)]
    return argv


def site_command(args: argparse.Namespace) -> list[str]:
    """``flower-supernode`` with TLS, its authentication key and the checked node config."""
    settings = SiteSettings.from_toml(args.node_config)
    settings.check_files()
    argv = [
        _executable("flower-supernode"),
        "--superlink", args.superlink,
        "--root-certificates", _existing(args.ca, "--ca"),
        "--auth-supernode-private-key", _existing(args.key, "--key"),
        "--node-config", str(Path(args.node_config).resolve()),
        "--host", args.host, "--port", str(args.port),
    ]
    if args.max_retries is not None:
        argv += ["--max-retries", str(args.max_retries)]
    return argv


def cmd_fed_server(args: argparse.Namespace) -> int:
    return _become(server_command(args), args.dry_run)


def cmd_fed_site(args: argparse.Namespace) -> int:
    return _become(site_command(args), args.dry_run)


def bundled_app_dir() -> Path:
    """Folder of the Flower app project (``pyproject.toml`` with ``[tool.flwr.app]``)."""
    # find_spec locates the package without importing it (framework never imports connectors).
    spec = importlib.util.find_spec("graphveil.connectors")
    for root in (spec.submodule_search_locations or []) if spec else []:
        app = Path(root) / "flower" / "app"
        if (app / "pyproject.toml").is_file():
            return app
    raise FlowerError("the GraphVeil Flower app folder is not installed (graphveil.connectors.flower/app)")


def cmd_fed_app_dir(args: argparse.Namespace) -> int:
    print(bundled_app_dir())
    return 0


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
        entry["root-certificates"] = _existing(ca, "--ca")
    links[name] = entry
    if default or "default" not in links:
        links["default"] = name
    home.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".toml.partial")
    tmp.write_text(tomli_w.dumps(raw), encoding="utf-8")
    tmp.replace(path)
    return path


def cmd_fed_connect(args: argparse.Namespace) -> int:
    path = write_connection(args.name, args.superlink, args.ca, default=args.default)
    print(f"SuperLink connection {args.name!r} -> {args.superlink} written to {path}")
    return 0


def _flwr_json(argv: list[str], timeout: float) -> dict[str, Any]:
    proc = subprocess.run(argv, capture_output=True, text=True, env=_flower_env(), timeout=timeout)
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
    argv = [_executable("flwr"), "run", str(app)]
    if connection:
        argv.append(connection)
    for item in run_config:
        argv += ["--run-config", item]
    argv += ["--format", "json"]
    return int(_flwr_json(argv, timeout)["run-id"])


def run_status(run_id: int, connection: str | None, timeout: float = 60.0) -> dict[str, Any]:
    argv = [_executable("flwr"), "list"]
    if connection:
        argv.append(connection)
    argv += ["--run-id", str(run_id), "--format", "json"]
    return _flwr_json(argv, timeout)["runs"][0]


def wait_for_run(run_id: int, connection: str | None, timeout: float, poll: float = 2.0) -> dict[str, Any]:
    """Poll until the run's status is ``finished:*``; raise :class:`FlowerError` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        status = run_status(run_id, connection)
        if str(status.get("status", "")).startswith("finished"):
            return status
        if time.monotonic() > deadline:
            raise FlowerError(f"run {run_id} still {status.get('status')!r} after {timeout:.0f} s")
        time.sleep(poll)


def cmd_fed_run(args: argparse.Namespace) -> int:
    app = Path(args.app) if args.app else bundled_app_dir()
    run_id = start_run(app, args.connection, args.run_config)
    if not args.wait:
        print(json.dumps({"run-id": run_id}) if args.json else f"started run {run_id}")
        return 0
    status = wait_for_run(run_id, args.connection, args.timeout)
    print(json.dumps(status, indent=2) if args.json else f"run {run_id}: {status.get('status')}")
    return 0 if status.get("status") == "finished:completed" else 1


# --------------------------------------------------------------------------------------------
# parsers
# --------------------------------------------------------------------------------------------


def add_fed_parsers(subparsers: Any) -> None:
    """Add ``budget`` and ``fed`` to the ``graphveil`` command line."""
    budget = subparsers.add_parser("budget", help="a site's privacy ledger (privacy odometer)")
    bsub = budget.add_subparsers(dest="budget_command", required=True)
    p = bsub.add_parser("show", help="ε spent, budget, and every release/refusal in a ledger")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_show)

    fed = subparsers.add_parser("fed", help="federated runs with Flower (SuperLink, SuperNodes, flwr run)")
    fsub = fed.add_subparsers(dest="fed_command", required=True)

    p = fsub.add_parser("server", help="start the SuperLink (TLS and SuperNode authentication on)")
    p.add_argument("--ca", required=True, help="CA certificate (PEM)")
    p.add_argument("--cert", required=True, help="server certificate (PEM), SAN must name the address sites dial")
    p.add_argument("--key", required=True, help="server private key (PEM)")
    p.add_argument("--host", default="0.0.0.0", help="listen address (default: 0.0.0.0)")
    p.add_argument("--port", type=int, default=8000, help="the SuperLink's one HTTPS port (default: 8000)")
    p.add_argument("--database", help="SuperLink state file (default: in memory)")
    p.add_argument("--dry-run", action="store_true", help="print the flower-superlink command, do not start it")
    p.set_defaults(func=cmd_fed_server)

    p = fsub.add_parser("site", help="start this site's SuperNode with its checked node config")
    p.add_argument("--node-config", required=True, help="the site's node config TOML (site-name, data-path, epsilon-budget, ledger, ...)")
    p.add_argument("--superlink", required=True, help="SuperLink address HOST:PORT")
    p.add_argument("--ca", required=True, help="CA certificate that signed the SuperLink's certificate")
    p.add_argument("--key", required=True, help="this site's SuperNode private key (ECDSA, registered by the operator)")
    p.add_argument("--host", default="127.0.0.1", help="address of the SuperNode's local runtime API (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=9094, help="port of the SuperNode's local runtime API (default: 9094)")
    p.add_argument("--max-retries", type=int, help="give up after N failed connection attempts (default: retry forever)")
    p.add_argument("--dry-run", action="store_true", help="print the flower-supernode command, do not start it")
    p.set_defaults(func=cmd_fed_site)

    p = fsub.add_parser("connect", help="save a SuperLink connection for flwr (in $FLWR_HOME/config.toml)")
    p.add_argument("--name", required=True, help="connection name, used by `flwr run APP NAME`")
    p.add_argument("--superlink", required=True, help="SuperLink address HOST:PORT")
    p.add_argument("--ca", required=True, help="CA certificate that signed the SuperLink's certificate")
    p.add_argument("--default", action="store_true", help="make it the default connection")
    p.set_defaults(func=cmd_fed_connect)

    p = fsub.add_parser("run", help="start the GraphVeil Flower app on a SuperLink (flwr run) and optionally wait")
    p.add_argument("--connection", help="flwr connection name (default: flwr's default)")
    p.add_argument("--app", help="Flower app folder (default: the one shipped with GraphVeil)")
    p.add_argument("--run-config", action="append", default=[], metavar="KEY=VALUE",
                   help="override the app's [tool.flwr.app.config], e.g. num-server-rounds=3 (repeatable)")
    p.add_argument("--wait", action="store_true", help="wait until the run finishes; exit 1 unless it completed")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait with --wait (default: 3600)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_fed_run)

    p = fsub.add_parser("app-dir", help="print the folder of the GraphVeil Flower app (for flwr run / flwr build)")
    p.set_defaults(func=cmd_fed_app_dir)
