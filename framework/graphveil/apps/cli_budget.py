"""``graphveil budget``: create, read, verify, anchor and migrate a site's privacy ledger.

The ledger (:mod:`graphveil.ledger`) is the core's. ``init`` is the only command that creates
one (with its site key and anchor) or upgrades an old one; ``migrate`` migrates a schema-1
ledger that has its key. ``verify``, ``head`` and ``migrate`` exit 1 when the ledger fails
verification — ``verify --witness`` also when the ledger does not hold a head the server's
witness saw — so scripts can gate on them. ``witness`` is the server operator's view of the
witness file (:mod:`graphveil.ledger.witness`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_budget_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``budget {init,show,verify,head,migrate,witness}`` to a ``graphveil`` sub-parser set."""
    budget = subparsers.add_parser(
        "budget", help="a site's privacy ledger (privacy odometer)",
        description="A site's privacy ledger: a keyed hash chain of every spend. Create it once with "
                    "`init`; a rollback is caught by its anchor (the site's) and by the server's witness "
                    "of the heads its replies carry (`verify --witness`). deploy/RUNBOOK.md §4 and §8.")
    bsub = budget.add_subparsers(dest="budget_command", required=True)
    p = bsub.add_parser(
        "init", help="create a site's ledger, its key and its anchor (once), or upgrade an older ledger",
        description="Create the site key <ledger>.key (0600, never replaced), the ledger bound to --site and "
                    "the anchor --anchor at its head. On an existing schema-1 or schema-2 ledger: create the "
                    "key and migrate / verify and re-chain it under the key. Nothing is ever created on "
                    "first use: a site runs this once, before `graphveil fed site`.")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite) to create or upgrade")
    p.add_argument("--site", default=None,
                   help="the site's name (its node config's site-name); required for a new ledger")
    p.add_argument("--anchor", default=None,
                   help="anchor file to create, on ANOTHER volume than the ledger (node config ledger-anchor)")
    p.add_argument("--reanchor", action="store_true",
                   help="the ledger exists and its anchor was lost: verify the ledger and write --anchor at its "
                        "current head (a rollback before now is then caught only by the server's witness)")
    p.set_defaults(func=cmd_budget_init)
    p = bsub.add_parser("show", help="ε spent, budget, and every release/refusal in a ledger")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_show)
    p = bsub.add_parser("verify", help="check a ledger's hash chain, recorded ε, anchor and witnessed heads "
                                       "(exit 1 if tampered)")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--anchor", default=None, help="anchor file kept outside the ledger's volume")
    p.add_argument("--expect-head", default=None, help="a head hash recorded elsewhere; must be in the chain")
    p.add_argument("--witness", default=None,
                   help="the server's ledger witness file (or this site's lines of it): the ledger must hold "
                        "every (seq, head) it witnessed — catches a rollback and a rewrite of history the "
                        "server saw, even one re-signed with the site key")
    p.add_argument("--site", default=None, help="the site's name in the witness (default: the ledger's site)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_verify)
    p = bsub.add_parser("head", help="print the ledger's head (rows, hash) to anchor outside its volume")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_head)
    p = bsub.add_parser("migrate", help="migrate a schema-1 ledger that has its key (else: `budget init`)")
    p.add_argument("--ledger", required=True, help="the site's ledger file (SQLite)")
    p.set_defaults(func=cmd_budget_migrate)
    p = bsub.add_parser("witness", help="(server) the ledger heads the server witnessed per site; clear a flag",
                        description="Show the server's ledger witness file: per site the last witnessed "
                                    "checkpoint and head, and whether the site is flagged (its ledger went "
                                    "backwards or forked; its replies are refused). --clear lifts a flag.")
    p.add_argument("--witness", required=True, help="the witness file (server setting ledger-witness)")
    p.add_argument("--clear", metavar="SITE", default=None, help="lift SITE's flag (needs --note)")
    p.add_argument("--note", default="", help="why the flag is lifted (kept in the file)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_budget_witness)
    return budget


def cmd_budget_init(args: argparse.Namespace) -> int:
    """Create the ledger, its key and anchor (or upgrade / re-anchor); print what was done."""
    from graphveil.contract.errors import ConfigError
    from graphveil.ledger import SCHEMA_VERSION, init_ledger, schema_version_of
    from graphveil.ledger.site_key import key_path_for

    path = Path(args.ledger)
    before = schema_version_of(path) if path.exists() and not args.reanchor else None
    if before is None and not args.reanchor and not args.site:
        raise ConfigError("budget init: --site NAME is required for a new ledger (the node config's site-name)")
    with init_ledger(path, site=args.site, anchor=args.anchor, reanchor=args.reanchor) as ledger:
        count, head = ledger.head()
    what = ("re-anchored" if args.reanchor else "created" if before is None else
            f"upgraded from schema {before} to {SCHEMA_VERSION}")
    print(f"{path}: {what}; key {key_path_for(path)}"
          + (f", anchor {args.anchor}" if args.anchor else ", no anchor") + f"; {count} rows, head {head}")
    if args.reanchor:
        print("graphveil: note: the anchor now starts at this head; a rollback to before it is caught only "
              "by the server's ledger witness", file=sys.stderr)
    return 0


def cmd_budget_show(args: argparse.Namespace) -> int:
    """Print ε spent, the budget and every entry; a ledger failing verification is shown with a warning."""
    from graphveil.ledger import PrivacyLedger, format_summary

    with PrivacyLedger(args.ledger) as ledger:
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

    witnessed: list[tuple[int, str]] = []
    with PrivacyLedger(args.ledger) as ledger:
        if args.witness is not None:
            from graphveil.ledger.witness import Witness

            site = args.site or ledger.meta().get("site")
            if not site:
                print(f"graphveil: error: {args.ledger} is bound to no site; name it with --site", file=sys.stderr)
                return 2
            if not Path(args.witness).is_file():
                print(f"graphveil: error: {args.witness}: no such witness file", file=sys.stderr)
                return 2
            witnessed = [(o.seq, o.head) for o in Witness(args.witness).observations(site)]
            if not witnessed:
                print(f"graphveil: warning: {args.witness} holds no heads of site {site!r}", file=sys.stderr)
        report = ledger.verify(anchor=args.anchor, expect_head=args.expect_head, witnessed=witnessed)
        mark = ledger.witness_head()
        seq, checkpoint = mark.seq, mark.head
    if args.json:
        print(json.dumps({**report.as_dict(), "witnessed": len(witnessed), "checkpoints": seq}, indent=2))
    if report.ok:
        if not args.json:
            print(f"ok: {report.count} rows, head {report.head}, ε spent {report.epsilon:.6g}"
                  + (f" (δ={report.delta:.3g})" if report.delta is not None else "")
                  + f"; checkpoint {seq} {checkpoint}"
                  + (f"; holds all {len(witnessed)} witnessed heads" if args.witness is not None else ""))
        return 0
    print(f"graphveil: ledger {args.ledger} FAILS verification: {report.error}", file=sys.stderr)
    return 1


def cmd_budget_head(args: argparse.Namespace) -> int:
    """Print the ledger's head (row count and hash) for anchoring outside the site's volume."""
    from graphveil.ledger import PrivacyLedger

    with PrivacyLedger(args.ledger) as ledger:
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
    from graphveil.ledger import SCHEMA_VERSION, PrivacyLedger, schema_version_of

    path = Path(args.ledger)
    before = schema_version_of(path)
    with PrivacyLedger(path) as ledger:  # a schema-1 or -2 ledger without its key: "run budget init"
        report = ledger.verify()
    what = "migrated" if before == 1 else f"already schema version {SCHEMA_VERSION}"
    print(f"{path}: {what}; {report.count} rows, ε spent {report.epsilon:.6g}, head {report.head}")
    return 0 if report.ok else 1


def cmd_budget_witness(args: argparse.Namespace) -> int:
    """Print the witness's per-site state (server side); ``--clear SITE --note TEXT`` lifts a flag."""
    from graphveil.ledger.witness import Witness

    if not Path(args.witness).is_file():
        print(f"graphveil: error: {args.witness}: no such witness file", file=sys.stderr)
        return 2
    witness = Witness(args.witness)
    if args.clear is not None:
        witness.clear(args.clear, args.note)
        print(f"{args.witness}: site {args.clear!r} cleared ({args.note})")
        return 0
    sites = witness.sites()
    if args.json:
        print(json.dumps(sites, indent=2))
    else:
        for name, state in sites.items():
            flag = f"  FLAGGED: {state['flagged']}" if state["flagged"] else ""
            print(f"{name}  checkpoint {state['seq']}  head {state['head']}{flag}")
    return 1 if any(s["flagged"] for s in sites.values()) else 0
