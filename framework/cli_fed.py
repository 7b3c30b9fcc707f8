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

from graphveil.config import PositiveFinite, Probability, format_validation_error
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


#: The built-in accountants of each privacy unit (a site's default ``accountants``).
BUILTIN_ACCOUNTANTS: dict[str, tuple[str, ...]] = {
    "node": ("coupled_rdp", "coupled_rdp_freq", "coupled_rdp_standard"),
    "edge": ("edge_rdp",),
}
#: σ floor of a site that sets no ``min-noise-multiplier``.
DEFAULT_MIN_NOISE_MULTIPLIER = 0.5
#: Local steps per round of a site that sets no ``max-steps-per-round``.
DEFAULT_MAX_STEPS_PER_ROUND = 100


class SiteSettings(BaseModel):
    """What a data owner sets for its SuperNode (``--node-config site.toml``).

    Keys use Flower's dashed style. Of these, only ``site-name``, ``epsilon-budget`` and ``delta``
    are ever reported to the server (see deploy/RUNBOOK.md, "What leaves the site").

    The site's privacy *policy* is part of it: ``delta``, ``privacy-unit``, ``accountants``,
    ``min-noise-multiplier``, ``max-steps-per-round`` (and the rule that a task never pins a
    seed or the noise source). The ClientApp refuses a task that differs before any data is
    read (``graphveil.connectors.flower.settings.check_site_policy``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    site_name: str = Field(alias="site-name", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                           description="Name the site reports to the server.")
    data_source: Literal["edge_list", "citeseer_tape", "pyg", "citeseer"] = Field(
        "edge_list", alias="data-source", description="Loader for the site's graph (see data.source).")
    data_path: Path | None = Field(None, alias="data-path",
                                   description="Edge file (edge_list), folder (citeseer_tape) or .pt file (pyg).")
    data_entities: Path | None = Field(None, alias="data-entities", description="Entity table (edge_list).")
    data_source_col: str | None = Field(None, alias="data-source-col", min_length=1, description=(
        "edge_list: edge-file header column of a relation's first entity id (with data-target-col); "
        "default: a recognised header pair such as source/target (data.source_col)."))
    data_target_col: str | None = Field(None, alias="data-target-col", min_length=1, description=(
        "edge_list: edge-file header column of a relation's second entity id (data.target_col)."))
    data_id_col: str | None = Field(None, alias="data-id-col", min_length=1, description=(
        "edge_list: entity-table column (JSONL: key) of the entity id; default 'id' (data.id_col)."))
    data_text_col: str | None = Field(None, alias="data-text-col", min_length=1, description=(
        "edge_list: entity-table column (JSONL: key) of the entity text; default 'text' (data.text_col)."))
    epsilon_budget: PositiveFinite = Field(alias="epsilon-budget",
                                  description="Total ε this site will ever release, across rounds and runs.")
    delta: Probability = Field(
        description="δ of the budget (required; the site's, whatever the task says): keep it well below "
                    "1/(number of your entities or relations).")
    privacy_unit: Literal["node", "edge"] = Field(
        alias="privacy-unit", description="What this site protects: one entity (node) or one relation (edge).")
    accountants: tuple[str, ...] | None = Field(
        None, description="Accountants this site accepts (comma-separated names); default: the built-in "
                          "accountants of its privacy unit.")
    ledger: Path = Field(description="The site's privacy ledger (SQLite), kept across runs.")
    ledger_anchor: Path | None = Field(
        None, alias="ledger-anchor",
        description="File on ANOTHER volume than the ledger where the ledger's head (row count, hash) is "
                    "written after every entry; a ledger restored from a backup or replaced is then refused.")
    site_config: Path | None = Field(None, alias="site-config",
                                     description="Optional YAML overriding sections of the run's task (e.g. data.split).")
    min_noise_multiplier: PositiveFinite = Field(
        DEFAULT_MIN_NOISE_MULTIPLIER, alias="min-noise-multiplier", description="Refuse rounds asking for a smaller σ.")
    max_steps_per_round: int = Field(
        DEFAULT_MAX_STEPS_PER_ROUND, ge=1, alias="max-steps-per-round",
        description="Refuse rounds asking for more local DP steps.")
    share_utility_metrics: bool = Field(
        False, alias="share-utility-metrics",
        description="Report held-out MRR and PREC@1 to the server (NOT privatized; off by default).")
    share_epsilon: bool = Field(
        False, alias="share-epsilon",
        description="Report ε spent (and the ε a refused round would reach) to the server; ε depends on "
                    "the sampling rate b/|Ē| (NOT privatized; off by default).")
    seed: int | None = Field(None, description="Reproducible per-round seeds (testing); default: fresh OS randomness.")
    threads: int | None = Field(None, gt=0, description="torch threads for local training.")
    approved_apps: str | None = Field(
        None, alias="approved-apps",
        description="FAB SHA-256 hashes this site runs (comma/space separated, 'bundled' for the app "
                    "shipped with this installation, or an absolute path to a file of them); "
                    "default: bundled. Checked by the site's guard before any app code runs.")

    @field_validator("accountants", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        # Flower node configs hold scalars only: a list is written as one comma-separated string.
        if isinstance(v, str):
            v = [n for n in v.replace(",", " ").split() if n]
            if not v:
                raise ValueError("name at least one accountant")
        return v

    @property
    def accepted_accountants(self) -> tuple[str, ...]:
        """``accountants``, or the built-in accountants of the site's privacy unit."""
        return self.accountants if self.accountants is not None else BUILTIN_ACCOUNTANTS[self.privacy_unit]

    @field_validator("data_path", "data_entities", "ledger", "ledger_anchor", "site_config")
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
            known = sorted(f.alias or n for n, f in cls.model_fields.items())
            raise ConfigError(format_validation_error(source, exc, model=cls, known=known, noun="key")) from exc
        if settings.data_source != "citeseer" and settings.data_path is None:
            raise ConfigError(f"{source}: data-path is required for data-source {settings.data_source!r}")
        if settings.data_source == "edge_list" and settings.data_entities is None:
            raise ConfigError(f"{source}: data-entities is required for data-source 'edge_list'")
        columns = {k: v for k, v in settings.data_columns.items() if v is not None}
        if columns and settings.data_source != "edge_list":
            key = f"data-{next(iter(columns)).replace('_', '-')}"
            raise ConfigError(f"{source}: {key} applies only to data-source 'edge_list'")
        if (settings.data_source_col is None) != (settings.data_target_col is None):
            raise ConfigError(f"{source}: give both data-source-col and data-target-col, or neither")
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
        out.update({k: v for k, v in self.data_columns.items() if v is not None})
        return out

    @property
    def data_columns(self) -> dict[str, str | None]:
        """``data-source-col`` … ``data-text-col`` under their run-config names (``source_col`` …)."""
        return {"source_col": self.data_source_col, "target_col": self.data_target_col,
                "id_col": self.data_id_col, "text_col": self.data_text_col}


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
    chain = summary.get("chain") or {}
    if not chain.get("verified", True):
        print(f"graphveil: WARNING: ledger {args.ledger} FAILS verification: {chain.get('error')}; "
              "the ε shown is not a trustworthy record of spend", file=sys.stderr)
    return 0


