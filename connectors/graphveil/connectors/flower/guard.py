"""App pinning at the site: run only a Flower app (FAB) this site approved.

Flower 1.41's SuperNode executes whatever FAB the SuperLink sends for a run. Its own check,
``flower-supernode --trusted-entities``, only passes FABs that carry Flower Hub signatures
(``valid_license``, filled in when the SuperLink fetched the app from the Hub); a FAB sent with
``flwr run`` from a folder is refused by it, so it cannot pin a self-built app. GraphVeil therefore
pins the app itself, at the SuperNode boundary, with code installed at the site:

* ``graphveil fed site`` starts the SuperNode with ``--isolation process``: the SuperNode no
  longer launches ClientApp processes itself.
* :func:`run_executor` (started by ``graphveil fed site`` next to the SuperNode; it stops when the
  SuperNode stops) takes the SuperNode's ClientApp tasks from its local Runtime API, as Flower's
  SuperExec does, and runs each task in a guarded ClientApp process of its own
  (:func:`run_guarded_clientapp`). To keep ~8-13 s of imports out of every round, that process
  is *forked* from a fork server (:func:`serve_forks`) the executor starts with the site: it
  imports the site's installed packages once (torch, transformers, GraphVeil, Flower;
  :data:`PREIMPORT`; never the FAB's code), runs nothing else, and forks one child per task
  token it reads. Each task still gets a process of its own (a fresh copy of the imported,
  untouched parent), with the same environment and the same checks below, and the imports no
  longer run beside a round's training. A token that arrives while the server is still
  importing waits in its pipe (no later than a fresh process would start); if the server is
  gone, the task gets a fresh process and the server is restarted. The fork server exits when
  its pipe closes or its executor dies. ``GRAPHVEIL_CLIENTAPP_FORKSERVER=0`` turns it off (a
  fresh process per task).
* The guarded process pulls the task input (FAB bytes, run, context, message) exactly like
  ``flwr-clientapp``, computes SHA-256 over the FAB bytes itself (never trusting the hash the
  SuperLink announced) and compares it with the site's approved list. An unapproved FAB is never
  unpacked, installed or imported: the process logs the refusal at the site, replies
  ``Error(INVALID_FAB, "app not approved by this site")`` to the server and exits. An approved
  FAB continues through Flower's own ``run_clientapp``.

The approved list is the node config key ``approved-apps`` read from the site's own TOML file
(not from anything the server sends). Unset, it is ``bundled``: the FAB that ``flwr run`` /
``flwr build`` makes from the app folder shipped with this site's GraphVeil installation
(:func:`graphveil.connectors.flower.bundle.app_hash`; ``graphveil fed app-hash`` prints it).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from logging import ERROR, INFO
from pathlib import Path

HASH_RE = re.compile(r"^[0-9a-f]{64}$")
#: The approved-apps keyword for the app folder shipped with this installation.
BUNDLED = "bundled"
#: Environment variable carrying the task token to the guarded ClientApp (not on its argv).
TOKEN_ENV = "GV_CLIENTAPP_TOKEN"
REFUSAL = "app not approved by this site"
#: Set to 0 in the SuperNode's environment to start every ClientApp process afresh when its task
#: arrives (no fork server importing ahead of time).
FORK_SERVER_ENV = "GRAPHVEIL_CLIENTAPP_FORKSERVER"
#: What the fork server imports before it forks tasks: installed site code only, never the FAB's.
# dp_accounting: the ledger's reservation imports it in every round otherwise (0.1-0.2 s a round)
PREIMPORT = ("torch", "transformers", "peft", "dp_accounting", "flwr.supernode.runtime.run_clientapp",
             "graphveil.run.session", "graphveil.connectors.flower.site")


class AppNotApproved(Exception):
    """The FAB offered for a task is not in the site's approved list."""


# --------------------------------------------------------------------------------------------
# hashes
# --------------------------------------------------------------------------------------------


def fab_sha256(content: bytes) -> str:
    """Flower's FAB hash: SHA-256 over the FAB (zip) bytes, hex."""
    return hashlib.sha256(content).hexdigest()


