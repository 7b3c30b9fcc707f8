"""``graphveil`` command line: run, demo, plugins, privacy, budget, and the plugins' commands.

The core's commands are added here; plugins and connectors add theirs through the
``graphveil_add_commands`` hook (the Flower connector adds ``fed``), so this module imports no
connector. Every user error (a :class:`GraphVeilError`) is printed on one line and exits with
code 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from graphveil.contract.errors import ConfigError, GraphVeilError, PluginError
from graphveil.contract.host import FAMILIES, PluginHost, default_host

if TYPE_CHECKING:
    from graphveil.run.config import RunConfig

EXIT_USAGE = 2


def version_line() -> str:
    """What ``graphveil --version`` prints: the one version number (``graphveil.__version__``)."""
    import graphveil

    return f"graphveil {graphveil.__version__}"


def _offline() -> None:
    # Nothing may download at run time: models come from packages or local folders.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def cmd_plugins(args: argparse.Namespace) -> int:
    """Every family the host knows, each with its components and their plugins; ``(none)`` if empty."""
    host = default_host()
    rows = host.components()
    width = max((len(c.name) for c in rows), default=4)
    pwidth = max((len(c.plugin) for c in rows), default=4) + 2
    for family in FAMILIES:
        print(f"{family}s:")
        found = host.components(family)
        if not found:
            print("  (none)")
        for c in found:
            print(f"  {c.name.ljust(width)}  {f'[{c.plugin}]'.ljust(pwidth)}  {c.description}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """One run, or with a ``sweep`` section one run per (target ε, seed) and a summary table.

    ``--nproc N`` (N > 1) checks the run can be split and re-executes this command through
    torchrun (:func:`_launch`); a process that torchrun started (``WORLD_SIZE`` > 1) joins the
    group and runs its rank (:func:`_run_rank`).
    """
    from graphveil.engine.data_parallel import world_size_from_env
    from graphveil.run.config import load_config

    if args.nproc is not None and args.nproc < 1:
        raise ConfigError(f"--nproc {args.nproc}: the number of processes must be >= 1")
    config = load_config(args.config, args.set)
    if args.output:
        config.output.dir = Path(args.output)
    if args.no_progress:
        config.output.progress = False
    if world_size_from_env() > 1:
        if args.nproc is not None:
            raise ConfigError(f"--nproc {args.nproc}: this process was already started by torchrun "
                              f"(WORLD_SIZE={world_size_from_env()}); give the process count to one of them")
        return _run_rank(config)
    if args.nproc is not None and args.nproc > 1:
        return _launch(args, config)
    if config.sweep is not None:
        from graphveil.run.runner import run_sweep

        sweep = run_sweep(config, host=default_host())
        print(sweep["table"])
        print(f"sweep directory: {sweep['run_dir']}")
        return 0
    from graphveil.run.runner import run_training

    result = run_training(config, host=default_host())
    print(result["table"])
    print(f"run directory: {result['run_dir']}")
    return 0


def _launch(args: argparse.Namespace, config: RunConfig) -> int:
    """Refuse a run that cannot be split (before any data is read or anything written), then run
    ``args.nproc`` ranks of this command under ``torch.distributed.run`` (gloo on CPU, NCCL on
    CUDA); rank 0 writes the run directory, which is removed again if any rank fails."""
    import subprocess

    from graphveil.run.outputs import RunDirectory
    from graphveil.run.session import TrainingSession

    if config.sweep is not None:
        raise ConfigError(f"--nproc {args.nproc}: a sweep runs its cells one by one; run each cell with --nproc")
    session = TrainingSession(config, host=default_host())
    session.assemble()
    session.check_data_parallel(args.nproc)
    final = Path(config.output.dir or RunDirectory.default_for(config.name))
    if final.exists():
        raise ConfigError(f"output directory {final} already exists; choose another output.dir")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc}",
               "-m", "graphveil.apps.cli", *(["--verbose"] if args.verbose else []), "run", str(args.config),
               *(f"--set={item}" for item in args.set), "--output", str(final),
               *(["--no-progress"] if not config.output.progress else [])]
    code = subprocess.run(command, check=False).returncode
    if code != 0:
        import shutil

        shutil.rmtree(RunDirectory.staging_path(final), ignore_errors=True)  # a rank stopped by a signal
        print(f"graphveil: error: the {args.nproc} processes of the run failed (torchrun exit code {code}); "
              "the failing rank's message is above", file=sys.stderr)
    return code


def _run_rank(config: RunConfig) -> int:
    """One rank of a torchrun group: join it, train its shards; rank 0 prints and writes."""
    import signal

    from graphveil.engine.data_parallel import DataParallel
    from graphveil.run.runner import run_training

    if config.sweep is not None:
        raise ConfigError("a sweep under torchrun: a sweep runs its cells one by one; run each cell with --nproc")
    # torchrun stops the other ranks with SIGTERM when one fails: unwind, so rank 0 removes its
    # partial run directory
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    group = DataParallel.from_env()
    try:
        result = run_training(config, host=default_host(), data_parallel=group)
    finally:
        group.close()
    if result is not None:
        print(result["table"])
        print(f"run directory: {result['run_dir']} ({group.world_size} processes)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from graphveil.apps.demo import run_demo

    run_demo(quick=args.quick, output=Path(args.output) if args.output else None,
             progress=not args.no_progress, task=args.task, overrides=args.set, setting=args.setting)
    return 0


def cmd_privacy(args: argparse.Namespace) -> int:
    from graphveil.apps.cli_privacy import run_privacy

    return run_privacy(args, default_host())


def build_parser(host: PluginHost | None = None) -> argparse.ArgumentParser:
    """The core's commands, then those of every plugin implementing ``graphveil_add_commands``.

    :param host: the plugin host whose plugins add commands (default: :func:`default_host`).
    :raises PluginError: if a plugin adds a command whose name is taken, naming the plugins that add commands.
    """
    from graphveil.apps.cli_audit import add_audit_parser
    from graphveil.apps.cli_budget import add_budget_parser
    from graphveil.apps.cli_plugin import add_plugin_parser
    from graphveil.apps.cli_privacy import add_privacy_parser
    from graphveil.apps.cli_report import add_report_parser
    from graphveil.apps.cli_sweep import add_sweep_parser

    parser = argparse.ArgumentParser(prog="graphveil", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--version", action="version", version=version_line())
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="train from a YAML run config")
    p.add_argument("config", help="path to the run's YAML file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set sampler.batch_size=128 (repeatable)")
    p.add_argument("--output", help="run directory (default: runs/<name>-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="split each DP-SGD step across N processes on this machine (torchrun; gloo on "
                        "CPU, NCCL with one GPU per process): one sampling draw, one noise draw on "
                        "rank 0, the same ε; relational DP-SGD runs only")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="compare private and non-private methods on bundled data or your own graph")
    p.add_argument("--task", choices=["relational", "node"], default="relational",
                   help="relational (default): base / non-private / entity-DP / edge-DP relation prediction "
                        "(--setting); node: paper 4's GDP methods (MLP, GAP, DPDGC, DP-SAGE) on node "
                        "classification. Both run on bundled data, or on your graph with --set data.…")
    p.add_argument("--quick", action="store_true", help="a few steps per row on a small graph (smoke test)")
    p.add_argument("--output", help="folder for the demo's runs and results (default: runs/demo[-node]-<timestamp>)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field in every row, as for run (repeatable), e.g. your graph: "
                        "--set data.source=edge_list --set data.path=edges.csv --set data.entities=nodes.csv; "
                        "node demo: --set data.source=pyg --set data.path=graph.pt (a Data with x and y), or "
                        "edge_list/parquet/sql with data.feature_cols (or features_col, features_table) and "
                        "data.label_col")
    p.add_argument("--setting", default=None, choices=["cora-features", "citeseer-minilm-lora"],
                   help="relational demo's encoder: cora-features (a weight per entity feature; bundled "
                        "Cora's bag of words) or citeseer-minilm-lora (MiniLM + LoRA on entity texts; bundled "
                        "CiteSeer). Default: picked by the graph (features: cora-features; texts only: "
                        "citeseer-minilm-lora), and said in the output")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("plugins", help="list every registered component with its plugin")
    p.set_defaults(func=cmd_plugins)

    add_privacy_parser(sub).set_defaults(func=cmd_privacy)
    add_budget_parser(sub)
    add_plugin_parser(sub)
    add_audit_parser(sub)
    add_sweep_parser(sub)
    add_report_parser(sub)

    host = host or default_host()
    try:
        host.hook.graphveil_add_commands(subparsers=sub)
    except argparse.ArgumentError as exc:  # argparse refuses a second parser of the same name
        adders = ", ".join(repr(i.plugin_name) for i in host.hook.graphveil_add_commands.get_hookimpls())
        raise PluginError(f"graphveil_add_commands of plugin(s) {adders}: {exc}") from exc
    return parser


def main(argv: list[str] | None = None) -> int:
    _offline()
    if (sys.argv[1:] if argv is None else argv) == ["--version"]:
        print(version_line())  # before any plugin is loaded: answers even when one is broken
        return 0
    try:
        parser = build_parser()  # loads the plugins: a broken one is a one-line error too
    except GraphVeilError as exc:
        print(f"graphveil: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
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
