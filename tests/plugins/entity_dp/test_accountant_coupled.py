"""Coupled-sampling RDP (paper 1, Thm 3 / Thm C.1) and the ``coupled_rdp`` accountant.

References: dp-accounting and opacus for the Poisson-subsampled Gaussian (the K = 1, k_neg = 0
reduction), mpmath quadrature for Ψ, and a brute-force sum over every ℓ = 0…m for the
binomial expectation.
"""

from __future__ import annotations

import copy
import doctest
import json
import math

import dp_accounting
import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opacus.accountants.analysis.rdp import compute_rdp
from scipy.special import logsumexp
from scipy.stats import binom

from graphveil.contract.errors import ConfigError, PrivacyError, ProfileMismatchError
from graphveil.contract.host import PluginHost
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.plugins.entity_dp import coupled_rdp as C
from graphveil.plugins.entity_dp.accountant import (
    CoupledRdpAccountant,
    CoupledRdpFreqAccountant,
    CoupledRdpStandardAccountant,
)
from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
from graphveil.privacy import DEFAULT_ORDERS, rdp_to_epsilon

ORDERS = np.asarray(DEFAULT_ORDERS)
SOME = np.array([1.1, 1.5, 2.0, 2.7, 4.0, 6.3, 10.0, 24.0, 64.0, 256.0])
FRACTIONAL = ORDERS[ORDERS != np.round(ORDERS)]
INTEGER = ORDERS[ORDERS == np.round(ORDERS)]
FREQ, STANDARD = SensitivityKind.FREQ_CLIP_NODE, SensitivityKind.STANDARD_TUPLE_NODE


def test_doctests() -> None:
    assert doctest.testmod(C).failed == 0


# ------------------------------------------------------------------ Ψ against independent references
def _mp_log_excess(beta: float, weights: np.ndarray, sigma: float) -> float:
    """log(E_{t∼N(0,1)} (Σ_μ w_μ e^{μt/σ − μ²/(2σ²)})^β − 1) by mpmath quadrature.

    The band is located on a float grid (log-integrand within 150 nats of its maximum), then
    integrated at 25 digits; independent of the module's envelope/band/trapezoid code.
    """
    mp.mp.dps = 25
    mus = np.arange(len(weights))
    span = abs(beta) * mus[-1] / sigma
    grid = np.linspace(-60 - span, 60 + span, 20_001)
    with np.errstate(divide="ignore"):
        log_ratio = logsumexp(np.log(weights) + np.outer(grid, mus / sigma) - mus**2 / (2 * sigma**2), axis=1)
    log_f = -grid**2 / 2 + beta * log_ratio
    inside = grid[log_f > log_f.max() - 150]
    lo, hi = inside[0] - 1, inside[-1] + 1
    w = [mp.mpf(float(x)) for x in weights]
    if w[0] > 0:  # exactly a probability vector (float weights are off by ~1e-16), as in the module
        w[0] = 1 - mp.fsum(w[1:])
    else:
        w = [x / mp.fsum(w) for x in w]
    s, b = mp.mpf(sigma), mp.mpf(beta)

    def f(t: mp.mpf) -> mp.mpf:
        ratio = mp.fsum(w[k] * mp.exp(k * t / s - k * k / (2 * s * s)) for k in range(len(w)))
        return mp.npdf(t) * (ratio**b - 1)

    points = list(np.linspace(min(lo, -40), max(hi, 40), 41))
    return float(mp.log(mp.quad(f, points)))


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.0), (1e-3, 0.7), (0.2, 2.0), (1e-5, 0.5), (0.05, 5.0)])
def test_reduction_to_poisson_subsampled_gaussian(q: float, sigma: float) -> None:
    """REQUIRED: K = 1, k_neg = 0 gives Γ = γ, i.e. the sampled Gaussian mechanism (Mironov et al. 2019)."""
    ours = thm3_rdp(ORDERS, sigma, q, m=1000, n=1000, K=1, k_neg=0)
    opacus = np.array(compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=list(ORDERS)))
    acc = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    acc.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), 1)
    library = acc.rdp
    integer = ORDERS == np.round(ORDERS)
    # integer orders: all three compute the same closed form
    # (absolute 1e-15: the libraries carry log(1 + tiny), we carry log(tiny) itself)
    np.testing.assert_allclose(ours[integer], library[integer], rtol=1e-10, atol=1e-15)
    np.testing.assert_allclose(ours[integer], opacus[integer], rtol=1e-10, atol=1e-15)
    # fractional orders: opacus sums the exact alternating series (Mironov et al., Sec. 3.3) to ~1e-6
    # relative and ~1e-14 absolute (mpmath pins ours tighter, see the next test);
    np.testing.assert_allclose(ours[~integer], opacus[~integer], rtol=2e-6, atol=3e-13)
    # dp-accounting 0.6 adds |terms| of that series (log of |binomial coefficients|), an upper bound,
    # and gives inf where it does not converge
    assert (ours[~integer] <= library[~integer] * (1 + 1e-12)).all()


