"""RDP → (ε, δ)-DP conversion and the default order grid.

The conversion is Theorem D.1 of the entity-level paper (shared/papers/
entity-level-dp-relational-learning.txt, App. D), taken from Balle et al. (2020,
"Hypothesis testing interpretations and Rényi DP", Thm 21): an (α, ε_α)-RDP mechanism is
(ε, δ)-DP for every 0 < δ < 1 with

    ε = ε_α + log((α − 1)/α) − (log δ + log α)/(α − 1),

minimised over the order grid. dp-accounting's ``compute_epsilon`` uses the same bound
(its "Proposition 12"), so the two agree wherever both are finite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from graphveil.contract.errors import PrivacyError

#: Default RDP orders α > 1. Fractional orders 1.1, 1.2, …, 10.9 (step 0.1; this includes the
#: integers 2…10) matter for large budgets and few steps; integers 11…63 as in opacus and
#: dp-accounting; then 64, 80, 96, 128, 160, 192, 256 for small budgets and many steps.
#: 159 orders in all; the coupled bounds cost grows with the largest integer order, which is
#: why the grid stops at 256 (dp-accounting goes on to 1024). Pass custom orders to an
#: accountant's ``Params`` when ε is tiny and the optimum sits at the top of the grid.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10 for x in range(1, 100)]
    + [float(a) for a in range(11, 64)]
    + [64.0, 80.0, 96.0, 128.0, 160.0, 192.0, 256.0]
)


def validate_delta(delta: float) -> float:
    """Return ``delta`` as a float, or raise :class:`PrivacyError` unless 0 < δ < 1."""
    try:
        value = float(delta)
    except (TypeError, ValueError):
        raise PrivacyError(f"delta must be a number in (0, 1), got {delta!r}") from None
    if not 0.0 < value < 1.0:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    return value


def validate_orders(orders: Sequence[float]) -> np.ndarray:
    """Sorted unique float array of RDP orders; each must be a finite α > 1."""
    arr = np.asarray(list(orders), dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise PrivacyError("RDP orders must be a non-empty list of numbers > 1")
    bad = arr[~(np.isfinite(arr) & (arr > 1.0))]
    if bad.size:
        raise PrivacyError(f"RDP orders must be finite numbers > 1, got {bad[0]!r}")
    return np.unique(arr)


def rdp_to_epsilon(orders: Sequence[float], rdp: Sequence[float], delta: float) -> tuple[float, float]:
    """(ε, α*): the smallest ε of Thm D.1 over the grid and the order α* attaining it.

    ``rdp`` is the *total* RDP curve (already composed over steps). Orders whose RDP is
    infinite give ε = ∞; ε is clamped at 0. If every order is infinite, returns (∞, α₀).

    >>> eps, alpha = rdp_to_epsilon([2.0, 4.0, 8.0], [0.01, 0.02, 0.04], 1e-5)
    >>> round(eps, 6), alpha
    (1.254109, 8.0)
    """
    delta = validate_delta(delta)
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if a.shape != r.shape or a.ndim != 1 or a.size == 0:
        raise PrivacyError(f"orders and RDP values must be 1-D of equal length, got {a.shape} and {r.shape}")
    if np.isnan(r).any():
        raise PrivacyError("RDP curve contains NaN; refusing to convert it to (ε, δ)")
    if not (a > 1).all():
        raise PrivacyError("RDP orders must be > 1 for the (ε, δ) conversion of Thm D.1")
    r = np.maximum(r, 0.0)  # RDP is non-negative; a rounding -0 must not lower ε
    with np.errstate(invalid="ignore"):
        eps = r + np.log1p(-1.0 / a) - (math.log(delta) + np.log(a)) / (a - 1.0)
    eps = np.where(np.isfinite(r), eps, np.inf)
    i = int(np.argmin(eps))
    return max(0.0, float(eps[i])), float(a[i])
