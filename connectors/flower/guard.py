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
  (:func:`run_guarded_clientapp`). To keep ~8 s of imports out of every round, one such process
  is started ahead of time as a *spare*: it imports the site's installed packages (torch,
  transformers, GraphVeil, Flower; :data:`PREIMPORT`), then waits for a task token on its stdin.
  A task goes to the spare only once the spare reports its imports done (else to a fresh
  process, as without a spare: a slow start must not outlast the task token's heartbeat), and a
  new spare is started; each task still gets a process of its own, with the same environment
  and the same checks below. A spare exits when its stdin closes
  or its executor dies (:func:`wait_for_token`). ``GRAPHVEIL_CLIENTAPP_SPARE=0`` turns it off.
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
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from logging import ERROR, INFO
from pathlib import Path

HASH_RE = re.compile(r"^[0-9a-f]{64}$")
#: The approved-apps keyword for the app folder shipped with this installation.
BUNDLED = "bundled"
#: Environment variable carrying the task token to the guarded ClientApp (not on its argv).
TOKEN_ENV = "GV_CLIENTAPP_TOKEN"
REFUSAL = "app not approved by this site"
#: Set to 0 in the SuperNode's environment to start every ClientApp process only when its task
#: arrives (no spare process imported ahead of time).
SPARE_ENV = "GRAPHVEIL_CLIENTAPP_SPARE"
#: What a spare imports before it has a task: installed site code only, never the FAB's.
PREIMPORT = ("torch", "transformers", "peft", "flwr.supernode.runtime.run_clientapp",
             "graphveil.session", "graphveil.connectors.flower.site")


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
# the spare: a ClientApp process whose imports are done before its task arrives
# --------------------------------------------------------------------------------------------


def preimport() -> None:
    """Import :data:`PREIMPORT` and the built-in GraphVeil plugins with the classes their
    component hooks import (imports only: the plugins are registered on a throwaway host, which
    is dropped; the task builds its own. Nothing is configured or read that a task would
    otherwise set up, and no third-party plugin is touched)."""
    import importlib
    import importlib.util
    from importlib.metadata import entry_points

    from graphveil.host import BUILTIN_PREFIXES, ENTRY_POINT_GROUP, PluginHost

    for name in PREIMPORT:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)
    scratch = PluginHost(autoload=False)  # its component hooks import the classes (~1.7 s)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.value.startswith(BUILTIN_PREFIXES):
            scratch.register(ep.load(), ep.name)


def wait_for_token(stream=None, ready_fd: int | None = None) -> str:  # noqa: ANN001 - text stream
    """The spare's life before its task: import, tell the executor on ``ready_fd``, then read one
    token line from ``stream`` (stdin by default).

    Returns ``""`` when the executor closed the pipe (it stopped) or died while this process was
    still importing (its parent changed); the caller then exits without touching the Runtime API.
    """
    import threading

    stream = stream if stream is not None else sys.stdin
    executor, handed_off = os.getppid(), threading.Event()

    def orphan_watch() -> None:  # stdin EOF is only seen after the imports: watch the parent too
        while not handed_off.wait(0.2):
            if os.getppid() != executor:
                os._exit(0)

    threading.Thread(target=orphan_watch, daemon=True).start()
    started = time.monotonic()
    preimport()
    ready = time.monotonic()
    _log(INFO, "spare ClientApp process %d: imports done in %.1f s, waiting for a task", os.getpid(),
         ready - started)
    if ready_fd is not None:
        try:
            os.write(ready_fd, b"1")
            os.close(ready_fd)
        except OSError:  # the executor is gone: so is this process's reason to exist
            return ""
    token = stream.readline().strip()
    handed_off.set()
    if token:
        _log(INFO, "spare ClientApp process %d: task received %.1f s after its imports were done",
             os.getpid(), time.monotonic() - ready)
    return token


# --------------------------------------------------------------------------------------------
# the executor next to the SuperNode (instead of Flower's SuperExec)
# --------------------------------------------------------------------------------------------


def clientapp_argv(runtime_api_address: str, node_config: str, parent_pid: int,
                   spare: bool = False) -> list[str]:
    return [sys.executable, "-m", "graphveil.connectors.flower.guard", "clientapp",
            "--runtime-api-address", runtime_api_address, "--node-config", node_config,
            "--parent-pid", str(parent_pid), *(["--spare"] if spare else [])]


