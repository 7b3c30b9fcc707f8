"""A site's rounds on the ledger, shared by the ledger tests (no tests in this module)."""

from __future__ import annotations

from _fed_support import ORDERS

from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.ledger import PrivacyLedger
from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
from graphveil.privacy import RdpParams

DELTA = 1e-5
RATE = 0.02


def edge(rate: float = RATE, orders=ORDERS) -> EdgeRdpAccountant:
    """An edge-level RDP accountant (dp-accounting's Poisson-subsampled Gaussian) bound to γ."""
    acc = EdgeRdpAccountant(RdpParams(orders=orders))
    acc.bind(SamplingProfile(SamplingKind.POISSON, rate, num_records=1000),
             SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0))
    return acc


def site_round(ledger: PrivacyLedger, steps: int, sigma: float, budget: float, rate: float = RATE, **kw) -> float:
    """One site round: reserve, run the steps on this run's own accountant, release."""
    res = ledger.reserve(edge(rate), noise_multiplier=sigma, steps=steps, delta=DELTA, budget=budget, **kw)
    running = edge(rate)
    if steps:
        running.step(noise_multiplier=sigma, num_steps=steps)
    return ledger.release(res, running).epsilon
