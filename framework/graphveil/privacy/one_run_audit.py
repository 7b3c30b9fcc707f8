"""The empirical ε lower bound of a one-run privacy audit (Steinke, Nasr & Jagielski, NeurIPS 2023).

"Privacy Auditing with One (1) Training Run" (arXiv:2305.08846). ``m`` canaries are each
included in the training data independently with probability 1/2; after the one run an auditor
guesses "in" or "out" for ``r`` of them (abstaining on the rest) from the released model and
gets ``v`` right. If the training algorithm is (ε, δ)-DP with respect to one canary, the main
theorem bounds the chance of that many correct guesses by the accuracy of ε-DP randomized
response plus a δ term. With ``W̃ ~ Binomial(r, q)``, ``q = e^ε / (1 + e^ε)``:

    P[W ≥ v] ≤ P[W̃ ≥ v] + 2·m·δ · max_{i = 1..v} P[v > W̃ ≥ v − i] / i

(the bound of the paper's Appendix D algorithm, ``p_value_DP_audit``; at δ = 0 only the
binomial tail is left). This right-hand side, capped at 1, is the p-value of the hypothesis
"the run is (ε, δ)-DP" given ``v``; the ε lower bound at confidence ``1 − p`` is the largest ε
whose hypothesis is rejected, ``p-value(ε) < p``, found by the same bisection as the paper's
``get_eps_audit`` (grow an upper end by 1 until the p-value reaches ``p``, then bisect; here to
a width of ``1e-9`` instead of 30 halvings).

What this is, and what it is not: a statistically valid *lower* bound — with probability at
least ``1 − p`` over the canaries' inclusion, a run that really is (ε, δ)-DP yields a bound
below ε — never an estimate of the true ε. With few canaries it cannot be large even for a
run that leaks everything: all ``r`` guesses right at δ = 0 gives at most
``log(p^{1/r} / (1 − p^{1/r}))`` (:func:`all_correct_bound`), about 1.82 for r = 20 at 95 %.

>>> round(epsilon_lower_bound(m=100, r=20, v=20, delta=0.0), 4)
1.8227
>>> round(all_correct_bound(20), 4)
1.8227
>>> epsilon_lower_bound(m=100, r=20, v=10, delta=1e-5)
0.0
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from graphveil.contract.errors import PrivacyError

#: Bisection stops when the bracket is this narrow (ε units).
TOLERANCE = 1e-9
#: Where the search for the bracket's upper end gives up: by then e^ε/(1 + e^ε) rounds to 1.
MAX_EPSILON = 800.0


def _check_counts(m: int, r: int, v: int) -> tuple[int, int, int]:
    try:
        m, r, v = (int(x) for x in (m, r, v))
    except (TypeError, ValueError):
        raise PrivacyError(f"audit counts must be integers, got m={m!r}, r={r!r}, v={v!r}") from None
    if not 0 <= v <= r <= m:
        raise PrivacyError(f"audit counts need 0 <= correct <= guesses <= canaries, got v={v}, r={r}, m={m}")
    return m, r, v


def _check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0.0 <= delta < 1.0:
        raise PrivacyError(f"audit delta must be in [0, 1), got {delta!r}")
    return delta


def audit_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Probability bound of ``≥ v`` correct out of ``r`` guesses on ``m`` canaries under (ε, δ)-DP.

    ``P[W̃ ≥ v] + 2mδ · max_{1≤i≤v} P[v > W̃ ≥ v − i]/i``, capped at 1 (module docstring). The
    window sums ``P[v > W̃ ≥ v − i]`` add probability masses, not differences of CDFs that would
    cancel near 1.

    :raises PrivacyError: on counts outside ``0 ≤ v ≤ r ≤ m``, ε < 0 or δ ∉ [0, 1).
    """
    m, r, v = _check_counts(m, r, v)
    delta = _check_delta(delta)
    if not epsilon >= 0:
        raise PrivacyError(f"audit epsilon must be >= 0, got {epsilon!r}")
    q = 1.0 / (1.0 + math.exp(-epsilon)) if epsilon < 700 else 1.0  # ε-DP randomized response accuracy
    tail = float(stats.binom.sf(v - 1, r, q))  # P[W̃ ≥ v]
    if delta == 0.0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    windows = np.cumsum(stats.binom.pmf(v - i, r, q))  # P[v > W̃ ≥ v − i], i = 1..v
    alpha = float(np.max(windows / i))
    return min(tail + 2.0 * m * delta * alpha, 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """Largest ε such that "(ε, δ)-DP" is rejected at level ``1 − confidence`` by ``v`` of ``r``
    correct guesses on ``m`` canaries; 0 if not even ε = 0 is rejected.

    :raises PrivacyError: on bad counts, δ ∉ [0, 1) or confidence ∉ (0, 1).
    """
    m, r, v = _check_counts(m, r, v)
    delta = _check_delta(delta)
    if not 0.0 < confidence < 1.0:
        raise PrivacyError(f"audit confidence must be in (0, 1), got {confidence!r}")
    p = 1.0 - confidence
    if audit_p_value(m, r, v, 0.0, delta) >= p:
        return 0.0
    low, high = 0.0, 1.0  # keep p-value(low) < p <= p-value(high)
    while audit_p_value(m, r, v, high, delta) < p:
        if high >= MAX_EPSILON:  # p-value(ε) → P[Binomial(r, 1) ≥ v] = 1: only a broken p-value gets here
            raise PrivacyError(f"audit p-value stays below {p:g} up to ε = {high:g} (m={m}, r={r}, v={v})")
        low, high = high, high + 1.0
    while high - low > TOLERANCE:
        mid = 0.5 * (low + high)
        if audit_p_value(m, r, v, mid, delta) < p:
            low = mid
        else:
            high = mid
    return low


def all_correct_bound(r: int, confidence: float = 0.95) -> float:
    """Closed form of :func:`epsilon_lower_bound` at δ = 0 when all ``r ≥ 1`` guesses are right:
    ``P[W̃ ≥ r] = q^r = 1 − confidence`` gives ``q = (1 − confidence)^{1/r}`` and ε = logit(q),
    or 0 if that is negative (q < 1/2: too few guesses to reject even ε = 0). The most any audit
    with ``r`` guesses can show."""
    q = (1.0 - confidence) ** (1.0 / r)
    return max(0.0, math.log(q / (1.0 - q)))
