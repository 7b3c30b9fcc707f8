"""Shared fixtures. Tests never download: models are built tiny from a config or come from packages."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CITESEER_TAPE = SHARED / "data" / "text_attributed" / "citeseer_tape"


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
