"""Coupled-sampling RDP bounds: Theorem 3 (Eq. 3) and Theorem C.1 (Eq. 47).

Source: "entity-level-dp-relational-learning" (shared/papers/), Sec. 4.2, App. B and C.
Pure functions of numbers; nothing here knows about graphs or accountants.

**The bounds.** Positives are Poisson(γ) over m records (degree-capped edges), negatives are
k_neg·|B⁺| nodes drawn without replacement from n (Def. 4.1, Alg. 2); removing one node
removes at most K records. Both theorems have the form (App. B Eq. 43, App. C Eqs. 52–53)

    ε(α) = 1/(α−1) · log E_{ℓ∼Bin(m,γ)} A_α(ℓ),

with Q = N(0, σ²), P_ℓ a mixture of N(μ, σ²) over integer means μ, and ρ_ℓ = min(1, ℓ·k_neg/n)
(App. B: "replace ℓ by k_neg·ℓ"; clamped at 1 where the count would exceed the node set):

* Thm 3, FREQ-CLIP (sensitivity C whatever is removed): A_α(ℓ) = Ψ_α(P_ℓ ‖ Q) (Eq. 44) with
  P_ℓ = (1−Γ_ℓ)·N(0, σ²) + Γ_ℓ·N(1, σ²) and Γ_ℓ = 1 − (1−γ)^K (1 − ρ_ℓ). The other direction
  Ψ_α(Q ‖ P_ℓ) is no larger (Mironov et al. 2019, used in App. B).
* Thm C.1, standard clipping (sensitivity C·(i + 2j)): P_ℓ = Σ_{i≤K, j∈{0,1}} ω_{i,j}(ℓ)
  N(i+2j, σ²) with ω_{i,0} = Bin(i; K, γ)(1−ρ_ℓ), ω_{i,1} = Bin(i; K, γ)·ρ_ℓ, and ε(α) is the
  larger of the two directions Ψ_α(P_ℓ ‖ Q), Ψ_α(Q ‖ P_ℓ), each averaged over ℓ (Eq. 47).

Here Ψ_α(P ‖ Q) = E_Q (P/Q)^α; σ is the noise multiplier (C = 1 without loss of generality).

**Numerics.** Everything is carried in log space, as log(Ψ − 1) so that tiny per-step RDP keeps
its relative precision.

1. *Integer α, P ‖ Q, closed form.* With t = x/σ and z = e^{t/σ}, P/Q = Σ_μ w_μ e^{−μ²/(2σ²)} z^μ,
   so (P/Q)^α is a polynomial in z with positive coefficients c_s and, as E_Q z^s = e^{s²/(2σ²)},
   Ψ_α = Σ_s c_s e^{s²/(2σ²)} exactly. Thm 3: the binomial sum of Mironov et al. (2019, Sec. 3.3),
   written as Ψ_α − 1 = Σ_{k≥2} C(α,k)(1−Γ)^{α−k} Γ^k (e^{k(k−1)/(2σ²)} − 1), all terms
   positive. Thm C.1: coefficients by repeated log-space multiplication, dropping columns that
   can no longer matter (:func:`lattice_log_psi_int`).
2. *Fractional α, and Q ‖ P at every α: quadrature.* Ψ = E_{t∼N(0,1)} (P/Q)^β with β = α
   (P ‖ Q) or β = 1 − α (Q ‖ P). A Gaussian envelope of the integrand bounds where it can
   matter; a scan with step ≤ 1 finds the band within e^{−120} of the maximum (valid because
   log-integrand'' ≥ −1 for β ≥ 1 and the log-integrand is concave for β ≤ 0); the
   trapezoidal rule on that band is repeated, per ℓ, with the step halved until the sums at h
   and 2h agree to 1e-10 (the rule converges geometrically for these analytic integrands; the
   agreement test is a numerical check, not a proven bound). Where Ψ is close to 1 the
   integrand φ(t)·expm1(β·log1p(P/Q − 1)) of Ψ − 1 is summed directly, plus a rounding
   allowance. :func:`log_psi_excess_quad`.
3. *The expectation over ℓ, conservatively.* The exact window [lo, hi] leaves binomial mass
   ≤ e^{−80} on each side (Chernoff bound, log P ≤ −m·KL(b/m ‖ γ)). A_α is convex in ρ (Ψ is
   jointly convex and P_ℓ is affine in ρ_ℓ), hence convex in ℓ up to n/k_neg and constant
   after; inside the window at most ``max_nodes`` nodes are evaluated and A between nodes is
   bounded by the chord (exact when every integer is a node, as for the paper's numbers).
   Tails are split into blocks [0, lo) and (hi, 2hi], (2hi, 4hi], …, up to m; each contributes
   its Chernoff mass times the larger of A at its two ends (the maximum of a convex function;
   for Thm 3, A increases with ℓ, so this is the right end and never more than the Γ = 1 value
   e^{α(α−1)/(2σ²)}). Binomial pmf values get a 1e-12 relative allowance for scipy's rounding.

Checked against opacus and dp-accounting (K = 1, k_neg = 0), opacus per ℓ at the paper's
numbers, mpmath quadrature and a full sum over ℓ (tests/test_accountant_coupled.py).

Speed (bench/accountant_speed.py, paper setting n = 1e6, m = 5e6, K = 5, k_neg = 4, γ = 1e-5,
σ = 0.5, all 159 default orders, one core): Thm 3 ≈ 0.2 s, Thm C.1 ≈ 2.5–3.5 s; the paper's
own code needs ~7 s and over an hour.

>>> import numpy as np
>>> eps = thm3_rdp([2.0, 2.5, 8.0], sigma=1.0, gamma=0.01, m=10_000, n=10_000, K=1, k_neg=0)
>>> np.round(eps, 8)  # K = 1, k_neg = 0: the Poisson-subsampled Gaussian of Mironov et al.
array([0.00017181, 0.00021758, 0.00089364])
>>> c1 = thmc1_rdp([2.0, 2.5, 8.0], sigma=1.0, gamma=0.01, m=10_000, n=10_000, K=1, k_neg=0)
>>> bool(np.allclose(c1, eps, rtol=1e-9))  # one removed record, no negatives: the same mixture
True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, rel_entr, xlog1py, xlogy
from scipy.stats import binom

#: Binomial mass allowed outside the exact window on each side, in nats (Chernoff bound).
TAIL_NATS = 80.0
#: Quadrature drops integrand values below (maximum)·e^{−BAND_NATS}.
BAND_NATS = 120.0
#: Relative agreement required between trapezoid sums at h and 2h.
QUAD_RTOL = 1e-10
#: Relative allowance added to scipy's binomial pmf (accurate to ~1e-13).
PMF_SLACK = 1e-12
#: Nodes evaluated inside the window at most (chord bound between them).
DEFAULT_MAX_NODES = 256

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_MAX_REFINE = 12
_CHUNK_ELEMENTS = 3_000_000
#: first quadrature step in t = x/σ for P‖Q, and the floor of σ/(mean span) used for Q‖P; the step is
#: then halved per row until the h and 2h sums agree. Tuned on the paper's setting for σ ∈ [0.1, 8].
_FIRST_STEP = 0.3
_FIRST_STEP_REVERSE = 0.07
#: below log Ψ = this, Ψ − 1 is summed directly rather than taken from log Ψ.
_DIRECT_BELOW = 0.5
#: closed-form columns this far (in nats) below a larger-s column are dropped.
_PRUNE_NATS = 750.0


# ------------------------------------------------------------------------------------ helpers
def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log Σ exp along ``axis``; all −∞ gives −∞."""
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True)) + peak
    return np.squeeze(out, axis=axis)