def cmd_budget_verify(args: argparse.Namespace) -> int:
    """Exit 0 if the hash chain, every recorded ε, the record sets and the anchor check out; 1 if not."""
    from graphveil.ledger import PrivacyLedger

    with PrivacyLedger(args.ledger, create=False) as ledger:
        report = ledger.verify(anchor=args.anchor, expect_head=args.expect_head)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    if report.ok:
        if not args.json:
            print(f"ok: {report.count} rows, head {report.head}, ε spent {report.epsilon:.6g}"
                  + (f" (δ={report.delta:.3g})" if report.delta is not None else ""))
        return 0
    print(f"graphveil: ledger {args.ledger} FAILS verification: {report.error}", file=sys.stderr)
    return 1


def cmd_budget_head(args: argparse.Namespace) -> int:
    """Print the ledger's head (row count and hash) for anchoring outside the site's volume."""
    from graphveil.ledger import PrivacyLedger

    with PrivacyLedger(args.ledger, create=False) as ledger:
        report = ledger.verify()
    if not report.ok:
        print(f"graphveil: ledger {args.ledger} FAILS verification: {report.error}; not printing its head "
              "as an anchor", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"count": report.count, "hash": report.head}))
    else:
        print(f"{report.count} {report.head}")
    return 0


def cmd_budget_migrate(args: argparse.Namespace) -> int:
    """Migrate a schema-1 ledger to the RDP-curve ledger (opening it migrates; this says so)."""
    import sqlite3

    from graphveil.ledger import SCHEMA_VERSION, PrivacyLedger

    path = Path(args.ledger)
    if not path.is_file():
        print(f"graphveil: error: {path}: no such ledger file", file=sys.stderr)
        return 2
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        before = int(row[0]) if row else 0
    except sqlite3.DatabaseError:
        before = 0
    with PrivacyLedger(path, create=False) as ledger:
        report = ledger.verify()
    what = "migrated" if before == 1 else f"already schema version {SCHEMA_VERSION}"
    print(f"{path}: {what}; {report.count} rows, ε spent {report.epsilon:.6g}, head {report.head}")
    return 0 if report.ok else 1


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
    """``flower-superlink`` with TLS and SuperNode authentication on, bound to the operator address.

    Flower 1.41 serves the Fleet, Control and Runtime APIs on one port and the Control API
    authenticates nothing, so the SuperLink listens on ``--control-host:--control-port``
    (default 127.0.0.1:8001, operator only); sites reach the Fleet gateway (:func:`gateway_command`)
    on ``--host:--port``.
    """
    ca = _existing(args.ca, "--ca")
    cert = _existing(args.cert, "--cert")
    key = _existing(args.key, "--key")
    if args.fleet_gateway and (args.control_host, args.control_port) == (args.host, args.port):
        raise ConfigError("--control-host/--control-port must differ from the public --host/--port")
    argv = [
        _executable("flower-superlink"),
        "--ssl-ca-certfile", ca, "--ssl-certfile", cert, "--ssl-keyfile", key,
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host", args.control_host, "--port", str(args.control_port),
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
        # ClientApp processes are started by GraphVeil's guard (guard_command), not by Flower:
        # only a FAB whose SHA-256 is in the site's approved-apps is ever unpacked or run.
        "--isolation", "process",
    ]
    if args.max_retries is not None:
        argv += ["--max-retries", str(args.max_retries)]
    return argv


