"""The default method: the run config's one-shot releases in order, then DP-SGD training."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import Method, Plan, Release, Train


class DpSgd(Method):
    """The run config's mechanisms in order (one-shot releases), then DP-SGD on the run's model."""

    def plan(self, config: Any, mechanisms: Sequence[tuple[str, Mechanism]]) -> Plan:
        return Plan((*(Release(name, m) for name, m in mechanisms), Train()))
