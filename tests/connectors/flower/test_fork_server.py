"""The guard's fork server (``connectors/graphveil/connectors/flower/guard.py``): one forked process per task token,
tokens framed by lines whatever the pipe's chunks, exit at EOF, and no inherited generator state.

The whole path (real SuperNodes, a task per round forked by each site's server) runs in
``tests/connectors/flower/test_federation.py``; here the server runs a recording task instead of a ClientApp.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from graphveil.connectors.flower import guard


def _recorder(out: Path):  # noqa: ANN202 - a task for serve_forks
    """A task recording (token, its own pid) as one JSON line in ``out``."""
    def record(token: str) -> int:
        with out.open("a") as f:
            f.write(json.dumps([token, os.getpid()]) + "\n")
        return 0

    return record


def _serve_in_child(run_task, read_fd: int, write_fd: int, imports=lambda: None) -> int:  # noqa: ANN001
    """Fork a child (so the server's parent is this test process) serving ``read_fd`` with
    ``run_task``; returns its pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(write_fd)  # else the server holds its own pipe open and never sees EOF
            guard.serve_forks(run_task, fd=read_fd, imports=imports)
            code = 0
        finally:
            os._exit(code)
    os.close(read_fd)
    return pid


def _recorded(out: Path, count: int) -> list[list]:
    """The (token, pid) rows in ``out`` once ``count`` are there (forked tasks may outlive the
    server), or after 10 s."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(out.read_text().splitlines() if out.exists() else []) < count:
        time.sleep(0.05)
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_each_token_runs_in_a_process_of_its_own_and_eof_stops_the_server(tmp_path: Path) -> None:
    out = tmp_path / "tasks.jsonl"
    read_fd, write_fd = os.pipe()
    server = _serve_in_child(_recorder(out), read_fd, write_fd)
    # tokens split across writes and several in one write: framing is by line, not by chunk
    for chunk in (b"tok-a\ntok", b"-b\n", b"\ntok-c\ntok-d\n"):
        os.write(write_fd, chunk)
        time.sleep(0.2)
    os.close(write_fd)
    _, status = os.waitpid(server, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0  # EOF: the server returned
    rows = _recorded(out, 4)
    assert sorted(r[0] for r in rows) == ["tok-a", "tok-b", "tok-c", "tok-d"]
    pids = [r[1] for r in rows]
    assert len(set(pids)) == 4 and server not in pids  # a fresh child per task, never the server


def test_a_failing_task_does_not_stop_the_server(tmp_path: Path) -> None:
    out = tmp_path / "tasks.jsonl"
    record = _recorder(out)

    def flaky(token: str) -> int:
        if token == "boom":
            raise RuntimeError("task failed")
        return record(token)

    read_fd, write_fd = os.pipe()
    server = _serve_in_child(flaky, read_fd, write_fd)
    os.write(write_fd, b"boom\n")
    time.sleep(0.3)
    os.write(write_fd, b"after\n")
    os.close(write_fd)
    os.waitpid(server, 0)
    assert [r[0] for r in _recorded(out, 1)] == ["after"]


def test_forked_tasks_do_not_share_the_parents_generator_states() -> None:
    """numpy's and torch's global generators survive a fork unchanged; a task reseeds them, so
    two tasks forked from one server never draw the same numbers."""
    import numpy as np
    import torch

    np.random.rand()  # numpy seeds its global state lazily: make it exist before the forks
    draws = []
    for reseed in (False, True):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                if reseed:
                    guard._reseed_inherited_rngs()
                os.write(write_fd, json.dumps([np.random.rand(), torch.rand(1).item()]).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        os.waitpid(pid, 0)
        draws.append(json.loads(os.read(read_fd, 4096)))
        os.close(read_fd)
    here = [np.random.rand(), torch.rand(1).item()]
    assert draws[0] == here  # without a reseed the child repeats the parent's next draws
    assert draws[1][0] != here[0] and draws[1][1] != here[1]


def test_a_failed_import_ahead_does_not_lose_the_tasks(tmp_path: Path) -> None:
    """Tokens queued while the server imports still run if the imports fail (a task then
    imports what it needs itself): the first task of a round must not vanish in the pipe."""
    out = tmp_path / "tasks.jsonl"

    def broken_imports() -> None:
        raise ImportError("no module named 'torch'")

    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"queued\n")  # before the server even starts
    server = _serve_in_child(_recorder(out), read_fd, write_fd, imports=broken_imports)
    os.close(write_fd)
    os.waitpid(server, 0)
    assert [r[0] for r in _recorded(out, 1)] == ["queued"]
