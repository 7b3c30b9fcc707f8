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
   matter; a scan with step 1 finds the band within e^{−120} of the maximum (valid because
   log-integrand'' ≥ −1 for β ≥ 1 and the log-integrand is concave for β ≤ 0); the
   trapezoidal rule on that band is repeated, per (α, ℓ), with the step halved until the sums
   at h and 2h agree to 1e-10 (the rule converges geometrically for these analytic integrands;
   the agreement test is a numerical check, not a proven bound). Where Ψ is close to 1 the
   integrand φ(t)·expm1(β·log1p(P/Q − 1)) of Ψ − 1 is summed directly, plus a rounding
   allowance. All orders are integrated together (:func:`log_psi_excess_quad_many`; many
   orders in two groups, each in a thread of its own): the points are a lattice t = k·h per
   ℓ shared by the orders whose bands lie close, so P/Q is evaluated once for all of them,
   and the halved steps are nested, so each refinement evaluates only the new midpoints.
   Each refinement forms the sums of all unfinished pairs together, in blocks of pairs with
   rows of similar length (no loop over segments).
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
numbers, mpmath quadrature and a full sum over ℓ (tests/plugins/entity_dp/test_accountant_coupled.py).

Speed: bench/accountant_speed.py times both bounds on the paper's setting (n = 1e6, m = 5e6,
K = 5, k_neg = 4, γ = 1e-5, σ = 0.5, all 159 default orders), and σ calibration with them on
that setting and the relational demo's Cora one; the README (*Accounting speed*) gives the
numbers and the machine load they were measured under. The paper's own code needs ~7 s and over
an hour.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

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

_Part = TypeVar("_Part")
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_MAX_REFINE = 12
_CHUNK_ELEMENTS = 3_000_000
#: pairs are handled in blocks of about this many (pair × point) values: a block's arrays stay in cache.
_BLOCK_ELEMENTS = 1 << 17
#: first quadrature step in t = x/σ for P‖Q, and the floor of σ/(mean span) used for Q‖P; the step is
#: then halved per row until the h and 2h sums agree. Tuned on the paper's setting for σ ∈ [0.1, 8].
_FIRST_STEP = 0.3
_FIRST_STEP_REVERSE = 0.07
#: below log Ψ = this, Ψ − 1 is summed directly rather than taken from log Ψ.
_DIRECT_BELOW = 0.5
#: quadrature over this many β or more, and the closed form over this many rows or more, is split
#: into _QUAD_GROUPS groups run in threads.
_GROUP_FROM = 16
_QUAD_GROUPS = 2
#: closed-form columns this far (in nats) below a larger-s column are dropped: each drop loses less
#: than e^{−100} of Ψ, and there are fewer than (K + 2)·α² drops (< 1e-30·Ψ in all for (K + 2)·α² <
#: 10¹³), far below Ψ's own rounding. 750 before issue 29 (the same values to ~1e-13, rounding).
_PRUNE_NATS = 100.0
#: Below σ = μ_max / UNSAMPLED_BELOW both bounds are the Gaussian mechanism's without sampling,
#: α·μ_max²/(2σ²) (:func:`_unsampled_rdp`): the quadrature's bands grow as μ_max/σ (σ = 1e-3
#: asked for ~1 GiB at K = 5, 1e-9 for 563 GiB), while at σ = μ_max/500 the amplified bound is
#: already within 1 % of the unsampled one (0.1–0.3 % at α = 1.1, γ = 0.1 / 1e-3; ε then exceeds
#: 10⁵ per step anyway).
UNSAMPLED_BELOW = 500.0


# ------------------------------------------------------------------------------------ helpers
def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """log Σ exp along ``axis``; all −∞ gives −∞."""
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True)) + peak
    return np.squeeze(out, axis=axis)


def _in_threads(work: Callable[[_Part], np.ndarray], parts: Sequence[_Part]) -> list[np.ndarray]:
    """``[work(part) for part in parts]``, each part in a thread of its own (numpy releases the
    GIL in its loops, so the parts run on separate cores)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        return list(pool.map(work, parts))


def _blocks(widths: np.ndarray, elements: int = _BLOCK_ELEMENTS) -> list[np.ndarray]:
    """Indices of items (pairs, each needing ``widths`` points) in blocks of similar width holding
    about ``elements`` values each: little padding, and a block's arrays stay in cache."""
    order = np.argsort(widths, kind="stable")
    cut = np.cumsum(widths[order]) // elements
    return np.split(order, np.flatnonzero(np.diff(cut)) + 1) if order.size else []


