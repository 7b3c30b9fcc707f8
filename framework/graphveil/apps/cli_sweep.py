"""``graphveil sweep``: one run per (target ε, seed) of a config, resumable, for ``graphveil report``.

    graphveil sweep CONFIG --epsilons 1,2,4,8,16 --seeds 3 [--no-baseline] [--set KEY=VALUE ...]
                    [--output DIR] [--no-progress]

Sets the config's ``sweep`` section (:class:`graphveil.run.config.SweepConfig`) from the flags and runs
it with :func:`graphveil.run.runner.run_sweep`: every cell is a complete run directory
``DIR/<eps…|nonprivate>/seed<k>``, and ``DIR`` gets ``results.jsonl`` and ``table.txt`` once every
cell has finished. Until then the cells live in ``DIR.partial``; run the same command again with
the same ``--output`` and the complete cells are read, not run again.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from graphveil.contract.errors import ConfigError


def add_sweep_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``sweep`` to a ``graphveil`` sub-parser set."""
    p = subparsers.add_parser(
        "sweep", help="one run per (target ε, seed) of a config, with mean ± 95 %% CI per ε (resumable)",
        description=__doc__.split("\n\n")[0])
    p.add_argument("config", help="path to the run's YAML file (its own sweep section is replaced)")
    p.add_argument("--epsilons", required=True, metavar="E1,E2,...",
                   help="target ε values, comma-separated, e.g. 1,2,4,8,16")
    p.add_argument("--seeds", required=True, metavar="N|S1,S2,...",
                   help="N: seeds 0..N-1; or a comma-separated list of seeds, e.g. 0,3,7 "
                        "(each sets sampling, the split key and initialisation)")
    p.add_argument("--no-baseline", action="store_true",
                   help="leave out the non-private baseline (privacy.enabled: false) run at every seed")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field for every cell, e.g. --set training.epochs=20 (repeatable)")
    p.add_argument("--output", help="sweep folder (default: runs/<name>-sweep-<timestamp>); "
                                    "an interrupted sweep resumes when given the same folder")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_sweep)
    return p


def parse_epsilons(text: str) -> list[float]:
    """``"1,2,4"`` → ``[1.0, 2.0, 4.0]``: finite, > 0, distinct.

    :raises ConfigError: naming the bad entry.
    """
    values = []
    for part in (p.strip() for p in text.split(",")):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"--epsilons: {part!r} is not a number (give e.g. 1,2,4,8,16)") from None
        if not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"--epsilons: every ε must be a finite number > 0, got {part!r}")
        if value in values:
            raise ConfigError(f"--epsilons: {part!r} is given twice")
        values.append(value)
    return values


def parse_seeds(text: str) -> list[int]:
    """``"3"`` → ``[0, 1, 2]``; ``"0,5,9"`` → ``[0, 5, 9]`` (distinct integers ≥ 0).

    :raises ConfigError: naming the bad entry.
    """
    parts = [p.strip() for p in text.split(",")]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(f"--seeds: expected a count N or a list of integers, got {text!r}") from None
    if len(numbers) == 1:
        if numbers[0] < 1:
            raise ConfigError(f"--seeds: a count must be >= 1, got {numbers[0]}")
        return list(range(numbers[0]))
    if any(n < 0 for n in numbers) or len(set(numbers)) != len(numbers):
        raise ConfigError(f"--seeds: seeds must be distinct integers >= 0, got {text!r}")
    return numbers


def sweep_config(args: argparse.Namespace) -> Any:
    """The validated run config with its sweep section set from the flags."""
    from graphveil.run.config import load_config

    epsilons, seeds = parse_epsilons(args.epsilons), parse_seeds(args.seeds)
    targets = [str(e) for e in epsilons] + ([] if args.no_baseline else ["null"])
    # the file's own sweep section, if any, is replaced as a whole
    sweep = f"sweep={{target_epsilon: [{', '.join(targets)}], seeds: [{', '.join(map(str, seeds))}]}}"
    overrides = [*args.set, sweep]
    config = load_config(args.config, overrides)
    if args.output:
        config.output.dir = Path(args.output)
    elif config.output.dir is None:
        from graphveil.run.outputs import RunDirectory

        config.output.dir = RunDirectory.default_for(f"{config.name}-sweep")
    if args.no_progress:
        config.output.progress = False
    return config


def cmd_sweep(args: argparse.Namespace) -> int:
    from graphveil.contract.host import default_host
    from graphveil.run.runner import run_sweep

    config = sweep_config(args)
    final = Path(config.output.dir)
    partial = final.with_name(final.name + ".partial")
    if partial.is_dir():
        done = sum(1 for p in partial.glob("*/seed*") if p.is_dir() and not p.name.endswith(".partial"))
        print(f"resuming {partial}: {done} complete cell(s) kept", flush=True)
    try:
        sweep = run_sweep(config, host=default_host(), resume=True)
    except BaseException:
        if partial.is_dir():
            print(f"graphveil: sweep stopped; its complete cells are kept in {partial}: run the same command "
                  f"with --output {final} to resume", file=sys.stderr, flush=True)
        raise
    print(sweep["table"])
    print(f"sweep directory: {sweep['run_dir']}")
    print(f"next: graphveil report {sweep['run_dir']}")
    return 0
