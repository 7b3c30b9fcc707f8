"""The per-site privacy ledger: a durable, hash-chained privacy odometer in one SQLite file.

A data owner keeps **one ledger per site dataset**. It records the RDP curve of *everything the
site has released*, across rounds, runs, mechanisms, sampling rates γ and noise multipliers σ,
so the ε it shows is the total spent on the site's data, not the spend of one run.

Composition
-----------
Rényi DP composes additively: if mechanism i is (α, ρᵢ(α))-RDP for every order α, the
adaptive composition of all of them is (α, Σᵢ ρᵢ(α))-RDP (Mironov 2017, "Rényi Differential
Privacy", Prop. 1). This holds across *different* mechanisms, γ and σ as long as every ρᵢ is
stated for the same privacy unit and adjacency relation. The ledger is therefore bound (in its
``meta`` table, through chained ``bind`` rows) to the site, the privacy unit, δ and the RDP
order grid — and to nothing else. Each reservation stores the RDP *increment* of its steps,
``steps · accountant.rdp_curve(σ)`` on the ledger's orders; the spent ε is
``rdp_to_epsilon(orders, Σ increments, δ)`` (Thm D.1). A change of batch size, data size,
mechanism or σ is simply another increment. Accountants without an RDP curve (no
``orders``/``rdp_curve``/``total_rdp``) are refused: their spend cannot be added up here.

Write-ahead rule (DESIGN.md, "Federated"): spend is written *before* any output leaves the site.

1. :meth:`PrivacyLedger.reserve` — in one exclusive transaction: verify the chain, add the
   planned increment to the recorded total, and either append a ``reserve`` row or, if ε would
   exceed the budget, a ``refuse`` row and raise :class:`BudgetExhaustedError`.
2. :meth:`PrivacyLedger.release` — after training, compare the RDP curve of the steps the run's
   accountant actually took with the reserved increment (pointwise). If it is larger, the larger
   increment is appended first (``raise`` row), or the output is withheld when later
   reservations were already built on the smaller one; then a ``release`` row.

A site killed between 1 and 2 leaves an unconfirmed reservation, which counts in full.

Creation
--------
A ledger is created once, explicitly: :func:`init_ledger` (``graphveil budget init``) makes the
site key ``<ledger>.key`` (:mod:`graphveil.ledger.site_key`, 0600, never replaced), the ledger and, if
asked, its anchor. Opening a ledger never creates any of them: a missing ledger, key or anchor
is an error naming the file. (An implicit create-on-first-use would turn "restore a backup,
delete the anchor" into a silent re-anchoring.)

Tamper evidence
---------------
The ``entries`` table is append-only and hash-chained: each row's ``hash`` is the HMAC-SHA256,
under the site key, of the canonical JSON of all its fields (id, kind, reference, site, run,
round, steps, σ, δ, ε, budget, mechanism, profile, increment, note) together with ``prev_hash``;
the first row's ``prev_hash`` is the genesis hash, the keyed hash of the ledger's creation meta
(a random ledger id and the creation time). Status changes (release, withhold, a larger
increment) and the storage of a degree-capped record set are new chained rows that reference
the reservation or key, never updates. So a raw SQL ``UPDATE`` or ``DELETE`` of any row breaks
:meth:`PrivacyLedger.verify` (a deleted last row is caught by SQLite's AUTOINCREMENT counter,
and for certain by an anchor), and so does a *consistent* rewrite of the whole chain (every
increment scaled, every hash recomputed) by anyone without the key. A ledger that fails
verification refuses to reserve.

The key does not stop the party that holds it: the site's operator can rewrite the chain and
re-sign it. What stops the operator is a witness outside the site (below). The key also keeps
the heads the server witnesses opaque: entry values depend on private sizes (ε depends on
b/|Ē|), and an unkeyed head would let the server test guesses of them.

Anchoring against rollback
--------------------------
A chain cannot tell a restored backup from the real file: both verify. Pass
``anchor=Path(...)``: after every committed write the ledger atomically writes
``{"count": n, "hash": h}`` (its head) to that file, and on open and before every reservation
it checks that its own chain has the anchored head as a prefix; a missing anchor is refused
(``init`` writes the first one; ``init --reanchor`` a lost one, explicitly). **Keep the anchor
outside the ledger's volume** — another disk or mount, a WORM/object-lock bucket synced from
it, or simply the head printed by ``graphveil budget head`` into the operator's log — otherwise
a restored volume snapshot rolls back the anchor together with the ledger. ``graphveil budget
verify --anchor FILE`` or ``--expect-head HASH`` checks a ledger against an anchor kept
elsewhere.

The witness
-----------
An anchor is the site operator's own file. Every reply a site sends after opening its ledger
carries :meth:`PrivacyLedger.witness_head`: the number of *checkpoint* rows (one per round that
reached the ledger: ``release``, ``withhold`` or ``refuse``) and the keyed hash of the last one.
The server keeps them per site (:mod:`graphveil.ledger.witness`) and refuses a site whose
sequence number goes backwards (a restored backup, a replaced ledger) or whose head differs at
a sequence number it saw before (a fork). Without the key the server cannot check that a larger
sequence number extends what it saw; the site can: ``graphveil budget verify --witness FILE``
checks that the ledger's chain holds every witnessed (seq, head), which catches a rewrite of
history the server saw, even one re-signed with the key. See deploy/RUNBOOK.md §8 for what the
witness does and does not protect against.

Schema migration (versions 1 and 2 → 3)
---------------------------------------
Schema 3 is schema 2 with the chain keyed (and a ``rekey`` row kind). ``graphveil budget init``
upgrades an older ledger: a schema-2 ledger's unkeyed chain is verified, then every row is
re-chained under the new key in one transaction; the unkeyed table stays as ``entries_v2`` and a
chained ``rekey`` row records its row count and head. Opening a schema-2 ledger without that
step is an error saying so.

A version-1 ledger held, per entry, the *cumulative* accountant state (mechanism, profile, order
grid, history of (σ, steps)). ``init`` creates its key, and opening it then migrates it in one
transaction: the v1 table is kept as ``entries_v1`` (audit), and the latest counting v1 state is
replayed by the installed accountant plugin of the same mechanism, rebound to the recorded
profile (the accountant's own ``load_state_dict`` refuses a different profile or order grid) —
its ``total_rdp()`` becomes a single chained ``migrate`` row that counts like a reservation. The
rebuilt ε must equal the ε the v1 ledger recorded, otherwise nothing changes. This is sound (it
is the exact RDP curve the v1 ledger was accounting) and is the only option that is: a bare
(ε, δ) total has no RDP curve to compose with. When the curve cannot be rebuilt (plugin missing,
accountant without RDP), the v1 file is left untouched (and ``init`` removes the key it made)
and a :class:`LedgerError` explains why; ``graphveil budget migrate`` performs the same
migration explicitly on a ledger that has its key.

Degree-capped record sets
-------------------------
:meth:`PrivacyLedger.save_records` stores the site's degree-capped record set Ē (an (m, 2)
int64 tensor) once; its SHA-256 is a chained row, so replacing Ē silently breaks
verification, saving different content under an existing key is refused, and so is a second
record set under another key (other data or other capping options): one ledger, one Ē.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from graphveil.contract.accountant import Accountant
from graphveil.contract.errors import GraphVeilError, PrivacyError
from graphveil.ledger.site_key import (
    SiteKeyError,
    create_site_key,
    key_path_for,
    keyed_digest,
    load_site_key,
)
from graphveil.privacy.conversion import DEFAULT_ORDERS, rdp_to_epsilon

if TYPE_CHECKING:
    import torch

SCHEMA_VERSION = 3
#: Entry statuses whose spend counts (``refused`` entries record a request, not a release).
COUNTING = ("reserved", "released", "withheld", "migrated")
#: Row kinds of the chain.
KINDS = ("bind", "reserve", "refuse", "release", "withhold", "raise", "migrate", "records", "rekey")
#: Row kinds that close a request (one per round that reached the ledger, whatever the data):
#: the witness's sequence number counts these, never the data-dependent ``raise``/``records`` rows.
CHECKPOINTS = ("release", "withhold", "refuse")
_REL_TOL = 1e-9
_EPS_TOL = 1e-9

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('bind', 'reserve', 'refuse', 'release', 'withhold', 'raise', 'migrate', 'records', 'rekey')),
    ref INTEGER,
    site TEXT NOT NULL,
    run TEXT NOT NULL,
    round INTEGER NOT NULL,
    steps INTEGER NOT NULL,
    noise_multiplier REAL,
    delta REAL,
    epsilon REAL,
    budget REAL,
    mechanism TEXT NOT NULL,
    profile TEXT,
    increment TEXT,
    note TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS records (
    key TEXT PRIMARY KEY,
    entry INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    data BLOB NOT NULL
);
"""

