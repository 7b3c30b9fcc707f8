"""``graphveil budget``: read, verify, anchor and migrate a site's privacy ledger.

The ledger (:mod:`graphveil.ledger`) is the core's and these commands never create one; only
``migrate`` changes the file (opening a schema-1 ledger migrates it). ``verify``, ``head`` and
``migrate`` exit 1 when the ledger fails verification, so scripts can gate on them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_budget_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``budget {show,verify,head,migrate}`` to a ``graphveil`` sub-parser set."""
    budget = subparsers.add_parser("budget", help="a site's privacy ledger (privacy odometer)")
    bsub = budget.add_subparsers(dest="budget_command", required=True)
    p = bsub.add_parser("show", help="ε spent, budget, and every release/refusal in a ledger")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_show)
    p = bsub.add_parser("verify", help="check a ledger's hash chain, recorded ε and anchor (exit 1 if tampered)")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--anchor", default=None, help="anchor file kept outside the ledger's volume")
    p.add_argument("--expect-head", default=None, help="a head hash recorded elsewhere; must be in the chain")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_verify)
    p = bsub.add_parser("head", help="print the ledger's head (rows, hash) to anchor outside its volume")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_head)
    p = bsub.add_parser("migrate", help="migrate a schema-1 ledger to the RDP-curve ledger")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.set_defaults(func=cmd_budget_migrate)
    return budget


def cmd_budget_show(args: argparse.Namespace) -> int:
    """Print ε spent, the budget and every entry; a ledger failing verification is shown with a warning."""
    from graphveil.ledger import PrivacyLedger, format_summary

    with PrivacyLedger(args.ledger, create=False) as ledger:
        summary, entries = ledger.summary(), ledger.entries()
    if args.json:
        print(json.dumps({"summary": summary, "entries": [e.as_dict() for e in entries]}, indent=2))
    else:
        print(format_summary(summary, entries))
    chain = summary.get("chain") or {}
    if not chain.get("verified", True):
        print(f"graphveil: WARNING: ledger {args.ledger} FAILS verification: {chain.get('error')}; "
              "the ε shown is not a trustworthy record of spend", file=sys.stderr)
    return 0


def cmd_budget_verify(args: argparse.Namespace) -> int:
    """Exit 0 if the hash chain, every recorded ε, the record sets and the anchor check out; 1 if not."""
    from graphveil.ledger import PrivacyLedger

    with PrivacyLedger(args.ledger, create=False) as ledger:
        report = ledger.verify(anchor=args.anchor, expect_head=args.expect_head)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    if report.ok:
        if not args.json:
            print(f"ok: {report.count} rows, head {report.head}, ε spent {report.epsilon:.6g}"
                  + (f" (δ={report.delta:.3g})" if report.delta is not None else ""))
        return 0
    print(f"graphveil: ledger {args.ledger} FAILS verification: {report.error}", file=sys.stderr)
    return 1


def cmd_budget_head(args: argparse.Namespace) -> int:
    """Print the ledger's head (row count and hash) for anchoring outside the site's volume."""
    from graphveil.ledger import PrivacyLedger

    with PrivacyLedger(args.ledger, create=False) as ledger:
        report = ledger.verify()
    if not report.ok:
        print(f"graphveil: ledger {args.ledger} FAILS verification: {report.error}; not printing its head "
              "as an anchor", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"count": report.count, "hash": report.head}))
    else:
        print(f"{report.count} {report.head}")
    return 0


def cmd_budget_migrate(args: argparse.Namespace) -> int:
    """Migrate a schema-1 ledger to the RDP-curve ledger (opening it migrates; this says so)."""
    import sqlite3

    from graphveil.ledger import SCHEMA_VERSION, PrivacyLedger

    path = Path(args.ledger)
    if not path.is_file():
        print(f"graphveil: error: {path}: no such ledger file", file=sys.stderr)
        return 2
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        before = int(row[0]) if row else 0
    except sqlite3.DatabaseError:
        before = 0
    with PrivacyLedger(path, create=False) as ledger:
        report = ledger.verify()
    what = "migrated" if before == 1 else f"already schema version {SCHEMA_VERSION}"
    print(f"{path}: {what}; {report.count} rows, ε spent {report.epsilon:.6g}, head {report.head}")
    return 0 if report.ok else 1
