"""The per-site privacy ledger: a durable privacy odometer in one SQLite file.

A data owner keeps one ledger per privacy unit and mechanism. It holds the accountant state of
*everything the site has released*, across rounds and runs, so the ε it shows is the total
spent on the site's data, not the spend of one run.

Write-ahead rule (DESIGN.md, "Federated"): spend is written *before* any output leaves the site.

1. :meth:`PrivacyLedger.reserve` — in one exclusive transaction: read the latest recorded
   accountant state, add the planned steps, and either record a ``reserved`` entry holding the
   resulting state or, if ε would exceed the budget, record a ``refused`` entry and raise
   :class:`BudgetExhaustedError`. Training starts only after this commit.
2. :meth:`PrivacyLedger.release` — after training, check the accountant that actually ran
   against the reservation (a larger ε is written first; the reserved ε is kept if the run did
   less) and mark the entry ``released``; only then may the update leave the site.

A site killed between 1 and 2 leaves a ``reserved`` entry, which counts in full: a restarted
site never undercounts. The stopping rule depends only on public parameters (σ, steps, the
sampling profile) and the ledger, never on the data, so the spend is the ordinary composition
of the recorded steps.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graphveil.components import Accountant
from graphveil.errors import GraphVeilError, PrivacyError

SCHEMA_VERSION = 1
#: Entry statuses whose spend counts (``refused`` entries record a request, not a release).
COUNTING = ("reserved", "released", "withheld")
_REL_TOL = 1e-9

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('reserved', 'released', 'withheld', 'refused')),
    site TEXT NOT NULL,
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    steps INTEGER NOT NULL,
    noise_multiplier REAL NOT NULL,
    delta REAL NOT NULL,
    epsilon REAL NOT NULL,
    budget REAL NOT NULL,
    mechanism TEXT NOT NULL,
    state TEXT,
    note TEXT NOT NULL DEFAULT ''
);
"""


class LedgerError(GraphVeilError):
    """The ledger file is unreadable, from another program, or from a newer GraphVeil."""


class BudgetExhaustedError(PrivacyError):
    """The requested steps would take the site past its privacy budget; nothing was released."""

    def __init__(self, message: str, *, projected_epsilon: float, budget: float, spent: float) -> None:
        super().__init__(message)
        self.projected_epsilon = projected_epsilon
        self.budget = budget
        self.spent = spent


@dataclass(frozen=True)
class LedgerEntry:
    """One row: a reservation (later released or withheld) or a refusal.

    ``epsilon`` is the *cumulative* ε at ``delta`` after this entry (for a refusal: the ε the
    request would have reached).
    """

    id: int
    created: str
    status: str
    site: str
    run: str
    round: int
    steps: int
    noise_multiplier: float
    delta: float
    epsilon: float
    budget: float
    mechanism: str
    note: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Reservation:
    """Spend recorded ahead of training. ``prior_state`` is the state before these steps
    (``None`` for a fresh ledger): load it into the session's accountant before training so the
    accountant that runs continues the site's history."""

    entry_id: int
    prior_state: dict[str, Any] | None
    state: dict[str, Any]
    epsilon: float
    delta: float
    budget: float
    steps: int

    def apply_prior(self, accountant: Accountant) -> None:
        if self.prior_state is not None:
            accountant.load_state_dict(copy.deepcopy(self.prior_state))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _dump_state(state: Mapping[str, Any]) -> str:
    def default(value: Any) -> Any:
        if hasattr(value, "tolist"):
            return value.tolist()
        if hasattr(value, "value"):  # enums
            return value.value
        raise TypeError(f"accountant state holds a {type(value).__name__}, which JSON cannot store")

    try:
        return json.dumps(dict(state), default=default, allow_nan=True)
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"cannot record accountant state: {exc}") from exc


