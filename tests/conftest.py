"""Shared fixtures and the suite's parallel layout. Tests never download: models are built tiny
from a config or come from packages.

The suite runs on every core with pytest-xdist (``./run test``: ``-n auto --dist loadgroup``).
Tests that must not run beside each other, or that share one expensive module fixture, carry
``xdist_group`` and so run on one worker: every ``federation`` test (real SuperLink/SuperNode
processes: two federations at once on a small machine miss their timeouts) and every
``simulation`` test (Flower's Simulation Engine: a Ray runtime on every core), and modules that
mark themselves (e.g. the PostgreSQL server of the SQL source's tests).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CITESEER_TAPE = SHARED / "data" / "text_attributed" / "citeseer_tape"


def pytest_configure(config: pytest.Config) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        # N workers x all cores' intra-op threads oversubscribe the CPU: share the cores out.
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


_GROUP_LOST = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    for item in items:  # before xdist reads the groups
        # a simulation (a local Ray runtime sized to every core) beside a loopback federation would
        # starve it: both kinds share one group, so one worker runs them one after the other
        if (item.get_closest_marker("federation") or item.get_closest_marker("simulation")) and \
                not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("flower-loopback"))
    result = yield
    # After xdist wrote each group into the node id. When a pytest release stops honouring that
    # write (pytest 9.2 with xdist 3.8), groups vanish silently and two loopback federations run
    # at once: fail those tests with the reason instead.
    if getattr(config.option, "loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid.rpartition("::")[2]:
                item.stash[_GROUP_LOST] = True
    return result


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_GROUP_LOST, False):
        pytest.fail("pytest-xdist did not apply this test's xdist_group: this pytest and "
                    "pytest-xdist do not work together (see the pin in pyproject.toml's test extra)")


@pytest.fixture(scope="session")
def citeseer_tape_dir() -> Path:
    if not CITESEER_TAPE.is_dir():
        pytest.skip(f"shared data not present at {CITESEER_TAPE}")
    return CITESEER_TAPE


@pytest.fixture
def flower_task():
    """Flower builds Messages only inside a task: pretend to be one (task 1 of run 1, node 0)."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
