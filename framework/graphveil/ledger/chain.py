"""The keyed hash chain: the SQLite schema, the canonical row encoding, row and genesis hashes
under the site key (and schema 2's unkeyed ones, read once by ``init``), anchors, and the check
of witnessed heads against the chain."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from graphveil.ledger.entries import LedgerError
from graphveil.ledger.site_key import SiteKeyError, key_path_for, keyed_digest, load_site_key

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

def _read_anchor(path: Path) -> tuple[int, str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        count, head = int(data["count"]), str(data["hash"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LedgerError(f"{path}: not a ledger anchor ({exc})") from exc
    if count < 0 or len(head) != 64:
        raise LedgerError(f"{path}: not a ledger anchor (count {count}, hash {head!r})")
    return count, head

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
