"""Decide ε(σ) ≤ target from a few RDP orders: what σ calibration needs at each bisection step.

ε(σ) = min over the grid of Thm D.1's ε_α (:func:`graphveil.privacy.conversion.rdp_to_epsilon`),
and the minimum sits at one order α*, which moves little from one σ to the next. So
:class:`OrderWindow` evaluates the per-step RDP on a window of orders around the last α*, and
bounds every order outside the window from below by two facts of Rényi divergences:

* D_α is non-decreasing in α (van Erven & Harremoës 2014, Thm 3): above the window,
  ρ(α) ≥ ρ(α_top);
* K(α) = (α − 1)·D_α is convex in α and ≥ 0 (ibid., Cor. 2), so it lies above the line through
  the window's two lowest orders to their left, and above the line through its two highest
  orders to their right (a convex function's slope only grows).

The rest of the plan's RDP (releases, composed with the steps) may be given on the whole grid
or computed where the window looks; then it is bounded outside the window by monotonicity alone
(by 0 below, by its value at the window's top above), the convexity argument being left to the
steps' curve (a pure-ε release's min(ε, αε²/2) has a concave kink).

The answer is "yes" when some order of the window meets the target (ε on a subset of the grid
is an upper bound on ε over the grid, so this is exact), "no" when no order of the window does
and every bound outside it exceeds the target; otherwise the window grows toward the orders that
might and the test is repeated (at worst over the whole grid). It grows by :data:`RADIUS` orders
on a side, then twice as many each time: a wider window has steeper secants, so its bounds rule
out far orders that a narrow one cannot; and upward by at most a doubling of α, since a high
order is what costs the coupled bounds most (before issue 29 the window jumped to every order
that might, often the top of the grid: the same decisions, several times the work). Each RDP curve the accountants
compute is such a divergence bound built from moments (a sum or maximum of log-convex moment
functions), so the bounds hold for the curves themselves; were one to fail, the only effect is a
"no" where the whole grid says "yes": calibration returns a larger σ (more noise), never a smaller.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

#: orders on each side of the last optimum evaluated first
RADIUS = 3
#: :meth:`OrderWindow.epsilon` estimates ε to within this share of |log(ε/target)| (relative)
ESTIMATE_SHARE = 0.01
#: the RDP of the rest of the plan (releases) on the whole grid, or a function giving it at the
#: orders of an index array (computed only where the window looks)
Planned = np.ndarray | Callable[[np.ndarray], np.ndarray]


class OrderWindow:
    """Exact ``ε(σ) ≤ target``, or ε(σ) itself, on the grid ``orders`` from RDP at as few orders as needed.

    :param orders: the sorted order grid.
    :param per_step: ``per_step(σ, index)`` → per-step RDP at ``orders[index]``.
    :param steps: number of steps composed (T·ρ).
    :param delta: δ of the conversion.
    """

    def __init__(self, orders: np.ndarray, per_step: Callable[[float, np.ndarray], np.ndarray],
                 steps: int, delta: float) -> None:
        self.orders = np.asarray(orders, dtype=float)
        self.per_step = per_step
        self.steps = steps
        with np.errstate(divide="ignore", invalid="ignore"):
            self.conv = np.log1p(-1.0 / self.orders) - (math.log(delta) + np.log(self.orders)) / (self.orders - 1.0)
        # no information yet: the order at which the conversion alone is cheapest for ε ≈ 1
        self.best = int(np.argmin(self.conv + self.orders))
        self.evaluated = 0  # orders evaluated in all (for tests and benchmarks)
        self.offset = 0.0  # the conversion's term at the last optimum: the part of ε that σ does not scale

    def feasible(self, sigma: float, planned: Planned, target: float) -> bool:
        """Whether min over the grid of ε_α(σ) ≤ target, ``planned`` the other RDP (:data:`Planned`)."""
        return self._search(sigma, planned, target, estimate=False) <= target

    def epsilon(self, sigma: float, planned: Planned, target: float) -> float:
        """An estimate ε̂ of ε(σ) = min over the grid of ε_α(σ) with ε ≤ ε̂ ≤ (1 + τ)·ε, τ =
        :data:`ESTIMATE_SHARE`·|log(ε̂/target)|: the window grows until no bound outside it is
        below ε̂/(1 + τ). Exact as ε̂ nears the target; ε̂ ≤ target exactly when ε ≤ target."""
        return self._search(sigma, planned, target, estimate=True)

    def _search(self, sigma: float, planned: Planned, target: float, *, estimate: bool) -> float:
        """The smallest ε of the window once it decides: for :meth:`feasible`, a value ≤ target
        (some order meets it; the grid's ε is at most this) or, when every bound outside exceeds
        the target, the window's smallest ε (> target); for :meth:`epsilon`, its estimate."""
        n = self.orders.size
        rho, other = np.full(n, np.nan), np.full(n, np.nan)
        lazy = callable(planned)
        if not lazy:
            other[:] = planned
        lo, hi = max(0, self.best - RADIUS), min(n - 1, self.best + RADIUS)
        if hi - lo < 1:  # the lower bound needs two orders
            lo, hi = max(0, hi - 1), min(n - 1, lo + 1)
        known_lo, known_hi = lo, lo - 1  # nothing evaluated yet
        grow = RADIUS
        while True:
            need = np.arange(lo, hi + 1)
            need = need[(need < known_lo) | (need > known_hi)]
            if need.size:
                rho[need] = np.asarray(self.per_step(sigma, need), dtype=float)
                if lazy:
                    other[need] = np.asarray(planned(need), dtype=float)
                self.evaluated += need.size
                known_lo, known_hi = min(known_lo, lo), max(known_hi, hi)
            window = slice(lo, hi + 1)
            r = np.maximum(other[window] + self.steps * rho[window], 0.0)
            eps = np.where(np.isfinite(r), r + self.conv[window], np.inf)
            i = int(np.argmin(eps))
            self.best = lo + i
            self.offset = float(self.conv[self.best])
            smallest = max(0.0, float(eps[i]))  # ε is clamped at 0 (rdp_to_epsilon)
            if not estimate and smallest <= target:
                return smallest
            bound = self._lower_bounds(rho, lo, hi, self._other_below(other, lo, hi) if lazy else other)
            if estimate:  # orders whose ε might lie below ε̂/(1 + τ)
                share = ESTIMATE_SHARE * abs(math.log(smallest / target)) if 0 < smallest < math.inf else 0.0
                might = np.flatnonzero(bound < smallest / (1.0 + share))
            else:
                might = np.flatnonzero(bound <= target)
            if not might.size:
                return smallest
            lo = max(min(lo, int(might.min())), lo - grow)
            # upward by at most a doubling of α too: a high order costs the coupled bounds the most
            top = int(np.searchsorted(self.orders, 2.0 * self.orders[hi], side="right")) - 1
            hi = min(max(hi, int(might.max())), hi + grow, max(top, hi + 1))
            grow *= 2

    @staticmethod
    def _other_below(other: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """The other RDP where known ([lo, hi]), and below it elsewhere: ≥ 0 below the window,
        ≥ its value at the window's top order above (RDP is non-decreasing in α)."""
        out = np.zeros_like(other)
        out[lo:hi + 1] = other[lo:hi + 1]
        top = other[hi]
        out[hi + 1:] = max(0.0, top) if np.isfinite(top) else 0.0
        return out

    def _lower_bounds(self, rho: np.ndarray, lo: int, hi: int, planned: np.ndarray) -> np.ndarray:
        """Lower bounds on ε_α for the orders outside [lo, hi] (+inf inside)."""
        a = self.orders
        n = a.size
        rho_lb = np.full(n, np.inf)
        finite = np.flatnonzero(np.isfinite(rho[lo:hi + 1])) + lo
        top = finite.max() if finite.size else None
        if hi + 1 < n:  # monotone in α; and (α−1)ρ convex: above the secant of the two highest orders
            rho_lb[hi + 1:] = max(0.0, rho[top]) if top is not None else 0.0
            if finite.size >= 2 and finite[-1] == hi and finite[-2] == hi - 1:
                k0, k1 = (a[hi - 1] - 1) * rho[hi - 1], (a[hi] - 1) * rho[hi]
                slope = (k1 - k0) / (a[hi] - a[hi - 1])
                rho_lb[hi + 1:] = np.maximum(rho_lb[hi + 1:], (k1 + slope * (a[hi + 1:] - a[hi])) / (a[hi + 1:] - 1))
        if lo > 0:  # (α−1)ρ convex and ≥ 0
            rho_lb[:lo] = 0.0
            if finite.size >= 2 and finite[0] == lo and finite[1] == lo + 1:
                k0, k1 = (a[lo] - 1) * rho[lo], (a[lo + 1] - 1) * rho[lo + 1]
                slope = (k1 - k0) / (a[lo + 1] - a[lo])
                below = np.maximum(0.0, k0 - slope * (a[lo] - a[:lo])) / (a[:lo] - 1)
                rho_lb[:lo] = below
        bound = np.full(n, np.inf)
        outside = np.ones(n, dtype=bool)
        outside[lo:hi + 1] = False
        r = np.maximum(planned[outside] + self.steps * rho_lb[outside], 0.0)
        bound[outside] = np.where(np.isfinite(r), r + self.conv[outside], np.inf)
        return bound