@pytest.mark.parametrize(("q", "sigma", "alpha"), [(0.01, 1.0, 2.5), (1e-3, 0.7, 1.5), (1e-5, 0.5, 3.3),
                                                    (0.05, 5.0, 7.7)])
def test_fractional_orders_match_mpmath(q: float, sigma: float, alpha: float) -> None:
    ours = thm3_rdp([alpha], sigma, q, m=10, n=10, K=1, k_neg=0)[0]
    exact = math.log1p(math.exp(_mp_log_excess(alpha, np.array([1 - q, q]), sigma))) / (alpha - 1)
    assert ours == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize(("rho", "sigma", "beta"), [
    (2e-4, 0.4, -31.0), (1.0, 0.4, -31.0), (0.3, 1.0, -3.3), (0.0, 4.0, -0.5), (2e-4, 4.0, 1.5),
    (0.3, 0.4, 4.3), (1.0, 1.0, 2.5), (2e-4, 1.0, -255.0),
])
def test_quadrature_matches_mpmath_for_standard_clipping_mixtures(rho: float, sigma: float, beta: float) -> None:
    """Both directions of Eq. (47): β = α (P‖Q) and β = 1 − α (Q‖P)."""
    log_w = C.thmc1_log_weights(1e-2, 3, np.array([rho]))
    ours = C.log_psi_excess_quad(beta, log_w, sigma)[0]
    assert ours == pytest.approx(_mp_log_excess(beta, np.exp(log_w[0]), sigma), rel=1e-9, abs=1e-9)


@settings(max_examples=25, deadline=None)
@given(
    log_q=st.floats(-12.0, 0.0),
    sigma=st.floats(0.3, 8.0),
    alpha=st.integers(2, 40),
)
def test_closed_form_agrees_with_quadrature_at_integer_orders(log_q: float, sigma: float, alpha: int) -> None:
    """Thm 3's binomial sum, the lattice power of Thm C.1, and quadrature agree at integer α."""
    gamma = math.exp(log_q)
    log1m = np.array([math.log1p(-gamma)]) if gamma < 1 else np.array([-np.inf])
    closed = C._thm3_log_excess(np.array([float(alpha)]), sigma, log1m)[0, 0]
    weights = np.array([[log1m[0], log_q]])
    quad = C.log_psi_excess_quad(float(alpha), weights, sigma)[0]
    lattice = C.lattice_log_psi_int([alpha], weights, sigma)[0, 0]
    assert quad == pytest.approx(closed, rel=1e-9, abs=1e-9)
    if lattice > 1:  # log Ψ; compare as log(Ψ − 1) where that is well conditioned
        assert C._log_expm1(lattice) == pytest.approx(closed, rel=1e-9)
    mixture = C.thmc1_log_weights(gamma, 4, np.array([0.01, 0.5]))
    lat = C._log_expm1(C.lattice_log_psi_int([alpha], mixture, sigma)[0])
    np.testing.assert_allclose(C.log_psi_excess_quad(float(alpha), mixture, sigma), lat, rtol=1e-9)


