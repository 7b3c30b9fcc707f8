"""One accountant composes events of different kinds: DP-SGD steps (edge-level Poisson, the coupled
theorems of paper 1), one-shot Gaussian releases and pure-ε releases (randomized response).

Each curve is checked against dp-accounting or a closed form; the mutants these catch: the RR
event analysed under add/remove (dp-accounting refuses it), the pure-ε bound replaced by ε
alone or by αε²/2 alone, events not added to the total.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
from graphveil.plugins.entity_dp.accountant import CoupledRdpAccountant
from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant
from graphveil.plugins.node_dp.units import NODE_GDP
from graphveil.privacy.conversion import rdp_to_epsilon
from graphveil.privacy.events import PureDpEvent

Rel = dp_accounting.privacy_accountant.NeighboringRelation


def edge_accountant() -> EdgeRdpAccountant:
    acc = EdgeRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.POISSON, rate=0.01, num_records=10_000),
             SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0))
    return acc


def coupled_accountant() -> CoupledRdpAccountant:
    acc = CoupledRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, rate=0.01, num_records=2000, num_nodes=1000,
                             degree_cap=3, k_neg=1),
             SensitivityProfile(SensitivityKind.FREQ_CLIP_NODE, PrivacyUnit.NODE, 1.0))
    return acc


def rr_event(eps0: float) -> dp_accounting.RandomizedResponseDpEvent:
    """Binary RR flipping each entry with probability 1/(1+e^ε₀): dp-accounting's noise parameter
    is the probability of answering uniformly at random, i.e. twice the flip probability."""
    return dp_accounting.RandomizedResponseDpEvent(2.0 / (1.0 + math.exp(eps0)), 2)


@pytest.mark.parametrize("eps0", [0.5, 2.0, 5.0])
def test_randomized_response_on_edges_is_its_exact_replace_one_curve_and_pure_eps0(eps0: float) -> None:
    acc = edge_accountant()
    acc.compose_event(rr_event(eps0), "rand_edge")
    by_hand = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in acc.orders],
                                              neighboring_relation=Rel.REPLACE_ONE)
    by_hand.compose(rr_event(eps0))
    np.testing.assert_allclose(acc.total_rdp(), by_hand.rdp, rtol=1e-12)
    assert float(acc.total_rdp().max()) <= eps0 * (1 + 1e-9)  # never above the pure-ε₀ divergence
    assert float(acc.total_rdp()[-1]) >= 0.8 * eps0  # and tends to ε₀ at high orders (not vacuous)


def test_randomized_response_is_refused_for_a_node_level_unit() -> None:
    acc = coupled_accountant()
    with pytest.raises(PrivacyError, match="randomized response on adjacency entries protects one edge"):
        acc.compose_event(rr_event(1.0), "rand_edge")


@pytest.mark.parametrize("eps0", [0.1, 1.0, 4.0])
def test_a_pure_eps_event_is_min_of_eps_and_zcdp(eps0: float) -> None:
    acc = NodeReplaceRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 0.1, 100, batch_size=10),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, NODE_GDP, 1.0))
    acc.compose_event(PureDpEvent(eps0), "a")
    acc.compose_event(PureDpEvent(eps0), "b")
    curve = 2 * np.minimum(eps0, acc.orders * eps0**2 / 2)
    np.testing.assert_allclose(acc.total_rdp(), curve, rtol=1e-12)
    if eps0 < 2:  # orders below 2/ε₀ take the zCDP branch, the others the max-divergence one
        assert bool((acc.total_rdp() < 2 * eps0).any()) and bool((acc.total_rdp() < acc.orders * eps0**2).any())
    # no steps, pure releases only: the smaller of the RDP conversion and basic composition 2ε₀
    expected = min(rdp_to_epsilon(acc.orders, curve, 1e-6)[0], 2 * eps0)
    assert acc.get_epsilon(1e-6) == pytest.approx(expected, rel=1e-12)
    acc.step(noise_multiplier=50.0)  # with a step the curve is what counts
    assert acc.get_epsilon(1e-6) == pytest.approx(
        rdp_to_epsilon(acc.orders, curve + acc.rdp_curve(50.0), 1e-6)[0], rel=1e-12)
    with pytest.raises(PrivacyError, match="needs a finite ε >= 0"):
        acc.compose_event(PureDpEvent(math.inf), "c")


def test_coupled_steps_and_a_gaussian_release_compose_on_one_curve() -> None:
    acc = coupled_accountant()
    sigma, steps, release_sigma = 1.2, 50, 3.0
    acc.step(noise_multiplier=sigma, num_steps=steps)
    steps_only = acc.total_rdp()
    acc.compose_event(dp_accounting.GaussianDpEvent(release_sigma), "embedding")
    gaussian = acc.orders / (2 * release_sigma**2)  # RDP of the Gaussian at sensitivity 1
    np.testing.assert_allclose(acc.total_rdp(), steps_only + gaussian, rtol=1e-12)
    assert acc.get_epsilon(1e-6) == pytest.approx(rdp_to_epsilon(acc.orders, steps_only + gaussian, 1e-6)[0])
    assert acc.get_epsilon(1e-6) > rdp_to_epsilon(acc.orders, steps_only, 1e-6)[0]
    # one σ calibrated for steps plus a release that takes it, in the coupled accountant too
    sigma_plan = acc.calibrate(target_epsilon=8.0, delta=1e-6, num_steps=steps,
                               releases=lambda s: [("shared", dp_accounting.GaussianDpEvent(s))])
    fresh = coupled_accountant()
    fresh.step(noise_multiplier=sigma_plan, num_steps=steps)
    fresh.compose_event(dp_accounting.GaussianDpEvent(3.0), "embedding")
    fresh.compose_event(dp_accounting.GaussianDpEvent(sigma_plan), "shared")
    assert 8.0 * (1 - 0.02) <= fresh.get_epsilon(1e-6) <= 8.0


def test_leaf_curves_are_cached_and_composites_add_up_as_in_dp_accounting() -> None:
    from graphveil.privacy.rdp_accountant import _leaf_rdp, dp_event_rdp

    rel = dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE
    orders = [1.5, 2.0, 4.0, 16.0]
    swor = dp_accounting.SampledWithoutReplacementDpEvent(997, 31, dp_accounting.GaussianDpEvent(1.7))
    event = dp_accounting.ComposedDpEvent([dp_accounting.SelfComposedDpEvent(swor, 40),
                                           dp_accounting.GaussianDpEvent(3.0), swor])
    reference = dp_accounting.rdp.RdpAccountant(orders=orders, neighboring_relation=rel)
    reference.compose(event)
    before = _leaf_rdp.cache_info()
    np.testing.assert_allclose(dp_event_rdp(event, orders, rel), reference._rdp, rtol=1e-12)
    after = _leaf_rdp.cache_info()
    assert after.misses - before.misses <= 2 and after.hits - before.hits >= 1  # swor computed once
    np.testing.assert_allclose(dp_event_rdp(swor, orders, rel), dp_event_rdp(swor, orders, rel))
    with pytest.raises(Exception, match="PoissonSampledDpEvent"):
        dp_event_rdp(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(1.0)), orders, rel)