#: The site's app-pinning guard (graphveil.connectors.flower.guard), run as a module so that the
#: framework does not import connectors.
GUARD_MODULE = "graphveil.connectors.flower.guard"


def guard_command(args: argparse.Namespace, subcommand: str = "executor") -> list[str]:
    """The guard that starts one pinned ClientApp process per SuperNode task."""
    host = f"[{args.host}]" if ":" in args.host else args.host
    return [sys.executable, "-m", GUARD_MODULE, subcommand, "--runtime-api-address", f"{host}:{args.port}",
            "--node-config", str(Path(args.node_config).resolve())]


GATEWAY_MODULE = "graphveil.connectors.flower.gateway"


def gateway_command(args: argparse.Namespace) -> list[str]:
    """The Fleet gateway on the public address: forwards only ``/v1/fleet/*`` to the SuperLink."""
    host = f"[{args.control_host}]" if ":" in args.control_host else args.control_host
    if host in ("0.0.0.0", "[::]"):
        host = "127.0.0.1"
    return [sys.executable, "-m", GATEWAY_MODULE, "--host", args.host, "--port", str(args.port),
            "--upstream", f"https://{host}:{args.control_port}",
            "--ca", _existing(args.ca, "--ca"), "--cert", _existing(args.cert, "--cert"),
            "--key", _existing(args.key, "--key")]