def spare_enabled() -> bool:
    return os.environ.get(SPARE_ENV, "1").strip() not in ("0", "false", "no", "off")


class Spare(subprocess.Popen):
    """A spare ClientApp process and the read end of the pipe it reports readiness on."""

    ready_fd: int
    is_ready: bool = False

    def ready(self) -> bool:
        """True once the spare wrote its byte (its imports are done); never blocks."""
        import select

        if not self.is_ready and self.ready_fd >= 0 and select.select([self.ready_fd], [], [], 0)[0]:
            self.is_ready = os.read(self.ready_fd, 1) == b"1"
        return self.is_ready


def start_spare(runtime_api_address: str, node_config: str) -> Spare:
    """A guarded ClientApp process that imports now and takes its token on stdin later. Its
    environment is this process's, as a per-task process gets it (minus the token variable)."""
    read_fd, write_fd = os.pipe()
    try:
        spare = Spare([*clientapp_argv(runtime_api_address, node_config, os.getpid(), spare=True),
                       "--ready-fd", str(write_fd)],
                      stdin=subprocess.PIPE, text=True, env=dict(os.environ), pass_fds=(write_fd,))
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    spare.ready_fd = read_fd
    _log(INFO, "spare ClientApp process %d started", spare.pid)
    return spare


def hand_off(spare: Spare, token: str) -> bool:
    """Give ``token`` to ``spare`` if its imports are done; False if not ready or gone (the task
    then gets a fresh process and ``spare`` waits for the next one)."""
    if spare.poll() is not None or not spare.ready():
        return False
    _close_ready_fd(spare)
    try:
        spare.stdin.write(token + "\n")
        spare.stdin.close()
    except (BrokenPipeError, OSError):
        return False
    return True


def _close_ready_fd(spare: Spare) -> None:
    if spare.ready_fd >= 0:
        os.close(spare.ready_fd)
        spare.ready_fd = -1


def stop_spare(spare: Spare | None) -> None:
    if spare is None:
        return
    _close_ready_fd(spare)
    if spare.poll() is not None:
        return
    spare.stdin.close()  # the spare exits on EOF; terminate it if it is still importing
    try:
        spare.wait(timeout=2)
    except subprocess.TimeoutExpired:
        spare.terminate()


def run_executor(runtime_api_address: str, node_config: str, parent_pid: int | None = None,
                 poll: float = 0.25) -> None:
    """Take ClientApp tasks from the SuperNode's Runtime API; start a guarded process for each.

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
    use_spare = spare_enabled()
    spare = start_spare(runtime_api_address, node_config) if use_spare else None
    try:
        while True:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            if res.HasField("task") and res.token:
                if spare is not None and hand_off(spare, res.token):
                    _log(INFO, "task handed to spare ClientApp process %d", spare.pid)
                    children.append(spare)
                    spare = start_spare(runtime_api_address, node_config)
                else:
                    env = {**os.environ, TOKEN_ENV: res.token}
                    children.append(subprocess.Popen(
                        clientapp_argv(runtime_api_address, node_config, os.getpid()), env=env))
                    if spare is not None:
                        _log(INFO, "task given a fresh ClientApp process %d (spare %d still importing)",
                             children[-1].pid, spare.pid)
                    if spare is not None and spare.poll() is not None:  # died: replace it
                        stop_spare(spare)
                        spare = start_spare(runtime_api_address, node_config)
            children = [c for c in children if c.poll() is None]  # reap finished ones
            time.sleep(poll)
    finally:
        stop_spare(spare)
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
    for name in ("executor", "clientapp", "check"):
        p = sub.add_parser(name)
        p.add_argument("--runtime-api-address", required=True)
        p.add_argument("--node-config", required=True)
        p.add_argument("--parent-pid", type=int)
        if name == "clientapp":
            p.add_argument("--spare", action="store_true",
                           help="import first, then read the task token from stdin (started by the executor)")
            p.add_argument("--ready-fd", type=int, help="with --spare: write one byte here when imported")
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
    token = os.environ.pop(TOKEN_ENV, "")
    _site_logging()
    if args.spare:
        token = wait_for_token(ready_fd=args.ready_fd)
        if not token:  # the executor stopped before it had a task for this process
            return 0
    if not token:
        print(f"{TOKEN_ENV} is not set", file=sys.stderr)
        return 2
    run_guarded_clientapp(args.runtime_api_address, token, approved_from_node_config(args.node_config),
                          args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
