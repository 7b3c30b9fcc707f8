"""Creating a ledger, once and explicitly (``graphveil budget init``): the site key, an empty
ledger bound to its site and the anchor; or upgrading an older ledger (schema 1 migrated, schema 2
re-chained under a new key); or writing a lost anchor again (``--reanchor``)."""

from __future__ import annotations

import os
import secrets
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from graphveil.ledger.chain import (
    _FIELDS,
    _SCHEMA,
    _canonical,
    _connect,
    _fsync_dir,
    _now,
    _schema_version,
    _unkeyed_genesis,
    _unkeyed_row_hash,
    schema_version_of,
)
from graphveil.ledger.entries import SCHEMA_VERSION, LedgerError
from graphveil.ledger.ledger import PrivacyLedger
from graphveil.ledger.site_key import SiteKeyError, create_site_key, key_path_for


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