#: The chained columns, in order (``hash`` is computed over these).
_FIELDS = ("id", "created", "kind", "ref", "site", "run", "round", "steps", "noise_multiplier", "delta",
           "epsilon", "budget", "mechanism", "profile", "increment", "note", "prev_hash")
_INTS = {"id", "ref", "round", "steps"}
_FLOATS = {"noise_multiplier", "delta", "epsilon", "budget"}


class LedgerError(GraphVeilError):
    """The ledger file is unreadable, from another program or a newer GraphVeil, fails
    verification, or was rolled back behind its anchor."""


class LedgerBindingError(PrivacyError):
    """The run's site, privacy unit, δ or RDP order grid differs from the one the ledger is
    bound to. ``key`` names it (``site``, ``unit``, ``delta`` or ``orders``)."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class BudgetExhaustedError(PrivacyError):
    """The requested steps would take the site past its privacy budget; nothing was released."""

    def __init__(self, message: str, *, projected_epsilon: float, budget: float, spent: float) -> None:
        super().__init__(message)
        self.projected_epsilon = projected_epsilon
        self.budget = budget
        self.spent = spent


@dataclass(frozen=True)
class LedgerEntry:
    """One reservation (later released or withheld), refusal, or migrated v1 total.

    ``epsilon`` is the *cumulative* ε at ``delta`` after this entry (for a refusal: the ε the
    request would have reached). ``id`` is the id of the entry's first chain row.
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
    """Spend recorded ahead of training: the RDP increment of ``steps`` steps at σ."""

    entry_id: int
    increment: tuple[float, ...]
    orders: tuple[float, ...]
    epsilon: float
    delta: float
    budget: float
    steps: int
    noise_multiplier: float


