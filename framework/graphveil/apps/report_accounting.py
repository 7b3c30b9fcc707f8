"""A finished private run's accountant, asked again: ε after t steps at its σ; σ for a target ε.

``graphveil report`` draws ε against the number of steps and σ against the target ε with the code
that accounted the run, never a re-implementation:

* runs that public sizes describe (the graph methods: DP-MLP, GAP, DPDGC, DP-GCN, …) go through
  :func:`graphveil.run.planning.planned_account` — what ``graphveil privacy --config`` runs — with the
  run's config, its n training nodes, its δ, and ``training.steps = t`` at the run's σ, or
  ``privacy.target_epsilon`` for σ;
* runs whose sampler reads the data (relational runs: degree capping, relation counts) bind the
  configured accountant to the sampling profile the run recorded in ``privacy.json`` and the
  clipper's sensitivity profile, as ``graphveil privacy --method entity|edge`` does, then
  ``step(σ, t)`` / ``calibrate``. Such a run may not have composed a release (its event would
  need the data).

Either way :meth:`RunAccounting.of` checks that ε after the run's own steps equals the ε in its
``privacy.json`` before any curve is drawn, so a curve that does not describe the run is refused.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from graphveil.apps.report_data import Cell, ReportError, resolved_raw
from graphveil.contract.errors import GraphVeilError

#: relative tolerance of the check that the re-evaluated ε at the run's steps is the run's ε
MATCH_RTOL = 1e-6


class RunAccounting:
    """The accounting of one private run (:meth:`of`), re-evaluated at other steps or targets."""

    def __init__(self, cell: Cell, host: Any) -> None:
        self.cell, self.host = cell, host
        self.privacy = cell.privacy
        self.sigma = float(self.privacy["noise_multiplier"])
        self.delta = float(self.privacy["delta"])
        self.steps = int(self.privacy["steps"])
        self.accountant = str(self.privacy["accountant"])
        self._raw = resolved_raw(cell)
        nodes = (self.privacy.get("dataset") or {}).get("nodes")
        self._public = nodes is not None  # graph methods record their n training nodes
        self._nodes = int(nodes) if nodes is not None else 0
        self.trains_privately = self.privacy.get("training") == "dp_sgd"
        self._sections: dict[str, dict[str, Any]] = {}  # accountant → its config section (applicable_accountants)
        self._curves: dict[tuple[int, ...], list[float]] = {}  # epsilons_after, by grid

    @classmethod
    def of(cls, cell: Cell, host: Any) -> RunAccounting:
        """The run's accounting, checked against its ``privacy.json``.

        :raises ReportError: for a non-private run, or if ε after the run's steps is not the ε
            the run claims (the curves would not describe this run).
        """
        if not cell.privacy.get("private"):
            raise ReportError(f"{cell.run_dir}: a non-private run has no accountant")
        accounting = cls(cell, host)
        if accounting._public:
            try:
                accounting._planned(steps=max(accounting.steps, 1))
            except GraphVeilError:  # the run reads more than public sizes: its recorded profile
                accounting._public = False
        if not accounting._public and accounting.privacy.get("releases"):
            raise ReportError(f"{cell.run_dir}: the run composed releases ({', '.join(accounting.privacy['releases'])}) "
                              "whose events need its data; graphveil report cannot re-account it")
        claimed = float(cell.privacy["epsilon"])
        # a training run's check is the last point of the curve the report draws (computed once)
        again = (accounting.epsilons_after(steps_grid(accounting.steps))[-1] if accounting.trains_privately
                 and accounting.steps >= 1 else accounting.epsilon_after(accounting.steps))
        if not math.isclose(again, claimed, rel_tol=MATCH_RTOL, abs_tol=1e-12):
            raise ReportError(f"{cell.run_dir}: its accountant {accounting.accountant!r} gives ε={again:.6g} after "
                              f"{accounting.steps} steps at σ={accounting.sigma:.6g}, but privacy.json claims "
                              f"ε={claimed:.6g}; not drawing curves that do not describe the run")
        return accounting

    # ------------------------------------------------------------------ ε after t steps
    def epsilon_after(self, steps: int) -> float:
        """ε of the run had it taken ``steps`` ≥ 1 DP-SGD steps at its σ (its releases unchanged)."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if self._public:
            return float(self._planned(steps=steps)["epsilon"])
        accountant = self._bound(self.accountant)
        accountant.step(noise_multiplier=self.sigma, num_steps=steps)
        return float(accountant.get_epsilon(self.delta))

    def epsilons_after(self, grid: list[int]) -> list[float]:
        """:meth:`epsilon_after` at each t of an increasing ``grid`` (t ≥ 1).

        A relational run's accountant is bound once and stepped from one t to the next, as the
        run stepped it, so its per-step curve at σ is computed once (binding a fresh accountant
        per t recomputed Thm C.1's curve every time: 11 of a report's 12 minutes). The curve is
        kept per grid: :meth:`of` checks the run's claim on its last point.
        """
        if any(b <= a for a, b in zip(grid, grid[1:], strict=False)) or (grid and grid[0] < 1):
            raise ValueError(f"grid must be increasing steps >= 1, got {grid}")
        key = tuple(grid)
        if key not in self._curves:
            self._curves[key] = self._epsilons_after(grid)
        return list(self._curves[key])

    def _epsilons_after(self, grid: list[int]) -> list[float]:
        if self._public:
            return [self.epsilon_after(t) for t in grid]
        accountant, done, out = self._bound(self.accountant), 0, []
        for t in grid:
            accountant.step(noise_multiplier=self.sigma, num_steps=t - done)
            done = t
            out.append(float(accountant.get_epsilon(self.delta)))
        return out

    # ------------------------------------------------------------------ σ for a target ε
    def applicable_accountants(self) -> list[str]:
        """Every registered accountant the run's sampler, clipper and unit pass the invariant
        with (:func:`graphveil.contract.invariant.check_run`, as ``graphveil run`` checks them). Another
        accountant takes the run's accountant options (e.g. its RDP orders) where it accepts them,
        else its defaults."""
        from graphveil.run.config import config_from_dict
        from graphveil.run.session import TrainingSession

        names = []
        for component in self.host.components("accountant"):
            for section in ({**self._raw["accountant"], "name": component.name}, {"name": component.name}):
                raw = {**copy.deepcopy(self._raw), "accountant": section}
                try:
                    TrainingSession(config_from_dict(raw, f"accountant {component.name}"), host=self.host).assemble()
                except GraphVeilError:
                    continue
                self._sections[component.name] = section
                names.append(component.name)
                break
        return names

    def calibrate(self, target_epsilon: float, accountant: str | None = None) -> float:
        """σ that ``accountant`` (default: the run's) calibrates for ``target_epsilon`` at the
        run's steps and δ.

        :raises PrivacyError: if no σ in the accountant's range meets the target.
        """
        name = accountant or self.accountant
        if self._public:
            return float(self._planned(accountant=name, target_epsilon=target_epsilon)["noise_multiplier"])
        return float(self._bound(name).calibrate(target_epsilon=target_epsilon, delta=self.delta,
                                                 num_steps=max(self.steps, 1)))

    # ------------------------------------------------------------------ the two paths
    def _with_accountant(self, name: str) -> dict[str, Any]:
        raw = copy.deepcopy(self._raw)
        if name != raw["accountant"]["name"]:
            raw["accountant"] = copy.deepcopy(self._sections.get(name, {"name": name}))
        return raw

    def _planned(self, *, steps: int | None = None, accountant: str | None = None,
                 target_epsilon: float | None = None) -> dict[str, Any]:
        """:func:`~graphveil.run.planning.planned_account` of the run's config with its n and δ."""
        from graphveil.run.config import config_from_dict
        from graphveil.run.planning import PublicSizes, planned_account

        raw = self._with_accountant(accountant or self.accountant)
        training = raw.setdefault("training", {})
        training["epochs"] = None
        training["steps"] = max(self.steps if steps is None else steps, 1)
        raw["privacy"] = {**raw.get("privacy", {}), "delta": self.delta,
                          "noise_multiplier": None if target_epsilon is not None else self.sigma,
                          "target_epsilon": target_epsilon}
        config = config_from_dict(raw, f"{self.cell.run_dir} (re-accounted)")
        # δ is the run's own, so the edge count (δ's default rule for edge units) changes nothing
        sizes = PublicSizes(nodes=self._nodes, edges=max(int(self.privacy.get("num_units") or 1), 1))
        return planned_account(config, sizes, host=self.host)

    def _bound(self, name: str) -> Any:
        """Accountant ``name``, fresh, bound to the run's recorded sampling profile and the
        sensitivity profile of its clipper (the run's components, assembled from its config)."""
        from graphveil.contract.profiles import SamplingKind, SamplingProfile
        from graphveil.run.config import config_from_dict
        from graphveil.run.session import TrainingSession

        session = TrainingSession(config_from_dict(self._with_accountant(name), str(self.cell.run_dir)),
                                  host=self.host)
        session.assemble()
        recorded = dict(self.privacy["sampling_profile"])
        profile = SamplingProfile(**{**recorded, "kind": SamplingKind(recorded["kind"])})
        session.clipper.bind(profile)
        session.accountant.bind(profile, session.clipper.profile)
        return session.accountant


def steps_grid(steps: int, points: int = 40) -> list[int]:
    """About ``points`` distinct step counts from 1 to ``steps`` (both ends): half evenly spaced,
    half geometric, so the steep start of ε(t) is drawn as finely as the rest."""
    if steps <= points:
        return list(range(1, steps + 1))
    half = points // 2
    even = {1 + round(i * (steps - 1) / (half - 1)) for i in range(half)}
    geometric = {round(steps ** (i / (half - 1))) for i in range(half)}
    return sorted(even | geometric)


def targets_grid(epsilons: list[float]) -> list[float]:
    """The swept ε values plus one octave below and above, for the σ curve."""
    finite = sorted({float(e) for e in epsilons if math.isfinite(e) and e > 0})
    if not finite:
        return []
    return sorted({finite[0] / 2, *finite, finite[-1] * 2})

