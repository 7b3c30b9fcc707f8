"""Schema 1 → 3: a version-1 ledger's cumulative accountant state replayed by the installed
plugin into one chained ``migrate`` row (see the package docstring, "Schema migration")."""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from graphveil.ledger.chain import _SCHEMA, _canonical, _now
from graphveil.ledger.entries import SCHEMA_VERSION, LedgerError
from graphveil.ledger.spend import _curve_json, _epsilon, _rdp_capable
from graphveil.privacy.conversion import DEFAULT_ORDERS


def migrate_v1(ledger: Any) -> None:
    """Migrate ``ledger`` (a :class:`~graphveil.ledger.ledger.PrivacyLedger` over a schema-1 file)
    in one transaction (see the package docstring)."""
    db = ledger._db
    with ledger._transaction():
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
            orders, curve, unit = _rebuild_v1_curve(ledger.path, state, float(last[5]), float(last[4]))
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
            ledger._append(db, "bind", site=binding.get("site", ""), note=_canonical(binding))
            for key, value in binding.items():
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))
        if migrate is not None:
            ledger._append(db, "migrate", **migrate)


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
