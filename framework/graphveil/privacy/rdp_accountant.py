"""A stateful RDP accountant over a pure per-step RDP function.

Mirrors opacus' small accountants (``accountants/rdp.py``): the state is a history of
(σ, steps) pairs; RDP composes additively over steps (Mironov 2017, Prop. 1), so the total
curve is Σ steps·ρ_σ(α) and ε comes from Thm D.1 (:mod:`graphveil.privacy.conversion`).
A subclass supplies only the analysis — :meth:`RdpAccountantBase.per_step_rdp`, a pure
function of σ (over ``self.orders`` or the orders asked for) once :meth:`bind` has fixed the
profile numbers — and :meth:`RdpAccountantBase._profile_state`, which is recorded in the state
dict so a state is never loaded into an accountant analysing different numbers.

Unlike opacus, ``len(accountant)`` is the number of steps, not of history segments.
"""

from __future__ import annotations

import functools
import inspect
import math
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from graphveil.contract.accountant import Accountant
from graphveil.contract.errors import PrivacyError
from graphveil.privacy.conversion import (
    DEFAULT_ORDERS,
    rdp_to_epsilon,
    validate_delta,
    validate_orders,
)
from graphveil.privacy.order_window import OrderWindow


def check_noise_multiplier(sigma: Any) -> float:
    """σ as a float; :class:`PrivacyError` unless it is a finite number > 0."""
    if isinstance(sigma, bool) or not isinstance(sigma, (int, float, np.integer, np.floating)):
        raise PrivacyError(f"noise multiplier must be a finite number > 0, got {sigma!r}")
    value = float(sigma)
    if not (value > 0 and math.isfinite(value)):
        raise PrivacyError(f"noise multiplier must be a finite number > 0, got {sigma!r}")
    return value