@dataclass(frozen=True)
class VerifyReport:
    """Result of :meth:`PrivacyLedger.verify`. ``first_bad`` is the id of the first row that
    fails (``None`` if the failure is not one row's, e.g. the anchor or the meta table)."""

    ok: bool
    count: int
    head: str
    epsilon: float
    delta: float | None
    error: str | None = None
    first_bad: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class WitnessHead:
    """What each reply of a site tells the server's witness: ``seq`` checkpoints (rounds the
    ledger closed), the keyed hash ``head`` of the last one and ``previous``, the hash of the
    one before (the genesis hash when ``seq`` is 1; ``None`` when it is 0)."""

    seq: int
    head: str
    previous: str | None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def _sha(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


def _normalize(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as SQLite gives it back (REAL columns as floats), so hashes are reproducible."""
    out: dict[str, Any] = {}
    for name in _FIELDS:
        value = row.get(name)
        if value is not None and name in _FLOATS:
            value = float(value)
        elif value is not None and name in _INTS:
            value = int(value)
        out[name] = value
    return out


def _row_hash(key: bytes, row: Mapping[str, Any]) -> str:
    """HMAC-SHA256 under the site key of the row's canonical JSON (``prev_hash`` included)."""
    return keyed_digest(key, b"graphveil-ledger-row-v3", _canonical(_normalize(row)).encode())


def _genesis(key: bytes, meta: Mapping[str, str]) -> str:
    """The keyed hash of the ledger's creation meta: the ``prev_hash`` of its first row."""
    return keyed_digest(key, b"graphveil-ledger-genesis-v3", _canonical(
        {"ledger": "graphveil-privacy-ledger", "ledger_id": meta.get("ledger_id"),
         "created": meta.get("created")}).encode())


def _unkeyed_row_hash(row: Mapping[str, Any]) -> str:
    """Schema 2's row hash (plain SHA-256): checked once, when ``init`` re-chains such a ledger."""
    return _sha(_canonical(_normalize(row)))


def _unkeyed_genesis(meta: Mapping[str, str]) -> str:
    return _sha(_canonical({"ledger": "graphveil-privacy-ledger", "ledger_id": meta.get("ledger_id"),
                            "created": meta.get("created")}))


def _curve_json(curve: np.ndarray) -> str:
    return _canonical([float(v) for v in np.asarray(curve, dtype=float)])


def _curve(text: str | None, n: int) -> np.ndarray:
    values = json.loads(text or "null")
    if not isinstance(values, list) or len(values) != n:
        raise ValueError(f"increment is not a list of {n} numbers")
    arr = np.asarray(values, dtype=float)
    if np.isnan(arr).any() or (arr < 0).any():
        raise ValueError("increment holds NaN or negative RDP values")
    return arr


def _epsilon(orders: np.ndarray, total: np.ndarray, delta: float) -> float:
    if not total.any():
        return 0.0
    return float(rdp_to_epsilon(orders, total, delta)[0])


def _close(a: float | None, b: float) -> bool:
    if a is None:
        return False
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=_EPS_TOL, abs_tol=1e-12)


def _rdp_capable(accountant: Accountant) -> tuple[np.ndarray, str]:
    """The accountant's order grid and mechanism name; refuse accountants without RDP curves."""
    mechanism = str(getattr(accountant, "mechanism", type(accountant).__name__))
    if not all(callable(getattr(accountant, name, None)) for name in ("rdp_curve", "total_rdp")) or \
            getattr(accountant, "orders", None) is None:
        raise PrivacyError(
            f"accountant {mechanism!r} has no RDP curve (orders, rdp_curve, total_rdp); the privacy "
            "ledger composes RDP curves across runs and cannot add up its spend — use an RDP "
            "accountant (e.g. one built on graphveil.privacy.RdpAccountantBase)"
        )
    return np.asarray(accountant.orders, dtype=float), mechanism


def _profile_of(accountant: Accountant) -> Any:
    try:
        return dict(accountant.state_dict()).get("profile")
    except Exception:  # an accountant without a profile: audit only, not needed for the spend
        return None


@dataclass
class _Item:
    """A reservation, refusal or migration as folded from its chain rows."""

    row: dict[str, Any]
    status: str
    increment: np.ndarray | None
    epsilon: float
    note: str


@dataclass
class _Scan:
    """Everything the chain says, plus the first problem found."""

    count: int = 0
    head: str = ""
    orders: np.ndarray | None = None
    delta: float | None = None
    bound: dict[str, Any] = field(default_factory=dict)
    items: dict[int, _Item] = field(default_factory=dict)
    last_counting: int | None = None
    total: np.ndarray | None = None
    records: dict[str, tuple[int, str]] = field(default_factory=dict)
    #: Hashes of the checkpoint rows (:data:`CHECKPOINTS`), in order: what a witness saw.
    checkpoints: list[str] = field(default_factory=list)
    error: str | None = None
    first_bad: int | None = None

    def fail(self, message: str, row: int | None) -> None:
        if self.error is None:
            self.error, self.first_bad = message, row

    @property
    def epsilon(self) -> float:
        if self.total is None or self.orders is None or self.delta is None:
            return 0.0
        return _epsilon(self.orders, self.total, self.delta)


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
                self._migrate_v1()
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

    def _scan(self, db: sqlite3.Connection | None = None) -> _Scan:
        """Fold the chain: hashes, bindings, reservations and their status, the RDP total."""
        db = db or self._db
        scan = _Scan()
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
                self._fold(scan, row)
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

    def _fold(self, scan: _Scan, row: dict[str, Any]) -> None:
        kind, rid = row["kind"], row["id"]
        if kind == "bind":
            values = json.loads(row["note"])
            for key, value in values.items():
                if key in scan.bound and scan.bound[key] != value:
                    raise ValueError(f"rebinds {key} from {scan.bound[key]!r} to {value!r}")
                scan.bound[key] = value
            if "orders" in values:
                scan.orders = np.asarray(json.loads(values["orders"]), dtype=float)
                scan.total = np.zeros_like(scan.orders)
            if "delta" in values:
                scan.delta = float(values["delta"])
            return
        if kind == "rekey":  # evidence of the unkeyed chain this one replaced; no spend
            info = json.loads(row["note"])
            if not (isinstance(info, dict) and isinstance(info.get("unkeyed_head"), str)
                    and len(info["unkeyed_head"]) == 64):
                raise ValueError("a rekey row without the unkeyed chain's head")
            return
        if kind == "records":
            info = json.loads(row["note"])
            if info["key"] in scan.records:
                raise ValueError(f"record set {info['key']!r} stored twice")
            scan.records[info["key"]] = (rid, info["sha256"])
            return
        if scan.orders is None or scan.delta is None or scan.total is None:
            raise ValueError(f"a {kind} row before the ledger's order grid and δ were bound")
        n = scan.orders.size
        if kind in ("reserve", "migrate", "refuse"):
            if row["delta"] != scan.delta:
                raise ValueError(f"δ {row['delta']!r} differs from the ledger's {scan.delta!r}")
            inc = _curve(row["increment"], n)
            if kind == "refuse":
                projected = _epsilon(scan.orders, scan.total + inc, scan.delta)
                if not _close(row["epsilon"], projected):
                    raise ValueError(f"records projected ε {row['epsilon']!r}, the chain gives {projected!r}")
                scan.items[rid] = _Item(row, "refused", None, projected, row["note"])
                return
            scan.total = scan.total + inc
            eps = _epsilon(scan.orders, scan.total, scan.delta)
            if not _close(row["epsilon"], eps):
                raise ValueError(f"records ε {row['epsilon']!r}, the chain gives {eps!r}")
            if kind == "reserve" and not eps <= row["budget"] * (1 + _REL_TOL):
                raise ValueError(f"reserves past its budget (ε {eps!r} > {row['budget']!r})")
            status = "reserved" if kind == "reserve" else "migrated"
            scan.items[rid] = _Item(row, status, inc, eps, row["note"])
            scan.last_counting = rid
            return
        item = scan.items.get(row["ref"]) if row["ref"] is not None else None
        if item is None or item.row["kind"] != "reserve":
            raise ValueError(f"{kind} refers to {row['ref']!r}, which is not a reservation")
        if item.status != "reserved":
            raise ValueError(f"{kind} of reservation {row['ref']}, which is already {item.status}")
        if kind == "raise":
            if scan.last_counting != row["ref"]:
                raise ValueError(f"raises reservation {row['ref']} behind later reservations")
            new = _curve(row["increment"], n)
            assert item.increment is not None
            if (new < item.increment).any():
                raise ValueError("lowers a reserved increment")
            scan.total = scan.total - item.increment + new
            eps = _epsilon(scan.orders, scan.total, scan.delta)
            if not _close(row["epsilon"], eps):
                raise ValueError(f"records ε {row['epsilon']!r}, the chain gives {eps!r}")
            item.increment, item.epsilon, item.note = new, eps, row["note"]
            return
        item.status = "released" if kind == "release" else "withheld"
        item.note = row["note"]

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

    def _entry(self, item: _Item) -> LedgerEntry:
        row = item.row
        return LedgerEntry(
            id=row["id"], created=row["created"], status=item.status, site=row["site"], run=row["run"],
            round=row["round"], steps=row["steps"],
            noise_multiplier=row["noise_multiplier"] if row["noise_multiplier"] is not None else 0.0,
            delta=row["delta"], epsilon=item.epsilon,
            budget=row["budget"] if row["budget"] is not None else math.inf,
            mechanism=row["mechanism"], note=item.note,
        )

    def entries(self) -> list[LedgerEntry]:
        """Reservations (with their current status), refusals and migrated totals, in order."""
        return [self._entry(item) for item in self._scan().items.values()]

    def entry(self, entry_id: int) -> LedgerEntry:
        item = self._scan().items.get(entry_id)
        if item is None:
            raise LedgerError(f"{self.path}: no entry {entry_id}")
        return self._entry(item)

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
        meta = self.meta()
        scan = self._scan()
        entries = [self._entry(item) for item in scan.items.values()]
        counts = {s: sum(e.status == s for e in entries) for s in ("reserved", "released", "withheld", "refused")}
        migrated = sum(e.status == "migrated" for e in entries)
        if migrated:
            counts["migrated"] = migrated
        budgets = [e.budget for e in entries if math.isfinite(e.budget)]
        latest_budget = budgets[-1] if budgets else None
        spent = scan.epsilon
        mechanisms = list(dict.fromkeys(e.mechanism for e in entries if e.status in COUNTING))
        return {
            "ledger": str(self.path),
            "site": meta.get("site"),
            "mechanism": ", ".join(mechanisms) or None,
            "unit": meta.get("unit"),
            "delta": float(meta["delta"]) if "delta" in meta else None,
            "epsilon_spent": spent,
            "epsilon_budget": latest_budget,
            "epsilon_remaining": None if latest_budget is None else max(latest_budget - spent, 0.0),
            "steps": sum(e.steps for e in entries if e.status in COUNTING),
            "counts": counts,
            "created": meta.get("created"),
            "chain": {"count": scan.count, "head": scan.head, "verified": scan.error is None,
                      "error": scan.error},
        }

    # ------------------------------------------------------------------------------ writing
    def _require_valid(self, db: sqlite3.Connection) -> _Scan:
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

    def _bind(self, db: sqlite3.Connection, scan: _Scan, accountant: Accountant, orders: np.ndarray,
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

    # ------------------------------------------------------------------------------ migration
    def _migrate_v1(self) -> None:
        """Migrate a schema-1 ledger in one transaction (see the module docstring)."""
        db = self._db
        with self._transaction():
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            if meta.get("schema_version") != "1":
                return  # another process migrated it meanwhile
            rows = db.execute(
                "SELECT id, status, site, steps, epsilon, delta, mechanism, state FROM entries "
                "WHERE status IN ('reserved', 'released', 'withheld') ORDER BY id"
            ).fetchall()
            migrate: dict[str, Any] | None = None
            binding: dict[str, str] = {}
            if "site" in meta:
                binding["site"] = meta["site"]
            if rows:
                last = rows[-1]
                state = json.loads(last[7])
                orders, curve, unit = _rebuild_v1_curve(self.path, state, float(last[5]), float(last[4]))
                binding.update({"unit": unit, "delta": repr(float(last[5])),
                                "orders": _canonical([float(a) for a in orders])})
                migrate = dict(
                    site=last[2], steps=sum(int(r[3]) for r in rows), delta=float(last[5]),
                    epsilon=_epsilon(orders, curve, float(last[5])), budget=None, mechanism=str(last[6]),
                    profile=_canonical({"mechanism": state.get("mechanism"), "profile": state.get("profile"),
                                        "history": state.get("history"), "v1_entries": len(rows),
                                        "v1_epsilon": float(last[4])}),
                    increment=_curve_json(curve),
                    note=f"migrated from schema v1: total of {len(rows)} counting entries "
                         f"(ε={float(last[4]):.6g}); v1 rows kept in table entries_v1",
                )
            db.execute("ALTER TABLE entries RENAME TO entries_v1")
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                db.execute(stmt)
            for key in ("mechanism", "unit", "delta", "site"):
                if key in meta:
                    db.execute("DELETE FROM meta WHERE key = ?", (key,))
                    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (f"v1_{key}", meta[key]))
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('ledger_id', ?)", (secrets.token_hex(16),))
            db.execute("INSERT OR IGNORE INTO meta VALUES ('created', ?)", (_now(),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('migrated', ?)", (_now(),))
            if binding:
                self._append(db, "bind", site=binding.get("site", ""), note=_canonical(binding))
                for key, value in binding.items():
                    db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
            if migrate is not None:
                self._append(db, "migrate", **migrate)


def _connect(path: Path) -> sqlite3.Connection:
    try:
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE in _transaction).
        db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        db.execute("PRAGMA journal_mode=DELETE")
        db.execute("PRAGMA synchronous=FULL")  # a committed spend survives power loss
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"{path}: not a GraphVeil privacy ledger ({exc})") from exc
    return db


def _schema_version(db: sqlite3.Connection, path: Path) -> int:
    try:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "meta" not in tables:
            raise LedgerError(f"{path}: not a GraphVeil privacy ledger (no meta table)")
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0
    except (sqlite3.DatabaseError, ValueError) as exc:
        raise LedgerError(f"{path}: not a GraphVeil privacy ledger ({exc})") from exc


def schema_version_of(path: str | os.PathLike[str]) -> int:
    """The schema version of the ledger file ``path``, read without changing it.

    :raises LedgerError: if it is missing or not a ledger."""
    path = Path(path)
    if not path.is_file():
        raise LedgerError(f"{path}: no such ledger file")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"{path}: not a GraphVeil privacy ledger ({exc})") from exc
    try:
        return _schema_version(db, path)
    finally:
        db.close()


