"""Smallest σ meeting a target ε with few evaluations of an expensive, smooth ε(σ).

:func:`graphveil.privacy.bisect_sigma` needs ~log2(ln(range) / rtol) evaluations (about 11 for a
factor-4 range at rtol 1e-3). A PLD evaluation costs ~0.1 s, so ``edge_pld`` searches with a
safeguarded secant in (log σ, log ε), where ε(σ) is close to a power law: about three evaluations
once the root is known to a few per cent. Every answer is still decided by an evaluation: the
returned σ is one that met the target, and σ / (1 + rtol) is below one that missed it (or the
search range's lower end), so the safety and tolerance are those of the bisection.
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: a probe aims this fraction of the tolerance (in log σ) beyond the predicted root, so that one
#: probe on each side closes the bracket to within the tolerance
_AIM = 0.4
#: after this many probes every further one bisects (a guard against slow secant progress)
_SECANT_PROBES = 8


def log_secant_search(epsilon_at: Callable[[float], float], target: float, *, lower: float, upper: float,
                      rtol: float, guess: float | None = None,
                      slope: float | None = None) -> tuple[float, float | None]:
    """Smallest σ in [lower, upper] with ``epsilon_at(σ) <= target``, to a factor 1 + rtol.

    ``epsilon_at`` must be non-increasing in σ, and ``upper`` must meet the target (it is not
    evaluated). ``guess`` (the first probe) and ``slope`` (d log ε / d log σ, < 0) may come from
    a cheaper approximation of ``epsilon_at``. Each probe goes to the secant's predicted root,
    shifted to the side whose bracket end is farther; a bisection step replaces it when the
    prediction is unusable or outside the bracket, after three probes on the same side, and
    after eight probes, so there are at most eight more evaluations than a bisection's.

    :returns: ``(σ, slope)``: the upper end of the final bracket — ``upper`` or a σ that met the
        target — and the last secant slope (``None`` if there was none), for a finer search.
    """
    log_target, width = math.log(target), math.log1p(rtol)
    lo, hi = math.log(lower), math.log(upper)
    sigma_hi = upper
    lo_missed = False  # whether ``lo`` was evaluated and missed the target (the lower end may meet it)
    points: list[tuple[float, float]] = []  # (log σ, log ε) of every probe, the latest last
    sides: list[bool] = []  # whether each probe met the target
    while hi - lo > width:
        if len(points) >= 2 and points[-1][0] != points[-2][0]:
            (x0, y0), (x1, y1) = points[-2:]
            secant = (y1 - y0) / (x1 - x0)
            slope = secant if math.isfinite(secant) and secant < 0 else slope
        if not points and guess is not None:
            x = math.log(guess)
        elif points and slope is not None and math.isfinite(points[-1][1]):
            root = points[-1][0] + (log_target - points[-1][1]) / slope
            x = root + _AIM * width if hi - root > root - lo else root - _AIM * width
            if x <= lo and not lo_missed:
                x = lo  # the lower end may itself meet the target
        else:
            x = (lo + hi) / 2.0
        stalled = len(points) >= _SECANT_PROBES or len(sides) >= 3 and sides[-1] == sides[-2] == sides[-3]
        if not (lo < x < hi or x == lo and not lo_missed) or stalled:
            x = (lo + hi) / 2.0
        sigma = lower if x == lo and not lo_missed else math.exp(x)
        eps = float(epsilon_at(sigma))
        points.append((x, math.log(eps) if eps > 0 else -math.inf))
        if eps <= target:  # the check every returned σ but ``upper`` passed
            if sigma == lower:
                return lower, slope
            hi, sigma_hi = x, sigma
        else:
            lo, lo_missed = x, True
        sides.append(eps <= target)
    return sigma_hi, slope
