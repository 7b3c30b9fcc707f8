"""The guard's fork server (``connectors/flower/guard.py``): one forked process per task token,
tokens framed by lines whatever the pipe's chunks, exit at EOF, and no inherited generator state.

The whole path (real SuperNodes, a task per round forked by each site's server) runs in
``tests/test_federation.py``; here the server runs a recording task instead of a ClientApp.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from graphveil.connectors.flower import guard


def _serve_in_child(out: Path, fd: int, write_fd: int) -> int:
    """Fork a child (so the server's parent is this test process) that serves ``fd`` with a task
    recording (token, its own pid) in ``out``."""
    def record(token: str) -> int:
        with out.open("a") as f:
            f.write(json.dumps([token, os.getpid()]) + "\n")
        return 0

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(write_fd)  # else the server holds its own pipe open and never sees EOF
            guard.serve_forks(record, fd=fd, imports=lambda: None)
            code = 0
        finally:
            os._exit(code)
    return pid


def test_each_token_runs_in_a_process_of_its_own_and_eof_stops_the_server(tmp_path: Path) -> None:
    out = tmp_path / "tasks.jsonl"
    read_fd, write_fd = os.pipe()
    server = _serve_in_child(out, read_fd, write_fd)
    os.close(read_fd)
    # tokens split across writes and several in one write: framing is by line, not by chunk
    for chunk in (b"tok-a\ntok", b"-b\n", b"\ntok-c\ntok-d\n"):
        os.write(write_fd, chunk)
        time.sleep(0.2)
    os.close(write_fd)
    _, status = os.waitpid(server, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0  # EOF: the server returned
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(out.read_text().splitlines() if out.exists() else []) < 4:
        time.sleep(0.05)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r[0] for r in rows) == ["tok-a", "tok-b", "tok-c", "tok-d"]
    pids = [r[1] for r in rows]
    assert len(set(pids)) == 4 and server not in pids  # a fresh child per task, never the server


def test_a_failing_task_does_not_stop_the_server(tmp_path: Path) -> None:
    out = tmp_path / "tasks.jsonl"

    def flaky(token: str) -> int:
        if token == "boom":
            raise RuntimeError("task failed")
        with out.open("a") as f:
            f.write(token + "\n")
        return 0

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(write_fd)
            guard.serve_forks(flaky, fd=read_fd, imports=lambda: None)
        finally:
            os._exit(0)
    os.close(read_fd)
    os.write(write_fd, b"boom\n")
    time.sleep(0.3)
    os.write(write_fd, b"after\n")
    os.close(write_fd)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.05)
    assert out.read_text() == "after\n"


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

    def record(token: str) -> int:
        with out.open("a") as f:
            f.write(token + "\n")
        return 0

    read_fd, write_fd = os.pipe()
    os.write(write_fd, b"queued\n")  # before the server even starts
    pid = os.fork()
    if pid == 0:
        try:
            os.close(write_fd)
            guard.serve_forks(record, fd=read_fd, imports=broken_imports)
        finally:
            os._exit(0)
    os.close(read_fd)
    os.close(write_fd)
    os.waitpid(pid, 0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not out.exists():
        time.sleep(0.05)
    assert out.read_text() == "queued\n"