def parse_approved(spec: str | None) -> frozenset[str]:
    """The approved FAB hashes from an ``approved-apps`` value.

    ``spec`` is a comma/space-separated list of SHA-256 hex digests and/or the word ``bundled``,
    or the absolute path of a file holding them (one or more per line, ``#`` starts a comment).
    ``None`` means ``bundled``. Raises ``ValueError`` on anything else; an empty list approves
    nothing.
    """
    if spec is None:
        spec = BUNDLED
    spec = spec.strip()
    if spec.startswith("/"):
        path = Path(spec)
        if not path.is_file():
            raise ValueError(f"{spec} is not a file")
        text = "\n".join(line.split("#", 1)[0] for line in path.read_text(encoding="utf-8").splitlines())
    else:
        text = spec
    out: set[str] = set()
    for token in re.split(r"[\s,]+", text.strip()):
        if not token:
            continue
        if token == BUNDLED:
            from graphveil.connectors.flower.bundle import app_hash

            out.add(app_hash())
        elif HASH_RE.match(token.lower()):
            out.add(token.lower())
        else:
            raise ValueError(f"{token!r} is neither a SHA-256 FAB hash (64 hex digits) nor {BUNDLED!r}")
    return frozenset(out)


def approved_from_node_config(path: str | os.PathLike[str]) -> frozenset[str]:
    """Read ``approved-apps`` from the site's node config file."""
    import tomllib

    raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    value = raw.get("approved-apps")
    if value is not None and not isinstance(value, str):
        raise ValueError("approved-apps must be a string (hashes, 'bundled', or an absolute file path)")
    return parse_approved(value)


# --------------------------------------------------------------------------------------------
# the guarded ClientApp process
# --------------------------------------------------------------------------------------------


def _log(level: int, msg: str, *args: object) -> None:
    from flwr.common.logger import log

    log(level, "[graphveil app pinning] " + msg, *args)


def guarded_pull(approved: Iterable[str], pull):  # noqa: ANN001, ANN201 - Flower's callable
    """Wrap Flower's ``pull_task_input`` so that an unapproved FAB stops the task before install."""
    approved = frozenset(approved)

    def pull_task_input(client):  # noqa: ANN001, ANN202
        from flwr.app import Message
        from flwr.app.error import Error
        from flwr.common.constant import ErrorCode
        from flwr.supernode.runtime.run_clientapp import push_message

        message, context, run, fab = pull(client)
        digest = fab_sha256(fab.content)
        if digest in approved:
            _log(INFO, "run %s: app %s %s approved (FAB sha256 %s)", run.run_id, run.fab_id,
                 run.fab_version, digest)
            return message, context, run, fab
        reason = (f"run {run.run_id}: REFUSED app {run.fab_id} {run.fab_version}: FAB sha256 {digest} "
                  f"is not in this site's approved-apps ({', '.join(sorted(approved)) or 'none'}); "
                  "none of its code was run")
        _log(ERROR, "%s", reason)
        push_message(client, Message(Error(ErrorCode.INVALID_FAB, REFUSAL), reply_to=message), context)
        raise AppNotApproved(reason)

    return pull_task_input


def run_guarded_clientapp(runtime_api_address: str, token: str, approved: Iterable[str],
                          parent_pid: int | None = None) -> None:
    """Flower's ``flwr-clientapp`` for one task, refusing any FAB not in ``approved``."""
    import flwr.supernode.runtime.run_clientapp as rc

    rc.pull_task_input = guarded_pull(approved, rc.pull_task_input)
    # Runtime dependency installation stays off: an approved app runs on the site's packages.
    rc.run_clientapp(runtime_api_address=runtime_api_address, token=token, insecure=True,
                     certificates=None, parent_pid=parent_pid, runtime_dependency_install=False)


# --------------------------------------------------------------------------------------------
# the fork server: imports once, then forks one guarded ClientApp process per task
# --------------------------------------------------------------------------------------------


def preimport() -> None:
    """Import :data:`PREIMPORT` and the built-in GraphVeil plugins with the classes their
    component hooks import (imports only: the plugins are registered on a throwaway host, which
    is dropped; the task builds its own. Nothing is configured or read that a task would
    otherwise set up, no torch operation runs (a forked child starts with torch's thread pools
    untouched) and no third-party plugin is touched)."""
    import importlib
    import importlib.util
    from importlib.metadata import entry_points

    from graphveil.contract.host import BUILTIN_PREFIXES, ENTRY_POINT_GROUP, PluginHost

    for name in PREIMPORT:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
    scratch = PluginHost(autoload=False)  # its component hooks import the classes (~1.7 s)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value.startswith(BUILTIN_PREFIXES):
            scratch.register(ep.load(), ep.name)


