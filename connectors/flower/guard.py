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
  SuperExec does, and starts one guarded ClientApp process per task (:func:`run_guarded_clientapp`).
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
# the executor next to the SuperNode (instead of Flower's SuperExec)
# --------------------------------------------------------------------------------------------


def clientapp_argv(runtime_api_address: str, node_config: str, parent_pid: int) -> list[str]:
    return [sys.executable, "-m", "graphveil.connectors.flower.guard", "clientapp",
            "--runtime-api-address", runtime_api_address, "--node-config", node_config,
            "--parent-pid", str(parent_pid)]


def run_executor(runtime_api_address: str, node_config: str, parent_pid: int | None = None,
                 poll: float = 1.0) -> None:
    """Take ClientApp tasks from the SuperNode's Runtime API; start a guarded process for each."""
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
    try:
        while True:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
            if res.HasField("task") and res.token:
                env = {**os.environ, TOKEN_ENV: res.token}
                children.append(subprocess.Popen(
                    clientapp_argv(runtime_api_address, node_config, os.getpid()), env=env))
            children = [c for c in children if c.poll() is None]  # reap finished ones
            time.sleep(poll)
    finally:
        client.close()


# --------------------------------------------------------------------------------------------
# python -m graphveil.connectors.flower.guard {executor,clientapp,check}
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphveil.connectors.flower.guard")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("executor", "clientapp", "check"):
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
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        print(f"{TOKEN_ENV} is not set", file=sys.stderr)
        return 2
    run_guarded_clientapp(args.runtime_api_address, token, approved_from_node_config(args.node_config),
                          args.parent_pid)
    return 0


if __name__ == "__main__":
    sys.exit(main())
