"""Paper 2's comparison on the bundled CiteSeer: RR baseline vs edge-level DP fine-tuning vs
non-private at ε ∈ {4, 10}, zero-shot and few-shot relation prediction, few-shot entity
classification; mean ± 95 % CI over seeds.

Rows (paper 2, Tables 2-4): the base encoder (no fine-tuning), non-private fine-tuning, DP-SGD at
edge level (``examples/edge_level.yaml`` with the PLD accountant, as paper 2 accounts with PRV)
and the randomized-response baseline (``examples/rr_baseline.yaml``), each at ε = 4 and 10. All
rows share the encoder (packaged MiniLM, LoRA on its top layer), steps, batch and learning rate,
and every row is evaluated the same way (``evaluation.few_shot`` and
``evaluation.entity_classification`` with their defaults: 16 + 16 relations, 8 + 8 entities per
class).

Settings (``--setting``):

- ``one_graph``: the keyed 70 / 30 entity split of CiteSeer (zero-shot on the held-out side);
- ``two_graphs``: train on the papers of three topics (graph A: DB, IR, HCI) and evaluate on the
  other three (graph B: AI, Agents, ML), ``data.split.kind: two_graphs`` with ``data.classes``,
  the papers' one-domain-to-another setting cut from one graph.

The table gives each metric's mean ± 95 % CI over seeds (a seed sets the split too, so that
spread includes the split's) and, for MRR, few-shot MRR and macro-F1, the paired difference to
the base encoder on the same seed (same split, test relations and few-shot draws): the number
that says whether fine-tuning helped.

Cells are appended to a JSON-lines file as they finish and skipped when already there (resume
after an interruption; ``--table-only`` prints the table of what is there).

    python bench/paper2_table.py --setting one_graph --seeds 3
    python bench/paper2_table.py --setting two_graphs --seeds 3
    python bench/paper2_table.py --table-only --setting one_graph
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from graphveil.contract.host import default_host
from graphveil.run.config import load_config
from graphveil.run.runner import mean_ci95, read_cells, run_training, sweep_cell

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PROTOCOLS = ["evaluation.few_shot={}", "evaluation.entity_classification={}"]
TWO_GRAPHS = ["data.split.kind=two_graphs", "data.classes=[DB, IR, HCI]",
              "data.split.eval_data={source: citeseer, classes: [AI, Agents, ML]}"]
SETTINGS = {"one_graph": [], "two_graphs": TWO_GRAPHS}

#: (row, config, overrides, target ε or None for non-private)
ROWS: list[tuple[str, str, list[str], float | None]] = [
    ("base encoder", "edge_level.yaml", ["training.steps=0"], None),
    ("non-private", "edge_level.yaml", [], None),
    ("DP-SGD edge ε=10", "edge_level.yaml", ["accountant={name: edge_pld}"], 10.0),
    ("DP-SGD edge ε=4", "edge_level.yaml", ["accountant={name: edge_pld}"], 4.0),
    ("RR ε=10", "rr_baseline.yaml", [], 10.0),
    ("RR ε=4", "rr_baseline.yaml", [], 4.0),
]
METRICS = [("prec1", "PREC@1"), ("mrr", "MRR"), ("fewshot_released_mrr", "MRR on few-shot test"),
           ("fewshot_prec1", "few-shot PREC@1"), ("fewshot_mrr", "few-shot MRR"),
           ("ec_macro_f1", "EC macro-F1"), ("ec_micro_f1", "EC micro-F1")]
#: (metric, header) of the table; the ones in PAIRED get a column of the paired difference to the
#: base encoder on the same seed (same split, same test relations and few-shot draws)
COLUMNS = [("prec1", "PREC@1"), ("mrr", "MRR"), ("fewshot_mrr", "few-shot MRR"),
           ("ec_macro_f1", "EC macro-F1"), ("ec_micro_f1", "EC micro-F1")]
PAIRED = {"mrr": "Δ MRR", "fewshot_mrr": "Δ few-shot MRR", "ec_macro_f1": "Δ macro-F1"}
BASE_ROW = ROWS[0][0]


def key(cell: dict[str, Any]) -> str:
    return f"{cell['setting']}|{cell['row']}|{cell['seed']}"


def fmt(values: list[float]) -> str:
    mean, half = mean_ci95(values)
    return f"{mean:.2f}" + ("" if math.isnan(half) else f" ± {half:.2f}")


def table(cells: dict[str, dict[str, Any]], setting: str) -> str:
    """Mean ± 95 % CI over seeds (in %; the seeds differ in split, so this spread includes the
    split's), and the paired difference to the base encoder on the same seed."""
    head = ["row"]
    for metric, header in COLUMNS:
        head += [header] + ([PAIRED[metric]] if metric in PAIRED else [])
    head += ["ε", "seeds", "s / run"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = {c["seed"]: c for c in cells.values() if (c["setting"], c["row"]) == (setting, BASE_ROW)}
    for row, *_ in ROWS:
        runs = [c for c in cells.values() if (c["setting"], c["row"]) == (setting, row)]
        if not runs:
            continue
        parts = [row]
        for metric, _ in COLUMNS:
            parts.append(fmt([100 * c[metric] for c in runs]))
            if metric in PAIRED:
                paired = [100 * (c[metric] - base[c["seed"]][metric]) for c in runs if c["seed"] in base]
                parts.append("–" if row == BASE_ROW or not paired else fmt(paired))
        eps = [c["epsilon"] for c in runs]
        parts += ["∞" if math.isinf(eps[0]) else f"{max(eps):.2f}", str(len(runs)),
                  f"{sum(c['seconds'] for c in runs) / len(runs):.0f}"]
        lines.append("| " + " | ".join(parts) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setting", choices=list(SETTINGS), default="one_graph")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rows", default="", help="comma-separated row numbers (0-based); default all")
    ap.add_argument("--out", type=Path, default=None, help="JSON lines (default bench/results/paper2_<setting>.jsonl)")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    out = args.out or Path(f"bench/results/paper2_{args.setting}.jsonl")
    if not args.table_only:
        host = default_host()
        chosen = [int(i) for i in args.rows.split(",") if i] or range(len(ROWS))
        for seed in range(args.seeds):  # seed-major: a partial run still covers every row
            for i in chosen:
                row, config, overrides, eps = ROWS[i]
                cell_key = {"setting": args.setting, "row": row, "seed": seed}
                if key(cell_key) in read_cells([out], key):
                    continue
                base = load_config(EXAMPLES / config, [*SETTINGS[args.setting], *PROTOCOLS, *overrides,
                                                       "output.progress=false"])
                cfg = sweep_cell(base, eps, seed, Path("runs/bench-paper2") / args.setting / f"row{i}", host)
                shutil.rmtree(cfg.output.dir, ignore_errors=True)  # an interrupted cell starts over
                started = time.perf_counter()
                result = run_training(cfg, host=host)
                cell = {**cell_key, **{m: result["row"][m] for m, _ in METRICS},
                        "epsilon": result["row"]["epsilon"], "noise_multiplier": result["row"]["noise_multiplier"],
                        "fewshot_step": result["row"]["fewshot_step"], "seconds": time.perf_counter() - started}
                out.parent.mkdir(parents=True, exist_ok=True)
                with out.open("a") as f:
                    f.write(json.dumps(cell) + "\n")
                print(f"{row:18s} seed {seed}: MRR {100 * cell['mrr']:.2f} few-shot {100 * cell['fewshot_mrr']:.2f} "
                      f"EC macro-F1 {100 * cell['ec_macro_f1']:.2f} ({cell['seconds']:.0f} s)", flush=True)
    print(table(read_cells([out], key), args.setting))
    return 0


if __name__ == "__main__":
    sys.exit(main())