def _load_key(ledger: Path) -> bytes:
    key_path = key_path_for(ledger)
    if not key_path.exists():
        raise LedgerError(
            f"{ledger}: its site key {key_path} does not exist; restore it from the backup of the site's "
            "ledger volume (a ledger is made with its key by `graphveil budget init`; a new key cannot "
            "verify an existing chain, so init never replaces one)")
    try:
        return load_site_key(key_path)
    except SiteKeyError as exc:
        raise LedgerError(f"{ledger}: {exc}") from None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _witnessed_problem(marks: Sequence[str], witnessed: Iterable[tuple[int, str]]) -> str | None:
    """The first witnessed ``(seq, head)`` the chain does not hold; ``marks[k]`` is the hash of
    the k-th checkpoint (``marks[0]``: the genesis hash)."""
    for seq, head in sorted((int(s), str(h).strip().lower()) for s, h in witnessed):
        if seq >= len(marks):
            return (f"ledger was rolled back or replaced: a witness saw checkpoint {seq} (head {head[:16]}…), "
                    f"the ledger has {len(marks) - 1} checkpoints")
        if marks[seq] != head:
            return (f"ledger history was rewritten or replaced: a witness saw checkpoint {seq} with head "
                    f"{head[:16]}…, the ledger's checkpoint {seq} is {marks[seq][:16]}…")
    return None


