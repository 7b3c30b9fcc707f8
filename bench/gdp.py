"""Paper 4's Table 2 (Cora column) and extra datasets: GDP methods, accuracy ± 95 % CI over seeds.

Each row is a run config of ``examples/`` with overrides, run once per seed through the same
sweep cells as ``graphveil run`` (seed → sampling, split key, initialisation). Results are
appended to a JSON-lines file as each cell finishes, and cells already there are skipped, so
a long benchmark can be resumed or split across processes (``--rows``) and summed up later
(``--table-only``). Prints a markdown table for the README.

    python bench/gdp.py --dataset cora --seeds 5 --out bench/results/gdp_cora.jsonl
    python bench/gdp.py --table-only --out bench/results/gdp_cora.jsonl
    python bench/gdp.py --rows 4 --set method.encoder_dropout=0.5 --out /tmp/gap_edge_dropout.jsonl

Datasets (``--dataset``): ``cora`` (bundled with GraphVeil), ``citeseer`` (Planetoid raw files)
and ``twitch`` (MUSAE Twitch ENGB, label: mature) from the project's data folder (``--data``,
default ``shared/data`` next to the repository; not shipped to users). Every dataset gets the
same protocol: dp-gnn's preprocessing (CiteSeer: its 48 isolated nodes removed, 3327 → 3279
nodes, while PyG's 15 zero-feature rows padded in for missing test documents have edges and stay,
with class 0; Twitch ENGB: nothing removed) and the keyed 0.1 / 0.15 random node split.

Every row states its guarantee: the table's ``unit`` column is the run's ``privacy.unit`` (as
``privacy.json`` reports it; ``–`` for a run without privacy) and ``δ`` its δ (the default rule
over the unit's count: directed adjacency entries, undirected edges or training nodes). The edge
rows run at both edge units at the same ε: ``edge/replacement/predictions`` (one directed
adjacency entry, paper 4's edge GDP, which on an undirected graph protects one direction of a
citation only) and ``undirected_edge/replacement/predictions`` (both entries: GAP's and DPDGC's
sensitivities × √2, DP-Emb's group 2). RandEdge decides each unordered pair once, so its
release is the same ε-DP mechanism at both units.

About 1.5 h for all Cora rows at 5 seeds on 2 CPU cores (see the README for measured times).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from graphveil.contract.host import PluginHost, default_host
from graphveil.run.config import load_config
from graphveil.run.runner import mean_ci95, read_cells, run_training, sweep_cell

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
#: the project's offline datasets (shared/data next to the repository; see its README.md)
DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
#: dataset → (folder under --data or None for bundled data, overrides of the Cora examples' data section)
DATASETS: dict[str, tuple[str | None, list[str]]] = {
    "cora": (None, ["data.name=cora"]),
    "citeseer": ("planetoid/CiteSeer", ["data.name=citeseer"]),
    "twitch": ("social/musae_twitch_ENGB", ["data.source=twitch", "data.name=ENGB"]),
}
#: D of the node-level rows: paper 4's 100 where the graph's largest out-degree allows it, else that
#: degree (Cora 168, CiteSeer 99, Twitch ENGB 720). Node level refuses a graph above D instead of
#: capping it (no cap of a raw graph keeps the node-level sensitivities; issue 25), where paper 4
#: subsamples to D = 100.
NODE_D = {"cora": 168, "citeseer": 100, "twitch": 720}
EDGE = "edge/replacement/predictions"
UNDIRECTED = "undirected_edge/replacement/predictions"
NODE = f"node/replacement/D={NODE_D['cora']}/predictions"
K1 = "k_neighbor/replacement/k=1/predictions"
#: paper 4's dropout: 0.5 non-private and at edge level, 0 at node and k-neighbor level
DROPOUT = ["model.dropout=0.5"]
#: paper 4 (App. K) trains "without mini-batching whenever the training does not involve a
#: DP-optimizer and the method has better performance": full batch or 64 per row, chosen by mean
#: validation accuracy over seeds 0-2 on Cora (README: full wins for the non-private rows and
#: edge DPDGC, batch 64 for edge GAP)
FULL_BATCH = [*DROPOUT, "sampler.batch_size=null"]
#: GAP passes the same dropout to its encoder DP-MLP (GAP's code and paper 4's GAP-edge.sh);
#: without it the edge row was 3.1 points low (README)
GAP_DROPOUT = ["method.encoder_dropout=0.5"]

#: DP-Emb at node / k-neighbor level: one full-batch step at σ · scale (group of 2D + 1 or k + 1
#: rows, no amplification): most of the budget goes to the classifier
GRAPH_SHARE = "method.noise_scale={} method.embedding_training.epochs=1"
#: DP-Emb without that group (non-private, edge level): 100 epochs at σ (the example ships the
#: node-level share above)
EMB_FULL = ["method.noise_scale=1", "method.embedding_training.epochs=100"]

#: (setting, method, config, overrides, target ε or None for non-private, paper 4's Cora value)
ROWS: list[tuple[str, str, str, list[str], float | None, float | None]] = [
    ("non-private", "DPDGC", "dpdgc_cora.yaml", [*FULL_BATCH, *EMB_FULL], None, 82.44),
    ("non-private", "GAP", "gap_cora.yaml", [*FULL_BATCH, *GAP_DROPOUT], None, 86.53),
    ("non-private", "MLP", "dp_mlp_cora.yaml", FULL_BATCH, None, 76.48),
    ("edge ε=1", "DPDGC", "dpdgc_cora.yaml", [f"privacy.unit={EDGE}", *FULL_BATCH, *EMB_FULL], 1.0, 77.71),
    ("edge ε=1", "GAP", "gap_cora.yaml", [f"privacy.unit={EDGE}", *DROPOUT, *GAP_DROPOUT], 1.0, 76.95),
    ("undirected edge ε=1", "RandEdge+SAGE", "rand_edge_sage_cora.yaml", DROPOUT, 1.0, 59.95),
    ("non-private", "SAGE", "rand_edge_sage_cora.yaml", DROPOUT, None, 84.19),
    ("N1 ε=16", "DPDGC", "dpdgc_cora.yaml", [f"privacy.unit={K1}", *GRAPH_SHARE.format(50).split()], 16.0, 59.98),
    ("node ε=16", "DPDGC", "dpdgc_cora.yaml", [f"privacy.unit={NODE}", *GRAPH_SHARE.format(1000).split()],
     16.0, 58.97),
    ("node ε=16", "GAP", "gap_cora.yaml", [f"privacy.unit={NODE}"], 16.0, 54.36),
    ("node ε=16", "DP-MLP", "dp_mlp_cora.yaml", [], 16.0, 64.29),
    ("node ε=16", "DP-SAGE", "dp_sage_cora.yaml", [], 16.0, 15.86),
    # the edge rows at the undirected-edge unit (issue 25): paper 4 reports the directed entry only;
    # RandEdge's release is the same mechanism at both units, so the paper's value stands beside both
    ("undirected edge ε=1", "DPDGC", "dpdgc_cora.yaml", [f"privacy.unit={UNDIRECTED}", *FULL_BATCH, *EMB_FULL],
     1.0, None),
    ("undirected edge ε=1", "GAP", "gap_cora.yaml", [f"privacy.unit={UNDIRECTED}", *DROPOUT, *GAP_DROPOUT],
     1.0, None),
    ("edge ε=1", "RandEdge+SAGE", "rand_edge_sage_cora.yaml", [f"privacy.unit={EDGE}", *DROPOUT], 1.0, 59.95),
]
#: table order (row numbers stay stable for --rows, resuming and the README's references)
DISPLAY = [0, 1, 2, 6, 3, 4, 14, 12, 13, 5, 7, 8, 9, 10, 11]


def key(setting: str, method: str, dataset: str, seed: int) -> str:
    return f"{dataset}|{setting}|{method}|{seed}"


def done(paths: list[Path]) -> dict[str, dict[str, Any]]:
    return read_cells(paths, lambda c: key(c["setting"], c["method"], c["dataset"], c["seed"]))


def guarantee(row: int, data: list[str], host: PluginHost, graphs: dict[str, Any]) -> tuple[str, str]:
    """(unit, δ) of a row's runs as ``privacy.json`` states them: the sampler's privacy unit and δ
    (explicit, or the default rule over the unit's count on this dataset); ``–`` without privacy.
    ``graphs`` caches the loaded dataset across rows."""
    from graphveil.run.session import TrainingSession

    _, _, config, overrides, eps, _ = ROWS[row]
    if eps is None:
        return "–", "–"
    cfg = sweep_cell(load_config(EXAMPLES / config, [*data, *overrides]), eps, 0, Path("unused"), host)
    session = TrainingSession(cfg, host=host)
    session.assemble()
    name = "|".join(data)
    if name not in graphs:
        graphs[name] = session.load_data()
    session.task.setup(graphs[name], cfg.data.split)
    session._choose_delta()  # the session's own rule, as a run applies it
    return session.sampler.unit.value, f"{session.delta:g}"


def table(cells: dict[str, dict[str, Any]], dataset: str, data: list[str], host: PluginHost) -> str:
    """The markdown table; every row states its unit and δ. A cell that recorded another unit or δ
    than its row's config gives now (a stale result) is refused."""
    lines = [f"| {dataset} | method | unit | δ | test acc (%) | paper 4 | seeds | σ | s / run |",
             "|---|---|---|---|---|---|---|---|---|"]
    graphs: dict[str, Any] = {}
    for i in DISPLAY:
        setting, method, *_, eps, paper = ROWS[i]
        runs = [c for c in cells.values() if (c["setting"], c["method"], c["dataset"]) == (setting, method, dataset)]
        if not runs:
            continue
        unit, delta = guarantee(i, data, host, graphs)
        for c in runs:
            if (c.get("unit", unit), c.get("delta", delta)) != (unit, delta):
                raise SystemExit(f"bench/gdp.py: cell {key(setting, method, dataset, c['seed'])} ran at unit "
                                 f"{c.get('unit')!r}, δ {c.get('delta')!r}; row {i} now states {unit!r}, δ {delta}: "
                                 "remove the stale cell or restore the row")
        mean, half = mean_ci95([100 * c["test_accuracy"] for c in runs])
        sigmas = sorted({float(f"{c['noise_multiplier'] or 0:.3g}") for c in runs})
        sigma = sigmas[-1]
        # σ can differ by seed: the keyed split's training-node count sets steps and batch (e.g. b = n)
        sigma_text = ("–" if not sigma else f"{sigma:.3g}" if len(sigmas) == 1
                      else f"{sigmas[0]:.3g}–{sigmas[-1]:.3g}")
        if eps is not None and not sigma:  # private without Gaussian noise: randomized response, pure ε
            delta = "0 (pure ε)"
        seconds = sum(c["seconds"] for c in runs) / len(runs)
        ci = "" if half != half else f" ± {half:.2f}"  # nan: one seed
        ref = "–" if paper is None or dataset != "cora" else f"{paper:.2f}"
        lines.append(f"| {setting} | {method} | {unit} | {delta} | {mean:.2f}{ci} | {ref} | {len(runs)} | "
                     f"{sigma_text} | {seconds:.0f} |")
    return "\n".join(lines)


def data_overrides(dataset: str, root: Path) -> list[str]:
    """The ``data.*`` overrides that point the Cora examples at ``dataset``."""
    folder, overrides = DATASETS[dataset]
    if folder is None:
        return list(overrides)
    path = root / folder
    if not path.is_dir():
        raise SystemExit(f"bench/gdp.py: {dataset}: no folder {path} (set --data to the folder holding "
                         f"{folder}; see shared/data/README.md)")
    return [*overrides, f"data.path={path}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="cora", choices=list(DATASETS))
    ap.add_argument("--data", type=Path, default=DATA, help=f"offline datasets folder (default: {DATA})")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rows", default="", help="comma-separated row numbers (0-based) to run; default all")
    ap.add_argument("--out", type=Path, action="append", help="JSON-lines results (repeatable for --table-only)")
    ap.add_argument("--table-only", action="store_true", help="print the table of the results so far")
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="override appended to every chosen row (repeatable; with its own --out: the "
                         "results file does not record it), e.g. --set method.encoder_dropout=0.5")
    args = ap.parse_args(argv)
    outs = args.out or [Path(f"bench/results/gdp_{args.dataset}.jsonl")]
    host = default_host()
    data = data_overrides(args.dataset, args.data)
    if not args.table_only:
        chosen = [int(i) for i in args.rows.split(",") if i] or range(len(ROWS))
        runs = Path("runs/bench-gdp") / args.dataset
        if args.extra:  # run folders of their own: the table's runs are not replaced
            runs = runs / ("set-" + hashlib.sha256("\n".join(args.extra).encode()).hexdigest()[:8])
        for i in chosen:
            setting, method, config, overrides, eps, _ = ROWS[i]
            if setting.startswith("node") and config != "dp_mlp_cora.yaml":  # the dataset's D
                overrides = [*overrides, f"privacy.unit=node/replacement/D={NODE_D[args.dataset]}/predictions"]
            for seed in range(args.seeds):
                if key(setting, method, args.dataset, seed) in done(outs):
                    continue
                base = load_config(EXAMPLES / config, [*data, *overrides, *args.extra, "output.progress=false"])
                cfg = sweep_cell(base, eps, seed, runs / f"row{i}", host)
                # a run folder without a result line is an interrupted cell: run it again from scratch
                shutil.rmtree(cfg.output.dir, ignore_errors=True)
                started = time.perf_counter()
                result = run_training(cfg, host=host)
                row, report = result["row"], result["session"].privacy_report()
                cell = {"dataset": args.dataset, "setting": setting, "method": method, "seed": seed,
                        "test_accuracy": row["test_accuracy"], "val_accuracy": row["val_accuracy"],
                        "epsilon": row["epsilon"], "noise_multiplier": row["noise_multiplier"],
                        # the guarantee as privacy.json states it (the table checks it against the row)
                        "unit": report["unit"] or "–", "delta": f"{report['delta']:g}" if report["private"] else "–",
                        "seconds": time.perf_counter() - started}
                with outs[0].open("a") as f:
                    f.write(json.dumps(cell) + "\n")
                print(f"{setting:20s} {method:7s} {cell['unit']} seed {seed}: acc {100 * row['test_accuracy']:.2f} "
                      f"ε {row['epsilon']:.3f} ({cell['seconds']:.0f} s)", flush=True)
    print(table(done(outs), args.dataset, data, host))
    return 0


if __name__ == "__main__":
    sys.exit(main())