def _log_expm1(y: np.ndarray) -> np.ndarray:
    """log(e^y − 1) for y ≥ 0 (−∞ at 0)."""
    y = np.asarray(y, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        big = np.maximum(y, 30.0)
        return np.where(y > 30.0, big + np.log1p(-np.exp(-big)), np.log(np.expm1(np.minimum(y, 30.0))))


def _log_abs_expm1(y: np.ndarray) -> np.ndarray:
    """log|e^y − 1| for any real y."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y > 0, _log_expm1(np.maximum(y, 0.0)), np.log(-np.expm1(np.minimum(y, 0.0))))


def _check_orders(orders: Sequence[float]) -> np.ndarray:
    a = np.asarray(orders, dtype=float).reshape(-1)
    if a.size == 0 or not (np.isfinite(a) & (a > 1)).all():
        raise ValueError(f"orders must be finite numbers > 1, got {orders!r}")
    return a


def _check_numbers(sigma: float, gamma: float, m: int, n: int, K: int, k_neg: int) -> None:
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"sigma must be a finite number > 0, got {sigma!r}")
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
    if m < 1 or n < 1 or K < 1 or k_neg < 0:
        raise ValueError(f"need m >= 1, n >= 1, K >= 1, k_neg >= 0; got m={m}, n={n}, K={K}, k_neg={k_neg}")


# ----------------------------------------------------------------- expectation over ℓ ~ Bin(m, γ)
@dataclass(frozen=True)
class BinomialNodes:
    """Nodes ℓ at which A_α is evaluated, and how their values bound E_{ℓ∼Bin(m,γ)} A_α(ℓ).

    :param ell: the nodes (sorted integers).
    :param rho: ρ = min(1, ℓ·k_neg/n) at each node.
    :param log_weight: log of the chord (hat-function) mass of the exact window at each node.
    :param block_a, block_b: node indices bounding each tail block.
    :param block_log_p: log of a Chernoff upper bound on the block's binomial mass.
    """

    ell: np.ndarray
    rho: np.ndarray
    log_weight: np.ndarray
    block_a: np.ndarray
    block_b: np.ndarray
    block_log_p: np.ndarray

    def log_expectation(self, log_f: np.ndarray) -> np.ndarray:
        """Upper bound on log E f(ℓ) for f ≥ 0 convex in ℓ, from ``log_f[..., node]``."""
        parts = [log_f + self.log_weight]
        if self.block_a.size:
            worst = np.maximum(log_f[..., self.block_a], log_f[..., self.block_b])
            parts.append(worst + self.block_log_p)
        return _lse(np.concatenate(parts, axis=-1), axis=-1)


def binomial_nodes(m: int, gamma: float, n: int, k_neg: int, *,
                   max_nodes: int = DEFAULT_MAX_NODES) -> BinomialNodes:
    """Nodes and weights for the expectation over ℓ ∼ Bin(m, γ) (see the module notes, step 3)."""
    empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
    if k_neg == 0 or gamma == 1.0:  # A does not depend on ℓ, or ℓ = m surely
        ell = np.array([m if gamma == 1.0 else 0], dtype=np.int64)
        rho = np.minimum(1.0, ell * k_neg / n).astype(float)
        return BinomialNodes(ell, rho, np.zeros(1), empty_i, empty_i, empty_f)

    mean = m * gamma

    def log_tail(b: float) -> float:
        """Chernoff: log P(ℓ ≥ b) for b ≥ mean, log P(ℓ ≤ b) for b ≤ mean."""
        a = min(max(b / m, 0.0), 1.0)
        return float(-m * (rel_entr(a, gamma) + rel_entr(1.0 - a, 1.0 - gamma)))

    if log_tail(m) > -TAIL_NATS:
        hi = m
    else:
        hi = min(m, math.ceil(brentq(lambda b: log_tail(b) + TAIL_NATS, mean, m, xtol=1e-6)))
    if log_tail(0) > -TAIL_NATS:
        lo = 0
    else:
        lo = max(0, math.floor(brentq(lambda b: log_tail(b) + TAIL_NATS, 0.0, mean, xtol=1e-6)))

    window = np.arange(lo, hi + 1, dtype=np.int64)
    cap = n / k_neg  # ρ reaches 1 here; A is convex on each side, so no chord may straddle it
    if window.size <= max_nodes:
        inner = window
    else:
        inner = np.unique(np.round(np.linspace(lo, hi, max_nodes)).astype(np.int64))
        inner = np.union1d(inner, [c for c in (math.floor(cap), math.ceil(cap)) if lo <= c <= hi])
    upper = []
    b = hi
    while b < m:
        b = min(m, max(b + 1, 2 * b))
        upper.append(b)
    ell = np.union1d(np.union1d(inner, upper), [0] if lo > 0 else [])
    ell = ell.astype(np.int64)

    # chord (hat-function) weights of the window's pmf on the inner nodes
    pmf = binom.pmf(window, m, gamma)
    a_idx = np.searchsorted(inner, window, side="right") - 1
    b_idx = np.minimum(a_idx + 1, inner.size - 1)
    span = (inner[b_idx] - inner[a_idx]).astype(float)
    lam = np.where(span > 0, (window - inner[a_idx]) / np.where(span > 0, span, 1.0), 0.0)
    w_inner = np.bincount(a_idx, pmf * (1 - lam), inner.size) + np.bincount(b_idx, pmf * lam, inner.size)
    log_weight = np.full(ell.size, -np.inf)
    with np.errstate(divide="ignore"):
        log_weight[np.searchsorted(ell, inner)] = np.log(w_inner) + math.log1p(PMF_SLACK)

    blocks: list[tuple[int, int, float]] = []
    if lo > 0:
        blocks.append((0, lo, log_tail(lo - 1)))
    edges = [hi, *upper]
    for left, right in zip(edges[:-1], edges[1:], strict=True):
        blocks.append((left, right, log_tail(left + 1)))
    pos = {int(v): i for i, v in enumerate(ell)}
    block_a = np.array([pos[x] for x, _, _ in blocks], dtype=np.int64)
    block_b = np.array([pos[y] for _, y, _ in blocks], dtype=np.int64)
    block_log_p = np.array([p for _, _, p in blocks], dtype=float)
    rho = np.minimum(1.0, ell * (k_neg / n))
    return BinomialNodes(ell, rho, log_weight, block_a, block_b, block_log_p)


# ------------------------------------------------------------------ Ψ for lattice mixtures
def _log_ratio(t: np.ndarray, log_w: np.ndarray, sigma: float) -> np.ndarray:
    """log P/Q at t = x/σ (rows × points) for P = Σ_μ w_μ N(μ, σ²), μ = column index of log_w:
    log Σ_μ exp(log w_μ + μt/σ − μ²/(2σ²))."""
    slope = t / sigma
    parts = []
    peak = np.full_like(t, -np.inf)
    for mu in range(log_w.shape[1]):
        x = slope * mu
        x += (log_w[:, mu] - mu**2 / (2.0 * sigma**2))[:, None]
        np.maximum(peak, x, out=peak)
        parts.append(x)
    total = np.zeros_like(t)
    for x in parts:
        x -= peak
        np.exp(x, out=x)
        total += x
    return np.log(total, out=total) + peak


def _ratio_minus_one(t: np.ndarray, log_w: np.ndarray, sigma: float) -> np.ndarray:
    """P/Q − 1 = Σ_{μ≥1} w_μ expm1(μt/σ − μ²/(2σ²)), exact near 0 (the weight of μ = 0 is
    implicitly one minus the others); overflows to a huge value, never to inf·0."""
    slope = t / sigma
    out = np.zeros_like(t)
    w = np.exp(log_w)
    for mu in range(1, log_w.shape[1]):
        x = slope * mu
        x -= mu**2 / (2.0 * sigma**2)
        np.minimum(x, 700.0, out=x)
        np.expm1(x, out=x)
        x *= w[:, mu, None]
        out += x
    return out


def _envelope(beta: float, log_w: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Interval of t outside which the integrand φ(t)(P/Q)^β is below e^{−BAND}·Ψ (and φ too)."""
    rows, width = log_w.shape
    mus = np.arange(width, dtype=float)
    present = np.isfinite(log_w)
    if beta >= 1:  # (Σ v_μ)^β ≤ k^{β−1} Σ v_μ^β: Gaussians centred at βμ/σ
        with np.errstate(invalid="ignore"):
            lp = np.where(present, beta * log_w + beta * (beta - 1) * mus**2 / (2 * sigma**2), -np.inf)
        lower = np.maximum(0.0, lp.max(axis=1))  # log Ψ ≥ max(0, lp_μ)
        slack = (beta - 1) * np.log(present.sum(axis=1))[:, None] + lp - lower[:, None] + BAND_NATS
        keep = slack > 0
        radius = np.sqrt(2 * np.where(keep, slack, 0.0))
        centre = beta * mus / sigma
        lo = np.where(keep, centre - radius, np.inf).min(axis=1)
        hi = np.where(keep, centre + radius, -np.inf).max(axis=1)
    elif beta <= 0:  # (P/Q)^β ≤ v_μ^β for the smallest present μ
        first = np.argmax(present, axis=1)
        lw = log_w[np.arange(rows), first]
        lp = beta * lw + beta * (beta - 1) * first**2 / (2 * sigma**2)
        radius = np.sqrt(2 * (np.maximum(lp, 0.0) + BAND_NATS))
        centre = beta * first / sigma
        lo, hi = centre - radius, centre + radius
    else:
        raise ValueError(f"beta must be >= 1 or <= 0, got {beta}")
    r_phi = math.sqrt(2 * BAND_NATS)
    return np.minimum(lo, -r_phi), np.maximum(hi, r_phi)


def _band(beta: float, log_w: np.ndarray, sigma: float, lo: np.ndarray, hi: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray]:
    """Scan [lo, hi] with step ≤ 1; return the sub-interval holding all non-negligible mass."""
    count = int(math.ceil(float(np.max(hi - lo)))) + 2
    u = np.linspace(0.0, 1.0, count)
    step = (hi - lo) / (count - 1)
    t = lo[:, None] + (hi - lo)[:, None] * u
    log_phi = -0.5 * t**2 - _LOG_SQRT_2PI
    g = log_phi + beta * _log_ratio(t, log_w, sigma)
    s = np.maximum(g, log_phi)
    hit = s >= s.max(axis=1, keepdims=True) - BAND_NATS - 0.5
    first = np.argmax(hit, axis=1)
    last = count - 1 - np.argmax(hit[:, ::-1], axis=1)
    top = np.argmax(g, axis=1)
    rows = np.arange(t.shape[0])
    a = np.minimum(t[rows, first], t[rows, top]) - step
    b = np.maximum(t[rows, last], t[rows, top]) + step
    return a, b


def _trapezoid(beta: float, log_w: np.ndarray, sigma: float, a: np.ndarray, b: np.ndarray, h: float
               ) -> tuple[np.ndarray, np.ndarray]:
    """log(Ψ − 1) by the trapezoidal rule with step ≤ h on [a, b]; and whether h and 2h agree."""
    count = int(math.ceil(float(np.max((b - a) / h)))) + 1
    count += 1 - count % 2  # odd, so the 2h rule uses the same end points
    u = np.linspace(0.0, 1.0, count)
    step = (b - a) / (count - 1)
    t = a[:, None] + (b - a)[:, None] * u
    log_phi = -0.5 * t**2 - _LOG_SQRT_2PI
    log_r = _log_ratio(t, log_w, sigma)
    log_f = log_phi + beta * log_r
    log_psi = np.log(step) + _lse(log_f, axis=1)
    log_psi2 = np.log(2 * step) + _lse(log_f[:, ::2], axis=1)
    out = _log_expm1(np.maximum(log_psi, _DIRECT_BELOW))
    ok = np.abs(log_psi - log_psi2) <= QUAD_RTOL * np.maximum(1.0, np.abs(log_psi))
    near = np.flatnonzero(log_psi <= _DIRECT_BELOW)
    if near.size:  # Ψ close to 1: sum φ·expm1(β log(P/Q)) for Ψ − 1 directly, log(P/Q) = log1p(P/Q − 1)
        d = _ratio_minus_one(t[near], log_w[near], sigma)
        small = np.abs(d) < 0.5
        y = beta * np.where(small, np.log1p(np.where(small, d, 0.0)), log_r[near])
        with np.errstate(over="ignore", invalid="ignore"):
            term = np.where(y == 0, 0.0, np.sign(y) * np.exp(log_phi[near] + _log_abs_expm1(y)))
        excess = step[near] * term.sum(axis=1)
        excess2 = 2 * step[near] * term[:, ::2].sum(axis=1)
        mass = step[near] * np.abs(term).sum(axis=1)
        ok[near] = np.abs(excess - excess2) <= QUAD_RTOL * np.abs(excess) + 1e-14 * mass
        bound = excess + 64 * np.finfo(float).eps * mass  # rounding allowance
        out[near] = np.log(np.maximum(bound, np.finfo(float).tiny))
    return out, ok


def _row_groups(points: np.ndarray, width: int) -> list[np.ndarray]:
    """Split rows (sorted by grid size) into groups of at most ``_CHUNK_ELEMENTS`` grid values."""
    order = np.argsort(points, kind="stable")
    groups, start = [], 0
    while start < order.size:
        stop = start + 1
        while stop < order.size and (stop - start + 1) * (points[order[stop]] + 2) * width <= _CHUNK_ELEMENTS:
            stop += 1
        groups.append(order[start:stop])
        start = stop
    return groups


def log_psi_excess_quad(beta: float, log_w: np.ndarray, sigma: float) -> np.ndarray:
    """log(E_{x∼N(0,σ²)}[(P/Q)(x)^β] − 1) by adaptive trapezoidal quadrature.

    :param beta: α for Ψ_α(P ‖ Q), or 1 − α for Ψ_α(Q ‖ P) = E_Q (P/Q)^{1−α}; must be ≥ 1 or ≤ 0.
    :param log_w: ``(rows, M)`` log mixture weights of P = Σ_μ w_μ N(μ, σ²), μ = 0…M−1, each row
        summing to 1 (the weight of μ = 0 is taken as one minus the others).
    :param sigma: the noise multiplier.
    :returns: ``(rows,)`` log(Ψ − 1).
    """
    log_w = np.atleast_2d(np.asarray(log_w, dtype=float))
    rows, width = log_w.shape
    present = np.isfinite(log_w)
    idx = np.arange(width)
    spans = np.where(present, idx, -1).max(axis=1) - np.where(present, idx, width).min(axis=1)
    h = _FIRST_STEP if beta > 0 else min(_FIRST_STEP, max(_FIRST_STEP_REVERSE, sigma / max(1, int(spans.max()))))
    lo, hi = _envelope(beta, log_w, sigma)
    a, b = np.empty(rows), np.empty(rows)
    for group in _row_groups(hi - lo, width):
        a[group], b[group] = _band(beta, log_w[group], sigma, lo[group], hi[group])
    out = np.empty(rows)
    pending = np.arange(rows)
    for _ in range(_MAX_REFINE):  # halve the step for the rows whose h and 2h sums disagree
        failed = []
        for group in _row_groups((b - a)[pending] / h, width):
            rows_g = pending[group]
            res, ok = _trapezoid(beta, log_w[rows_g], sigma, a[rows_g], b[rows_g], h)
            out[rows_g] = res
            failed.append(rows_g[~ok])
        pending = np.concatenate(failed)
        if not pending.size:
            return out
        h /= 2
    raise RuntimeError(f"quadrature of Psi did not converge (beta={beta}, sigma={sigma})")


def lattice_log_psi_int(alphas: Sequence[int], log_w: np.ndarray, sigma: float) -> np.ndarray:
    """log Ψ_α(P ‖ Q) for integer α in closed form: Σ_s c_s e^{s²/(2σ²)}, c = coefficients of
    (Σ_μ w_μ e^{−μ²/(2σ²)} z^μ)^α computed by repeated log-space polynomial multiplication.

    Columns s whose term c_s e^{s²/(2σ²)} is below e^{−PRUNE_NATS} times that of some larger s
    are dropped from the left: every later contribution of s is dominated by that of the larger
    s (the multiplier e^{μ(s−μ)/σ²} of a step grows with s), so the loss is < e^{−700}·Ψ.

    :returns: ``(len(alphas), rows)``.
    """
    log_w = np.atleast_2d(np.asarray(log_w, dtype=float))
    rows, width = log_w.shape
    log_a = log_w - np.arange(width) ** 2 / (2.0 * sigma**2)
    wanted = sorted({int(a) for a in alphas})
    if not wanted or wanted[0] < 1:
        raise ValueError(f"integer orders >= 1 expected, got {alphas!r}")
    found: dict[int, np.ndarray] = {}
    coef, offset = log_a, 0  # coef[:, j] holds s = offset + j
    for power in range(1, wanted[-1] + 1):
        if power > 1:  # coef ← coef · a in log space: Σ_μ exp(coef[s−μ] + log a_μ)
            size = coef.shape[1]
            shifted = [coef + log_a[:, mu:mu + 1] for mu in range(width)]
            peak = np.full((rows, size + width - 1), -np.inf)
            for mu, x in enumerate(shifted):
                np.maximum(peak[:, mu:mu + size], x, out=peak[:, mu:mu + size])
            peak[~np.isfinite(peak)] = 0.0
            total = np.zeros_like(peak)
            for mu, x in enumerate(shifted):
                total[:, mu:mu + size] += np.exp(x - peak[:, mu:mu + size])
            with np.errstate(divide="ignore"):
                coef = np.log(total) + peak
        s = offset + np.arange(coef.shape[1], dtype=float)
        log_terms = coef + s**2 / (2.0 * sigma**2)
        if power in wanted:
            found[power] = _lse(log_terms, axis=1)
        later = np.maximum.accumulate(log_terms[:, ::-1], axis=1)[:, ::-1]
        dominated = log_terms[:, :-1] < later[:, 1:] - _PRUNE_NATS
        first_kept = np.where(dominated.all(axis=1), dominated.shape[1], np.argmin(dominated, axis=1))
        drop = int(first_kept.min())
        if drop:
            coef, offset = coef[:, drop:], offset + drop
    return np.stack([found[int(a)] for a in alphas])


# ------------------------------------------------------------------ Theorem 3 and Theorem C.1
def _thm3_log_excess(orders: np.ndarray, sigma: float, log1m_gamma: np.ndarray) -> np.ndarray:
    """log(A_α(ℓ) − 1) of Eq. (44) for each order and each effective rate Γ (given as log(1−Γ))."""
    with np.errstate(divide="ignore"):
        log_gamma = np.log(-np.expm1(log1m_gamma))
    out = np.empty((orders.size, log1m_gamma.size))
    log_w = np.stack([log1m_gamma, log_gamma], axis=1)
    for i, alpha in enumerate(orders):
        if alpha == round(alpha):
            k = np.arange(2, int(alpha) + 1, dtype=float)
            rest = alpha - k
            log_c = gammaln(alpha + 1) - gammaln(k + 1) - gammaln(rest + 1)
            with np.errstate(invalid="ignore"):
                tail = np.where(rest == 0, 0.0, rest * log1m_gamma[:, None])
            terms = log_c + k * log_gamma[:, None] + tail + _log_expm1(k * (k - 1) / (2 * sigma**2))
            out[i] = _lse(terms, axis=1)
        else:
            out[i] = log_psi_excess_quad(float(alpha), log_w, sigma)
    return out


def thm3_rdp(orders: Sequence[float], sigma: float, gamma: float, m: int, n: int, K: int, k_neg: int,
             *, max_nodes: int = DEFAULT_MAX_NODES) -> np.ndarray:
    """Per-step RDP ε(α) of Theorem 3, Eq. (3): coupled sampling with FREQ-CLIP (adaptive clipping).

    :param orders: RDP orders α > 1 (integer ones in closed form, fractional by quadrature).
    :param sigma: noise multiplier σ (noise std σ·C).
    :param gamma: Poisson rate γ of the positives.
    :param m: number of positive records (edges after degree capping).
    :param n: number of nodes negatives are drawn from.
    :param K: degree cap (records removed with one node).
    :param k_neg: negatives per positive.
    :param max_nodes: at most this many ℓ evaluated inside the binomial window.
    """
    orders = _check_orders(orders)
    _check_numbers(sigma, gamma, m, n, K, k_neg)
    nodes = binomial_nodes(m, gamma, n, k_neg, max_nodes=max_nodes)
    rho, inverse = np.unique(nodes.rho, return_inverse=True)
    with np.errstate(divide="ignore"):
        log1m_gamma = K * math.log1p(-gamma) + np.log1p(-rho) if gamma < 1 else np.full(rho.size, -np.inf)
    log_ex = _thm3_log_excess(orders, sigma, log1m_gamma)[:, inverse]
    return np.logaddexp(0.0, nodes.log_expectation(log_ex)) / (orders - 1)


def thmc1_log_weights(gamma: float, K: int, rho: np.ndarray) -> np.ndarray:
    """``(rows, K+3)`` log ω over means μ = i + 2j (App. C, below Eq. 47), one row per ρ."""
    i = np.arange(K + 1, dtype=float)
    log_bin = gammaln(K + 1) - gammaln(i + 1) - gammaln(K - i + 1) + xlogy(i, gamma) + xlog1py(K - i, -gamma)
    rho = np.asarray(rho, dtype=float)
    with np.errstate(divide="ignore"):
        log_keep, log_hit = np.log1p(-rho), np.log(rho)
    log_w = np.full((rho.size, K + 3), -np.inf)
    log_w[:, : K + 1] = log_bin + log_keep[:, None]
    log_w[:, 2:] = np.logaddexp(log_w[:, 2:], log_bin + log_hit[:, None])
    return log_w


def thmc1_rdp(orders: Sequence[float], sigma: float, gamma: float, m: int, n: int, K: int, k_neg: int,
              *, max_nodes: int = DEFAULT_MAX_NODES) -> np.ndarray:
    """Per-step RDP ε(α) of Theorem C.1, Eq. (47): coupled sampling with standard clipping.

    Same parameters as :func:`thm3_rdp`. The larger of the two directions, each averaged over ℓ.
    """
    orders = _check_orders(orders)
    _check_numbers(sigma, gamma, m, n, K, k_neg)
    nodes = binomial_nodes(m, gamma, n, k_neg, max_nodes=max_nodes)
    rho, inverse = np.unique(nodes.rho, return_inverse=True)
    log_w = thmc1_log_weights(gamma, K, rho)
    forward = np.empty((orders.size, rho.size))
    integer = orders == np.round(orders)
    if integer.any():
        log_psi = lattice_log_psi_int(orders[integer].astype(int), log_w, sigma)
        forward[integer] = _log_expm1(np.maximum(log_psi, 0.0))
    for i in np.flatnonzero(~integer):
        forward[i] = log_psi_excess_quad(float(orders[i]), log_w, sigma)
    reverse = np.stack([log_psi_excess_quad(1.0 - float(a), log_w, sigma) for a in orders])
    log_fwd = nodes.log_expectation(forward[:, inverse])
    log_rev = nodes.log_expectation(reverse[:, inverse])
    return np.maximum(np.logaddexp(0.0, log_fwd), np.logaddexp(0.0, log_rev)) / (orders - 1)
