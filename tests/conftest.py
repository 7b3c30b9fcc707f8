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