def _over(cls: type[PrivacyLedger], path: Path, db: sqlite3.Connection, key: bytes) -> PrivacyLedger:
    """A ledger object over an open connection, without the opening checks (init's upgrades)."""
    ledger = cls.__new__(cls)
    ledger.path, ledger.anchor, ledger._db, ledger._key = path, None, db, key
    return ledger


class _UnkeyedChain(PrivacyLedger):
    """A schema-2 ledger's chain (plain SHA-256), read once to verify it before re-chaining."""

    def genesis(self) -> str:
        return _unkeyed_genesis(self.meta())

    def _digest(self, row: Mapping[str, Any]) -> str:
        return _unkeyed_row_hash(row)


def init_ledger(path: str | os.PathLike[str], *, site: str | None = None,
                anchor: str | os.PathLike[str] | None = None, reanchor: bool = False) -> PrivacyLedger:
    """Create a site's ledger with its key (and anchor), or upgrade an older ledger; return it open.

    * no file at ``path``: create the key ``<ledger>.key`` (0600), an empty ledger bound to
      ``site``, and the anchor at its head;
    * a schema-1 ledger: create the key and migrate it (see the module docstring);
    * a schema-2 (unkeyed) ledger: create the key, verify the old chain with its plain
      SHA-256 hashes and re-chain every row under the key in one transaction; the old table
      stays as ``entries_v2`` and a chained ``rekey`` row records the old row count and head;
    * ``reanchor``: an existing ledger whose anchor was lost: verify it, write ``anchor`` at
      its current head (refused if the anchor exists).

    A key is never replaced and an anchor never overwritten; a failed init leaves no key, no
    ledger and no anchor behind (an upgrade is one transaction).

    :raises LedgerError: naming the file that exists, is missing, or fails verification.
    """
    path = Path(path)
    anchor = None if anchor is None else Path(anchor)
    if reanchor:
        return _reanchor(path, anchor, site)
    key_path = key_path_for(path)
    if anchor is not None and anchor.exists():
        raise LedgerError(f"{anchor}: an anchor file already exists (of a ledger initialised before); "
                          "init never overwrites one — move it away yourself if it is stale")
    version = schema_version_of(path) if path.exists() else None
    if version == SCHEMA_VERSION:
        raise LedgerError(f"{path}: already initialised (schema {SCHEMA_VERSION}, key {key_path}); "
                          "nothing to do (a lost anchor: --anchor FILE --reanchor)")
    if version is not None and version not in (1, 2):
        raise LedgerError(f"{path}: ledger schema version {version}, this GraphVeil reads version "
                          f"{SCHEMA_VERSION}")
    if version is not None and site is not None:
        _check_old_site(path, site)
    if key_path.exists():
        raise LedgerError(f"{key_path}: a site key already exists; init never replaces a key (a new key "
                          "would re-sign, and so hide, any rewrite of the chain)")
    try:
        key = create_site_key(key_path)
    except SiteKeyError as exc:
        raise LedgerError(str(exc)) from None
    made = rekeyed = False
    try:
        if version is None:
            _create(path)
            made = True
        elif version == 2:
            _rekey_v2(path, key)
            rekeyed = True
        ledger = PrivacyLedger(path, key=key)  # a schema-1 ledger is migrated here, in one transaction
    except BaseException:
        if not rekeyed:  # nothing is chained under the key: leave no key (and no new ledger) behind
            key_path.unlink(missing_ok=True)
            if made:
                path.unlink(missing_ok=True)
        raise
    try:
        if site is not None:
            ledger._bind_site(site)
        if anchor is not None:
            ledger.anchor = anchor
            ledger._write_anchor(create=True)
    except BaseException:
        ledger.close()
        raise
    return ledger


