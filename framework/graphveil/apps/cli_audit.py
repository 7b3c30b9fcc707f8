"""``graphveil audit``: a one-run privacy audit of a relational run config (:mod:`graphveil.apps.audit`).

Trains the config's run once with canaries at its privacy unit put in or left out at random,
guesses their membership from the trained weights and prints the empirical ε lower bound beside
the claimed ε; ``audit.json`` in the audit's folder holds every number and each canary's score.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from graphveil.apps.audit import DEFAULT_CANARIES, DEFAULT_NEGATIVES


def add_audit_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``audit CONFIG [--canaries m] [--set KEY=VALUE] …`` to a ``graphveil`` sub-parser set."""
    p = subparsers.add_parser(
        "audit", help="one-run privacy audit: empirical ε lower bound of a run config beside its claim")
    p.add_argument("config", help="path to the run's YAML file (a relational run, entity- or edge-level)")
    p.add_argument("--canaries", type=int, default=DEFAULT_CANARIES, metavar="M",
                   help=f"canaries, each in or out with probability 1/2 (default {DEFAULT_CANARIES})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set training.steps=60 (repeatable)")
    p.add_argument("--guesses", type=int, default=None, metavar="R",
                   help="guess on exactly R canaries (R/2 highest scores in, R/2 lowest out); default: "
                        "10/20/50/100 %% of M, each at a Bonferroni-corrected level")
    p.add_argument("--degree", type=int, default=None, metavar="D",
                   help="relations per entity canary (default: the sampler's degree cap K)")
    p.add_argument("--negatives", type=int, default=DEFAULT_NEGATIVES, metavar="K",
                   help=f"negatives each canary relation is scored against (default {DEFAULT_NEGATIVES})")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of the lower bound (default 0.95)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of membership and canaries (reproducible tests only; default: OS entropy)")
    p.add_argument("--output", help="folder for audit.json (default: runs/audit-<name>-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_audit)
    return p


def cmd_audit(args: argparse.Namespace) -> int:
    from graphveil.apps.audit import format_audit, run_audit
    from graphveil.contract.host import default_host
    from graphveil.run.config import load_config

    config = load_config(args.config, args.set)
    if args.no_progress:
        config.output.progress = False
    result = run_audit(config, canaries=args.canaries, degree=args.degree, guesses=args.guesses,
                       confidence=args.confidence, negatives=args.negatives, seed=args.seed,
                       host=default_host(), output=Path(args.output) if args.output else None)
    print(format_audit(result))
    print(f"audit directory: {result['run_dir']}")
    return 0
