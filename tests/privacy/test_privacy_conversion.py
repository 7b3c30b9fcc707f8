"""RDP → (ε, δ) conversion (Thm D.1) and the default order grid, against dp-accounting and opacus."""

from __future__ import annotations

import doctest
import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis.rdp import get_privacy_spent

from graphveil.contract.errors import GraphVeilError, PrivacyError
from graphveil.privacy import DEFAULT_ORDERS, rdp_to_epsilon, validate_delta, validate_orders
from graphveil.privacy import conversion as conversion_module


def test_doctests() -> None:
    assert doctest.testmod(conversion_module).failed == 0


def test_default_grid_has_fractional_and_integer_orders_up_to_256() -> None:
    orders = np.asarray(DEFAULT_ORDERS)
    assert (np.diff(orders) > 0).all() and orders[0] == pytest.approx(1.1) and orders[-1] == 256
    fractional = orders[orders != np.round(orders)]
    assert fractional.size == 90 and fractional.max() == pytest.approx(10.9)
    assert set(range(2, 65)) <= set(orders[orders == np.round(orders)].astype(int))


def test_single_order_is_theorem_d1_by_hand() -> None:
    alpha, rdp, delta = 8.0, 0.3, 1e-6
    expected = rdp + math.log((alpha - 1) / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1)
    assert rdp_to_epsilon([alpha], [rdp], delta) == (pytest.approx(expected, rel=1e-14), alpha)


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
@settings(max_examples=60, deadline=None)
@given(
    scale=st.floats(1e-3, 50.0),
    power=st.floats(0.5, 2.0),
    log_delta=st.floats(-20.0, -4.0),
)
def test_matches_dp_accounting_and_opacus(scale: float, power: float, log_delta: float) -> None:
    orders = np.asarray(DEFAULT_ORDERS)
    # a plausible increasing RDP curve, kept above δ² so dp-accounting's extra KL bound
    # (ε = 0 when δ² > 1 − e^{−ρ}, not part of Thm D.1) never applies
    rdp = scale * orders**power / 100 + 0.01
    delta = math.exp(log_delta)
    eps, alpha = rdp_to_epsilon(orders, rdp, delta)
    ref_eps, ref_alpha = dp_accounting.rdp.compute_epsilon(orders, rdp, delta)
    op_eps, op_alpha = get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    assert eps == pytest.approx(ref_eps, rel=1e-12, abs=1e-12)
    assert eps == pytest.approx(max(0.0, op_eps), rel=1e-12, abs=1e-12)  # opacus does not clamp at 0
    if eps > 0:
        assert alpha == ref_alpha == op_alpha
        i = int(np.flatnonzero(orders == alpha)[0])
        assert rdp_to_epsilon([alpha], [rdp[i]], delta)[0] == pytest.approx(eps, rel=1e-14)


def test_infinite_orders_are_skipped_and_all_infinite_gives_inf() -> None:
    assert rdp_to_epsilon([2.0, 3.0], [np.inf, 0.1], 1e-5)[1] == 3.0
    assert rdp_to_epsilon([2.0, 3.0], [np.inf, np.inf], 1e-5)[0] == math.inf


def test_epsilon_is_clamped_at_zero_and_negative_rdp_does_not_lower_it() -> None:
    assert rdp_to_epsilon([64.0], [0.0], 0.5)[0] == 0.0
    assert rdp_to_epsilon([2.0], [-1.0], 1e-5)[0] == rdp_to_epsilon([2.0], [0.0], 1e-5)[0]


def test_epsilon_decreases_in_delta_and_increases_in_rdp() -> None:
    orders = np.asarray(DEFAULT_ORDERS)
    rdp = orders / 50
    assert rdp_to_epsilon(orders, rdp, 1e-8)[0] > rdp_to_epsilon(orders, rdp, 1e-4)[0]
    assert rdp_to_epsilon(orders, 2 * rdp, 1e-6)[0] > rdp_to_epsilon(orders, rdp, 1e-6)[0]


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.5, math.nan, math.inf, "x", None])
def test_bad_delta_is_refused_naming_the_value(delta: object) -> None:
    with pytest.raises(PrivacyError, match="delta") as info:
        validate_delta(delta)  # type: ignore[arg-type]
    assert repr(delta) in str(info.value)
    assert isinstance(info.value, GraphVeilError)
    with pytest.raises(PrivacyError):
        rdp_to_epsilon([2.0], [0.1], delta)  # type: ignore[arg-type]


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(PrivacyError, match="NaN"):
        rdp_to_epsilon([2.0, 3.0], [0.1, math.nan], 1e-5)
    with pytest.raises(PrivacyError):
        rdp_to_epsilon([2.0, 3.0], [0.1], 1e-5)
    with pytest.raises(PrivacyError):
        rdp_to_epsilon([1.0], [0.1], 1e-5)
    for bad in ([], [1.0], [0.5, 2.0], [2.0, math.inf], [math.nan]):
        with pytest.raises(PrivacyError):
            validate_orders(bad)
    assert list(validate_orders([3, 2, 2.5, 3])) == [2.0, 2.5, 3.0]
