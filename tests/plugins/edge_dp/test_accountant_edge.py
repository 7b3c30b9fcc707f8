"""``edge_rdp`` against dp-accounting's own RdpAccountant, and the non-private ``no_accounting``."""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest

from graphveil.contract.errors import PrivacyError, ProfileMismatchError
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
from graphveil.plugins.entity_dp.accountant import CoupledRdpAccountant
from graphveil.plugins.standard.no_accounting import NoAccountant
from graphveil.privacy import DEFAULT_ORDERS, rdp_to_epsilon

EDGE = SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0)


def _edge(rate: float = 2e-3, kind: SamplingKind = SamplingKind.POISSON_DECOUPLED) -> EdgeRdpAccountant:
    acc = EdgeRdpAccountant()
    acc.bind(SamplingProfile(kind, rate, 50_000), EDGE)
    return acc


def _library(rate: float, history: list[tuple[float, int]]) -> dp_accounting.rdp.RdpAccountant:
    lib = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS))
    for sigma, steps in history:
        lib.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)
    return lib


@pytest.mark.parametrize("kind", [SamplingKind.POISSON_DECOUPLED, SamplingKind.POISSON])
@pytest.mark.parametrize(("rate", "history"), [
    (2e-3, [(1.0, 1000)]),
    (0.01, [(0.8, 300), (1.5, 200), (0.8, 100)]),
    (1.0, [(5.0, 10)]),
])
def test_matches_dp_accounting_rdp_accountant(kind: SamplingKind, rate: float, history: list) -> None:
    acc = _edge(rate, kind)
    for sigma, steps in history:
        acc.step(noise_multiplier=sigma, num_steps=steps)
    lib = _library(rate, history)
    np.testing.assert_allclose(acc.total_rdp(), lib.rdp, rtol=1e-12)
    assert len(acc) == sum(n for _, n in history)
    for delta in (1e-5, 1e-8):
        eps, alpha = lib.get_epsilon_and_optimal_order(delta)
        assert acc.get_epsilon(delta) == pytest.approx(eps, rel=1e-12)
        assert acc.report(delta)["alpha"] == alpha


def test_report_and_state_round_trip() -> None:
    acc = _edge()
    acc.step(noise_multiplier=1.1, num_steps=700)
    report = acc.report(1e-6)
    assert report["mechanism"] == "edge_rdp" and report["unit"] == "edge" and report["steps"] == 700
    assert len(report["rdp"]) == len(DEFAULT_ORDERS)
    json.dumps(report)
    state = json.loads(json.dumps(acc.state_dict()))
    fresh = _edge()
    fresh.load_state_dict(state)
    assert fresh.get_epsilon(1e-6) == acc.get_epsilon(1e-6)
    with pytest.raises(PrivacyError, match="profile"):
        _edge(rate=3e-3).load_state_dict(state)
    coupled = CoupledRdpAccountant()
    coupled.bind(SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, 1e-3, 1000, 1000, 2, 1),
                 SensitivityProfile(SensitivityKind.FREQ_CLIP_NODE, PrivacyUnit.NODE, 1.0))
    with pytest.raises(PrivacyError, match="mechanism 'coupled_rdp'"):
        fresh.load_state_dict(coupled.state_dict())


def test_calibrate_matches_a_direct_search() -> None:
    acc = _edge(rate=0.01)
    sigma = acc.calibrate(target_epsilon=1.0, delta=1e-5, num_steps=1000)
    eps_at = lambda s: _library(0.01, [(s, 1000)]).get_epsilon(1e-5)  # noqa: E731
    assert eps_at(sigma) <= 1.0 < eps_at(sigma / (1 + 2 * acc.CALIBRATE_RTOL))


@pytest.mark.parametrize(("sampling", "sensitivity"), [
    (SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, 1e-3, 1000, 1000, 2, 1), EDGE),
    (SamplingProfile(SamplingKind.POISSON, 1e-3, 1000),
     SensitivityProfile(SensitivityKind.FREQ_CLIP_NODE, PrivacyUnit.NODE, 1.0)),
    (SamplingProfile(SamplingKind.POISSON, 1e-3, 1000),
     SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.NODE, 1.0)),
])
def test_bind_refuses_other_pairs(sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
    with pytest.raises(ProfileMismatchError, match="edge_rdp"):
        EdgeRdpAccountant().bind(sampling, sensitivity)


@pytest.mark.parametrize("rate", [0.0, -0.1, 1.5, math.nan])
def test_bind_refuses_bad_rate(rate: float) -> None:
    with pytest.raises(PrivacyError, match="gamma"):
        _edge(rate)


# ------------------------------------------------------------------ non-private baseline
def test_no_accounting_claims_nothing() -> None:
    acc = NoAccountant()
    for kind in SamplingKind:
        acc.bind(SamplingProfile(kind, 0.1, 100), SensitivityProfile(SensitivityKind.NONE, PrivacyUnit.EDGE, math.inf))
    assert all(s is SensitivityKind.NONE for _, s in acc.supports) and len(acc.supports) == len(SamplingKind)
    acc.step(noise_multiplier=0.0, num_steps=5)
    assert len(acc) == 5 and acc.get_epsilon(1e-5) == math.inf and acc.report(1e-5)["epsilon"] == math.inf
    with pytest.raises(PrivacyError):
        acc.calibrate(target_epsilon=1.0, delta=1e-5, num_steps=10)
    with pytest.raises(PrivacyError, match="delta"):
        acc.get_epsilon(0.0)
    with pytest.raises(ProfileMismatchError):
        acc.bind(SamplingProfile(SamplingKind.POISSON, 0.1, 100), EDGE)
    restored = NoAccountant()
    restored.load_state_dict(json.loads(json.dumps(acc.state_dict())))
    assert len(restored) == 5
    with pytest.raises(PrivacyError, match="mechanism"):
        restored.load_state_dict(_edge().state_dict())
    assert rdp_to_epsilon([2.0], [math.inf], 0.5)[0] == math.inf  # what a DP accountant would say instead
