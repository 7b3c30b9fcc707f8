"""Accounting events dp-accounting does not define (imported only where an event is built)."""

from __future__ import annotations

import attr
import dp_accounting


@attr.s(frozen=True, slots=True, auto_attribs=True)
class PureDpEvent(dp_accounting.DpEvent):
    """A release that is ε-DP (δ = 0) under the mechanism's unit, e.g. randomized response on
    node features or labels. GraphVeil's RDP accountants compose it as ``min(ε, α·ε²/2)``
    (:meth:`graphveil.privacy.RdpAccountantBase.event_rdp`)."""

    epsilon: float
