"""``graphveil`` command line: run, demo, plugins, privacy, budget, fed.

Every user error (a :class:`GraphVeilError`) is printed on one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from graphveil.errors import GraphVeilError

EXIT_USAGE = 2


def _offline() -> None:
    # Nothing may download at run time: models come from packages or local folders.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def cmd_plugins(args: argparse.Namespace) -> int:
    from graphveil.host import default_host

    host = default_host()
    rows = host.components()
    width = max((len(c.name) for c in rows), default=4)
    pwidth = max((len(c.plugin) for c in rows), default=4) + 2
    current = None
    for c in rows:
        if c.family != current:
            current = c.family
            print(f"{c.family}s:")
        print(f"  {c.name.ljust(width)}  {f'[{c.plugin}]'.ljust(pwidth)}  {c.description}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from graphveil.config import load_config
    from graphveil.runner import run_training

    config = load_config(args.config, args.set)
    if args.output:
        config.output.dir = Path(args.output)
    if args.no_progress:
        config.output.progress = False
    result = run_training(config)
    print(result["table"])
    print(f"run directory: {result['run_dir']}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from graphveil.demo import run_demo

    run_demo(quick=args.quick, output=Path(args.output) if args.output else None,
             progress=not args.no_progress)
    return 0


def cmd_privacy(args: argparse.Namespace) -> int:
    from graphveil.cli_privacy import run_privacy
    from graphveil.host import default_host

    return run_privacy(args, default_host())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="graphveil", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="train from a YAML run config")
    p.add_argument("config", help="path to the run's YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set sampler.batch_size=128 (repeatable)")
    p.add_argument("--output", help="run directory (default: runs/<name>-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="compare base / non-private / entity-DP / edge-DP on the bundled CiteSeer graph")
    p.add_argument("--quick", action="store_true", help="tiny encoder and a few steps (smoke test)")
    p.add_argument("--output", help="folder for the demo's runs and results (default: runs/demo-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("plugins", help="list every registered component with its plugin")
    p.set_defaults(func=cmd_plugins)

    from graphveil.cli_privacy import add_privacy_parser

    add_privacy_parser(sub).set_defaults(func=cmd_privacy)
    try:
        from graphveil.cli_fed import add_fed_parsers
    except ImportError:  # federation CLI not installed in this build
        pass
    else:
        add_fed_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    _offline()
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except GraphVeilError as exc:
        print(f"graphveil: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FileExistsError as exc:
        print(f"graphveil: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("graphveil: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