def _reseed_inherited_rngs() -> None:
    """A forked child starts with its parent's generator states. Python's ``random`` reseeds
    itself at fork; numpy's and torch's global generators do not, so reseed them from the OS as
    a fresh process would be (GraphVeil's noise and sampling never use them — ``os.urandom``
    per draw and per-round ``secrets`` seeds — but an app's own code might)."""
    import numpy as np
    import torch

    np.random.seed()
    torch.seed()


def run_forked_task(runtime_api_address: str, node_config: str, parent_pid: int | None,
                    token: str) -> int:
    """A forked child's task: the guarded ClientApp for ``token``."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the task pipe is the fork server's alone
    os.close(devnull)
    _reseed_inherited_rngs()
    _log(INFO, "ClientApp process %d forked for a task", os.getpid())
    run_guarded_clientapp(runtime_api_address, token, approved_from_node_config(node_config), parent_pid)
    return 0


def _child_exit_code(run_task: Callable[[str], int], token: str) -> int:
    """Run a forked child's task; its exit code, as Python would give it at exit."""
    import traceback

    try:
        return run_task(token)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported here; the server goes on
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve_forks(run_task: Callable[[str], int], fd: int = 0,
                imports: Callable[[], None] = preimport) -> None:
    """The fork server's life: ``imports()``, then read task tokens (one per line) from ``fd``
    and fork a child for each that exits with ``run_task(token)``, until ``fd`` closes (the
    executor stopped) or the executor (this process's parent) dies. Tokens that arrive while it
    is still importing wait in the pipe."""
    import select
    import threading

    executor, imported = os.getppid(), threading.Event()

    def orphan_watch() -> None:  # EOF on fd is only read after the imports: watch the parent too
        while not imported.wait(0.2):
            if os.getppid() != executor:
                os._exit(0)

    watcher = threading.Thread(target=orphan_watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        imports()
    except Exception as exc:  # noqa: BLE001 - each task then imports what it needs itself
        _log(ERROR, "fork server %d: importing ahead failed (%s: %s); tasks import for themselves",
             os.getpid(), type(exc).__name__, exc)
    imported.set()
    watcher.join()  # no other thread of this process may be running when it forks
    _log(INFO, "fork server %d: imports done in %.1f s, forking a ClientApp process per task",
         os.getpid(), time.monotonic() - started)
    pending, children = b"", set()
    while os.getppid() == executor:
        readable = select.select([fd], [], [], 0.5)[0]
        for pid in list(children):  # reap finished children
            if os.waitpid(pid, os.WNOHANG)[0]:
                children.discard(pid)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return
        *lines, pending = (pending + chunk).split(b"\n")
        for token in filter(None, (line.strip().decode() for line in lines)):
            pid = os.fork()
            if pid == 0:
                os._exit(_child_exit_code(run_task, token))  # skip the server's own shutdown
            children.add(pid)


# --------------------------------------------------------------------------------------------
# the executor next to the SuperNode (instead of Flower's SuperExec)
# --------------------------------------------------------------------------------------------


def clientapp_argv(runtime_api_address: str, node_config: str, parent_pid: int,
                   command: str = "clientapp") -> list[str]:
    return [sys.executable, "-m", "graphveil.connectors.flower.guard", command,
            "--runtime-api-address", runtime_api_address, "--node-config", node_config,
            "--parent-pid", str(parent_pid)]


def fork_server_enabled() -> bool:
    return os.environ.get(FORK_SERVER_ENV, "1").strip() not in ("0", "false", "no", "off")


def start_fork_server(runtime_api_address: str, node_config: str) -> subprocess.Popen:
    """The fork server, with this process's environment (as a per-task process gets it)."""
    server = subprocess.Popen(clientapp_argv(runtime_api_address, node_config, os.getpid(), "forkserver"),
                              stdin=subprocess.PIPE, env=dict(os.environ))
    _log(INFO, "fork server %d started", server.pid)
    return server


def send_task(server: subprocess.Popen, token: str) -> bool:
    """Queue ``token`` at the fork server; False if it is gone (the task then gets a fresh
    process)."""
    if server.poll() is not None:
        return False
    try:
        server.stdin.write(token.encode() + b"\n")
        server.stdin.flush()
    except (BrokenPipeError, OSError):
        return False
    return True


def stop_fork_server(server: subprocess.Popen | None) -> None:
    """Close its pipe (it exits at EOF, leaving running tasks to finish); terminate it if it is
    still importing after 2 s."""
    if server is None or server.poll() is not None:
        return
    try:
        server.stdin.close()
    except OSError:
        pass
    try:
        server.wait(timeout=2)
    except subprocess.TimeoutExpired:
        server.terminate()


def run_executor(runtime_api_address: str, node_config: str, parent_pid: int | None = None,
                 poll: float = 0.25) -> None:
    """Take ClientApp tasks from the SuperNode's Runtime API; run each in a guarded process of its
    own, forked by the fork server (or started fresh if there is none).

    ``poll``: seconds between two asks for a task (a local call; a round waits half of it on
    average before its process starts)."""
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.constant import TaskType
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    approved = approved_from_node_config(node_config)  # fail now, not at the first task
    _log(INFO, "SuperNode %s: ClientApps run only for approved FABs: %s", runtime_api_address,
         ", ".join(sorted(approved)) or "none")
    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)
    client = RuntimeHttpClient.from_server_address(
        server_address=runtime_api_address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=make_simple_http_retry_invoker())
    children: list[subprocess.Popen] = []
    server = start_fork_server(runtime_api_address, node_config) if fork_server_enabled() else None
    try:
        while True:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            if res.HasField("task") and res.token:
                if server is not None and send_task(server, res.token):
                    _log(INFO, "task sent to fork server %d", server.pid)
                else:
                    env = {**os.environ, TOKEN_ENV: res.token}
                    children.append(subprocess.Popen(
                        clientapp_argv(runtime_api_address, node_config, os.getpid()), env=env))
                    if server is not None:  # it died: this task starts fresh, the next is forked
                        _log(INFO, "task given a fresh ClientApp process %d (fork server %d exited "
                             "with %s; restarting it)", children[-1].pid, server.pid, server.returncode)
                        server = start_fork_server(runtime_api_address, node_config)
            children = [c for c in children if c.poll() is None]  # reap finished ones
            time.sleep(poll)
    finally:
        stop_fork_server(server)
        client.close()