def _log_sums(beta: np.ndarray, points: _Points, rows: np.ndarray, width: int, step: float, *,
              even: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """log(step·Σ_t φ(t)·(P/Q)(t)^β) per pair (row of ``beta``) over the points of its row ``rows``
    of ``points`` (the first ``width``, all of them; and log(2·step·Σ) over the even-indexed t
    only, if ``even``)."""
    x = points.log_r[rows, :width]
    x *= beta
    x += points.log_phi[rows, :width]
    peak = x.max(axis=1, keepdims=True)
    peak[~np.isfinite(peak)] = 0.0
    x -= peak
    np.exp(x, out=x)
    with np.errstate(divide="ignore"):
        full = np.log(x.sum(axis=1)) + peak[:, 0]
        full += math.log(step)
        if not even:
            return full, None
        half = np.log(x[:, ::2].sum(axis=1)) + peak[:, 0]
        half += math.log(2 * step)
        return full, half


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


def _unsampled_rdp(orders: np.ndarray, sigma: float, mu_max: float) -> np.ndarray | None:
    """α·μ_max²/(2σ²) when σ < μ_max / :data:`UNSAMPLED_BELOW`, else None (compute the bound).

    A valid bound for both theorems at every γ and ℓ: P_ℓ is a mixture of N(μ, σ²) with
    0 ≤ μ ≤ μ_max, and Ψ_α is jointly convex, so Ψ_α(P_ℓ ‖ Q) and Ψ_α(Q ‖ P_ℓ) are at most the
    largest component's e^{α(α−1)μ²/(2σ²)}; so is their expectation over ℓ.
    """
    if sigma * UNSAMPLED_BELOW >= mu_max:
        return None
    return orders * (mu_max * mu_max / (2.0 * sigma * sigma))


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


def _envelope(betas: np.ndarray, log_w: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """Per β and row, ``(len(betas), rows)``: the interval of t outside which the integrand
    φ(t)(P/Q)^β is below e^{−BAND}·Ψ (and φ too)."""
    rows, width = log_w.shape
    mus = np.arange(width, dtype=float)
    present = np.isfinite(log_w)
    between = ~((betas >= 1) | (betas <= 0))
    if between.any():
        raise ValueError(f"beta must be >= 1 or <= 0, got {betas[between][0]}")
    lo, hi = np.empty((betas.size, rows)), np.empty((betas.size, rows))
    up = betas >= 1
    if up.any():  # (Σ v_μ)^β ≤ k^{β−1} Σ v_μ^β: Gaussians centred at βμ/σ
        beta = betas[up, None, None]
        with np.errstate(invalid="ignore"):
            lp = np.where(present, beta * log_w + beta * (beta - 1) * mus**2 / (2 * sigma**2), -np.inf)
        lower = np.maximum(0.0, lp.max(axis=2))  # log Ψ ≥ max(0, lp_μ)
        slack = (beta - 1) * np.log(present.sum(axis=1))[:, None] + lp - lower[..., None] + BAND_NATS
        keep = slack > 0
        radius = np.sqrt(2 * np.where(keep, slack, 0.0))
        centre = beta * mus / sigma
        lo[up] = np.where(keep, centre - radius, np.inf).min(axis=2)
        hi[up] = np.where(keep, centre + radius, -np.inf).max(axis=2)
    if not up.all():  # β ≤ 0: (P/Q)^β ≤ v_μ^β for the smallest present μ
        beta = betas[~up, None]
        first = np.argmax(present, axis=1)
        lw = log_w[np.arange(rows), first]
        lp = beta * lw + beta * (beta - 1) * first**2 / (2 * sigma**2)
        radius = np.sqrt(2 * (np.maximum(lp, 0.0) + BAND_NATS))
        centre = beta * first / sigma
        lo[~up], hi[~up] = centre - radius, centre + radius
    r_phi = math.sqrt(2 * BAND_NATS)
    return np.minimum(lo, -r_phi), np.maximum(hi, r_phi)


def _values(t: np.ndarray, rows: np.ndarray, log_w: np.ndarray, sigma: float, *, near: bool = True
            ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """At points ``t`` of rows ``rows`` (flat): log P/Q; if ``near``, log P/Q taken as
    log1p(P/Q − 1) where |P/Q − 1| < 0.5 (exact near Ψ = 1); and log φ."""
    log_r, log_q = np.empty_like(t), (np.empty_like(t) if near else None)
    step = max(1, _CHUNK_ELEMENTS // (8 * log_w.shape[1]))
    for s in range(0, t.size, step):  # bounded memory: (points × M) weights per block
        tt, lw = t[s:s + step, None], log_w[rows[s:s + step]]
        log_r[s:s + step] = _log_ratio(tt, lw, sigma)[:, 0]
        if not near:
            continue
        d = _ratio_minus_one(tt, lw, sigma)[:, 0]
        small = np.abs(d) < 0.5
        log_q[s:s + step] = np.where(small, np.log1p(np.where(small, d, 0.0)), log_r[s:s + step])
    return log_r, log_q, -0.5 * t**2 - _LOG_SQRT_2PI


def _segments(rows: np.ndarray, a: np.ndarray, b: np.ndarray, h: float
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pairs on one row whose bands lie close together share their points: pairs are binned by
    band centre in bins as wide as the row's widest band (a segment spans at most twice that).

    :returns: each pair's segment, and per segment its row and lattice range k_lo…k_hi (an odd
        number of points, so that the 2h rule has the same end points).
    """
    width = np.zeros(rows.max() + 1 if rows.size else 0)
    np.maximum.at(width, rows, b - a)
    key = np.floor(0.5 * (a + b) / width[rows]).astype(np.int64)
    key -= key.min() if key.size else 0
    _, seg = np.unique(rows * (int(key.max()) + 1 if key.size else 1) + key, return_inverse=True)
    seg = seg.reshape(-1)
    count = int(seg.max()) + 1 if seg.size else 0
    seg_row = np.zeros(count, dtype=np.int64)
    seg_row[seg] = rows
    k_lo = np.full(count, np.iinfo(np.int64).max)
    k_hi = np.full(count, np.iinfo(np.int64).min)
    np.minimum.at(k_lo, seg, np.floor(a / h).astype(np.int64))
    np.maximum.at(k_hi, seg, np.ceil(b / h).astype(np.int64))
    k_hi += (k_hi - k_lo) % 2
    return seg, seg_row, k_lo, k_hi


class _Points(NamedTuple):
    """Quadrature points of several segments, one row each, padded to the longest with points
    that add nothing to any sum (log P/Q = 0, log φ = −∞, φ = 0)."""

    t: np.ndarray
    log_r: np.ndarray  #: log P/Q
    log_q: np.ndarray | None  #: log P/Q, exact near P/Q = 1 (:func:`_values`)
    log_phi: np.ndarray
    phi: np.ndarray
    far: np.ndarray  #: φ < e^{−700} (|t| > 37): those terms are formed in log space


def _points(first: np.ndarray, lengths: np.ndarray, stride: int, step: float, seg_row: np.ndarray,
            log_w: np.ndarray, sigma: float, *, near: bool = True) -> _Points:
    """Points t = (first + stride·j)·step, j < length, per segment (one row each) and the values
    :func:`_values` gives there."""
    j = np.arange(int(lengths.max()) if lengths.size else 0)
    real = j < lengths[:, None]
    t = (first[:, None] + stride * j) * step
    log_r, log_phi = np.zeros(t.shape), np.full(t.shape, -np.inf)
    log_q = np.zeros(t.shape) if near else None
    values = _values(t[real], np.repeat(seg_row, lengths), log_w, sigma, near=near)
    log_r[real], log_phi[real] = values[0], values[2]
    if log_q is not None:
        log_q[real] = values[1]
    far = real & (log_phi < -700.0)
    return _Points(t, log_r, log_q, log_phi, np.exp(log_phi), far)


def _bands(beta: np.ndarray, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, log_w: np.ndarray,
           sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pair (β, row): scan [lo, hi] at step 1 and return the sub-interval holding all
    non-negligible mass (integrand within e^{−BAND−1/2} of its maximum, or of φ's), and the
    log of the integrand's peak (to tell Ψ ≫ 1 in advance). Pairs of a segment (:func:`_segments`)
    scan their common range: points outside a pair's own [lo, hi] can only widen its band."""
    seg, seg_row, k_lo, k_hi = _segments(rows, lo, hi, 1.0)
    lengths = k_hi - k_lo + 1
    points = _points(k_lo, lengths, 1, 1.0, seg_row, log_w, sigma, near=False)
    a, b, rough = np.empty(beta.size), np.empty(beta.size), np.empty(beta.size)
    for part in _blocks(lengths[seg]):  # all pairs at once, in blocks
        r = seg[part]
        width = lengths[r].max()
        lphi = points.log_phi[r, :width]
        g = points.log_r[r, :width]
        g *= beta[part, None]
        g += lphi
        v = np.maximum(g, lphi)
        hit = v >= v.max(axis=1, keepdims=True) - BAND_NATS - 0.5
        first = np.argmax(hit, axis=1)
        last = hit.shape[1] - 1 - np.argmax(hit[:, ::-1], axis=1)
        top = np.argmax(g, axis=1)
        a[part] = np.minimum(points.t[r, first], points.t[r, top]) - 1.0
        b[part] = np.maximum(points.t[r, last], points.t[r, top]) + 1.0
        rough[part] = g[np.arange(r.size), top]  # the integrand's peak: enough to tell Ψ ≫ 1
    return a, b, rough


def _sums(beta: np.ndarray, points: _Points, rows: np.ndarray, width: int, step: float, *,
          even: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """step·Σ φ·expm1(y) and step·Σ |φ·expm1(y)|, y = β·log(P/Q), per pair (row of ``beta``)
    over the points of its row ``rows`` of ``points`` (the first ``width``, all of them; and
    2·step·Σ φ·expm1(y) over the even-indexed points if ``even``): in plain floating point where
    φ ≥ e^{−700} (|t| ≤ 37), in log space beyond (``points.far``), where φ alone would underflow;
    an overflowing term gives inf (Ψ is then far from 1)."""
    y = points.log_q[rows, :width]
    y *= beta
    phi = points.phi[rows, :width]
    far = np.nonzero(points.far[rows, :width]) if points.far[:, :width].any() else None
    with np.errstate(over="ignore", invalid="ignore"):
        if far is not None:
            yf = y[far]
            log_term = points.log_phi[rows[far[0]], far[1]] + _log_abs_expm1(yf)
        e = np.expm1(y, out=y)
        if far is not None:
            e[far] = np.where(yf != 0, np.sign(yf) * np.exp(log_term), 0.0)
            phi[far] = 1.0  # those terms are whole already
        total = np.einsum("ij,ij->i", e, phi)
        half = 2 * step * np.einsum("ij,ij->i", e[:, ::2], phi[:, ::2]) if even else None
        mass = np.einsum("ij,ij->i", np.abs(e, out=e), phi)
    total *= step
    mass *= step
    return total, mass, half


def _agree(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Log-space sums at h and 2h agree to QUAD_RTOL (relative, absolute below 1)."""
    return np.abs(new - old) <= QUAD_RTOL * np.maximum(1.0, np.abs(new))


def _trapezoid(beta: np.ndarray, rows: np.ndarray, a: np.ndarray, b: np.ndarray, h: float,
               log_w: np.ndarray, sigma: float, log_mode: np.ndarray) -> np.ndarray:
    """log(Ψ − 1) per pair (β, row) by the trapezoidal rule on [a, b], the step halved until the
    sums at h and 2h agree.

    The grids are nested (step h/2^j on the same end points), so a finer level evaluates only the
    new midpoints and the coarser sum is the "2h" sum of the next. Where Ψ is close to 1 the
    integrand φ·expm1(β log(P/Q)) of Ψ − 1 is summed directly (:func:`_sums`), plus a rounding
    allowance; elsewhere log Ψ is accumulated by log-sum-exp. ``log_mode`` (changed in place):
    the pairs expected far from 1, tried in log space first. Each level handles all pending
    pairs at once, each reading its segment's row of points.
    """
    seg, seg_row, k_lo, k_hi = _segments(rows, a, b, h)
    n = beta.size
    total = np.zeros(n)  # h·Σ term (= Ψ − 1), or in log mode log(h·Σ integrand)
    mass = np.zeros(n)  # h·Σ |term|
    pending = np.ones(n, dtype=bool)
    tiny, eps = np.finfo(float).tiny, np.finfo(float).eps
    for level in range(_MAX_REFINE):
        step, scale = h / 2**level, 2**level
        pairs = np.flatnonzero(pending)
        live, where = np.unique(seg[pairs], return_inverse=True)
        where = where.reshape(-1)
        # level 0: every lattice point; later levels: the odd multiples of the new step only
        span = (k_hi[live] - k_lo[live]) * scale
        lengths = span + 1 if level == 0 else span // 2
        points = _points(k_lo[live] * scale + (0 if level == 0 else 1), lengths, 1 if level == 0 else 2,
                         step, seg_row[live], log_w, sigma)
        for part in _blocks(lengths[where]):
            p, r = pairs[part], where[part]
            width = lengths[r].max()
            bet = beta[p, None]
            if level == 0 and log_mode[p].any():  # expected far from 1: log Ψ at h and 2h first
                q = np.flatnonzero(log_mode[p])
                l_h, l_2h = _log_sums(bet[q], points, r[q], width, step, even=True)
                near = l_h <= _DIRECT_BELOW  # not far after all: summed directly below
                log_mode[p[q[near]]] = False
                q, l_h, l_2h = p[q[~near]], l_h[~near], l_2h[~near]
                total[q] = l_h
                pending[q[_agree(l_h, l_2h)]] = False
            lin = np.flatnonzero(~log_mode[p])
            s_h, m_h, half = _sums(bet[lin], points, r[lin], width, step, even=level == 0)
            if level == 0:
                prev = half
                with np.errstate(invalid="ignore"):
                    far = ~(np.log1p(np.maximum(s_h, -0.5)) <= _DIRECT_BELOW)  # inf, nan: far too
                if far.any():  # switch these to log mode: log Ψ at h and 2h
                    q = lin[far]
                    l_h, l_2h = _log_sums(bet[q], points, r[q], width, step, even=True)
                    near = l_h <= _DIRECT_BELOW  # an inaccurate plain sum: Ψ is close to 1 after all
                    q, l_h, l_2h = q[~near], l_h[~near], l_2h[~near]
                    log_mode[p[q]] = True
                    total[p[q]] = l_h
                    pending[p[q[_agree(l_h, l_2h)]]] = False
                    keep = np.ones(lin.size, dtype=bool)
                    keep[np.flatnonzero(far)[~near]] = False
                    lin, s_h, m_h, prev = lin[keep], s_h[keep], m_h[keep], prev[keep]
            else:
                prev = total[p[lin]]
                s_h += prev / 2
                m_h += mass[p[lin]] / 2
                lm = np.flatnonzero(log_mode[p])
                if lm.size:
                    q = p[lm]
                    l_new = _log_sums(bet[lm], points, r[lm], width, step, even=False)[0]
                    l_h = np.logaddexp(total[q] - math.log(2.0), l_new)
                    done = _agree(l_h, total[q])
                    total[q] = l_h
                    pending[q[done]] = False
            q = p[lin]
            total[q], mass[q] = s_h, m_h
            pending[q[np.abs(s_h - prev) <= QUAD_RTOL * np.abs(s_h) + 1e-14 * m_h]] = False
        if not pending.any():
            out = np.log(np.maximum(total + 64 * eps * mass, tiny))  # rounding allowance
            out[log_mode] = _log_expm1(total[log_mode])
            return out
    i = int(np.flatnonzero(pending)[0])
    raise RuntimeError(f"quadrature of Psi did not converge (beta={beta[i]}, sigma={sigma})")


def log_psi_excess_quad_many(betas: Sequence[float], log_w: np.ndarray, sigma: float) -> np.ndarray:
    """log(E_{x∼N(0,σ²)}[(P/Q)(x)^β] − 1) for several β by adaptive trapezoidal quadrature.

    Each (β, row) pair gets its own band and its own step (halved until the h and 2h sums
    agree); pairs of one row with nearby bands share points, on which log P/Q is evaluated
    once for all of them (:func:`_trapezoid`). A pair's value depends on the other β asked for
    only through those shared points' extent (extra points outside its band add mass below
    e^{−BAND_NATS} of it). From :data:`_GROUP_FROM` β on, the β (in sorted order) are dealt
    alternately into :data:`_QUAD_GROUPS` groups integrated in threads of their own (numpy
    releases the GIL in its loops, so the groups run on separate cores); the grouping depends
    on the β alone, so the values do not depend on the machine.

    :param betas: α for Ψ_α(P ‖ Q), or 1 − α for Ψ_α(Q ‖ P) = E_Q (P/Q)^{1−α}; each ≥ 1 or ≤ 0.
    :param log_w: ``(rows, M)`` log mixture weights of P = Σ_μ w_μ N(μ, σ²), μ = 0…M−1, each row
        summing to 1 (the weight of μ = 0 is taken as one minus the others).
    :param sigma: the noise multiplier.
    :returns: ``(len(betas), rows)`` log(Ψ − 1).
    """
    betas = np.asarray(betas, dtype=float).reshape(-1)
    log_w = np.atleast_2d(np.asarray(log_w, dtype=float))
    if betas.size < _GROUP_FROM:
        return _quad_group(betas, log_w, sigma)
    order = np.argsort(betas, kind="stable")
    groups = [order[g::_QUAD_GROUPS] for g in range(_QUAD_GROUPS)]
    parts = _in_threads(lambda g: _quad_group(betas[g], log_w, sigma), groups)
    out = np.empty((betas.size, log_w.shape[0]))
    for g, part in zip(groups, parts, strict=True):
        out[g] = part
    return out


def _quad_group(betas: np.ndarray, log_w: np.ndarray, sigma: float) -> np.ndarray:
    """:func:`log_psi_excess_quad_many` for one group of β, in the calling thread."""
    rows, width = log_w.shape
    if not betas.size:
        return np.zeros((0, rows))
    present = np.isfinite(log_w)
    idx = np.arange(width)
    spans = np.where(present, idx, -1).max(axis=1) - np.where(present, idx, width).min(axis=1)
    first_reverse = min(_FIRST_STEP, max(_FIRST_STEP_REVERSE, sigma / max(1, int(spans.max()))))
    lo, hi = _envelope(betas, log_w, sigma)  # raises for 0 < β < 1
    pair_beta = np.repeat(betas, rows)
    pair_row = np.tile(np.arange(rows), betas.size)
    a, b, rough = _bands(pair_beta, pair_row, lo.reshape(-1), hi.reshape(-1), log_w, sigma)
    log_mode = rough > _DIRECT_BELOW + 3.0  # surely far from 1: skip the direct sum
    out = np.empty(pair_beta.size)
    for forward in (True, False):  # the first step: P‖Q and Q‖P as before
        sel = np.flatnonzero((pair_beta > 0) == forward)
        if sel.size:
            h = _FIRST_STEP if forward else first_reverse
            out[sel] = _trapezoid(pair_beta[sel], pair_row[sel], a[sel], b[sel], h, log_w, sigma,
                                  log_mode[sel])
    return out.reshape(betas.size, rows)


def log_psi_excess_quad(beta: float, log_w: np.ndarray, sigma: float) -> np.ndarray:
    """:func:`log_psi_excess_quad_many` for one β: ``(rows,)`` log(Ψ − 1)."""
    return log_psi_excess_quad_many([beta], log_w, sigma)[0]


def lattice_log_psi_int(alphas: Sequence[int], log_w: np.ndarray, sigma: float) -> np.ndarray:
    """log Ψ_α(P ‖ Q) for integer α in closed form: Σ_s c_s e^{s²/(2σ²)}, c = coefficients of
    (Σ_μ w_μ e^{−μ²/(2σ²)} z^μ)^α computed by repeated log-space polynomial multiplication.

    Columns s whose term c_s e^{s²/(2σ²)} is below e^{−PRUNE_NATS} times that of some larger s
    are dropped from the left: every later contribution of s is dominated by that of the larger
    s (the multiplier e^{μ(s−μ)/σ²} of a step grows with s), so each drop loses less than
    e^{−PRUNE_NATS}·Ψ (:data:`_PRUNE_NATS`).
    Each row prunes its own columns (a row keeps its own first column s, its offset): rows whose
    mixtures reach different largest means (ρ = 0 stops at K, ρ > 0 at K + 2) keep only the few
    columns that matter to each, instead of the span between them (at the paper's setting and
    σ = 0.5, 9 columns instead of 513 at α = 256).

    Rows are independent: from :data:`_GROUP_FROM` rows on they are split into
    :data:`_QUAD_GROUPS` halves run in threads of their own (numpy releases the GIL in its loops).
    Every row prunes its own columns, so the values are those of one pass over all the rows.

    :returns: ``(len(alphas), rows)``.
    """
    if not len(alphas) or min(int(a) for a in alphas) < 1:
        raise ValueError(f"integer orders >= 1 expected, got {alphas!r}")
    log_w = np.atleast_2d(np.asarray(log_w, dtype=float))
    if log_w.shape[0] < _GROUP_FROM:
        return _lattice_rows(alphas, log_w, sigma)
    halves = np.array_split(log_w, _QUAD_GROUPS)
    return np.concatenate(_in_threads(lambda part: _lattice_rows(alphas, part, sigma), halves), axis=1)


def _lattice_rows(alphas: Sequence[int], log_w: np.ndarray, sigma: float) -> np.ndarray:
    """:func:`lattice_log_psi_int` for some rows, in the calling thread."""
    rows, width = log_w.shape
    log_a = log_w - np.arange(width) ** 2 / (2.0 * sigma**2)
    wanted = sorted({int(a) for a in alphas})
    found: dict[int, np.ndarray] = {}
    coef, offset = log_a, np.zeros((rows, 1))  # coef[r, j] holds s = offset[r] + j
    for power in range(1, wanted[-1] + 1):
        if power > 1:  # coef ← coef · a in log space: Σ_μ exp(coef[s−μ] + log a_μ)
            size = coef.shape[1]
            shifted = [coef + log_a[:, mu:mu + 1] for mu in range(width)]
            peak = np.full((rows, size + width - 1), -np.inf)
            for mu, x in enumerate(shifted):
                np.maximum(peak[:, mu:mu + size], x, out=peak[:, mu:mu + size])
            peak[~np.isfinite(peak)] = 0.0
            total = np.zeros_like(peak)
            for mu, x in enumerate(shifted):  # x is not used again: exp in place
                np.subtract(x, peak[:, mu:mu + size], out=x)
                total[:, mu:mu + size] += np.exp(x, out=x)
            with np.errstate(divide="ignore"):
                coef = np.log(total) + peak
        s = offset + np.arange(coef.shape[1], dtype=float)
        log_terms = coef + s**2 / (2.0 * sigma**2)
        if power in wanted:
            found[power] = _lse(log_terms, axis=1)
        if power < wanted[-1]:
            coef, offset = _prune_columns(coef, offset, log_terms)
    return np.stack([found[int(a)] for a in alphas])


def _prune_columns(coef: np.ndarray, offset: np.ndarray, log_terms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop, per row, the leading columns dominated by a larger s (see :func:`lattice_log_psi_int`)
    and the trailing ones the row does not hold (−∞); each row is shifted to start at its first
    kept column (its ``offset``)."""
    later = np.maximum.accumulate(log_terms[:, ::-1], axis=1)[:, ::-1]
    dominated = log_terms[:, :-1] < later[:, 1:] - _PRUNE_NATS
    first = np.where(dominated.all(axis=1), dominated.shape[1], np.argmin(dominated, axis=1))
    last = coef.shape[1] - 1 - np.argmax(np.isfinite(coef)[:, ::-1], axis=1)  # the last finite column
    keep = int(np.max(np.maximum(last - first, 0))) + 1
    if not first.any() and keep == coef.shape[1]:
        return coef, offset
    index = first[:, None] + np.arange(keep)
    kept = np.take_along_axis(coef, np.minimum(index, coef.shape[1] - 1), axis=1)
    kept[index >= coef.shape[1]] = -np.inf
    return kept, offset + first[:, None]


# ------------------------------------------------------------------ Theorem 3 and Theorem C.1
def _binomial_log_excess(alphas: np.ndarray, sigma: float, log1m_gamma: np.ndarray, log_gamma: np.ndarray
                         ) -> np.ndarray:
    """``(len(alphas), rows)`` log(Ψ_α − 1) for integer α by the binomial sum of the module notes
    (step 1); the terms k = 2…α of all the orders side by side, one log-sum-exp per order."""
    count = alphas.astype(np.int64) - 1
    start = np.cumsum(count) - count
    alpha = np.repeat(alphas, count)
    k = (np.arange(count.sum()) - np.repeat(start - 2, count)).astype(float)
    rest = alpha - k
    log_c = gammaln(alpha + 1) - gammaln(k + 1) - gammaln(rest + 1)
    terms = k * log_gamma[:, None]
    terms += log_c
    with np.errstate(invalid="ignore"):
        tail = rest * log1m_gamma[:, None]
    tail[:, rest == 0] = 0.0
    terms += tail
    terms += _log_expm1(k * (k - 1) / (2 * sigma**2))
    peak = np.maximum.reduceat(terms, start, axis=1)
    peak[~np.isfinite(peak)] = 0.0
    terms -= np.repeat(peak, count, axis=1)
    power = np.zeros_like(terms)
    np.exp(terms, out=power, where=terms >= -750.0)  # below, exp is 0 exactly: not evaluated
    with np.errstate(divide="ignore"):
        return (np.log(np.add.reduceat(power, start, axis=1)) + peak).T


def _thm3_log_excess(orders: np.ndarray, sigma: float, log1m_gamma: np.ndarray) -> np.ndarray:
    """log(A_α(ℓ) − 1) of Eq. (44) for each order and each effective rate Γ (given as log(1−Γ))."""
    with np.errstate(divide="ignore"):
        log_gamma = np.log(-np.expm1(log1m_gamma))
    out = np.empty((orders.size, log1m_gamma.size))
    log_w = np.stack([log1m_gamma, log_gamma], axis=1)
    integer = np.flatnonzero(orders == np.round(orders))  # the binomial sum; fractional orders below
    batch = np.cumsum(orders[integer] - 1) * log1m_gamma.size // _BLOCK_ELEMENTS
    for j in np.unique(batch):
        part = integer[batch == j]
        out[part] = _binomial_log_excess(orders[part], sigma, log1m_gamma, log_gamma)
    fractional = orders != np.round(orders)
    if fractional.any():  # one quadrature for all of them: the points are shared
        out[fractional] = log_psi_excess_quad_many(orders[fractional], log_w, sigma)
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

    Below σ = 1/:data:`UNSAMPLED_BELOW`: the unsampled Gaussian's α/(2σ²) (:func:`_unsampled_rdp`).
    """
    orders = _check_orders(orders)
    _check_numbers(sigma, gamma, m, n, K, k_neg)
    if (tiny := _unsampled_rdp(orders, sigma, 1.0)) is not None:
        return tiny
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
    Below σ = (K + 2)/:data:`UNSAMPLED_BELOW`: the unsampled Gaussian's α(K + 2)²/(2σ²), the
    largest mean being K + 2 (:func:`_unsampled_rdp`).
    """
    orders = _check_orders(orders)
    _check_numbers(sigma, gamma, m, n, K, k_neg)
    if (tiny := _unsampled_rdp(orders, sigma, K + 2.0)) is not None:
        return tiny
    nodes = binomial_nodes(m, gamma, n, k_neg, max_nodes=max_nodes)
    rho, inverse = np.unique(nodes.rho, return_inverse=True)
    log_w = thmc1_log_weights(gamma, K, rho)
    forward = np.empty((orders.size, rho.size))
    integer = orders == np.round(orders)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:  # the closed form beside the quadratures
        lattice = pool.submit(lattice_log_psi_int, orders[integer].astype(int), log_w, sigma) \
            if integer.any() else None
        if not integer.all():
            forward[~integer] = log_psi_excess_quad_many(orders[~integer], log_w, sigma)
        reverse = log_psi_excess_quad_many(1.0 - orders, log_w, sigma)
        if lattice is not None:
            forward[integer] = _log_expm1(np.maximum(lattice.result(), 0.0))
    log_fwd = nodes.log_expectation(forward[:, inverse])
    log_rev = nodes.log_expectation(reverse[:, inverse])
    return np.maximum(np.logaddexp(0.0, log_fwd), np.logaddexp(0.0, log_rev)) / (orders - 1)