class PrivacyLedger:
    """A site's privacy odometer in the SQLite file ``path``.

    :param path: ledger file; created (with its folder) unless ``create`` is false.
    :param create: false to open an existing ledger only (``graphveil budget show``).
    :raises LedgerError: if the file is missing (``create=False``), not a ledger, or newer.
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise LedgerError(f"{self.path}: no such ledger file")
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE below).
            self._db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=DELETE")
            self._db.execute("PRAGMA synchronous=FULL")  # a committed spend survives power loss
            if create:
                with self._transaction():
                    for stmt in filter(str.strip, _SCHEMA.split(";")):
                        self._db.execute(stmt)
                    self._db.execute(
                        "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
                    self._db.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (_now(),))
            meta = self.meta()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: not a GraphVeil privacy ledger ({exc})") from exc
        version = int(meta.get("schema_version", "0"))
        if version != SCHEMA_VERSION:
            raise LedgerError(
                f"{self.path}: ledger schema version {version}, this GraphVeil reads version {SCHEMA_VERSION}"
            )

    # ------------------------------------------------------------------------------ plumbing
    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> PrivacyLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # IMMEDIATE: take the write lock at once, so two rounds at one site cannot both
        # reserve against the same prior state.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _row(self, row: tuple[Any, ...]) -> LedgerEntry:
        return LedgerEntry(*row)

    _COLUMNS = ("id, created, status, site, run, round, steps, noise_multiplier, delta, epsilon, "
                "budget, mechanism, note")

    # ------------------------------------------------------------------------------ reading
    def meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def entries(self) -> list[LedgerEntry]:
        rows = self._db.execute(f"SELECT {self._COLUMNS} FROM entries ORDER BY id").fetchall()
        return [self._row(r) for r in rows]

    def _latest(self) -> tuple[LedgerEntry, dict[str, Any]] | None:
        row = self._db.execute(
            f"SELECT {self._COLUMNS}, state FROM entries WHERE status IN {COUNTING} ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return None
        return self._row(row[:-1]), json.loads(row[-1])

    def spent_epsilon(self) -> float:
        """Cumulative ε (at the ledger's δ) of everything reserved or released; 0 if nothing."""
        latest = self._latest()
        return 0.0 if latest is None else latest[0].epsilon

    def accountant_state(self) -> dict[str, Any] | None:
        """The accountant state of everything that counts, or ``None`` for a fresh ledger."""
        latest = self._latest()
        return None if latest is None else latest[1]

    def total_steps(self) -> int:
        row = self._db.execute(f"SELECT COALESCE(SUM(steps), 0) FROM entries WHERE status IN {COUNTING}").fetchone()
        return int(row[0])

    def summary(self) -> dict[str, Any]:
        """Site, mechanism, δ, ε spent, latest budget and remaining, steps, entry counts."""
        meta = self.meta()
        entries = self.entries()
        counts = {s: sum(e.status == s for e in entries) for s in ("reserved", "released", "withheld", "refused")}
        latest_budget = entries[-1].budget if entries else None
        spent = self.spent_epsilon()
        return {
            "ledger": str(self.path),
            "site": meta.get("site"),
            "mechanism": meta.get("mechanism"),
            "unit": meta.get("unit"),
            "delta": float(meta["delta"]) if "delta" in meta else None,
            "epsilon_spent": spent,
            "epsilon_budget": latest_budget,
            "epsilon_remaining": None if latest_budget is None else max(latest_budget - spent, 0.0),
            "steps": self.total_steps(),
            "counts": counts,
            "created": meta.get("created"),
        }

    # ------------------------------------------------------------------------------ writing
    def _check_meta(self, accountant: Accountant, delta: float, site: str | None) -> None:
        """Bind the ledger to one mechanism, unit and δ (and site, once named) on first use;
        refuse others later."""
        if not 0 < delta < 1:
            raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
        mechanism = str(getattr(accountant, "mechanism", type(accountant).__name__))
        unit = getattr(getattr(accountant, "unit", None), "value", None) or "unknown"
        want = {"mechanism": mechanism, "unit": unit, "delta": repr(float(delta))}
        if site is not None:
            want["site"] = site
        have = self.meta()
        for key, value in want.items():
            if key not in have:
                self._db.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
            elif have[key] != value:
                raise PrivacyError(
                    f"{self.path}: ledger records {key} {have[key]!r} but this run uses {value!r}; "
                    "spend under different sites, mechanisms, units or δ cannot be added up — "
                    "use a separate ledger file"
                )

    def reserve(
        self,
        accountant: Accountant,
        *,
        noise_multiplier: float,
        steps: int,
        delta: float,
        budget: float,
        site: str | None = None,
        run: str = "",
        round: int = 0,
    ) -> Reservation:
        """Record the spend of ``steps`` more steps at σ before they run, or refuse.

        :param accountant: a bound accountant of the run (its own history is ignored; the
            ledger's recorded state is the starting point). It is not modified.
        :raises BudgetExhaustedError: if ε after the steps would exceed ``budget`` (a
            ``refused`` entry is recorded; nothing else changes).
        :raises PrivacyError: on a non-positive budget or a mismatched site/mechanism/δ.
        """
        if not (budget > 0 and math.isfinite(budget)):
            raise PrivacyError(f"privacy budget must be a finite ε > 0, got {budget!r}")
        if steps < 0:
            raise PrivacyError(f"steps must be >= 0, got {steps}")
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise PrivacyError(
                f"noise multiplier must be a finite σ > 0 for a release under a budget, got {noise_multiplier!r}"
            )
        with self._transaction() as db:
            self._check_meta(accountant, delta, site)
            mechanism = self.meta()["mechanism"]
            latest = self._latest()
            prior = None if latest is None else latest[1]
            spent = 0.0 if latest is None else latest[0].epsilon
            projected = copy.deepcopy(accountant)
            if prior is not None:
                projected.load_state_dict(copy.deepcopy(prior))
            if steps:
                projected.step(noise_multiplier=noise_multiplier, num_steps=steps)
            eps = float(projected.get_epsilon(delta))
            if steps == 0:
                eps = max(eps, spent)
            name = site or self.meta().get("site", "")
            values = (_now(), name, run, round, steps, noise_multiplier, delta, eps, budget, mechanism)
            if not eps <= budget:
                db.execute(
                    "INSERT INTO entries (created, status, site, run, round, steps, noise_multiplier, "
                    "delta, epsilon, budget, mechanism, state, note) "
                    "VALUES (?, 'refused', ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)",
                    (*values, f"would reach ε={eps:.6g} > budget {budget:.6g} (spent {spent:.6g})"),
                )
                refusal = BudgetExhaustedError(
                    f"site {name or 'local'!r}: {steps} more steps at σ={noise_multiplier:.4g} would bring ε to "
                    f"{eps:.4g} (δ={delta:.3g}), past its budget {budget:.4g}; already spent {spent:.4g}",
                    projected_epsilon=eps, budget=budget, spent=spent,
                )
            else:
                refusal = None
                state = projected.state_dict()
                blob = _dump_state(state)
                self._check_round_trip(accountant, blob, eps, delta)
                cur = db.execute(
                    "INSERT INTO entries (created, status, site, run, round, steps, noise_multiplier, "
                    "delta, epsilon, budget, mechanism, state, note) "
                    "VALUES (?, 'reserved', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '')",
                    (*values, blob),
                )
                entry_id = int(cur.lastrowid)
        if refusal is not None:
            raise refusal
        return Reservation(entry_id, prior, json.loads(blob), eps, delta, budget, steps)

    def _check_round_trip(self, accountant: Accountant, blob: str, eps: float, delta: float) -> None:
        """Refuse to record a state this ledger could not restore to the same ε."""
        probe = copy.deepcopy(accountant)
        probe.load_state_dict(json.loads(blob))
        again = float(probe.get_epsilon(delta))
        if not math.isclose(again, eps, rel_tol=1e-9, abs_tol=1e-12):
            raise LedgerError(
                f"accountant {type(accountant).__name__} does not restore from its recorded state "
                f"(ε {eps!r} became {again!r}); refusing to record spend it cannot reproduce"
            )

    def release(self, reservation: Reservation, accountant: Accountant) -> LedgerEntry:
        """Confirm a reservation with the accountant that ran; call just before the output leaves.

        If the accountant reports more than was reserved, the larger spend is recorded first;
        if it is past the budget the entry becomes ``withheld`` and
        :class:`BudgetExhaustedError` is raised: the output must not leave the site.
        """
        eps = float(accountant.get_epsilon(reservation.delta))
        with self._transaction() as db:
            row = db.execute("SELECT status FROM entries WHERE id = ?", (reservation.entry_id,)).fetchone()
            if row is None or row[0] != "reserved":
                raise LedgerError(
                    f"{self.path}: entry {reservation.entry_id} is {row[0] if row else 'missing'}, not reserved"
                )
            status, note = "released", ""
            if eps > reservation.epsilon * (1 + _REL_TOL) + 1e-12:
                note = f"accountant reported ε={eps:.6g} > reserved {reservation.epsilon:.6g}; recorded the larger"
                newer = db.execute(
                    f"SELECT COUNT(*) FROM entries WHERE id > ? AND status IN {COUNTING}", (reservation.entry_id,)
                ).fetchone()[0]
                if newer:
                    # Later reservations were built on the smaller state: the excess cannot be
                    # added behind them, so this output must not leave.
                    status, note = "withheld", note.replace("recorded the larger", "later rounds built on the reserved state")
                else:
                    db.execute(
                        "UPDATE entries SET epsilon = ?, state = ? WHERE id = ?",
                        (eps, _dump_state(accountant.state_dict()), reservation.entry_id),
                    )
                    if eps > reservation.budget:
                        status = "withheld"
            elif eps < reservation.epsilon * (1 - _REL_TOL) - 1e-12:
                note = f"accountant reported ε={eps:.6g} < reserved {reservation.epsilon:.6g}; kept the reserved"
            db.execute("UPDATE entries SET status = ?, note = ? WHERE id = ?", (status, note, reservation.entry_id))
        entry = self.entry(reservation.entry_id)
        if status == "withheld":
            raise BudgetExhaustedError(
                f"site {entry.site!r}: the steps that ran reached ε={eps:.4g}, more than the "
                f"{reservation.epsilon:.4g} reserved (budget {reservation.budget:.4g}); the update is withheld",
                projected_epsilon=eps, budget=reservation.budget, spent=max(eps, reservation.epsilon),
            )
        return entry

    def withhold(self, reservation: Reservation, note: str) -> LedgerEntry:
        """Close a reservation whose output will not leave (e.g. training failed); it still counts."""
        with self._transaction() as db:
            row = db.execute("SELECT status FROM entries WHERE id = ?", (reservation.entry_id,)).fetchone()
            if row is None or row[0] not in ("reserved", "withheld"):
                raise LedgerError(
                    f"{self.path}: entry {reservation.entry_id} is {row[0] if row else 'missing'}, not reserved"
                )
            if row[0] == "reserved":
                db.execute("UPDATE entries SET status = 'withheld', note = ? WHERE id = ?", (note, reservation.entry_id))
        return self.entry(reservation.entry_id)

    def entry(self, entry_id: int) -> LedgerEntry:
        row = self._db.execute(f"SELECT {self._COLUMNS} FROM entries WHERE id = ?", (entry_id,)).fetchone()
        if row is None:
            raise LedgerError(f"{self.path}: no entry {entry_id}")
        return self._row(row)


def format_summary(summary: Mapping[str, Any], entries: list[LedgerEntry]) -> str:
    """The human view of ``graphveil budget show``."""

    def num(v: Any) -> str:
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = [
        f"ledger     {summary['ledger']}",
        f"site       {num(summary['site'])}",
        f"mechanism  {num(summary['mechanism'])} ({num(summary['unit'])}-level)",
        f"delta      {num(summary['delta'])}",
        f"epsilon    spent {num(summary['epsilon_spent'])} of budget {num(summary['epsilon_budget'])}"
        f" (remaining {num(summary['epsilon_remaining'])})",
        f"steps      {summary['steps']}",
        "entries    " + ", ".join(f"{k} {v}" for k, v in summary["counts"].items()),
    ]
    if summary["counts"].get("reserved"):
        lines.append("note       reserved entries were never confirmed (site stopped mid-round); they count in full")
    if entries:
        lines.append("")
        header = f"{'id':>4}  {'created':<20}  {'status':<8}  {'run':<12}  {'round':>5}  {'steps':>5}  {'sigma':>7}  {'epsilon':>9}  {'budget':>7}"
        lines.append(header)
        for e in entries:
            lines.append(
                f"{e.id:>4}  {e.created:<20}  {e.status:<8}  {e.run[:12]:<12}  {e.round:>5}  {e.steps:>5}  "
                f"{e.noise_multiplier:>7.4g}  {e.epsilon:>9.4g}  {e.budget:>7.4g}"
            )
    return "\n".join(lines)