def check_steps(num_steps: Any, *, minimum: int = 0) -> int:
    """``num_steps`` as an int ≥ ``minimum``; :class:`PrivacyError` otherwise."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, (int, np.integer)):
        raise PrivacyError(f"number of steps must be an integer >= {minimum}, got {num_steps!r}")
    if num_steps < minimum:
        raise PrivacyError(f"number of steps must be an integer >= {minimum}, got {num_steps!r}")
    return int(num_steps)


def _pure_epsilon(event: Any) -> float | None:
    """ε of a pure ε-DP event (PureDpEvent; binary randomized response), else None."""
    import dp_accounting

    from graphveil.privacy.events import PureDpEvent

    if isinstance(event, PureDpEvent):
        return float(event.epsilon)
    if isinstance(event, dp_accounting.RandomizedResponseDpEvent) and event.num_buckets == 2:
        q = float(event.noise_parameter)  # keeps the true bit with probability 1 − q/2
        return math.inf if q <= 0 else math.log(2.0 / q - 1.0)
    return None


def bisect_sigma(epsilon_at: Callable[[float], float], target_epsilon: float, *,
                 sigma_range: tuple[float, float], rtol: float) -> float:
    """Smallest σ in ``sigma_range`` with ``epsilon_at(σ) <= target`` up to a factor 1 + rtol.

    ``epsilon_at`` must be non-increasing in σ. Brackets geometrically from σ = 1, then bisects
    in log σ and returns the conservative (upper) end, like opacus' ``get_noise_multiplier``.

    :raises PrivacyError: if even the largest σ of the range misses the target.
    """
    lo_limit, hi_limit = sigma_range
    hi = min(max(1.0, lo_limit), hi_limit)
    if epsilon_at(hi) > target_epsilon:
        lo = hi
        while True:
            if hi >= hi_limit:
                raise PrivacyError(
                    f"target ε={target_epsilon:g} is infeasible: even σ={hi_limit:g} gives "
                    f"ε={epsilon_at(hi_limit):.4g}"
                )
            lo, hi = hi, min(2.0 * hi, hi_limit)
            if epsilon_at(hi) <= target_epsilon:
                break
    else:
        lo = hi
        while True:
            if lo <= lo_limit:
                return lo_limit  # the smallest σ considered already meets the target
            hi, lo = lo, max(lo / 2.0, lo_limit)
            if epsilon_at(lo) > target_epsilon:
                break
    while hi / lo > 1.0 + rtol:
        mid = math.sqrt(lo * hi)
        if epsilon_at(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


class KnownDecisions:
    """Answers to "ε(σ) ≤ target?" from exact evaluations, extended by monotonicity.

    ε(σ) is non-increasing in σ (more noise is post-processing), so a σ at or above one that met
    the target meets it, and a σ at or below one that missed misses it; only a σ strictly between
    the two is evaluated (``decide``, exact). :attr:`exact` holds every σ evaluated and its answer.
    """

    def __init__(self, decide: Callable[[float], bool]) -> None:
        self.decide = decide
        self.met, self.missed = math.inf, 0.0
        self.exact: dict[float, bool] = {}

    def record(self, sigma: float, met: bool) -> bool:
        """Note an exact answer at σ (from ``decide`` or another exact evaluation)."""
        self.exact[sigma] = met
        if met:
            self.met = min(self.met, sigma)
        else:
            self.missed = max(self.missed, sigma)
        return met

    def __call__(self, sigma: float) -> bool:
        if sigma in self.exact:
            return self.exact[sigma]
        if sigma >= self.met:
            return True
        if sigma <= self.missed:
            return False
        return self.record(sigma, bool(self.decide(sigma)))


#: the localising secant stops once its step is below rtol / this (the prediction error is then
#: of the order of the step squared)
_SETTLED = 8.0
#: at most this many localising evaluations; a step moves σ by at most a factor _JUMP
_LOCALISE = 8
_JUMP = 64.0
#: predicted brackets checked at most (each costs two exact decisions)
_PREDICTIONS = 3


def guided_bisect_sigma(decide: Callable[[float], bool], epsilon_at: Callable[[float], tuple[float, float]],
                        target_epsilon: float, *, sigma_range: tuple[float, float], rtol: float,
                        start: tuple[float, float] | None = None) -> float:
    """:func:`bisect_sigma`'s σ (the same one) from far fewer exact evaluations.

    ``decide(σ)`` tells exactly whether ε(σ) ≤ target. ``epsilon_at(σ)`` → (ε̂, c): an estimate
    ε̂ ≥ ε(σ), close enough to aim and ≤ target exactly when ε(σ) ≤ target (its answers are kept
    as exact ones), and the part c of it that does not shrink with σ (the RDP conversion's term
    at the optimal order, :meth:`~graphveil.privacy.order_window.OrderWindow.epsilon`).

    The root is predicted by ``start`` = (σ, d log ε / d log σ) if given (a root a cheaper
    approximation located), else by :func:`localise_root` on ``epsilon_at``. :func:`bisect_sigma`
    is then run once on the predicted root, evaluating nothing, to find the bracket [lo, hi] it
    would end in; ``decide`` at lo and hi makes every answer of the real bisection known
    (:class:`KnownDecisions`: each of its probes lies at or below lo or at or above hi), so it
    ends in the same bracket and returns hi, which met the target exactly. If lo or hi answers
    against the prediction, the secant re-aims from there with ``epsilon_at`` (up to
    :data:`_PREDICTIONS` predictions); a prediction that still misses only costs evaluations:
    the real bisection evaluates what it does not know. The σ returned is always one ``decide``
    (or ``epsilon_at``) found to meet the target; were an answer inferred by monotonicity wrong
    at the returned σ, the plain bisection on ``decide`` is run instead.

    :raises PrivacyError: if even the largest σ of the range misses the target.
    """
    known = KnownDecisions(decide)
    target = float(target_epsilon)

    def meets(sigma: float) -> float:
        return target if known(sigma) else math.inf

    found = start or localise_root(epsilon_at, target, sigma_range=sigma_range, rtol=rtol, known=known)
    for _ in range(_PREDICTIONS):
        if found is None:
            break
        wrong = _check_prediction(known, found[0], target, sigma_range, rtol)
        if wrong is None:
            break
        # re-aim from the σ that contradicted the prediction, with the exact estimate
        found = localise_root(epsilon_at, target, sigma_range=sigma_range, rtol=rtol, start=(wrong, found[1]),
                              known=known)
    sigma = bisect_sigma(meets, target, sigma_range=sigma_range, rtol=rtol)
    met = known.exact.get(sigma)
    if met is None:  # inferred: decide it
        met = known.record(sigma, bool(decide(sigma)))
    if not met:  # ε(σ) was not monotone after all (rounding): the bisection's own evaluations
        return bisect_sigma(lambda s: target if decide(s) else math.inf, target, sigma_range=sigma_range,
                            rtol=rtol)
    return sigma


def _check_prediction(known: KnownDecisions, guess: float, target: float, sigma_range: tuple[float, float],
                      rtol: float) -> float | None:
    """Decide (exactly) the ends of the bracket :func:`bisect_sigma` ends in if its root is at
    ``guess``; the end whose answer contradicts that, or None if both agree (or the root is past
    the range's top end, which the real bisection reports)."""
    probes: list[float] = []

    def would(sigma: float) -> float:  # the bisection's answers were the root at ``guess``
        probes.append(sigma)
        return target if sigma >= guess else math.inf

    try:
        hi = bisect_sigma(would, target, sigma_range=sigma_range, rtol=rtol)
    except PrivacyError:
        return None
    if not known(hi):
        return hi
    missed = [p for p in probes if p < guess]
    if missed and known(max(missed)):
        return max(missed)
    return None


def localise_root(epsilon_at: Callable[[float], tuple[float, float]], target: float, *,
                  sigma_range: tuple[float, float], rtol: float, start: tuple[float, float] | None = None,
                  known: KnownDecisions | None = None) -> tuple[float, float] | None:
    """(σ, slope): where ε(σ) = target by a secant, once its step is below rtol / _SETTLED.

    ``epsilon_at(σ)`` → (ε̂, c) as for :func:`guided_bisect_sigma`. From σ = 1 (where
    :func:`bisect_sigma` starts) or ``start`` = (σ, d log ε / d log σ), each step aims at the
    target along the secant through the last two points. While the last two points have the
    same c (the same optimal order) the secant runs in (log σ, log(ε − c)), in which the RDP
    part ε − c is close to a power of σ where ε itself is not (at the paper's Thm C.1 root,
    ε − c ∝ σ^−57 beside c ≈ 7.5); otherwise in (log σ, log ε). Each answer ε̂ ≤ target is noted in
    ``known`` if given (only for exact estimates). ``None`` if the secant does not settle in
    _LOCALISE evaluations (or ε = 0 or ∞, or it runs into a range end); slope is d log ε / d log σ.
    """
    lo_limit, hi_limit = (math.log(v) for v in sigma_range)
    x, slope = min(max(0.0, lo_limit), hi_limit), -1.0  # ε ∝ 1/σ until the first secant
    if start is not None:
        x = min(max(math.log(start[0]), lo_limit), hi_limit)
        slope = start[1] if math.isfinite(start[1]) and start[1] < 0 else slope
    points: list[tuple[float, float, float]] = []  # (log σ, ε̂, c)
    for _ in range(_LOCALISE):
        sigma = math.exp(x)
        eps, fixed = (float(v) for v in epsilon_at(sigma))
        if known is not None:
            known.record(sigma, eps <= target)
        if not 0.0 < eps < math.inf:
            return None
        points.append((x, eps, fixed))
        c = 0.0
        if len(points) >= 2 and points[-1][0] != points[-2][0]:
            (x0, e0, c0), (x1, e1, c1) = points[-2:]
            if c0 == c1 and 0.0 <= c1 < min(e0, e1, target):
                c = c1
            secant = (math.log(e1 - c) - math.log(e0 - c)) / (x1 - x0)
            if math.isfinite(secant) and secant < 0:
                slope = secant * (e1 - c) / e1  # d log ε / d log σ at the latest point
        step = (math.log(target - c) - math.log(eps - c)) / (slope * eps / (eps - c))
        step = min(max(step, -math.log(_JUMP)), math.log(_JUMP))
        nxt = min(max(x + step, lo_limit), hi_limit)
        if abs(nxt - x) <= rtol / _SETTLED:
            return math.exp(nxt), slope
        if nxt == x:
            return None
        x = nxt
    return None


class RdpParams(BaseModel):
    """Options of an RDP accountant: the order grid."""

    model_config = ConfigDict(extra="forbid")
    orders: list[float] | None = Field(
        None, description="RDP orders α > 1 (default: graphveil.privacy.DEFAULT_ORDERS, 159 orders up to 256)."
    )

    @field_validator("orders")
    @classmethod
    def _orders(cls, v: list[float] | None) -> list[float] | None:
        if v is not None and (not v or not all(math.isfinite(a) and a > 1 for a in v)):
            raise ValueError("must be a non-empty list of finite numbers > 1")
        return v


class RdpAccountantBase(Accountant):
    """Generic RDP accountant: history of (σ, steps), composition, Thm D.1 conversion.

    :param params: an instance of the subclass' ``Params`` model; an ``orders`` field, if
        present and not ``None``, replaces :data:`~graphveil.privacy.conversion.DEFAULT_ORDERS`.
    """

    Params: ClassVar[type[BaseModel]] = RdpParams

    #: σ range searched by :meth:`calibrate`.
    SIGMA_RANGE: ClassVar[tuple[float, float]] = (0.05, 1000.0)
    #: :meth:`calibrate` stops when the bracket is narrower than a factor 1 + rtol.
    CALIBRATE_RTOL: ClassVar[float] = 1e-3
    #: at most this many per-σ RDP curves are cached.
    CACHE_SIZE: ClassVar[int] = 256

    def __init__(self, params: Any = None) -> None:
        self.params = params if params is not None else self.Params()
        orders = getattr(self.params, "orders", None)
        self.orders: np.ndarray = validate_orders(DEFAULT_ORDERS if orders is None else orders)
        self._history: dict[float, int] = {}  # σ → steps; equal σ merged
        self._last_sigma: float | None = None
        self._cache: dict[float, np.ndarray] = {}
        self._profile: dict[str, Any] | None = None
        self._events: list[tuple[str, np.ndarray]] = []  # one-shot releases: (name, RDP curve)
        self._pure: list[float | None] = []  # each release's pure ε, None if it is not pure DP

    # ------------------------------------------------------------------ for subclasses
    @abstractmethod
    def per_step_rdp(self, noise_multiplier: float, orders: Sequence[float] | None = None) -> np.ndarray:
        """RDP ε(α) of one step at noise multiplier σ, for every α in ``orders`` (default:
        ``self.orders``); each order's value must not depend on the other orders asked for."""

    def rough_per_step_rdp(self, noise_multiplier: float, orders: Sequence[float]) -> np.ndarray:
        """A cheaper approximation of :meth:`per_step_rdp` at ``orders``, which :meth:`calibrate`
        aims with before it evaluates the exact curve (it never decides anything with it). An
        accountant with one overrides this; the base has none (calibrate then aims with the
        exact curve)."""
        raise NotImplementedError

    def _step_orders(self, orders: Sequence[float] | None) -> np.ndarray:
        """The orders a :meth:`per_step_rdp` call evaluates: ``self.orders`` if ``orders`` is
        None, else ``orders`` as given (a float array, same order).

        :raises PrivacyError: unless each is a finite α > 1.
        """
        if orders is None:
            return self.orders
        arr = np.asarray(orders, dtype=float)
        if arr.ndim != 1 or arr.size == 0 or not (np.isfinite(arr) & (arr > 1.0)).all():
            raise PrivacyError(f"RDP orders must be a non-empty list of finite numbers > 1, got {orders!r}")
        return arr

    def _set_profile(self, profile: Mapping[str, Any]) -> None:
        """Record the bound profile numbers (JSON-able) and drop cached curves."""
        self._profile = dict(profile)
        self._cache.clear()

    def _profile_state(self) -> dict[str, Any]:
        if self._profile is None:
            raise PrivacyError(f"accountant {self.mechanism!r} is not bound to a sampling profile yet")
        return dict(self._profile)

    # ------------------------------------------------------------------ RDP curves
    def rdp_curve(self, noise_multiplier: float) -> np.ndarray:
        """Cached :meth:`per_step_rdp` (a copy)."""
        sigma = check_noise_multiplier(noise_multiplier)
        self._profile_state()
        curve = self._cache.get(sigma)
        if curve is None:
            curve = np.asarray(self.per_step_rdp(sigma), dtype=float)
            if curve.shape != self.orders.shape or np.isnan(curve).any():
                raise PrivacyError(f"accountant {self.mechanism!r} produced an invalid RDP curve at σ={sigma}")
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[sigma] = curve
        return curve.copy()

    def compose_event(self, event: Any, name: str) -> None:
        """Compose a one-shot release (a ``dp_accounting`` event) with the steps.

        The event's RDP curve (:meth:`event_rdp`) is added to every later ε.

        :raises PrivacyError: if dp-accounting cannot analyse the event under this unit.
        """
        self._events.append((str(name), self.event_rdp(event, name)))
        self._pure.append(_pure_epsilon(event))

    def event_rdp(self, event: Any, name: str, orders: np.ndarray | None = None) -> np.ndarray:
        """RDP curve of a ``dp_accounting`` event on this accountant's orders (or on ``orders``, some
        of them: each order's value does not depend on the others asked).

        Gaussian, Laplace and other events: ``dp_accounting.rdp.RdpAccountant`` under the
        neighbouring relation of this accountant's unit (replace-one for replacement adjacency,
        add-or-remove otherwise). Pure-ε releases compose on the same curve:

        * :class:`graphveil.privacy.events.PureDpEvent` ``(ε)`` (any ε-DP mechanism): ``min(ε, α·ε²/2)`` — an ε-DP
          mechanism is ε²/2-zCDP (Bun & Steinke 2016, Prop. 3.3) and its Rényi divergence of
          any order is at most its max divergence ε;
        * ``RandomizedResponseDpEvent`` (randomized response on adjacency entries): its exact RDP
          under replace-one, for edge units only — RR randomizes every entry of the public set of
          node pairs, and adding or removing one edge flips exactly one entry's value.

        :raises PrivacyError: if the event cannot be analysed under this accountant's unit.
        """
        import dp_accounting

        from graphveil.contract.units import Adjacency, UnitKind
        from graphveil.privacy.events import PureDpEvent

        grid = self.orders if orders is None else np.asarray(orders, dtype=float)
        rel = dp_accounting.privacy_accountant.NeighboringRelation
        unit = getattr(self, "unit", None)
        relation = (rel.REPLACE_ONE if getattr(unit, "adjacency", None) is Adjacency.REPLACEMENT
                    else rel.ADD_OR_REMOVE_ONE)
        if isinstance(event, PureDpEvent):
            eps = float(event.epsilon)
            if not (eps >= 0 and math.isfinite(eps)):
                raise PrivacyError(f"release {name!r}: a pure ε-DP event needs a finite ε >= 0, got {event.epsilon!r}")
            return np.minimum(eps, grid * eps**2 / 2.0)
        if isinstance(event, dp_accounting.RandomizedResponseDpEvent):
            if getattr(unit, "kind", None) not in (UnitKind.EDGE, UnitKind.UNDIRECTED_EDGE):
                raise PrivacyError(f"release {name!r}: randomized response on adjacency entries protects one "
                                   f"edge, not a {getattr(unit, 'kind', unit)!s} unit")
            relation = rel.REPLACE_ONE
        try:
            curve = dp_event_rdp(event, grid, relation)
        except _Unsupported as exc:
            raise PrivacyError(f"accountant {self.mechanism!r} cannot analyse release {name!r} "
                               f"({exc.args[0]}) under {relation.name} adjacency") from None
        if curve.shape != grid.shape or np.isnan(curve).any():
            raise PrivacyError(f"release {name!r} produced an invalid RDP curve")
        return curve

    def events_rdp(self) -> np.ndarray:
        """Σ of the composed one-shot releases' RDP curves."""
        total = np.zeros_like(self.orders)
        for _, curve in self._events:
            total += curve
        return total

    def total_rdp(self) -> np.ndarray:
        """Σ over the history of steps·ρ_σ(α), plus the one-shot releases."""
        total = self.events_rdp()
        for sigma, steps in self._history.items():
            if steps:
                total += steps * self.rdp_curve(sigma)
        return total

    # ------------------------------------------------------------------ Accountant API
    def step(self, *, noise_multiplier: float, num_steps: int = 1) -> None:
        sigma = check_noise_multiplier(noise_multiplier)
        steps = check_steps(num_steps)
        self._profile_state()
        self._history[sigma] = self._history.get(sigma, 0) + steps
        self._last_sigma = sigma

    def get_epsilon(self, delta: float) -> float:
        delta = validate_delta(delta)
        if len(self) == 0 and not self._events:
            return 0.0
        return min(rdp_to_epsilon(self.orders, self.total_rdp(), delta)[0], self._pure_bound())

    def _pure_bound(self) -> float:
        """Σ ε of the releases when there are no steps and every release is pure ε-DP (basic
        composition, δ = 0), which the RDP conversion can overshoot slightly; else ``inf``."""
        if len(self) or not self._pure or any(e is None for e in self._pure):
            return math.inf
        return float(sum(self._pure))

    def report(self, delta: float) -> dict[str, Any]:
        """ε, δ, the optimal α, the per-step RDP curve at the last σ, the total curve, history."""
        delta = validate_delta(delta)
        report: dict[str, Any] = {
            "mechanism": self.mechanism,
            "unit": getattr(self.unit, "value", None),
            "profile": self._profile_state(),
            "delta": delta,
            "steps": len(self),
            "noise_multiplier": self._last_sigma,
            "history": [[s, n] for s, n in self._history.items()],
            "releases": [name for name, _ in self._events],
        }
        if len(self) == 0 and not self._events:
            return {**report, "epsilon": 0.0, "alpha": None, "rdp": [], "rdp_total": []}
        total = self.total_rdp()
        eps, alpha = rdp_to_epsilon(self.orders, total, delta)
        if self._pure_bound() < eps:
            eps, alpha = self._pure_bound(), None  # pure ε-DP by basic composition
        last = self.rdp_curve(self._last_sigma) if self._last_sigma is not None else np.zeros_like(total)
        return {
            **report,
            "epsilon": eps,
            "alpha": alpha,
            "rdp": [[float(a), float(v)] for a, v in zip(self.orders, last, strict=True)],
            "rdp_total": [[float(a), float(v)] for a, v in zip(self.orders, total, strict=True)],
        }

    def calibrate(self, *, target_epsilon: float, delta: float, num_steps: int,
                  releases: Callable[[float], Sequence[tuple[str, Any]]] | None = None) -> float:
        """Smallest σ (conservative end of a log-bisection) with ε ≤ target after ``num_steps``.

        One budget for the whole plan: the one-shot releases composed so far count against the
        target, and so do the plan's releases still to come, ``releases(σ)`` → ``[(name,
        dp_accounting event)]`` (events of releases that take the shared σ depend on it; fixed
        ones do not). Does not touch the history. Each decision evaluates the per-step RDP, and
        the releases', only at the orders near the last optimum
        (:class:`~graphveil.privacy.order_window.OrderWindow`, the same answers as the whole
        curve), and :func:`guided_bisect_sigma` returns the σ of the log-bisection from a handful
        of decisions (the same σ as the bisection; issue 29), aiming first with
        :meth:`rough_per_step_rdp` if the accountant has one. :raises PrivacyError: on ε ≤ 0, a
        bad δ, fewer than one step with no release, or a target no σ in :attr:`SIGMA_RANGE` meets.
        """
        try:
            target = float(target_epsilon)
        except (TypeError, ValueError):
            raise PrivacyError(f"target epsilon must be a finite number > 0, got {target_epsilon!r}") from None
        if not (target > 0 and math.isfinite(target)):
            raise PrivacyError(f"target epsilon must be a finite number > 0, got {target_epsilon!r}")
        delta = validate_delta(delta)
        steps = check_steps(num_steps, minimum=0 if releases is not None else 1)
        self._profile_state()

        composed = self.events_rdp()
        # a release's RDP by the event's repr (events holding lists are not hashable) and order: a
        # fixed release is computed once, not at every σ tried, and only at the orders looked at
        curves: dict[tuple[str, int], float] = {}

        def planned_at(sigma: float) -> Callable[[np.ndarray], np.ndarray]:
            """The plan's other RDP at σ (releases composed so far and to come), at given orders."""
            events = list(releases(sigma)) if releases is not None else []

            def at(index: np.ndarray) -> np.ndarray:
                index = np.asarray(index, dtype=np.int64)
                total = composed[index].copy()
                for name, event in events:
                    key = repr(event)
                    missing = [int(i) for i in index if (key, int(i)) not in curves]
                    if missing:
                        values = self.event_rdp(event, name, orders=self.orders[missing])
                        curves.update(((key, i), float(v)) for i, v in zip(missing, values, strict=True))
                    total += np.array([curves[(key, int(i))] for i in index])
                return total

            return at

        def planned(sigma: float) -> np.ndarray:  # on the whole grid
            return planned_at(sigma)(np.arange(self.orders.size))

        def epsilon_at(sigma: float) -> float:
            curve = planned(sigma) + (steps * self.rdp_curve(sigma) if steps else 0.0)
            return rdp_to_epsilon(self.orders, curve, delta)[0]

        if steps == 0 and not np.any(planned(self.SIGMA_RANGE[1]) - planned(self.SIGMA_RANGE[0])):
            raise PrivacyError("nothing in the plan depends on the noise multiplier: no steps and no "
                               "release calibrated with the run, so there is no σ to calibrate")
        if not steps:
            return bisect_sigma(epsilon_at, target, sigma_range=self.SIGMA_RANGE, rtol=self.CALIBRATE_RTOL)

        # each bisection step asks only whether ε ≤ target: answered exactly from the orders
        # near the optimum (OrderWindow), the same answers as the whole curve, so the same σ; the
        # guided bisection asks the window a handful of times instead of ~20 (same σ again)
        window = OrderWindow(self.orders, self._per_step_rdp_at, steps, delta)
        start = None
        if type(self).rough_per_step_rdp is not RdpAccountantBase.rough_per_step_rdp:
            # aim with the cheaper approximation first; it decides nothing
            rough = OrderWindow(self.orders, lambda s, index: self.rough_per_step_rdp(s, self.orders[index]),
                                steps, delta)
            start = localise_root(lambda s: (rough.epsilon(s, planned_at(s), target), rough.offset), target,
                                  sigma_range=self.SIGMA_RANGE, rtol=self.CALIBRATE_RTOL)
            window.best = rough.best
        try:
            return guided_bisect_sigma(lambda s: window.feasible(s, planned_at(s), target),
                                       lambda s: (window.epsilon(s, planned_at(s), target), window.offset), target,
                                       sigma_range=self.SIGMA_RANGE, rtol=self.CALIBRATE_RTOL, start=start)
        except PrivacyError:
            top = self.SIGMA_RANGE[1]
            raise PrivacyError(f"target ε={target:g} is infeasible: even σ={top:g} gives "
                               f"ε={epsilon_at(top):.4g}") from None

    def _per_step_rdp_at(self, noise_multiplier: float, index: np.ndarray) -> np.ndarray:
        """Per-step RDP at σ on the orders ``self.orders[index]`` only.

        From the cached full curve if there is one; else :meth:`per_step_rdp` on those orders
        (every accountant computes each order on its own, so the values equal the full curve's
        there: tests check it).
        """
        sigma = check_noise_multiplier(noise_multiplier)
        cached = self._cache.get(sigma)
        if cached is not None:
            return cached[index]
        if not _takes_orders(type(self).per_step_rdp):
            # a plugin written before ``orders`` existed: its full curve, read at those orders
            return self.rdp_curve(sigma)[index]
        curve = np.asarray(self.per_step_rdp(sigma, orders=self.orders[index]), dtype=float)
        if curve.shape != (len(index),) or np.isnan(curve).any():
            raise PrivacyError(f"accountant {self.mechanism!r} produced an invalid RDP curve at σ={sigma}")
        return curve

    def state_dict(self) -> dict[str, Any]:
        return {
            "mechanism": self.mechanism,
            "profile": self._profile_state(),
            "orders": [float(a) for a in self.orders],
            "history": [[s, n] for s, n in self._history.items()],
            "last_sigma": self._last_sigma,
            "releases": [[name, [float(v) for v in curve]] for name, curve in self._events],
            "releases_pure_epsilon": list(self._pure),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the history; refuses state of another mechanism, profile or order grid."""
        mechanism = state.get("mechanism")
        if mechanism != self.mechanism:
            raise PrivacyError(f"cannot load state of mechanism {mechanism!r} into accountant {self.mechanism!r}")
        profile = self._profile_state()
        if state.get("profile") != profile:
            raise PrivacyError(
                f"accountant {self.mechanism!r}: saved state was computed for profile "
                f"{state.get('profile')!r}, this run has {profile!r}"
            )
        orders = np.asarray(state.get("orders", []), dtype=float)
        if orders.shape != self.orders.shape or not np.array_equal(orders, self.orders):
            raise PrivacyError(f"accountant {self.mechanism!r}: saved state uses a different RDP order grid")
        history: dict[float, int] = {}
        for entry in state.get("history", []):
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise PrivacyError(f"accountant {self.mechanism!r}: malformed history entry {entry!r}")
            sigma, steps = check_noise_multiplier(entry[0]), check_steps(entry[1])
            history[sigma] = history.get(sigma, 0) + steps
        last = state.get("last_sigma")
        events = []
        for entry in state.get("releases", []):
            curve = np.asarray(entry[1], dtype=float) if isinstance(entry, (list, tuple)) and len(entry) == 2 else None
            if curve is None or curve.shape != self.orders.shape or np.isnan(curve).any() or (curve < 0).any():
                raise PrivacyError(f"accountant {self.mechanism!r}: malformed release entry in saved state")
            events.append((str(entry[0]), curve))
        pure = list(state.get("releases_pure_epsilon", [None] * len(events)))  # absent: not pure (conservative)
        if len(pure) != len(events) or not all(e is None or (isinstance(e, int | float) and e >= 0) for e in pure):
            raise PrivacyError(f"accountant {self.mechanism!r}: malformed pure-ε entries in saved state")
        self._history = history
        self._events = events
        self._pure = [None if e is None else float(e) for e in pure]
        self._last_sigma = None if last is None else check_noise_multiplier(last)

    def __len__(self) -> int:
        return sum(self._history.values())


class _Unsupported(Exception):
    """A leaf event dp-accounting's RDP accountant cannot analyse (its type name in args[0])."""


@functools.lru_cache(maxsize=64)
def _takes_orders(per_step_rdp: Callable[..., Any]) -> bool:
    """Whether an accountant's ``per_step_rdp`` accepts ``orders`` (plugins may predate it)."""
    params = inspect.signature(per_step_rdp).parameters
    return "orders" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def dp_event_rdp(event: Any, orders: Any, relation: Any) -> np.ndarray:
    """RDP curve of a ``dp_accounting`` event at ``orders`` under ``relation``.

    Self-composed and composed events are split into their leaves, and each leaf's curve is
    cached for the process (:func:`_leaf_rdp`): calibration evaluates the same leaf at every σ it
    tries — e.g. the per-node sampled-without-replacement step of a GAP encoder release and of
    the run's own training steps, or every seed of a benchmark — and dp-accounting takes ~0.1 s
    per sampled-without-replacement curve. The result equals composing ``event`` in one
    ``dp_accounting.rdp.RdpAccountant`` (RDP adds up under composition).

    :raises _Unsupported: for a leaf dp-accounting cannot analyse under ``relation``.
    """
    import dp_accounting

    if isinstance(event, dp_accounting.SelfComposedDpEvent):
        return event.count * dp_event_rdp(event.event, orders, relation)
    if isinstance(event, dp_accounting.ComposedDpEvent):
        total = np.zeros(len(orders))
        for part in event.events:
            total += dp_event_rdp(part, orders, relation)
        return total
    try:
        hash(event)
    except TypeError:  # an event holding a list: not cacheable, computed directly
        return np.asarray(_leaf_rdp.__wrapped__(event, tuple(float(a) for a in orders), relation))
    return np.asarray(_leaf_rdp(event, tuple(float(a) for a in orders), relation))


@functools.lru_cache(maxsize=1024)
def _leaf_rdp(event: Any, orders: tuple[float, ...], relation: Any) -> tuple[float, ...]:
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant(orders=list(orders), neighboring_relation=relation)
    if not accountant.supports(event):
        raise _Unsupported(type(event).__name__)
    accountant.compose(event)
    return tuple(float(v) for v in accountant.rdp)
