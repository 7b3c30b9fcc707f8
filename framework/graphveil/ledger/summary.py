"""What ``graphveil budget show`` prints: a ledger's summary and its human view."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from graphveil.ledger.entries import COUNTING, LedgerEntry
from graphveil.ledger.spend import Scan, entry_of


def summarize(path: Any, meta: Mapping[str, str], scan: Scan) -> dict[str, Any]:
    """Site, unit, δ, ε spent, latest budget and remaining, steps, entry counts, chain head."""
    entries = [entry_of(item) for item in scan.items.values()]
    counts = {s: sum(e.status == s for e in entries) for s in ("reserved", "released", "withheld", "refused")}
    migrated = sum(e.status == "migrated" for e in entries)
    if migrated:
        counts["migrated"] = migrated
    budgets = [e.budget for e in entries if math.isfinite(e.budget)]
    latest_budget = budgets[-1] if budgets else None
    spent = scan.epsilon
    mechanisms = list(dict.fromkeys(e.mechanism for e in entries if e.status in COUNTING))
    return {
        "ledger": str(path),
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