def cmd_fed_server(args: argparse.Namespace) -> int:
    argv = server_command(args)
    if not args.fleet_gateway:
        return _become(argv, args.dry_run)
    gateway = gateway_command(args)
    if args.dry_run:
        print(" ".join(_quote(a) for a in gateway + ["--parent-pid", "<superlink pid>"]))
        return _become(argv, True)
    subprocess.Popen([*gateway, "--parent-pid", str(os.getpid())], env=_flower_env())
    return _become(argv, False)


def cmd_fed_site(args: argparse.Namespace) -> int:
    argv = site_command(args)
    guard = guard_command(args)
    check = subprocess.run([*guard_command(args, "check")], capture_output=True, text=True,
                           env=_flower_env())
    if check.returncode != 0:
        raise ConfigError(f"node config: approved-apps: {check.stderr.strip() or check.stdout.strip()}")
    if args.dry_run:
        print(" ".join(_quote(a) for a in guard + ["--parent-pid", "<supernode pid>"]))
        return _become(argv, True)
    # The guard outlives nothing: it watches this PID, which exec turns into flower-supernode.
    subprocess.Popen([*guard, "--parent-pid", str(os.getpid())], env=_flower_env())
    return _become(argv, False)


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


def app_hash(app: Path | None = None) -> str:
    """SHA-256 of the FAB ``flwr build`` / ``flwr run`` make from an app folder (Flower's fab_hash)."""
    import hashlib

    from flwr.cli.build import build_fab_from_disk

    return hashlib.sha256(build_fab_from_disk(app or bundled_app_dir())).hexdigest()


def cmd_fed_app_hash(args: argparse.Namespace) -> int:
    print(app_hash(Path(args.app) if args.app else None))
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
    p = bsub.add_parser("verify", help="check a ledger's hash chain, recorded ε and anchor (exit 1 if tampered)")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--anchor", default=None, help="anchor file kept outside the ledger's volume")
    p.add_argument("--expect-head", default=None, help="a head hash recorded elsewhere; must be in the chain")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_verify)
    p = bsub.add_parser("head", help="print the ledger's head (rows, hash) to anchor outside its volume")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_head)
    p = bsub.add_parser("migrate", help="migrate a schema-1 ledger to the RDP-curve ledger")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.set_defaults(func=cmd_budget_migrate)

    fed = subparsers.add_parser("fed", help="federated runs with Flower (SuperLink, SuperNodes, flwr run)")
    fsub = fed.add_subparsers(dest="fed_command", required=True)

    p = fsub.add_parser("server", help="start the SuperLink (TLS and SuperNode authentication on)")
    p.add_argument("--ca", required=True, help="CA certificate (PEM)")
    p.add_argument("--cert", required=True, help="server certificate (PEM), SAN must name the address sites dial")
    p.add_argument("--key", required=True, help="server private key (PEM)")
    p.add_argument("--host", default="0.0.0.0", help="public address of the Fleet gateway sites dial (default: 0.0.0.0)")
    p.add_argument("--port", type=int, default=8000, help="public HTTPS port, Fleet API only (default: 8000)")
    p.add_argument("--control-host", default="127.0.0.1",
                   help="operator-only address of the SuperLink itself: Control API for flwr, Runtime API "
                        "(default: 127.0.0.1; never a network sites or others reach)")
    p.add_argument("--control-port", type=int, default=8001, help="the SuperLink's own HTTPS port (default: 8001)")
    p.add_argument("--no-fleet-gateway", dest="fleet_gateway", action="store_false",
                   help="do not start the Fleet gateway (you front --control-host:--control-port with your own "
                        "proxy that forwards only POST /v1/fleet/*)")
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

    p = fsub.add_parser("app-hash", help="print the SHA-256 of the app's FAB as flwr run packs it (for approved-apps)")
    p.add_argument("--app", help="Flower app folder (default: the one shipped with GraphVeil)")
    p.set_defaults(func=cmd_fed_app_hash)