def _lattice_unpruned(alphas: list[int], log_w: np.ndarray, sigma: float) -> np.ndarray:
    """log Σ_s c_s e^{s²/(2σ²)} with every coefficient of (Σ_μ w_μ e^{−μ²/(2σ²)} z^μ)^α kept."""
    rows, width = log_w.shape
    log_a = log_w - np.arange(width) ** 2 / (2.0 * sigma**2)
    coef, out = log_a, {}
    for power in range(1, max(alphas) + 1):
        if power > 1:
            new = np.full((rows, coef.shape[1] + width - 1), -np.inf)
            for mu in range(width):
                part = new[:, mu:mu + coef.shape[1]]
                new[:, mu:mu + coef.shape[1]] = np.logaddexp(part, coef + log_a[:, mu:mu + 1])
            coef = new
        out[power] = logsumexp(coef + np.arange(coef.shape[1]) ** 2 / (2.0 * sigma**2), axis=1)
    return np.stack([out[a] for a in alphas])


@pytest.mark.parametrize("sigma", [0.4, 2.5, 40.0])
def test_lattice_column_pruning_loses_nothing(sigma: float) -> None:
    """The closed form drops columns per row (rows whose mixtures end at different means: ρ = 0
    stops at μ = K, ρ = 1 starts at μ = 2); every coefficient kept gives the same values."""
    log_w = C.thmc1_log_weights(0.2, 4, np.array([0.0, 0.05, 0.5, 1.0]))
    orders = [2, 5, 17, 64, 160]
    got = C.lattice_log_psi_int(orders, log_w, sigma)
    reference = _lattice_unpruned(orders, log_w, sigma)
    np.testing.assert_allclose(got, reference, rtol=1e-11)
    np.testing.assert_allclose(C._log_expm1(got), C._log_expm1(reference), rtol=1e-11)


def test_lattice_split_into_threads_equals_each_row_alone() -> None:
    """Many rows go to threads in halves; each row's values are those it gets alone (the
    halves put back in order, and a half's own column pruning changes nothing)."""
    rho = np.sort(np.random.default_rng(3).uniform(1e-4, 0.9, size=2 * C._GROUP_FROM + 1))
    log_w = C.thmc1_log_weights(0.05, 5, rho)
    orders = [2, 3, 7, 20, 64]
    together = C.lattice_log_psi_int(orders, log_w, 0.7)
    alone = np.concatenate([C.lattice_log_psi_int(orders, log_w[r:r + 1], 0.7) for r in range(rho.size)],
                           axis=1)
    np.testing.assert_array_equal(together, alone)
    with pytest.raises(ValueError, match="integer orders"):
        C.lattice_log_psi_int([0, 2], log_w, 0.7)


# ------------------------------------------------------------------ the expectation over ℓ
def _brute(orders: np.ndarray, sigma: float, gamma: float, m: int, n: int, K: int, k_neg: int,
           *, standard: bool) -> np.ndarray:
    """ε(α) summing Bin(ℓ; m, γ)·A_α(ℓ) over every ℓ = 0…m (no window, no tail bound)."""
    ell = np.arange(m + 1)
    rho = np.minimum(1.0, ell * k_neg / n)
    log_pmf = binom.logpmf(ell, m, gamma)
    if not standard:
        with np.errstate(divide="ignore"):
            log_ex = C._thm3_log_excess(orders, sigma, K * math.log1p(-gamma) + np.log1p(-rho))
        return np.logaddexp(0, logsumexp(log_ex + log_pmf, axis=1)) / (orders - 1)
    log_w = C.thmc1_log_weights(gamma, K, rho)
    eps = []
    for a in orders:
        if a == round(a):
            fwd = C._log_expm1(C.lattice_log_psi_int([int(a)], log_w, sigma)[0])
        else:
            fwd = C.log_psi_excess_quad(a, log_w, sigma)
        rev = C.log_psi_excess_quad(1 - a, log_w, sigma)
        both = [np.logaddexp(0, logsumexp(x + log_pmf)) for x in (fwd, rev)]
        eps.append(max(both) / (a - 1))
    return np.array(eps)


