"""``graphveil fed``: start Flower's SuperLink and SuperNodes, save connections, run the app.

``graphveil fed server`` and ``graphveil fed site`` check their inputs, then *become*
``flower-superlink`` / ``flower-supernode`` (``exec``: same PID, signals reach Flower) with TLS
and SuperNode authentication always on. ``graphveil fed run`` wraps ``flwr run`` and can wait
for the run to finish. This module only turns options into those calls; the site's node config
is :class:`~.settings.SiteSettings`, the ``flwr`` wrappers are in :mod:`.control` and the
shipped app in :mod:`.bundle`. It joins the ``graphveil`` command line through the
``graphveil_add_commands`` hook (:mod:`.plugin`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from graphveil.connectors.flower.bundle import app_hash, bundled_app_dir
from graphveil.connectors.flower.control import (
    executable,
    existing_file,
    flower_env,
    start_run,
    wait_for_run,
    write_connection,
)
from graphveil.connectors.flower.gateway import add_limit_arguments
from graphveil.connectors.flower.settings import SiteSettings
from graphveil.connectors.flower.simulation import add_simulate_parser
from graphveil.contract.errors import ConfigError


def _become(argv: list[str], dry_run: bool) -> int:
    if dry_run:
        print(" ".join(_quote(a) for a in argv))
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, flower_env())
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
    ca = existing_file(args.ca, "--ca")
    cert = existing_file(args.cert, "--cert")
    key = existing_file(args.key, "--key")
    if args.fleet_gateway and (args.control_host, args.control_port) == (args.host, args.port):
        raise ConfigError("--control-host/--control-port must differ from the public --host/--port")
    argv = [
        executable("flower-superlink"),
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
        executable("flower-supernode"),
        "--superlink", args.superlink,
        "--root-certificates", existing_file(args.ca, "--ca"),
        "--auth-supernode-private-key", existing_file(args.key, "--key"),
        "--node-config", str(Path(args.node_config).resolve()),
        "--host", args.host, "--port", str(args.port),
        # ClientApp processes are started by GraphVeil's guard (guard_command), not by Flower:
        # only a FAB whose SHA-256 is in the site's approved-apps is ever unpacked or run.
        "--isolation", "process",
    ]
    if args.max_retries is not None:
        argv += ["--max-retries", str(args.max_retries)]
    return argv


#: The site's app-pinning guard, run as a module in a process of its own next to the SuperNode.
GUARD_MODULE = "graphveil.connectors.flower.guard"


def guard_command(args: argparse.Namespace, subcommand: str = "executor") -> list[str]:
    """The guard that starts one pinned ClientApp process per SuperNode task."""
    host = f"[{args.host}]" if ":" in args.host else args.host
    return [sys.executable, "-m", GUARD_MODULE, subcommand, "--runtime-api-address", f"{host}:{args.port}",
            "--node-config", str(Path(args.node_config).resolve())]


#: The Fleet gateway, run as a module in a process of its own next to the SuperLink.
GATEWAY_MODULE = "graphveil.connectors.flower.gateway"


def gateway_command(args: argparse.Namespace) -> list[str]:
    """The Fleet gateway on the public address: forwards only ``/v1/fleet/*`` to the SuperLink,
    within the ``--gateway-*`` limits (body size, header and body timeouts, connections)."""
    from graphveil.connectors.flower.gateway import limits_from

    host = f"[{args.control_host}]" if ":" in args.control_host else args.control_host
    if host in ("0.0.0.0", "[::]"):
        host = "127.0.0.1"
    try:
        limits = limits_from(args, "gateway-")
    except ValueError as exc:
        raise ConfigError(f"--gateway-*: {exc}") from None
    return [sys.executable, "-m", GATEWAY_MODULE, "--host", args.host, "--port", str(args.port),
            "--upstream", f"https://{host}:{args.control_port}",
            "--ca", existing_file(args.ca, "--ca"), "--cert", existing_file(args.cert, "--cert"),
            "--key", existing_file(args.key, "--key"),
            "--max-body", str(limits.max_body), "--header-timeout", str(limits.header_timeout),
            "--body-timeout", str(limits.body_timeout), "--max-connections", str(limits.max_connections),
            "--max-buffered", str(limits.max_buffered)]


def cmd_fed_server(args: argparse.Namespace) -> int:
    argv = server_command(args)
    if not args.fleet_gateway:
        return _become(argv, args.dry_run)
    return _become_with_watcher(argv, gateway_command(args), args.dry_run, "superlink")


def cmd_fed_site(args: argparse.Namespace) -> int:
    argv = site_command(args)
    guard = guard_command(args)
    check = subprocess.run([*guard_command(args, "check")], capture_output=True, text=True,
                           env=flower_env())
    if check.returncode != 0:
        raise ConfigError(f"node config: approved-apps: {check.stderr.strip() or check.stdout.strip()}")
    return _become_with_watcher(argv, guard, args.dry_run, "supernode")


def _become_with_watcher(argv: list[str], watcher: list[str], dry_run: bool, what: str) -> int:
    """Start ``watcher`` on this PID, then exec ``argv`` (dry run: print both commands).

    The watcher outlives nothing: it watches this PID, which exec turns into the Flower process.
    """
    if dry_run:
        print(" ".join(_quote(a) for a in watcher + ["--parent-pid", f"<{what} pid>"]))
        return _become(argv, True)
    subprocess.Popen([*watcher, "--parent-pid", str(os.getpid())], env=flower_env())
    return _become(argv, False)


def cmd_fed_app_dir(args: argparse.Namespace) -> int:
    print(bundled_app_dir())
    return 0


def cmd_fed_app_hash(args: argparse.Namespace) -> int:
    print(app_hash(Path(args.app) if args.app else None))
    return 0


def cmd_fed_connect(args: argparse.Namespace) -> int:
    path = write_connection(args.name, args.superlink, args.ca, default=args.default)
    print(f"SuperLink connection {args.name!r} -> {args.superlink} written to {path}")
    return 0


def cmd_fed_run(args: argparse.Namespace) -> int:
    app = Path(args.app) if args.app else bundled_app_dir()
    run_id = start_run(app, args.connection, args.run_config)
    if not args.wait:
        print(json.dumps({"run-id": run_id}) if args.json else f"started run {run_id}")
        return 0
    status = wait_for_run(run_id, args.connection, args.timeout)
    print(json.dumps(status, indent=2) if args.json else f"run {run_id}: {status.get('status')}")
    return 0 if status.get("status") == "finished:completed" else 1


def add_fed_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``fed {server,site,connect,run,simulate,app-dir,app-hash}`` to a ``graphveil`` sub-parser set."""
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
    add_limit_arguments(p.add_argument_group("Fleet gateway limits (what an unauthenticated peer may hold)"),
                        "gateway-")
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

    add_simulate_parser(fsub)

    p = fsub.add_parser("app-dir", help="print the folder of the GraphVeil Flower app (for flwr run / flwr build)")
    p.set_defaults(func=cmd_fed_app_dir)

    p = fsub.add_parser("app-hash", help="print the SHA-256 of the app's FAB as flwr run packs it (for approved-apps)")
    p.add_argument("--app", help="Flower app folder (default: the one shipped with GraphVeil)")
    p.set_defaults(func=cmd_fed_app_hash)
    return fed
