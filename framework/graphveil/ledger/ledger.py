"""The privacy ledger itself: a site's odometer over one SQLite file (see the package docstring)."""

from __future__ import annotations

import io
import json
import math
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphveil.contract.accountant import Accountant
from graphveil.contract.errors import PrivacyError
from graphveil.ledger.chain import (
    _FIELDS,
    _canonical,
    _connect,
    _fsync_dir,
    _genesis,
    _load_key,
    _normalize,
    _now,
    _read_anchor,
    _row_hash,
    _schema_version,
    _sha,
    _witnessed_problem,
)
from graphveil.ledger.entries import (
    _REL_TOL,
    CHECKPOINTS,
    COUNTING,
    SCHEMA_VERSION,
    BudgetExhaustedError,
    LedgerBindingError,
    LedgerEntry,
    LedgerError,
    Reservation,
    VerifyReport,
    WitnessHead,
)
from graphveil.ledger.migration import migrate_v1
from graphveil.ledger.site_key import key_path_for
from graphveil.ledger.spend import (
    Scan,
    _curve_json,
    _epsilon,
    _profile_of,
    _rdp_capable,
    entry_of,
    fold,
)
from graphveil.ledger.summary import summarize

if TYPE_CHECKING:
    import torch


class PrivacyLedger:
    """A site's privacy odometer in the SQLite file ``path``, chained under the site's key.

    A ledger is created once, explicitly, by :func:`init_ledger` (``graphveil budget init``);
    opening one never creates a ledger, a key or an anchor.

    :param path: an existing ledger file.
    :param anchor: optional file *outside the ledger's volume* holding the last head
        ``{"count": n, "hash": h}``; written after every committed write, checked on open and
        before every reservation (see the module docstring). It must exist (``init`` writes it).
    :param key: the site key (tests); default: read from ``<ledger>.key``
        (:func:`graphveil.ledger.site_key.key_path_for`).
    :param create: kept for old callers; only ``False`` is accepted (see :func:`init_ledger`).
    :raises LedgerError: if the file, its key or its anchor is missing, the file is not a
        ledger, is newer, is a schema-2 (unkeyed) ledger not yet re-chained by ``init``, a v1
        ledger that cannot be migrated, or is behind / diverging from its anchor.
    """

    def __init__(self, path: str | os.PathLike[str], *, anchor: str | os.PathLike[str] | None = None,
                 key: bytes | None = None, create: bool = False) -> None:
        self.path = Path(path)
        self.anchor = None if anchor is None else Path(anchor)
        if create:
            raise LedgerError(f"{self.path}: a ledger is created only by `graphveil budget init` "
                              "(graphveil.ledger.init_ledger), never on first use")
        if not self.path.is_file():
            raise LedgerError(f"{self.path}: no such ledger file; a site creates its ledger once with "
                              f"`graphveil budget init --ledger {self.path} --site NAME`")
        self._db = _connect(self.path)
        try:
            version = _schema_version(self._db, self.path)
            if version == 2:
                raise LedgerError(
                    f"{self.path}: schema-2 ledger (an unkeyed hash chain, which whoever writes the file "
                    f"can recompute); re-chain it under a new site key with `graphveil budget init "
                    f"--ledger {self.path}` (it verifies the chain first and keeps the old head)")
            if version not in (1, SCHEMA_VERSION):
                raise LedgerError(f"{self.path}: ledger schema version {version}, this GraphVeil reads "
                                  f"version {SCHEMA_VERSION}")
            if version == 1 and key is None and not key_path_for(self.path).exists():
                raise LedgerError(f"{self.path}: schema-1 ledger without a site key; `graphveil budget init "
                                  f"--ledger {self.path}` creates the key and migrates it")
            self._key = key if key is not None else _load_key(self.path)
            # Never created here: an anchor written on first use would re-anchor a restored backup
            # whose anchor was deleted (only `graphveil budget init` writes a new one).
            if self.anchor is not None and not self.anchor.exists():
                raise LedgerError(
                    f"{self.path}: its anchor {self.anchor} does not exist. A new site creates it with "
                    f"`graphveil budget init`; if it was lost, `graphveil budget init --ledger {self.path} "
                    f"--anchor {self.anchor} --reanchor` anchors the current head (a rollback before "
                    "that point is then caught only by the server's witness)")
            if version == 1:
                migrate_v1(self)
            if self.anchor is not None:
                problem = self._anchor_problem(self.anchor)
                if problem:
                    raise LedgerError(f"{self.path}: {problem}")
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise LedgerError(f"{self.path}: not a GraphVeil privacy ledger ({exc})") from exc
        except BaseException:
            self._db.close()
            raise

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
        # reserve against the same total.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        if self.anchor is not None:
            self._write_anchor()

    def genesis(self) -> str:
        """The keyed hash of the ledger's creation meta: the ``prev_hash`` of its first row."""
        return _genesis(self._key, self.meta())

    def _digest(self, row: Mapping[str, Any]) -> str:
        return _row_hash(self._key, row)

    def _rows(self, db: sqlite3.Connection | None = None) -> list[dict[str, Any]]:
        cur = (db or self._db).execute(f"SELECT {', '.join(_FIELDS)}, hash FROM entries ORDER BY id")
        names = [*_FIELDS, "hash"]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def _append(self, db: sqlite3.Connection, kind: str, **values: Any) -> int:
        last = db.execute("SELECT id, hash FROM entries ORDER BY id DESC LIMIT 1").fetchone()
        row = {name: None for name in _FIELDS}
        row.update({"site": "", "run": "", "round": 0, "steps": 0, "mechanism": "", "note": ""})
        row.update(values)
        row.update({"id": 1 if last is None else int(last[0]) + 1, "created": _now(), "kind": kind,
                    "prev_hash": self.genesis() if last is None else last[1]})
        row = _normalize(row)
        row["hash"] = self._digest(row)
        names = [*_FIELDS, "hash"]
        db.execute(f"INSERT INTO entries ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                   [row[n] for n in names])
        return int(row["id"])

    # ------------------------------------------------------------------------------ head & anchor
    def head(self) -> tuple[int, str]:
        """(number of chain rows, hash of the last one — the genesis hash for an empty ledger)."""
        row = self._db.execute("SELECT COUNT(*), (SELECT hash FROM entries ORDER BY id DESC LIMIT 1) "
                               "FROM entries").fetchone()
        return int(row[0]), row[1] or self.genesis()

    def witness_head(self) -> WitnessHead:
        """What a reply tells the server's witness (:mod:`graphveil.ledger.witness`).

        The sequence number counts the ledger's checkpoint rows (:data:`CHECKPOINTS`: one per
        round that reached the ledger — released, withheld or refused), the head is the keyed
        hash of the last of them (the genesis hash before the first), ``previous`` the one
        before. Rows whose presence may depend on the data (``raise``, ``records``) and set-up
        rows (``bind``, ``migrate``, ``rekey``) move none of them: the server learns how many
        rounds the ledger closed, which the replies' statuses already tell it, plus the rounds
        the site closed elsewhere. The hashes are keyed: the server cannot test guesses of the
        rows' values against them.
        """
        marks = ", ".join("?" * len(CHECKPOINTS))
        (count,) = self._db.execute(f"SELECT COUNT(*) FROM entries WHERE kind IN ({marks})",
                                    CHECKPOINTS).fetchone()
        last = [r[0] for r in self._db.execute(
            f"SELECT hash FROM entries WHERE kind IN ({marks}) ORDER BY id DESC LIMIT 2", CHECKPOINTS)]
        marks_back = [*last, self.genesis()]  # the checkpoints' hashes, newest first, then genesis
        return WitnessHead(int(count), marks_back[0], marks_back[1] if count else None)

    def _write_anchor(self, *, create: bool = False) -> None:
        """Atomically write the head to the anchor file (temp + fsync + rename), never backwards.

        Only ``init`` creates an anchor (``create``); after a commit a missing anchor stays
        missing (the next open refuses: it was deleted, or never made)."""
        assert self.anchor is not None
        count, head = self.head()
        if self.anchor.exists():
            old = _read_anchor(self.anchor)
            if old[0] > count or self._prefix_problem(*old):
                # another process wrote a newer head, or the ledger is behind or diverges from the
                # anchor: never overwrite the evidence (open and reserve refuse on it)
                return
        elif not create:
            return
        self.anchor.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.anchor.with_name(f".{self.anchor.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps({"count": count, "hash": head}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.anchor)
        _fsync_dir(self.anchor.parent)

    def _anchor_problem(self, anchor: Path) -> str | None:
        if not anchor.exists():
            return None
        count, head = _read_anchor(anchor)
        return self._prefix_problem(count, head)

    def _prefix_problem(self, count: int | None, head: str) -> str | None:
        """``None`` if the chain has the head ``(count, head)`` as a prefix (count ``None``: anywhere)."""
        rows = self._db.execute("SELECT id, hash FROM entries ORDER BY id").fetchall()
        have_n, have_h = len(rows), (rows[-1][1] if rows else self.genesis())
        hashes = [self.genesis()] + [r[1] for r in rows]
        if count is None:
            if head in hashes:
                return None
            return (f"ledger was rolled back or replaced: the expected head {head[:16]}… is not in its chain; "
                    f"ledger has {have_n} entries ending in {have_h[:16]}…")
        if count <= have_n and hashes[count] == head:
            return None
        return (f"ledger was rolled back or replaced: anchor says {count} entries ending in {head[:16]}…, "
                f"ledger has {have_n} entries ending in {have_h[:16]}…")

    # ------------------------------------------------------------------------------ reading
    def meta(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT key, value FROM meta").fetchall())

    def _scan(self, db: sqlite3.Connection | None = None) -> Scan:
        """Fold the chain: hashes, bindings, reservations and their status, the RDP total."""
        db = db or self._db
        scan = Scan()
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if "ledger_id" not in meta or "created" not in meta:
            scan.fail("the meta table lost the ledger id or creation time", None)
        prev = self.genesis()
        rows = self._rows(db)
        for i, row in enumerate(rows, start=1):
            rid = row["id"]
            if rid != i:
                scan.fail(f"row {i} is missing (rows deleted or renumbered; found id {rid})", i)
                break
            if row["prev_hash"] != prev:
                scan.fail(f"row {rid} does not follow row {rid - 1} (prev_hash mismatch: a row was "
                          "edited, deleted or inserted)", rid)
                break
            if self._digest(row) != row["hash"]:
                scan.fail(f"row {rid} was modified after it was written (hash mismatch)", rid)
                break
            prev = row["hash"]
            try:
                fold(scan, row)
            except (ValueError, TypeError, KeyError, PrivacyError) as exc:
                scan.fail(f"row {rid} is inconsistent: {exc}", rid)
                break
            if row["kind"] in CHECKPOINTS:
                scan.checkpoints.append(row["hash"])
        scan.count, scan.head = len(rows), prev
        if scan.error is None:
            seq = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'entries'").fetchone()
            if seq is not None and int(seq[0]) > len(rows):
                scan.fail(f"rows {len(rows) + 1}..{int(seq[0])} were deleted from the end of the chain", len(rows) + 1)
        if scan.error is None:
            for key in ("site", "unit", "delta", "orders"):
                if key in scan.bound and meta.get(key) != scan.bound[key]:
                    scan.fail(f"the meta table's {key} {meta.get(key)!r} differs from the chained binding "
                              f"{scan.bound[key]!r}", None)
                elif key not in scan.bound and key in meta:
                    scan.fail(f"the meta table holds an unchained {key} {meta[key]!r}", None)
        if scan.error is None:
            stored = dict(db.execute("SELECT key, sha256 FROM records").fetchall())
            for key, sha in stored.items():
                if key not in scan.records:
                    scan.fail(f"record set {key!r} is not in the chain", None)
                elif scan.records[key][1] != sha:
                    scan.fail(f"record set {key!r} was replaced (chained at row {scan.records[key][0]})",
                              scan.records[key][0])
            for key, (rid, sha) in scan.records.items():
                blob = db.execute("SELECT data FROM records WHERE key = ?", (key,)).fetchone()
                if blob is None:
                    scan.fail(f"record set {key!r} (row {rid}) was deleted", rid)
                elif _sha(bytes(blob[0])) != sha:
                    scan.fail(f"record set {key!r} (row {rid}) was modified", rid)
        return scan

    def verify(self, *, anchor: str | os.PathLike[str] | None = None, expect_head: str | None = None,
               witnessed: Iterable[tuple[int, str]] = ()) -> VerifyReport:
        """Recompute the hash chain, every recorded ε and the stored record sets.

        :param anchor: an anchor file to check against (default: the ledger's own anchor).
        :param expect_head: a head hash recorded elsewhere; it must be in the chain.
        :param witnessed: ``(seq, head)`` pairs a witness saw (:meth:`witness_head` of earlier
            replies): the chain's ``seq``-th checkpoint must have hash ``head``. The first one it
            does not is the error: a rollback (fewer checkpoints) or a rewrite of history the
            server saw (another hash), even one recomputed with the key.
        """
        scan = self._scan()
        error, bad = scan.error, scan.first_bad
        anchor_path = Path(anchor) if anchor is not None else self.anchor
        if error is None and anchor_path is not None:
            if not anchor_path.exists():
                error = f"anchor file {anchor_path} does not exist"
            else:
                error = self._anchor_problem(anchor_path)
        if error is None and expect_head is not None:
            error = self._prefix_problem(None, expect_head.strip().lower())
        if error is None:
            error = _witnessed_problem([self.genesis(), *scan.checkpoints], witnessed)
        return VerifyReport(ok=error is None, count=scan.count, head=scan.head, epsilon=scan.epsilon,
                            delta=scan.delta, error=error, first_bad=bad)

    def entries(self) -> list[LedgerEntry]:
        """Reservations (with their current status), refusals and migrated totals, in order."""
        return [entry_of(item) for item in self._scan().items.values()]

    def entry(self, entry_id: int) -> LedgerEntry:
        item = self._scan().items.get(entry_id)
        if item is None:
            raise LedgerError(f"{self.path}: no entry {entry_id}")
        return entry_of(item)

    def events(self) -> list[dict[str, Any]]:
        """The raw chain rows (for audit), increments and profiles decoded."""
        out = []
        for row in self._rows():
            row = dict(row)
            for key in ("profile", "increment"):
                if row[key] is not None:
                    row[key] = json.loads(row[key])
            out.append(row)
        return out

    def spent_epsilon(self) -> float:
        """Cumulative ε (at the ledger's δ) of everything reserved, released or migrated; 0 if nothing."""
        return self._scan().epsilon

    def total_rdp(self) -> tuple[list[float], list[float]] | None:
        """(orders, total RDP curve) of everything that counts, or ``None`` before the first spend."""
        scan = self._scan()
        if scan.orders is None or scan.total is None:
            return None
        return [float(a) for a in scan.orders], [float(v) for v in scan.total]

    def total_steps(self) -> int:
        return sum(e.steps for e in self.entries() if e.status in COUNTING)

    def summary(self) -> dict[str, Any]:
        """Site, unit, δ, ε spent, latest budget and remaining, steps, entry counts, chain head."""
        return summarize(self.path, self.meta(), self._scan())

    # ------------------------------------------------------------------------------ writing
    def _require_valid(self, db: sqlite3.Connection) -> Scan:
        scan = self._scan(db)
        if scan.error is not None:
            raise LedgerError(
                f"{self.path}: the ledger fails verification at "
                f"{'row ' + str(scan.first_bad) if scan.first_bad else 'its meta table'}: {scan.error}; "
                "refusing to record spend on a ledger edited outside GraphVeil "
                "(`graphveil budget verify` shows the problem)"
            )
        if self.anchor is not None:
            problem = self._anchor_problem(self.anchor)
            if problem:
                raise LedgerError(f"{self.path}: {problem}")
        return scan

    def _bind(self, db: sqlite3.Connection, scan: Scan, accountant: Accountant, orders: np.ndarray,
              delta: float, site: str | None) -> None:
        """Bind the ledger to site, privacy unit, δ and order grid on first use; refuse others."""
        unit = getattr(getattr(accountant, "unit", None), "value", None) or "unknown"
        want = {"unit": unit, "delta": repr(float(delta)), "orders": _canonical([float(a) for a in orders])}
        if site is not None:
            want["site"] = site
        new: dict[str, str] = {}
        for key, value in want.items():
            have = scan.bound.get(key)
            if have is None:
                new[key] = value
            elif have != value:
                if key == "orders":
                    n_have = len(json.loads(have))
                    raise LedgerBindingError(
                        f"{self.path}: the ledger composes RDP curves on its order grid ({n_have} orders) "
                        f"but this run's accountant uses another ({orders.size} orders); configure the "
                        "accountant with the ledger's grid — the default grid "
                        "(graphveil.privacy.DEFAULT_ORDERS, i.e. leave `orders` unset) unless the ledger "
                        "was started with another", key=key)
                label = {"unit": "privacy unit", "delta": "δ", "site": "site"}[key]
                raise LedgerBindingError(
                    f"{self.path}: the ledger is bound to {label} {have!r} but this run uses {value!r}; "
                    f"RDP spend composes only under one {label} — run with the ledger's {label}",
                    key=key)
        if new:
            self._append(db, "bind", site=site or scan.bound.get("site", ""), note=_canonical(new))
            for key, value in new.items():
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
                scan.bound[key] = value
            scan.orders = np.asarray(json.loads(scan.bound["orders"]), dtype=float)
            scan.delta = float(scan.bound["delta"])
            if scan.total is None:
                scan.total = np.zeros_like(scan.orders)

    def _bind_site(self, site: str) -> None:
        """Bind the ledger to ``site`` (``init --site``); refuse another site's name."""
        with self._transaction() as db:
            scan = self._require_valid(db)
            have = scan.bound.get("site")
            if have is None:
                self._append(db, "bind", site=site, note=_canonical({"site": site}))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('site', ?)", (site,))
            elif have != site:
                raise LedgerBindingError(f"{self.path}: the ledger is bound to site {have!r}, not {site!r}",
                                         key="site")

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
        """Record the RDP increment of ``steps`` more steps at σ before they run, or refuse.

        :param accountant: a bound RDP accountant of the run (its own history is ignored; only
            its per-step curve ``rdp_curve(σ)`` on its orders is used). It is not modified.
        :raises BudgetExhaustedError: if ε after the steps would exceed ``budget`` (a
            ``refuse`` row is recorded; nothing else changes).
        :raises LedgerBindingError: on a site, unit, δ or order grid other than the ledger's.
        :raises PrivacyError: on a non-positive budget, a bad σ, or an accountant without RDP.
        :raises LedgerError: if the ledger fails verification or is behind its anchor.
        """
        if not (budget > 0 and math.isfinite(budget)):
            raise PrivacyError(f"privacy budget must be a finite ε > 0, got {budget!r}")
        if steps < 0:
            raise PrivacyError(f"steps must be >= 0, got {steps}")
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise PrivacyError(
                f"noise multiplier must be a finite σ > 0 for a release under a budget, got {noise_multiplier!r}"
            )
        if not 0 < delta < 1:
            raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
        orders, mechanism = _rdp_capable(accountant)
        if steps:
            increment = steps * np.asarray(accountant.rdp_curve(noise_multiplier), dtype=float)  # type: ignore[attr-defined]
        else:
            increment = np.zeros_like(orders)
        if increment.shape != orders.shape or np.isnan(increment).any():
            raise PrivacyError(f"accountant {mechanism!r} gave an RDP curve that does not match its orders")
        increment = np.maximum(increment, 0.0)
        profile = _canonical({"mechanism": mechanism, "profile": _profile_of(accountant),
                              "noise_multiplier": float(noise_multiplier), "steps": int(steps)})
        with self._transaction() as db:
            scan = self._require_valid(db)
            self._bind(db, scan, accountant, orders, delta, site)
            assert scan.orders is not None and scan.total is not None
            spent = scan.epsilon
            eps = _epsilon(scan.orders, scan.total + increment, float(delta))
            name = site or scan.bound.get("site", "")
            values = dict(site=name, run=run, round=round, steps=steps, noise_multiplier=noise_multiplier,
                          delta=float(delta), epsilon=eps, budget=budget, mechanism=mechanism, profile=profile,
                          increment=_curve_json(increment))
            if not eps <= budget:
                self._append(db, "refuse", **values,
                             note=f"would reach ε={eps:.6g} > budget {budget:.6g} (spent {spent:.6g})")
                refusal: BudgetExhaustedError | None = BudgetExhaustedError(
                    f"site {name or 'local'!r}: {steps} more steps at σ={noise_multiplier:.4g} would bring ε to "
                    f"{eps:.4g} (δ={delta:.3g}), past its budget {budget:.4g}; already spent {spent:.4g}",
                    projected_epsilon=eps, budget=budget, spent=spent,
                )
            else:
                refusal = None
                entry_id = self._append(db, "reserve", **values)
        if refusal is not None:
            raise refusal
        return Reservation(entry_id, tuple(float(v) for v in increment), tuple(float(a) for a in orders),
                           eps, float(delta), float(budget), int(steps), float(noise_multiplier))

    def release(self, reservation: Reservation, accountant: Accountant) -> LedgerEntry:
        """Confirm a reservation with the accountant that ran; call just before the output leaves.

        ``accountant`` must hold only this run's steps (``total_rdp()`` is compared pointwise with
        the reserved increment). If it is larger, the larger increment is recorded first; if that
        is past the budget, or later reservations were already built on the reserved increment,
        the entry becomes ``withheld`` and :class:`BudgetExhaustedError` is raised: the output
        must not leave the site.
        """
        orders, _ = _rdp_capable(accountant)
        if orders.shape != (len(reservation.orders),) or not np.array_equal(orders, reservation.orders):
            raise LedgerError(f"{self.path}: the accountant that ran uses another RDP order grid than the reservation")
        actual = np.maximum(np.asarray(accountant.total_rdp(), dtype=float), 0.0)  # type: ignore[attr-defined]
        reserved = np.asarray(reservation.increment, dtype=float)
        with np.errstate(invalid="ignore"):
            over = actual > reserved * (1 + _REL_TOL) + 1e-12
        over &= ~np.isinf(reserved)
        withheld_eps: float | None = None
        with self._transaction() as db:
            scan = self._scan(db)
            item = scan.items.get(reservation.entry_id)
            if item is None or item.row["kind"] != "reserve" or item.status != "reserved":
                status = "missing" if item is None else item.status
                raise LedgerError(f"{self.path}: entry {reservation.entry_id} is {status}, not reserved")
            assert item.increment is not None and scan.total is not None and scan.orders is not None
            ref = reservation.entry_id
            if over.any():
                new = np.maximum(item.increment, actual)
                eps = _epsilon(scan.orders, scan.total - item.increment + new, reservation.delta)
                note = (f"the steps that ran have a larger RDP curve than reserved (ε {eps:.6g} > "
                        f"{item.epsilon:.6g}); recorded the larger")
                if scan.last_counting != ref:
                    # Later reservations were checked against the smaller total: the excess
                    # cannot be added behind them, so this output must not leave.
                    note = note.replace("recorded the larger", "later rounds built on the reserved spend")
                    self._append(db, "withhold", ref=ref, site=item.row["site"], note=note)
                    withheld_eps = eps
                else:
                    self._append(db, "raise", ref=ref, site=item.row["site"], delta=reservation.delta,
                                 epsilon=eps, budget=reservation.budget, increment=_curve_json(new),
                                 mechanism=str(getattr(accountant, "mechanism", "")), note=note)
                    if eps > reservation.budget:
                        self._append(db, "withhold", ref=ref, site=item.row["site"], note=note + "; past the budget")
                        withheld_eps = eps
                    else:
                        self._append(db, "release", ref=ref, site=item.row["site"], note=note)
            else:
                note = ""
                if (actual < reserved * (1 - _REL_TOL) - 1e-12).any():
                    note = "the steps that ran have a smaller RDP curve than reserved; kept the reserved"
                self._append(db, "release", ref=ref, site=item.row["site"], note=note)
        entry = self.entry(reservation.entry_id)
        if withheld_eps is not None:
            raise BudgetExhaustedError(
                f"site {entry.site!r}: the steps that ran reached ε={withheld_eps:.4g}, more than the "
                f"{reservation.epsilon:.4g} reserved (budget {reservation.budget:.4g}); the update is withheld",
                projected_epsilon=withheld_eps, budget=reservation.budget,
                spent=max(entry.epsilon, reservation.epsilon),
            )
        return entry

    def withhold(self, reservation: Reservation, note: str) -> LedgerEntry:
        """Close a reservation whose output will not leave (e.g. training failed); it still counts."""
        with self._transaction() as db:
            item = self._scan(db).items.get(reservation.entry_id)
            if item is None or item.row["kind"] != "reserve" or item.status not in ("reserved", "withheld"):
                status = "missing" if item is None else item.status
                raise LedgerError(f"{self.path}: entry {reservation.entry_id} is {status}, not reserved")
            if item.status == "reserved":
                self._append(db, "withhold", ref=reservation.entry_id, site=item.row["site"], note=note)
        return self.entry(reservation.entry_id)

    # ------------------------------------------------------------------------------ record sets
    def save_records(self, key: str, records: torch.Tensor) -> None:
        """Store the degree-capped record set Ē under ``key`` (once; its SHA-256 is chained).

        :raises LedgerError: if ``key`` already holds different content, or the ledger fails
            verification.
        """
        import torch

        if not isinstance(records, torch.Tensor) or records.dim() != 2 or records.shape[1] != 2:
            raise LedgerError(f"record set {key!r} must be an (m, 2) tensor, got "
                              f"{getattr(records, 'shape', type(records).__name__)}")
        if records.dtype.is_floating_point or records.dtype.is_complex or records.dtype == torch.bool:
            raise LedgerError(f"record set {key!r} must hold integer ids, got {records.dtype}")
        buf = io.BytesIO()
        np.save(buf, records.detach().cpu().numpy().astype(np.int64), allow_pickle=False)
        blob = buf.getvalue()
        sha = _sha(blob)
        with self._transaction() as db:
            scan = self._require_valid(db)
            if key in scan.records:
                if scan.records[key][1] == sha:
                    return
                raise LedgerError(
                    f"{self.path}: record set {key!r} is already stored (row {scan.records[key][0]}) with "
                    "different content; the degree-capped record set of a dataset is fixed once chosen"
                )
            if scan.records:  # one ledger, one dataset, one Ē: a second would be another guarantee
                (other, (row, _)), *_ = scan.records.items()
                raise LedgerError(
                    f"{self.path}: this ledger already holds the record set {other!r} (row {row}); a second "
                    f"one ({key!r}: other data or other degree-cap options) would make its guarantee about "
                    "two different record sets. Keep the options, or start a new ledger for new data")
            info = _canonical({"key": key, "sha256": sha, "shape": [int(records.shape[0]), 2]})
            rid = self._append(db, "records", site=scan.bound.get("site", ""), note=info)
            db.execute("INSERT INTO records (key, entry, sha256, data) VALUES (?, ?, ?, ?)",
                       (key, rid, sha, sqlite3.Binary(blob)))

    def load_records(self, key: str) -> torch.Tensor | None:
        """The record set stored under ``key`` (int64, (m, 2)), or ``None``.

        :raises LedgerError: if the stored bytes do not match the chained SHA-256.
        """
        import torch

        row = self._db.execute("SELECT entry, sha256, data FROM records WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        chained = self._db.execute("SELECT note FROM entries WHERE id = ? AND kind = 'records'", (row[0],)).fetchone()
        blob = bytes(row[2])
        if chained is None or json.loads(chained[0]).get("sha256") != _sha(blob) or row[1] != _sha(blob):
            raise LedgerError(f"{self.path}: record set {key!r} does not match its chained SHA-256 (modified)")
        array = np.load(io.BytesIO(blob), allow_pickle=False)
        return torch.from_numpy(np.ascontiguousarray(array, dtype=np.int64))