def _check_old_site(path: Path, site: str) -> None:
    """``init --site`` on an old ledger: the site it is bound to must be the one named."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    finally:
        db.close()
    have = meta.get("site")
    if have is not None and have != site:
        raise LedgerError(f"{path}: the ledger is bound to site {have!r}, not {site!r}")


def _create(path: Path) -> None:
    """An empty schema-3 ledger at ``path``, built aside and linked in (never half-written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.init")
    try:
        db = _connect(tmp)
        try:
            db.execute("BEGIN IMMEDIATE")
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                db.execute(stmt)
            for key, value in (("schema_version", str(SCHEMA_VERSION)), ("ledger_id", secrets.token_hex(16)),
                               ("created", _now())):
                db.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
            db.execute("COMMIT")
        finally:
            db.close()
        try:
            os.link(tmp, path)  # fails if a ledger appeared meanwhile: never two ledgers at one path
        except FileExistsError:
            raise LedgerError(f"{path}: a ledger file appeared while init ran; not replaced") from None
        _fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _rekey_v2(path: Path, key: bytes) -> None:
    """Verify a schema-2 ledger's unkeyed chain, then re-chain it under ``key`` (one transaction)."""
    db = _connect(path)
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            if _schema_version(db, path) != 2:
                raise LedgerError(f"{path}: no longer a schema-2 ledger (changed while init ran)")
            scan = _over(_UnkeyedChain, path, db, b"")._scan(db)
            if scan.error is not None:
                where = f"row {scan.first_bad}" if scan.first_bad else "its meta table"
                raise LedgerError(f"{path}: the schema-2 chain fails verification at {where}: {scan.error}; "
                                  "not re-chained (nothing changed)")
            keyed = _over(PrivacyLedger, path, db, key)  # the same rows, hashed under the key
            rows = keyed._rows(db)
            db.execute("ALTER TABLE entries RENAME TO entries_v2")  # the unkeyed rows, kept for audit
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                db.execute(stmt)
            names = [*_FIELDS, "hash"]
            prev = keyed.genesis()
            for row in rows:
                row["prev_hash"] = prev
                row["hash"] = prev = keyed._digest(row)
                db.execute(f"INSERT INTO entries ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                           [row[n] for n in names])
            keyed._append(db, "rekey", site=scan.bound.get("site", ""), note=_canonical(
                {"from_schema": 2, "unkeyed_count": scan.count, "unkeyed_head": scan.head}))
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
            db.execute("INSERT OR REPLACE INTO meta VALUES ('rekeyed', ?)", (_now(),))
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
    finally:
        db.close()


def _reanchor(path: Path, anchor: Path | None, site: str | None) -> PrivacyLedger:
    if anchor is None:
        raise LedgerError("--reanchor needs --anchor FILE (the anchor to write)")
    if anchor.exists():
        raise LedgerError(f"{anchor}: the anchor exists; --reanchor writes a lost anchor only (it never "
                          "moves an anchor: a ledger behind its anchor was rolled back)")
    ledger = PrivacyLedger(path)
    try:
        report = ledger.verify()
        if not report.ok:
            raise LedgerError(f"{path}: fails verification ({report.error}); not anchoring it")
        bound = ledger.meta().get("site")
        if site is not None and bound is not None and bound != site:
            raise LedgerError(f"{path}: the ledger is bound to site {bound!r}, not {site!r}")
        ledger.anchor = anchor
        ledger._write_anchor(create=True)
    except BaseException:
        ledger.close()
        raise
    return ledger


def _read_anchor(path: Path) -> tuple[int, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        count, head = int(data["count"]), str(data["hash"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"{path}: not a ledger anchor ({exc})") from exc
    if count < 0 or len(head) != 64:
        raise LedgerError(f"{path}: not a ledger anchor (count {count}, hash {head!r})")
    return count, head


def _rebuild_v1_curve(path: Path, state: Mapping[str, Any], delta: float,
                      v1_epsilon: float) -> tuple[np.ndarray, np.ndarray, str]:
    """Replay a v1 accountant state with the installed plugin: (orders, total RDP, unit)."""
    from graphveil.contract.profiles import (
        SamplingKind,
        SamplingProfile,
        SensitivityKind,
        SensitivityProfile,
    )

    mechanism = state.get("mechanism")
    hint = (f"; {path} is left unchanged (schema v1) — install the plugin providing {mechanism!r} and "
            f"run `graphveil budget init --ledger {path}` again")
    try:
        from graphveil.contract.host import default_host

        orders = [float(a) for a in state.get("orders") or ()]
        params = {} if not orders or tuple(orders) == tuple(DEFAULT_ORDERS) else {"orders": orders}
        accountant = default_host().create("accountant", str(mechanism), params)
        _rdp_capable(accountant)
        profile = dict(state.get("profile") or {})
        unit = accountant.unit
        degree_cap = profile.get("K")
        sampling = SamplingProfile(
            kind=SamplingKind(profile["sampling"]), rate=float(profile["gamma"]),
            num_records=int(profile.get("m", 1)), num_nodes=int(profile.get("n", 0)),
            degree_cap=None if degree_cap is None else int(degree_cap), k_neg=int(profile.get("k_neg", 0)))
        sensitivity = SensitivityProfile(kind=SensitivityKind(profile["sensitivity"]), unit=unit, clip_norm=1.0)
        accountant.bind(sampling, sensitivity)
        accountant.load_state_dict(dict(state))  # refuses another profile or order grid
        curve = np.maximum(np.asarray(accountant.total_rdp(), dtype=float), 0.0)  # type: ignore[attr-defined]
        grid = np.asarray(accountant.orders, dtype=float)  # type: ignore[attr-defined]
    except Exception as exc:
        raise LedgerError(f"{path}: cannot rebuild the RDP curve of the v1 ledger's spend "
                          f"({type(exc).__name__}: {exc}){hint}") from exc
    eps = _epsilon(grid, curve, delta)
    if not math.isclose(eps, v1_epsilon, rel_tol=1e-6, abs_tol=1e-9):
        raise LedgerError(f"{path}: the rebuilt RDP curve gives ε={eps!r}, the v1 ledger recorded "
                          f"ε={v1_epsilon!r}{hint}")
    return grid, curve, str(getattr(unit, "value", unit))


def format_summary(summary: Mapping[str, Any], entries: Sequence[LedgerEntry]) -> str:
    """The human view of ``graphveil budget show``."""

    def num(v: Any) -> str:
        return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)

    lines: list[str] = []
    chain = summary.get("chain") or {}
    if chain and not chain.get("verified", True):
        lines += [
            "!" * 78,
            "WARNING    THIS LEDGER FAILS VERIFICATION — it was edited outside GraphVeil.",
            f"           {chain.get('error')}",
            "           The ε below is NOT a trustworthy record of spend; reservations are refused.",
            "!" * 78,
        ]
    lines += [
        f"ledger     {summary['ledger']}",
        f"site       {num(summary['site'])}",
        f"mechanism  {num(summary['mechanism'])} ({num(summary['unit'])}-level)",
        f"delta      {num(summary['delta'])}",
        f"epsilon    spent {num(summary['epsilon_spent'])} of budget {num(summary['epsilon_budget'])}"
        f" (remaining {num(summary['epsilon_remaining'])})",
        f"steps      {summary['steps']}",
        "entries    " + ", ".join(f"{k} {v}" for k, v in summary["counts"].items()),
    ]
    if chain:
        lines.append(f"chain      {chain.get('count')} rows, head {chain.get('head')}")
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
