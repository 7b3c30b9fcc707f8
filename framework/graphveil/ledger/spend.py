"""The spend a chain records: RDP increments and their composition into ε, folded row by row into
a :class:`Scan` (bindings, requests and their status, the RDP total, the record sets)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphveil.contract.accountant import Accountant
from graphveil.contract.errors import PrivacyError
from graphveil.ledger.chain import _canonical
from graphveil.ledger.entries import _EPS_TOL, _REL_TOL, LedgerEntry
from graphveil.privacy.conversion import rdp_to_epsilon


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
class Item:
    """A reservation, refusal or migration as folded from its chain rows."""

    row: dict[str, Any]
    status: str
    increment: np.ndarray | None
    epsilon: float
    note: str

@dataclass
class Scan:
    """Everything the chain says, plus the first problem found."""

    count: int = 0
    head: str = ""
    orders: np.ndarray | None = None
    delta: float | None = None
    bound: dict[str, Any] = field(default_factory=dict)
    items: dict[int, Item] = field(default_factory=dict)
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


def fold(scan: Scan, row: dict[str, Any]) -> None:
    """Add one verified chain row to ``scan``: a binding, a record set, a reservation (and its
    raise, release or withhold), a refusal or a migrated total; raise ValueError on a row the
    chain's own earlier rows contradict."""
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
            scan.items[rid] = Item(row, "refused", None, projected, row["note"])
            return
        scan.total = scan.total + inc
        eps = _epsilon(scan.orders, scan.total, scan.delta)
        if not _close(row["epsilon"], eps):
            raise ValueError(f"records ε {row['epsilon']!r}, the chain gives {eps!r}")
        if kind == "reserve" and not eps <= row["budget"] * (1 + _REL_TOL):
            raise ValueError(f"reserves past its budget (ε {eps!r} > {row['budget']!r})")
        status = "reserved" if kind == "reserve" else "migrated"
        scan.items[rid] = Item(row, status, inc, eps, row["note"])
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


def entry_of(item: Item) -> LedgerEntry:
    """The public view of a folded request."""
    row = item.row
    return LedgerEntry(
        id=row["id"], created=row["created"], status=item.status, site=row["site"], run=row["run"],
        round=row["round"], steps=row["steps"],
        noise_multiplier=row["noise_multiplier"] if row["noise_multiplier"] is not None else 0.0,
        delta=row["delta"], epsilon=item.epsilon,
        budget=row["budget"] if row["budget"] is not None else math.inf,
        mechanism=row["mechanism"], note=item.note,
    )