CASES = [  # (γ, m, n, K, k_neg): upper tail blocks past ρ = 1; then a lower tail as well
    (0.02, 300, 200, 2, 2),
    (0.2, 3000, 2000, 3, 1),
]


@pytest.mark.parametrize(("gamma", "m", "n", "K", "k_neg"), CASES)
@pytest.mark.parametrize("standard", [False, True])
def test_truncation_is_conservative_and_tight(gamma: float, m: int, n: int, K: int, k_neg: int,
                                              standard: bool) -> None:
    orders = np.array([1.5, 2.0, 3.0, 5.5, 8.0, 16.0])
    fn = thmc1_rdp if standard else thm3_rdp
    nodes = C.binomial_nodes(m, gamma, n, k_neg)
    assert nodes.block_a.size >= 2  # the window really leaves tails to the bound
    assert (nodes.ell.max() == m) and (gamma > 0.1) == (nodes.ell[1] > 1)
    for sigma in (0.6, 2.0):
        exact = _brute(orders, sigma, gamma, m, n, K, k_neg, standard=standard)
        windowed = fn(orders, sigma, gamma, m, n, K, k_neg)
        assert (windowed >= exact * (1 - 1e-12)).all()
        # every ℓ of the window is a node in the first case, chords of ~2 between nodes in the second
        np.testing.assert_allclose(windowed, exact, rtol=1e-9 if nodes.ell.size < 256 else 1e-5)
        coarse = fn(orders, sigma, gamma, m, n, K, k_neg, max_nodes=6)  # chords between 6 nodes
        assert (coarse >= exact * (1 - 1e-12)).all()


# ------------------------------------------------------------------ shape of the bounds
def test_paper_setting_against_opacus_per_ell() -> None:
    """Eq. (3) assembled independently: opacus' A_α at q = Γ_ℓ = 1 − (1−γ)^K (1 − ℓ·k_neg/n), averaged
    over ℓ = 0…300 with the binomial pmf (the omitted tail can only make the reference smaller)."""
    gamma, m, n, K, k_neg, sigma = 1e-5, 5_000_000, 1_000_000, 5, 4, 0.5
    orders = np.array([1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0])
    ell = np.arange(301)
    rate = 1 - (1 - gamma) ** K * (1 - ell * k_neg / n)
    log_a = np.array([(orders - 1) * compute_rdp(q=float(q), noise_multiplier=sigma, steps=1, orders=list(orders))
                      for q in rate])
    reference = logsumexp(log_a + np.log(binom.pmf(ell, m, gamma))[:, None], axis=0) / (orders - 1)
    np.testing.assert_allclose(thm3_rdp(orders, sigma, gamma, m, n, K, k_neg), reference, rtol=1e-7)


def test_standard_clipping_bound_dominates_freq_clip_in_paper_setting() -> None:
    numbers = dict(gamma=1e-5, m=5_000_000, n=1_000_000, K=5, k_neg=4)
    t3 = thm3_rdp(SOME, 0.5, **numbers)
    c1 = thmc1_rdp(SOME, 0.5, **numbers)
    assert (c1 >= t3).all()
    assert (t3 <= SOME / (2 * 0.5**2)).all()  # amplification never hurts: Gaussian RDP α/(2σ²)
    eps = rdp_to_epsilon(SOME, 7812 * t3, 1 / 5e6)[0]
    assert 3.0 < eps < 6.0  # paper Fig. 2 setting: a few units of ε after 7812 steps


