"""Paper 3's Table 1 (Cora and CiteSeer rows): GCN non-private, DP and DP on s = 10 graph splits.

Each row is ``examples/dp_gcn_cora.yaml`` with overrides, run once per seed through the same
sweep cells as ``graphveil run`` (seed → sampling, the split key, initialisation). Results are
appended to a JSON-lines file as each cell finishes, and cells already there are skipped, so
the benchmark can be resumed or split across processes (``--rows``, ``--dataset``) and summed
up later (``--table-only``). Prints a markdown table for the README: accuracy (= paper 3's
micro-F1) and macro-F1, mean ± 95 % CI over seeds, the majority class, and the paper's F1.
Every row states its privacy unit (``unit``, as ``privacy.json`` reports it; ``–`` without
privacy): ``graph/replacement``, one of the s splits replaced — node-level DP with respect to the
split-masked training graph (a node, its features, label and within-split edges are in one split).

    python bench/dp_gcn.py --seeds 3 --out bench/results/dp_gcn.jsonl     # every row: about 2 h
    python bench/dp_gcn.py --table-only --out bench/results/dp_gcn.jsonl

The DP runs cost ~0.02 s per step on Cora and ~0.05 s on CiteSeer (one thread; a large part of
it is the CSPRNG noise for 46 k / 119 k weights), so the 5000-step split rows take 2 and 4
minutes each.
``bench/results/dp_gcn.jsonl`` was filled within an hour of CPU: every Cora row at three seeds;
on CiteSeer the Adam rows at three seeds, the SGD rows at one, no ε = 1 or full-graph SGD row
(the README lists the commands).

Settings (paper 3, Sec. 5 and Appendix A): planetoid "full" split (Cora 1208 / 500 / 1000,
CiteSeer 1827 / 500 / 1000 nodes, no preprocessing), 2-layer GCN with 32 hidden units, ReLU and
dropout 0.5, C = 1, δ = 1e-5, lr 0.01 (DP-Adam: 0.1, the low end of the paper's tuned range);
SGD 2000 epochs, Adam 500 epochs. "DP" is the whole training graph as one example (s = 1, q = 1);
"DP split" cuts it into s = 10 splits, one split per step (the paper's lot size 1). Differences
from the paper that the numbers depend on (see ``plugins/graphveil/plugins/dp_gcn/README.md``): gradients really
clipped; σ from the replace-one analysis of what is run (sensitivity 2C, sampled without
replacement); each split's forward sees its own subgraph; evaluation on the graph of the
held-out nodes; no weight decay and no early stopping (the paper uses both only without DP);
DP-SGD on splits trains 500 epochs instead of 2000 (CPU time; ε is accounted for the steps run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from graphveil.contract.host import PluginHost, default_host
from graphveil.run.config import load_config
from graphveil.run.runner import mean_ci95, planned_unit, read_cells, run_training, sweep_cell

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dp_gcn_cora.yaml"

#: the raw Planetoid files of each dataset (None: Cora's, bundled with GraphVeil)
DATA_PATH = {"cora": None, "citeseer": "/work/shared/data/planetoid/CiteSeer/raw"}

WHOLE = ["sampler.num_splits=1", "sampler.batch_size=1"]
SPLIT = ["sampler.num_splits=10", "sampler.batch_size=1"]
SGD = ["training.optimizer=sgd", "training.lr=0.01", "training.epochs=2000"]
ADAM = ["training.optimizer=adam", "training.lr=0.01", "training.epochs=500"]
DP_ADAM = ["training.optimizer=adam", "training.lr=0.1", "training.epochs=500"]
DP_SGD_SPLIT = ["training.optimizer=sgd", "training.lr=0.01", "training.epochs=500"]

#: (setting, optimizer, overrides, target ε or None for non-private, paper 3's F1 on Cora, on CiteSeer)
ROWS: list[tuple[str, str, list[str], float | None, float | None, float | None]] = [
    ("non-DP", "SGD", [*WHOLE, *SGD], None, 0.77, 0.77),
    ("non-DP", "Adam", [*WHOLE, *ADAM], None, 0.88, 0.79),
    ("DP, s = 1", "SGD", [*WHOLE, *SGD], 2.0, 0.39, 0.36),
    ("DP, s = 1", "Adam", [*WHOLE, *DP_ADAM], 2.0, 0.52, 0.36),
    ("DP split, s = 10", "SGD", [*SPLIT, *DP_SGD_SPLIT], 2.0, 0.55, 0.35),
    ("DP split, s = 10", "Adam", [*SPLIT, *DP_ADAM], 2.0, 0.57, 0.36),
    ("DP split, s = 10", "SGD", [*SPLIT, *DP_SGD_SPLIT], 1.0, 0.55, 0.35),
    ("DP split, s = 10", "Adam", [*SPLIT, *DP_ADAM], 1.0, 0.56, 0.36),
    # the paper's evaluation: the whole graph (test nodes see their training neighbours; the
    # predictions then read training data, so this is for comparison with the paper only)
    ("non-DP, eval full graph", "SGD", [*WHOLE, *SGD, "task.eval_graph=full"], None, 0.77, 0.77),
    ("non-DP, eval full graph", "Adam", [*WHOLE, *ADAM, "task.eval_graph=full"], None, 0.88, 0.79),
]
#: table order (row numbers stay stable for --rows and resuming)
DISPLAY = [0, 1, 8, 9, 2, 3, 4, 5, 6, 7]
#: paper 3's "Maj." column
PAPER_MAJORITY = {"cora": 0.32, "citeseer": 0.18}


def key(dataset: str, row: int, seed: int) -> str:
    setting, optimizer, _, eps, *_ = ROWS[row]
    return f"{dataset}|{setting}|{optimizer}|{eps}|{seed}"


def done(paths: list[Path]) -> dict[str, dict[str, Any]]:
    return read_cells(paths, lambda c: f"{c['dataset']}|{c['setting']}|{c['optimizer']}|{c['target_epsilon']}|{c['seed']}")


def _pct(values: list[float]) -> str:
    mean, half = mean_ci95([100 * v for v in values])
    return f"{mean:.1f}" if half != half else f"{mean:.1f} ± {half:.1f}"  # nan: one seed


def unit_of(row: int, host: PluginHost) -> str:
    """The privacy unit a row's runs report (``privacy.json``'s ``unit``); ``–`` without privacy."""
    _, _, overrides, eps, *_ = ROWS[row]
    return planned_unit(sweep_cell(load_config(EXAMPLE, overrides), eps, 0, Path("unused"), host), host) or "–"


def table(cells: dict[str, dict[str, Any]], datasets: list[str], host: PluginHost) -> str:
    """The markdown table; a cell that recorded another unit than its row states now is refused."""
    lines = ["| dataset | setting | optimizer | unit | ε | σ | steps | test acc = micro-F1 (%) | "
             "test macro-F1 (%) | paper 3 F1 (%) | seeds | s / run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    units = {i: unit_of(i, host) for i in DISPLAY}
    for dataset in datasets:
        runs_all = [c for c in cells.values() if c["dataset"] == dataset]
        if not runs_all:
            continue
        maj = runs_all[0]
        lines.append(f"| {dataset} | majority class | – | – | – | – | – | {100 * maj['majority_accuracy']:.1f} | "
                     f"{100 * maj['majority_macro_f1']:.1f} | {100 * PAPER_MAJORITY[dataset]:.0f} | – | – |")
        for i in DISPLAY:
            setting, optimizer, _, eps, paper_cora, paper_citeseer = ROWS[i]
            runs = [c for c in runs_all if (c["setting"], c["optimizer"], c["target_epsilon"]) == (setting, optimizer, eps)]
            if not runs:
                continue
            if stale := [c for c in runs if c.get("unit", units[i]) != units[i]]:
                raise SystemExit(f"bench/dp_gcn.py: cell {key(dataset, i, stale[0]['seed'])} ran at unit "
                                 f"{stale[0]['unit']!r}, row {i} now states {units[i]!r}: remove the stale cell")
            paper = paper_cora if dataset == "cora" else paper_citeseer
            sigma = runs[0]["noise_multiplier"]
            seconds = sum(c["seconds"] for c in runs) / len(runs)
            lines.append(
                f"| {dataset} | {setting} | {optimizer} | {units[i]} | {'∞' if eps is None else f'{eps:g}'} | "
                f"{'–' if not sigma else f'{sigma:.3g}'} | {runs[0]['steps']} | "
                f"{_pct([c['test_accuracy'] for c in runs])} | {_pct([c['test_macro_f1'] for c in runs])} | "
                f"{'–' if paper is None else f'{100 * paper:.0f}'} | {len(runs)} | {seconds:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="all", choices=["cora", "citeseer", "all"])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", default="", help="comma-separated row numbers (0-based) to run; default all")
    ap.add_argument("--out", type=Path, action="append", help="JSON-lines results (repeatable for --table-only)")
    ap.add_argument("--table-only", action="store_true", help="print the table of the results so far")
    args = ap.parse_args(argv)
    outs = args.out or [Path("bench/results/dp_gcn.jsonl")]
    datasets = ["cora", "citeseer"] if args.dataset == "all" else [args.dataset]
    host = default_host()
    if not args.table_only:
        chosen = [int(i) for i in args.rows.split(",") if i] or range(len(ROWS))
        for seed in range(args.seeds):  # seed-major: a partial run still covers every row
            for dataset in datasets:
                data = [f"data.name={dataset}", "data.preprocess=none"]
                if DATA_PATH[dataset] is not None:
                    data.append(f"data.path={DATA_PATH[dataset]}")
                for i in chosen:
                    setting, optimizer, overrides, eps, *_ = ROWS[i]
                    if key(dataset, i, seed) in done(outs):
                        continue
                    base = load_config(EXAMPLE, [*data, *overrides, "output.progress=false"])
                    cfg = sweep_cell(base, eps, seed, Path("runs/bench-dp-gcn") / dataset / f"row{i}", host)
                    started, cpu = time.perf_counter(), time.process_time()
                    result = run_training(cfg, host=host)
                    row, unit = result["row"], result["session"].privacy_report()["unit"] or "–"
                    cell = {"dataset": dataset, "setting": setting, "optimizer": optimizer, "target_epsilon": eps,
                            "unit": unit, "seed": seed, **{k: row[k] for k in (
                                "test_accuracy", "test_macro_f1", "val_accuracy", "majority_accuracy",
                                "majority_macro_f1", "epsilon", "noise_multiplier", "steps")},
                            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu}
                    with outs[0].open("a") as f:
                        f.write(json.dumps(cell) + "\n")
                    print(f"{dataset:8s} {setting:16s} {optimizer:4s} ε {row['epsilon']:.3f} seed {seed}: "
                          f"acc {100 * row['test_accuracy']:.1f} macro-F1 {100 * row['test_macro_f1']:.1f} "
                          f"σ {row['noise_multiplier']:.3g} ({cell['seconds']:.0f} s, cpu {cell['cpu_seconds']:.0f} s)",
                          flush=True)
    print(table(done(outs), datasets, host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
