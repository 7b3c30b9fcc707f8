"""σ calibration from a window of RDP orders (graphveil.privacy.order_window, issue 10 item 5).

Each bisection step of ``RdpAccountantBase.calibrate`` asks whether ε(σ) ≤ target; the window
answers it from a few orders plus lower bounds on the rest. These tests hold it to the answers
of the whole curve: the same σ as a bisection on full curves, for every RDP accountant, and the
same decision as the full grid on random monotone, convex curves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.plugins.dp_gcn.accountant import SplitRdpAccountant
from graphveil.plugins.dp_gcn.units import SPLIT_REPLACE
from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
from graphveil.plugins.entity_dp.accountant import CoupledRdpAccountant
from graphveil.plugins.gdp.rooted_accountant import RootedRdpAccountant
from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant
from graphveil.plugins.node_dp.units import NODE_GDP
from graphveil.privacy import DEFAULT_ORDERS, bisect_sigma, rdp_to_epsilon
from graphveil.privacy.order_window import OrderWindow

ORDERS = np.asarray(DEFAULT_ORDERS)


def _coupled(kind: SensitivityKind) -> CoupledRdpAccountant:
    acc = CoupledRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, 1e-3, 20_000, 5_000, 3, 2),
             SensitivityProfile(kind, PrivacyUnit.NODE, 1.0))
    return acc


def _edge() -> EdgeRdpAccountant:
    acc = EdgeRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.POISSON_DECOUPLED, 2e-3, 50_000),
             SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0))
    return acc


def _node() -> NodeReplaceRdpAccountant:
    acc = NodeReplaceRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 64 / 2708, 2708, batch_size=64),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, NODE_GDP, 1.0))
    return acc


def _split() -> SplitRdpAccountant:
    acc = SplitRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 2 / 40, 40, batch_size=2),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, SPLIT_REPLACE, 1.0))
    return acc


def _rooted() -> RootedRdpAccountant:
    acc = RootedRdpAccountant()
    acc.unit = PrivacyUnit.parse("node/replacement/D=10/predictions")
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 0.1, 200, batch_size=20, examples_per_unit=3),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, acc.unit, 1.0))
    return acc


ACCOUNTANTS = {
    "coupled_freq": lambda: _coupled(SensitivityKind.FREQ_CLIP_NODE),
    "coupled_standard": lambda: _coupled(SensitivityKind.STANDARD_TUPLE_NODE),
    "edge_rdp": _edge,
    "node_rdp": _node,
    "split_rdp": _split,
    "rooted_rdp": _rooted,
}
CASES = [("coupled_freq", 2.0, 500), ("coupled_standard", 8.0, 300), ("edge_rdp", 1.0, 2000),
         ("node_rdp", 4.0, 300), ("split_rdp", 4.0, 200), ("rooted_rdp", 8.0, 100)]


def _full_bisection(acc, target: float, delta: float, steps: int) -> float:
    """The calibration before the window: bisection on ε of full curves."""
    def epsilon_at(sigma: float) -> float:
        return rdp_to_epsilon(acc.orders, steps * acc.rdp_curve(sigma), delta)[0]

    return bisect_sigma(epsilon_at, target, sigma_range=acc.SIGMA_RANGE, rtol=acc.CALIBRATE_RTOL)


@pytest.mark.slow  # the reference bisection computes ~14 full curves per case
@pytest.mark.parametrize(("name", "target", "steps"), CASES)
def test_same_sigma_as_bisection_on_full_curves(name: str, target: float, steps: int) -> None:
    delta = 1e-5
    sigma = ACCOUNTANTS[name]().calibrate(target_epsilon=target, delta=delta, num_steps=steps)
    assert sigma == _full_bisection(ACCOUNTANTS[name](), target, delta, steps)
    acc = ACCOUNTANTS[name]()
    acc.step(noise_multiplier=sigma, num_steps=steps)
    assert acc.get_epsilon(delta) <= target


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_a_few_orders_equal_the_full_curve_there(name: str) -> None:
    acc = ACCOUNTANTS[name]()
    index = np.array([0, 9, 10, 37, 98, 99, 120, ORDERS.size - 1])
    part = acc._per_step_rdp_at(1.3, index)
    assert np.array_equal(acc.orders, ORDERS)  # the grid is put back
    np.testing.assert_allclose(part, acc.rdp_curve(1.3)[index], rtol=1e-12)
    np.testing.assert_array_equal(acc._per_step_rdp_at(1.3, index), acc.rdp_curve(1.3)[index])  # cached curve


@pytest.mark.parametrize("name", sorted(ACCOUNTANTS))
def test_per_step_rdp_on_given_orders_equals_the_full_grid_there(name: str) -> None:
    acc = ACCOUNTANTS[name]()
    index = np.array([120, 0, 99, 37, ORDERS.size - 1, 10])  # unsorted: values follow the orders
    full = acc.per_step_rdp(1.3)
    assert full.shape == ORDERS.shape
    np.testing.assert_allclose(acc.per_step_rdp(1.3, orders=ORDERS[index]), full[index], rtol=1e-12)
    np.testing.assert_allclose(acc.per_step_rdp(1.3, orders=list(ORDERS[[98]])), full[[98]], rtol=1e-12)
    assert np.array_equal(acc.orders, ORDERS)
    for bad in ([], [1.0], [2.0, np.inf]):
        with pytest.raises(PrivacyError, match="RDP orders"):
            acc.per_step_rdp(1.3, orders=bad)


class _LegacyEdge(EdgeRdpAccountant):
    """A plugin accountant written before ``per_step_rdp`` took ``orders``."""

    def per_step_rdp(self, noise_multiplier: float) -> np.ndarray:  # type: ignore[override]
        return super().per_step_rdp(noise_multiplier)


def test_a_plugin_without_orders_still_calibrates_to_the_same_sigma() -> None:
    legacy, current = _LegacyEdge(), _edge()
    legacy.bind(SamplingProfile(SamplingKind.POISSON_DECOUPLED, 2e-3, 50_000),
                SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0))
    index = np.array([5, 60, 3])
    np.testing.assert_array_equal(legacy._per_step_rdp_at(1.1, index), current.rdp_curve(1.1)[index])
    np.testing.assert_array_equal(legacy.orders, ORDERS)
    kwargs = dict(target_epsilon=2.0, delta=1e-5, num_steps=2_000)
    assert legacy.calibrate(**kwargs) == current.calibrate(**kwargs)


def test_the_window_evaluates_few_orders() -> None:
    acc = _coupled(SensitivityKind.FREQ_CLIP_NODE)
    window = OrderWindow(acc.orders, acc._per_step_rdp_at, 500, 1e-5)
    planned = np.zeros(ORDERS.size)
    for sigma in (0.5, 1.0, 2.0, 1.5, 1.2):
        full = rdp_to_epsilon(ORDERS, 500 * acc.rdp_curve(sigma), 1e-5)[0]
        assert window.feasible(sigma, planned, 2.0) == (full <= 2.0)
    assert window.evaluated < 5 * ORDERS.size / 3  # a third of the grid per decision at most, on average


def test_infeasible_target_names_the_full_epsilon() -> None:
    acc = _edge()
    top = acc.SIGMA_RANGE[1]
    full = rdp_to_epsilon(acc.orders, 10**9 * acc.rdp_curve(top), 1e-5)[0]
    with pytest.raises(PrivacyError, match=f"ε={full:.4g}"):
        acc.calibrate(target_epsilon=1e-3, delta=1e-5, num_steps=10**9)


def _curve(scale: float, slope: float, power: float) -> np.ndarray:
    """A monotone ρ with (α − 1)ρ convex: ρ(α) = scale·α^power + slope·(α − 1), power ∈ [0, 1]."""
    return scale * ORDERS**power + slope * (ORDERS - 1)


@settings(max_examples=200, deadline=None)
@given(scale=st.floats(1e-8, 1.0), slope=st.floats(0.0, 1e-2), power=st.floats(0.0, 1.0),
       steps=st.integers(1, 10_000), log_delta=st.floats(-20.0, -3.0), target=st.floats(0.05, 50.0),
       pure=st.one_of(st.none(), st.floats(0.01, 2.0)), best=st.integers(0, ORDERS.size - 1))
def test_decision_equals_the_full_grid(scale, slope, power, steps, log_delta, target, pure, best) -> None:
    rho = _curve(scale, slope, power)
    rho[np.isclose(ORDERS, 7.7)] = np.inf  # an order the analysis cannot bound (as dp-accounting's)
    delta = math.exp(log_delta)
    planned = np.zeros(ORDERS.size) if pure is None else np.minimum(pure, ORDERS * pure**2 / 2)
    window = OrderWindow(ORDERS, lambda _sigma, index: rho[index], steps, delta)
    window.best = best  # wherever the last optimum was
    full = rdp_to_epsilon(ORDERS, planned + steps * rho, delta)[0]
    assert window.feasible(1.0, planned, target) == (full <= target)
