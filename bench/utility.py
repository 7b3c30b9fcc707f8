"""Utility benchmark: the demo's comparison at sizes where DP has a fairer chance.

Same rows as ``graphveil demo --setting citeseer-minilm-lora`` (base, non-private, entity-level standard clipping, entity-level
FREQ-CLIP, edge-level), same bundled CiteSeer graph and transfer split, but more steps, larger
batches and several ε targets. Prints a markdown table (for the README) and writes JSON lines.

    python bench/utility.py --steps 150 --batch-size 512 --epsilons 4 10 --out bench/results/utility.jsonl

Takes up to about an hour on 2 CPU cores at the default sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from graphveil.apps.demo import BASE, demo_configs
from graphveil.data import load_graph
from graphveil.run.config import merge_config
from graphveil.run.outputs import dumps
from graphveil.run.runner import run_training


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--batch-size", type=int, default=512, help="expected tuples per step")
    ap.add_argument("--k-neg", type=int, default=4)
    ap.add_argument("--degree-cap", type=int, default=5)
    ap.add_argument("--lora-layers", type=int, default=1)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[4.0, 10.0])
    ap.add_argument("--seed", type=int, default=None,
                    help="fix the SAMPLING seed (reproducible batches); default: fresh; noise is always CSPRNG")
    ap.add_argument("--out", type=Path, default=Path("bench/results/utility.jsonl"))
    args = ap.parse_args(argv)

    runs_root = args.out.parent / f"utility-runs-{time.strftime('%Y%m%d-%H%M%S')}"
    rows = []
    graph = None
    for i, eps in enumerate(args.epsilons):
        base = merge_config(BASE, {
            "seed": args.seed,
            "training": {"steps": args.steps, "lr": args.lr},
            "encoder": {"lora_layers": args.lora_layers},
        })
        sampler = {"batch_size": args.batch_size, "k_neg": args.k_neg, "degree_cap": args.degree_cap}
        configs = demo_configs(root=runs_root / f"eps{eps:g}", progress=True, base=base,
                               sampler=sampler, target_epsilon=eps, setting="citeseer-minilm-lora")
        for label, cfg in configs:
            private = cfg.privacy.enabled
            if i > 0 and not private:
                continue  # base and non-private rows do not depend on ε
            graph = graph or load_graph(cfg.data)
            result = run_training(cfg, graph=graph)
            row = {**result["row"], "name": label, "target_epsilon": eps if private else None,
                   "batch_size": args.batch_size, "steps": cfg.training.steps}
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(dumps(r) + "\n" for r in rows), encoding="utf-8")
    print("\n| method | PREC@1 | MRR | ε spent | σ | steps |\n|---|---|---|---|---|---|")
    for r in rows:
        eps = r["epsilon"]
        eps_text = "∞" if isinstance(eps, float) and eps == float("inf") else f"{eps:.2f}"
        print(f"| {r['name']} | {100 * r['prec1']:.2f} | {100 * r['mrr']:.2f} | {eps_text} | "
              f"{r['noise_multiplier']:.3f} | {r['steps']} |")
    print(f"\ncommand: python bench/utility.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
