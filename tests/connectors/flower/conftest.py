"""Fixtures of the Flower connector's tests."""

from __future__ import annotations

import pytest
from _fed_support import FakeSession


@pytest.fixture
def fresh_fake_sessions(flower_task):
    """Inside a (pretend) Flower task, with no ``FakeSession`` left from another test."""
    FakeSession.instances.clear()