@settings(max_examples=15, deadline=None)
@given(
    log_gamma=st.floats(-9.0, -1.0),
    K=st.integers(1, 6),
    k_neg=st.integers(0, 6),
    sigma=st.floats(0.4, 6.0),
)
def test_c1_dominates_thm3(log_gamma: float, K: int, k_neg: int, sigma: float) -> None:
    gamma = math.exp(log_gamma)
    m, n = 2000, max(50, math.ceil(k_neg * gamma * 2000))
    orders = np.array([1.3, 2.0, 4.5, 12.0])
    c1 = thmc1_rdp(orders, sigma, gamma, m, n, K, k_neg)
    t3 = thm3_rdp(orders, sigma, gamma, m, n, K, k_neg)
    assert (c1 >= t3 * (1 - 1e-9)).all()  # equal when K = 1 and k_neg = 0
    if K > 1 or k_neg > 0:
        assert (c1 > t3).all()


def test_c1_takes_the_larger_of_both_directions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eq. (47) is a max over Ψ(P‖Q) and Ψ(Q‖P); make the second one dominate and watch ε follow."""
    numbers = dict(sigma=1.0, gamma=1e-3, m=20_000, n=5_000, K=3, k_neg=2)
    orders = np.array([1.5, 3.0, 7.5])
    base = thmc1_rdp(orders, **numbers)
    real = C.log_psi_excess_quad_many
    monkeypatch.setattr(C, "log_psi_excess_quad_many",
                        lambda b, w, s: real(b, w, s) + np.where(np.asarray(b) <= 0, 600.0, 0.0)[:, None])
    boosted = thmc1_rdp(orders, **numbers)
    assert (boosted > base).all()
    assert (boosted > 500 / (orders - 1)).all()  # log E e^{600 + log(Ψ−1)} with log(Ψ−1) > −100


@pytest.mark.parametrize("fn", [thm3_rdp, thmc1_rdp])
@pytest.mark.parametrize(("key", "values"), [("K", [1, 2, 3, 5, 8]), ("k_neg", [0, 1, 2, 4, 8]),
                                             ("sigma", [4.0, 2.0, 1.0, 0.7, 0.5])])
def test_monotone_in_K_kneg_and_inverse_sigma(fn, key: str, values: list) -> None:
    numbers = dict(sigma=1.0, gamma=1e-3, m=20_000, n=5_000, K=3, k_neg=2)
    orders = np.array([1.3, 2.0, 3.5, 8.0, 32.0])
    curves = [fn(orders, **{**numbers, key: v}) for v in values]
    for smaller, larger in zip(curves[:-1], curves[1:], strict=True):
        assert (larger > smaller).all()


@pytest.mark.parametrize(("fn", "mu_max"), [(thm3_rdp, 1.0), (thmc1_rdp, 7.0)])  # K = 5: C.1's largest mean K + 2
def test_tiny_sigma_switches_to_the_unsampled_gaussian_without_a_jump(fn, mu_max: float) -> None:
    # The quadrature's bands grow as μ_max/σ; below μ_max/UNSAMPLED_BELOW the bound is α·μ_max²/(2σ²),
    # valid at any rate (joint convexity). Just above the switch the amplified bound must already be
    # within 1 % of it (0.3 % at α = 1.1 here) and below it, so ε stays monotone in σ across the switch.
    numbers = dict(gamma=1e-3, m=5_000, n=2_000, K=5, k_neg=4)
    orders = np.array([1.1, 2.0, 3.0, 8.0, 32.0])
    edge = mu_max / C.UNSAMPLED_BELOW
    above, below = fn(orders, sigma=edge * 1.01, **numbers), fn(orders, sigma=edge * 0.99, **numbers)
    unsampled_above = orders * mu_max**2 / (2 * (edge * 1.01) ** 2)
    assert (above <= unsampled_above * (1 + 1e-12)).all()
    assert (above >= unsampled_above * (1 - 1e-2)).all()
    np.testing.assert_allclose(below, orders * mu_max**2 / (2 * (edge * 0.99) ** 2), rtol=1e-14)
    assert (below > above).all()


def test_tiny_sigma_answers_without_the_quadrature() -> None:
    # σ = 1e-9 once asked numpy for 563 GiB (bands of ~1e11 points); ε here is astronomical, not an error
    orders = np.array([1.1, 2.0, 64.0])
    got = thmc1_rdp(orders, sigma=1e-9, gamma=0.1, m=5_000, n=2_000, K=5, k_neg=4)
    np.testing.assert_allclose(got, orders * 49.0 / 2e-18, rtol=1e-14)


def test_bad_numbers_raise_value_error() -> None:
    for kwargs in (dict(sigma=0.0), dict(gamma=0.0), dict(gamma=1.5), dict(K=0), dict(k_neg=-1), dict(m=0)):
        with pytest.raises(ValueError):
            thm3_rdp([2.0], **{**dict(sigma=1.0, gamma=0.1, m=10, n=10, K=1, k_neg=0), **kwargs})
    with pytest.raises(ValueError):
        thm3_rdp([1.0], 1.0, 0.1, 10, 10, 1, 0)


# ------------------------------------------------------------------ the accountant
def _sampling(**kw) -> SamplingProfile:
    numbers = dict(rate=1e-3, num_records=20_000, num_nodes=5_000, degree_cap=3, k_neg=2)
    return SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, **{**numbers, **kw})


def _bound(kind: SensitivityKind = FREQ, orders: np.ndarray | None = None, **kw) -> CoupledRdpAccountant:
    params = CoupledRdpAccountant.Params(orders=None if orders is None else list(orders))
    acc = CoupledRdpAccountant(params)
    acc.bind(_sampling(**kw), SensitivityProfile(kind, PrivacyUnit.NODE, 1.0))
    return acc


@pytest.mark.parametrize(("kind", "fn"), [(FREQ, thm3_rdp), (STANDARD, thmc1_rdp)])
def test_epsilon_composes_the_chosen_theorem(kind: SensitivityKind, fn) -> None:
    grid = ORDERS if kind is FREQ else SOME  # the full grid for Thm C.1 takes seconds per σ
    acc = _bound(kind, grid)
    acc.step(noise_multiplier=1.0, num_steps=300)
    acc.step(noise_multiplier=2.0, num_steps=100)
    acc.step(noise_multiplier=1.0, num_steps=200)
    assert len(acc) == 600
    assert acc.state_dict()["history"] == [[1.0, 500], [2.0, 100]]
    numbers = dict(gamma=1e-3, m=20_000, n=5_000, K=3, k_neg=2)
    total = 500 * fn(grid, 1.0, **numbers) + 100 * fn(grid, 2.0, **numbers)
    assert acc.get_epsilon(1e-5) == pytest.approx(rdp_to_epsilon(grid, total, 1e-5)[0], rel=1e-12)
    report = acc.report(1e-5)
    assert report["profile"]["theorem"] == ("Thm 3, Eq. (3)" if kind is FREQ else "Thm C.1, Eq. (47)")
    assert {"epsilon", "delta", "alpha", "rdp", "steps", "noise_multiplier", "mechanism"} <= set(report)
    assert report["noise_multiplier"] == 1.0 and report["steps"] == 600 and report["mechanism"] == "coupled_rdp"
    assert [a for a, _ in report["rdp"]] == list(grid)
    np.testing.assert_allclose([v for _, v in report["rdp"]], fn(grid, 1.0, **numbers), rtol=1e-12)
    json.dumps(report)


def test_fresh_accountant_reports_zero() -> None:
    acc = _bound()
    assert list(acc.orders) == list(DEFAULT_ORDERS)
    assert len(acc) == 0 and acc.get_epsilon(1e-5) == 0.0
    assert acc.report(1e-5)["epsilon"] == 0.0


def test_per_step_curve_is_cached_per_sigma(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = _bound()
    calls: list[float] = []
    original = acc.per_step_rdp
    monkeypatch.setattr(acc, "per_step_rdp", lambda s: calls.append(s) or original(s))
    for _ in range(3):
        acc.step(noise_multiplier=1.5)
        acc.get_epsilon(1e-5)
    assert calls == [1.5]


def test_calibrate_returns_the_conservative_end() -> None:
    acc = _bound()
    sigma = acc.calibrate(target_epsilon=2.0, delta=1e-5, num_steps=2000)
    assert len(acc) == 0  # calibration does not spend
    rdp_at = lambda s: 2000 * thm3_rdp(ORDERS, s, 1e-3, 20_000, 5_000, 3, 2)  # noqa: E731
    assert rdp_to_epsilon(ORDERS, rdp_at(sigma), 1e-5)[0] <= 2.0
    slightly_smaller = sigma / (1 + 2 * acc.CALIBRATE_RTOL)
    assert rdp_to_epsilon(ORDERS, rdp_at(slightly_smaller), 1e-5)[0] > 2.0


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(target_epsilon=0.0), "epsilon"), (dict(target_epsilon=-1.0), "epsilon"),
    (dict(target_epsilon=math.nan), "epsilon"), (dict(delta=1.0), "delta"), (dict(num_steps=0), "steps"),
    (dict(target_epsilon=1e-4, num_steps=10**6), "infeasible"),
])
def test_calibrate_refuses_bad_or_infeasible_targets(kwargs: dict, match: str) -> None:
    with pytest.raises(PrivacyError, match=match):
        _bound().calibrate(**{**dict(target_epsilon=1.0, delta=1e-5, num_steps=100), **kwargs})


def test_state_dict_round_trip_and_refusals() -> None:
    acc = _bound()
    acc.step(noise_multiplier=0.9, num_steps=400)
    acc.step(noise_multiplier=1.7, num_steps=50)
    state = json.loads(json.dumps(acc.state_dict()))
    fresh = _bound()
    fresh.load_state_dict(state)
    assert len(fresh) == 450 and fresh.get_epsilon(1e-6) == acc.get_epsilon(1e-6)
    assert copy.deepcopy(fresh).get_epsilon(1e-6) == acc.get_epsilon(1e-6)

    with pytest.raises(PrivacyError, match="mechanism 'edge_rdp'"):
        fresh.load_state_dict({**state, "mechanism": "edge_rdp"})
    with pytest.raises(PrivacyError, match="profile"):
        _bound(rate=2e-3).load_state_dict(state)
    with pytest.raises(PrivacyError, match="profile"):
        _bound(STANDARD).load_state_dict(state)
    with pytest.raises(PrivacyError, match="not bound"):
        CoupledRdpAccountant().load_state_dict(state)
    with pytest.raises(PrivacyError, match="order grid"):
        other = CoupledRdpAccountant(CoupledRdpAccountant.Params(orders=[2.0, 3.0]))
        other.bind(_sampling(), SensitivityProfile(FREQ, PrivacyUnit.NODE, 1.0))
        other.load_state_dict(state)
    with pytest.raises(PrivacyError, match="history"):
        fresh.load_state_dict({**state, "history": [[0.9]]})
    assert len(fresh) == 450  # a refused load changes nothing


@pytest.mark.parametrize(("sampling_kind", "kind", "unit"), [
    (SamplingKind.COUPLED_POISSON_WR, FREQ, PrivacyUnit.NODE),
    (SamplingKind.POISSON_DECOUPLED, SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE),
    (SamplingKind.COUPLED_POISSON_WOR, SensitivityKind.NONE, PrivacyUnit.NODE),
    (SamplingKind.COUPLED_POISSON_WOR, FREQ, PrivacyUnit.EDGE),
])
def test_bind_refuses_other_pairs(sampling_kind: SamplingKind, kind: SensitivityKind, unit: PrivacyUnit) -> None:
    sampling = SamplingProfile(sampling_kind, 1e-3, 20_000, 5_000, 3, 2)
    with pytest.raises(ProfileMismatchError, match="coupled_rdp"):
        CoupledRdpAccountant().bind(sampling, SensitivityProfile(kind, unit, 1.0))


@pytest.mark.parametrize(("kw", "match"), [
    (dict(degree_cap=None), "degree cap"), (dict(degree_cap=0), "degree cap"), (dict(k_neg=-1), "k_neg"),
    (dict(rate=0.0), "gamma"), (dict(rate=1.5), "gamma"), (dict(num_records=0), "records"),
    (dict(num_nodes=0), "nodes"), (dict(num_nodes=10), "exceeds n"),
])
def test_bind_refuses_bad_numbers(kw: dict, match: str) -> None:
    with pytest.raises(PrivacyError, match=match):
        _bound(**kw)


@pytest.mark.parametrize("sigma", [0.0, -1.0, math.nan, math.inf, "1"])
def test_step_refuses_bad_sigma_and_steps(sigma: object) -> None:
    acc = _bound()
    with pytest.raises(PrivacyError, match="noise multiplier"):
        acc.step(noise_multiplier=sigma)  # type: ignore[arg-type]
    for steps in (-1, 1.5, True):
        with pytest.raises(PrivacyError, match="steps"):
            acc.step(noise_multiplier=1.0, num_steps=steps)  # type: ignore[arg-type]
    with pytest.raises(PrivacyError, match="not bound"):
        CoupledRdpAccountant().step(noise_multiplier=1.0)
    assert len(acc) == 0


def test_params_through_the_host() -> None:
    host = PluginHost(autoload=False)

    class Plugin:
        from graphveil.contract.hookspecs import hookimpl

        @hookimpl
        def graphveil_accountants(self):
            return {"coupled_rdp": CoupledRdpAccountant}

    host.register(Plugin(), "coupled")
    acc = host.create("accountant", "coupled_rdp", {"orders": [2, 3.5, 8]})
    assert list(acc.orders) == [2.0, 3.5, 8.0]
    for bad in ({"orders": [1.0, 2.0]}, {"orders": []}, {"order": [2.0]}):
        with pytest.raises(ConfigError, match="accountant.order"):
            host.create("accountant", "coupled_rdp", bad)


@pytest.mark.parametrize(("cls", "kind", "other"), [
    (CoupledRdpFreqAccountant, FREQ, STANDARD), (CoupledRdpStandardAccountant, STANDARD, FREQ),
])
def test_single_theorem_variants(cls: type, kind: SensitivityKind, other: SensitivityKind) -> None:
    """``coupled_rdp_freq`` / ``coupled_rdp_standard`` analyse exactly one pair each."""
    assert cls.supports == {(SamplingKind.COUPLED_POISSON_WOR, kind)}
    acc = cls(cls.Params(orders=[2.0, 4.0]))
    acc.bind(_sampling(), SensitivityProfile(kind, PrivacyUnit.NODE, 1.0))
    acc.step(noise_multiplier=1.0, num_steps=10)
    both = _bound(kind, np.array([2.0, 4.0]))
    both.step(noise_multiplier=1.0, num_steps=10)
    assert acc.get_epsilon(1e-5) == both.get_epsilon(1e-5)
    with pytest.raises(ProfileMismatchError, match=cls.mechanism):
        cls().bind(_sampling(), SensitivityProfile(other, PrivacyUnit.NODE, 1.0))
    with pytest.raises(PrivacyError, match="mechanism"):
        acc.load_state_dict(both.state_dict())