# --------------------------------------------------------------------------------------------
# python -m graphveil.connectors.flower.guard {executor,clientapp,check}
# --------------------------------------------------------------------------------------------


def _site_logging() -> None:
    """GraphVeil's own INFO lines in a ClientApp process (a round's ε and timings) go to the
    site's log (stderr, as Flower's); they stay at the site."""
    import logging

    logger = logging.getLogger("graphveil")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(INFO)
        logger.propagate = False  # Flower's root handler would print each line again


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphveil.connectors.flower.guard")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("executor", "forkserver", "clientapp", "check"):
        p = sub.add_parser(name)
        p.add_argument("--runtime-api-address", required=True)
        p.add_argument("--node-config", required=True)
        p.add_argument("--parent-pid", type=int)
    args = parser.parse_args(argv)
    if args.command == "check":  # graphveil fed site: refuse a bad approved-apps before Flower starts
        try:
            approved = approved_from_node_config(args.node_config)
        except (ValueError, OSError) as exc:
            print(exc, file=sys.stderr)
            return 1
        print("\n".join(sorted(approved)))
        return 0
    if args.command == "executor":
        run_executor(args.runtime_api_address, args.node_config, args.parent_pid)
        return 0
    _site_logging()
    if args.command == "forkserver":  # started by the executor; tokens come on stdin
        serve_forks(functools.partial(run_forked_task, args.runtime_api_address, args.node_config,
                                      args.parent_pid))
        return 0
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        print(f"{TOKEN_ENV} is not set", file=sys.stderr)
        return 2
    run_guarded_clientapp(args.runtime_api_address, token, approved_from_node_config(args.node_config),
                          args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
