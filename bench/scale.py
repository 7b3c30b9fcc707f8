"""Scale benchmark (issue 28.3): time and peak memory per stage of four runs on synthetic graphs
of 10⁵, 10⁶ and 10⁷ undirected edges, and the fitted growth exponent of every stage.

Graphs: :func:`graphveil.data.synthetic.block_csbm` (5 classes, 32 Gaussian features, mean
degree 20, homophily 0.8; ``--graph power_law`` for :func:`~graphveil.data.synthetic.power_law_graph`),
written once per size with :func:`~graphveil.data.synthetic.write_parquet` into ``--work`` and read
back through the ``parquet`` source, so "load" is the real loader. Runs (``--methods``):

* ``relational_edge`` — the demo's edge-level relational run (``examples/cora_features_edge.yaml``:
  Poisson tuples + decoupled negatives, per-tuple clipping, a weight per feature);
* ``relational_entity`` — the same at entity level with paper 2's degree cap K = 5, coupled
  Poisson/WOR sampling, FREQ-CLIP and its Thm 3 accountant (``examples/entity_freq_clip.yaml``'s
  privacy pieces on the feature encoder);
* ``dp_mlp`` — paper 4's DP-MLP at node level (``examples/dp_mlp_cora.yaml``);
* ``gap_edge`` / ``gap_node`` — GAP at edge level and at node level with D = the graph's largest
  degree (``examples/gap_cora.yaml``; its encoder trains 100 steps too).

Every training stage runs 100 steps (``training.steps``; GAP's encoder ``epochs`` set to 100
batches). Stages, as :class:`~graphveil.run.session.TrainingSession` runs them: ``load``
(``load_data``), ``split`` (``task.setup``), ``sampler`` (``sampler.prepare``: the degree bound,
cap or record set), ``calibrate`` (``accountant.calibrate``), ``prepare`` (the plan's releases
before training — GAP's encoder and PMA —, the model and optimizer), ``train`` (100 steps), ``evaluate``.
Beside them, ``reference`` (:func:`reference_passes`): plain O(E) tensor passes over the loaded
edges, no GraphVeil code, the yardstick for what linear work grows at on this machine.

Each (method, size) cell runs in a fresh process (``--timeout`` seconds at most); its peak RSS
per stage is Linux's ``VmHWM``, reset before each stage (``/proc/self/clear_refs``), and the
parent kills a cell whose RSS passes ``--max-rss-gb`` and records it as failed with the stage
it was in. Cells run one at a time. Results: JSON lines in ``--out`` (a cell already there is
skipped, so a run can be resumed), a markdown table with the least-squares slope of
log(time) on log(edges) per stage, and a log–log plot (``--plot``).

    python bench/scale.py --sizes 1e5 1e6 1e7 --out bench/results/scale.jsonl --plot docs/img/scale_stages.png
    python bench/scale.py --table-only --out bench/results/scale.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
METHODS = ("relational_edge", "relational_entity", "dp_mlp", "gap_edge", "gap_node")
STAGES = ("load", "reference", "split", "sampler", "calibrate", "prepare", "train", "evaluate")
STEPS = 100
#: mean degree of the generated graphs: n = 2E / DEGREE nodes
DEGREE = 20
FEATURES, CLASSES = 32, 5
#: a stage shorter than this is noise at every size: its slope is not reported
MIN_SECONDS = 0.05
#: one colour per stage in every panel (matplotlib's cycle without its grey: the reference is grey)
STAGE_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9")


# ------------------------------------------------------------------------------------------- configs


def _node_base(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "data": {**data, "split": {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.15,
                                   "seed": 0}},
        "task": {"name": "node_classification"},
        "model": {"name": "mlp", "hidden": 64, "layers": 2, "activation": "selu", "dropout": 0.0},
        "sampler": {"name": "node_uniform_wor", "batch_size": 64},
        "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
        "accountant": {"name": "node_rdp"},
        "training": {"steps": STEPS, "optimizer": "adam", "lr": 0.001},
        "privacy": {"target_epsilon": 8},
    }


def _gap(data: dict[str, Any], unit: str, train_nodes: int) -> dict[str, Any]:
    cfg = _node_base(data)
    cfg["method"] = {"name": "gap", "hops": 2, "hidden": 64, "encoder_layers": 2,
                     "encoder_training": {"epochs": STEPS * 64 / train_nodes, "batch_size": 64}}
    cfg["task"]["features"] = "released:gap_aggregates"
    cfg["privacy"]["unit"] = unit
    return cfg


def run_config(method: str, data: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    """The raw run config of ``method`` on the graph ``data`` (parquet options) described by ``meta``."""
    train_nodes = int(meta["nodes"] * 0.75)
    if method == "relational_edge":
        cfg = {
            "data": {**data, "split": {"train_fraction": 0.7, "seed": 0}},
            "sampler": {"name": "edge_poisson_decoupled", "batch_size": 256, "k_neg": 4},
            "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
            "accountant": {"name": "edge_rdp"},
            "encoder": {"name": "frozen_head", "model": "features", "head": "diagonal"},
            "training": {"steps": STEPS, "loss": "infonce", "optimizer": "adam", "lr": 0.01,
                         "temperature": 0.1},
            "evaluation": {"batch_size": 256},
            "privacy": {"target_epsilon": 8},
        }
    elif method == "relational_entity":
        cfg = run_config("relational_edge", data, meta)
        cfg.update(sampler={"name": "entity_poisson_wor", "batch_size": 256, "k_neg": 4, "degree_cap": 5},
                   clipper={"name": "freq_clip", "clip_norm": 1.0}, accountant={"name": "coupled_rdp_freq"},
                   name=f"scale-{method}")
        return cfg
    elif method == "dp_mlp":
        cfg = _node_base(data)
    elif method == "gap_edge":
        cfg = _gap(data, "edge/replacement/predictions", train_nodes)
    elif method == "gap_node":
        cfg = _gap(data, f"node/replacement/D={meta['max_degree']}/predictions", train_nodes)
    else:
        raise SystemExit(f"bench/scale.py: unknown method {method!r} (choose from {', '.join(METHODS)})")
    return {"name": f"scale-{method}", "seed": 0, "output": {"progress": False}, **cfg}


# ------------------------------------------------------------------------------------------- child


def _status_mb(key: str) -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak RSS (VmHWM) to the current RSS
        f.write("5")


class Stages:
    """Wall time and peak RSS of each stage; a stage entered twice adds its time up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu_seconds: dict[str, float] = {}
        self.peak_mb: dict[str, float] = {}

    def run(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        print(f"stage {name}", file=sys.stderr, flush=True)  # the parent names the stage a kill hits
        _reset_peak()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + time.process_time() - cpu
            self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), _status_mb("VmHWM"))

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        """Time every call of ``obj.attr`` as stage ``name`` (an instance attribute shadows the method)."""
        fn = getattr(obj, attr)
        setattr(obj, attr, lambda *a, **k: self.run(name, fn, *a, **k))


def reference_passes(graph: Any) -> None:
    """Plain O(E) tensor work on the loaded edges, no GraphVeil code: a copy, a comparison
    counted, a sum, three times each. Its exponent is what linear, memory-bound work grows at on
    this machine between the sizes (the edges outgrow the last-level cache), the yardstick for
    the stages' exponents."""
    edges = graph.edge_index if hasattr(graph, "edge_index") else graph.edges.t()
    for _ in range(3):
        edges.clone()
        int((edges[0] < edges[1]).sum())
        edges[0] + edges[1]


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from graphveil.contract.host import default_host
    from graphveil.run.config import config_from_dict
    from graphveil.run.session import TrainingSession

    torch.set_num_threads(spec["threads"])
    host = default_host()
    cfg = config_from_dict(spec["config"], f"scale:{spec['method']}")
    session = TrainingSession(cfg, host=host)
    session.assemble()
    before = _status_mb("VmRSS")
    stages = Stages()
    session.graph = stages.run("load", session.load_data)
    stages.run("reference", reference_passes, session.graph)
    stages.wrap(session.task, "setup", "split")
    stages.wrap(session.sampler, "prepare", "sampler")
    stages.wrap(session.accountant, "calibrate", "calibrate")
    session.prepare_accounting()
    stages.run("prepare", session.prepare)
    result = stages.run("train", session.train, STEPS if session.plan.trains else 0)
    evaluation = stages.run("evaluate", session.evaluate)
    # the whole run's peak is the largest stage peak: clear_refs also resets ru_maxrss
    return {"seconds": stages.seconds, "cpu_seconds": stages.cpu_seconds, "peak_mb": stages.peak_mb,
            "peak_mb_total": max(stages.peak_mb.values()), "rss_after_imports_mb": before,
            "sigma": session.noise_multiplier, "epsilon": result["epsilon"],
            "metric": {k: v for k, v in evaluation.items() if isinstance(v, float)}}


# ------------------------------------------------------------------------------------------- parent


def make_graph(kind: str, edges: int, folder: Path, seed: int) -> dict[str, Any]:
    """The graph's Parquet tables (generated in a child process, once) and its sizes."""
    meta_path = folder / "meta.json"
    if meta_path.is_file():
        return json.loads(meta_path.read_text())
    code = (
        "import json, sys, time, torch\n"
        "from graphveil.data.synthetic import block_csbm, power_law_graph, write_parquet\n"
        "kind, edges, folder, seed, degree, f, c = sys.argv[1:]\n"
        "edges, n = int(edges), 2 * int(edges) // int(degree)\n"
        "gen = torch.Generator().manual_seed(int(seed))\n"
        "make = block_csbm if kind == 'csbm' else power_law_graph\n"
        "start = time.perf_counter()\n"
        "data = make(n, edges, num_classes=int(c), num_features=int(f), generator=gen)\n"
        "seconds = time.perf_counter() - start\n"
        "options = write_parquet(data, folder)\n"
        "deg = torch.bincount(data.edge_index[0], minlength=n)\n"
        "print(json.dumps({'kind': kind, 'nodes': n, 'edges': data.edge_index.shape[1] // 2,\n"
        "                  'max_degree': int(deg.max()), 'generate_seconds': seconds, 'options': options}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, kind, str(edges), str(folder), str(seed), str(DEGREE),
                           str(FEATURES), str(CLASSES)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench/scale.py: generating {kind} with {edges} edges failed:\n{done.stderr[-3000:]}")
    meta = json.loads(done.stdout)
    meta_path.write_text(json.dumps(meta))
    return meta


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def run_cell(spec: dict[str, Any], timeout: float, max_rss_mb: float) -> dict[str, Any]:
    """One cell in a fresh process, watched: killed past ``timeout`` s or ``max_rss_mb`` MB of RSS."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=out, stderr=err)
        start, reason, sampled = time.monotonic(), None, 0.0
        while True:  # the parent samples the child's RSS: the kill rule's measure
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            sampled = max(sampled, _rss_mb(proc.pid))
            if reason is None and sampled > max_rss_mb:
                reason = f"RSS above {max_rss_mb:.0f} MB"
            elif reason is None and time.monotonic() - start > timeout:
                reason = f"timeout after {timeout:.0f} s"
            if reason:
                proc.kill()
            time.sleep(0.1)
        proc.returncode = status  # reaped above; keeps Popen from waiting again
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    stage = next((x.split()[1] for x in reversed(stderr.splitlines()) if x.startswith("stage ")), "setup")
    if reason is None and status != 0:
        reason = "error: " + (stderr.strip().splitlines() or ["(no message)"])[-1][:300]
    if reason is not None:
        return {"ok": False, "failed_stage": stage, "reason": reason, "sampled_peak_mb": sampled}
    return {"ok": True, **json.loads(stdout.strip().splitlines()[-1]), "sampled_peak_mb": sampled,
            "wall_seconds": time.monotonic() - start}


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of log y on log x (``None`` below two points)."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


def read_cells(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def table(cells: list[dict[str, Any]]) -> str:
    """Per method and stage: wall seconds (CPU seconds) / peak MB at each size, and the fitted
    exponents of CPU time (all sizes, and the two largest: fixed costs weigh less there), wall
    time and peak memory. CPU time is the process's own
    (``time.process_time``): other jobs on the machine stretch the wall time, not it."""
    sizes = sorted({c["edges"] for c in cells})
    head = " | ".join(f"{e:.0e} edges: s (CPU s) / MB" for e in sizes)
    lines = [f"| method | stage | {head} | exponent: CPU | CPU, last two sizes | wall | memory |",
             "|---|---|" + "---|" * len(sizes) + "---|---|---|---|"]

    def fit(points: list[tuple[float, float]]) -> str:
        k = slope(points) if max((y for _, y in points), default=0) >= MIN_SECONDS else None
        return "–" if k is None else f"{k:.2f}"

    for method in METHODS:
        mine = {c["edges"]: c for c in cells if c["method"] == method}
        if not mine:
            continue
        for stage in STAGES:
            row, walls, cpus, mems = [], [], [], []
            for e in sizes:
                c = mine.get(e)
                if c is None:
                    row.append("–")
                elif not c["ok"]:
                    row.append(f"failed ({c['reason']})" if c["failed_stage"] == stage else "–")
                elif stage in c["seconds"]:
                    s, cpu, mb = c["seconds"][stage], c["cpu_seconds"][stage], c["peak_mb"][stage]
                    row.append(f"{s:.2f} ({cpu:.2f}) / {mb:.0f}")
                    walls.append((e, s))
                    cpus.append((e, cpu))
                    mems.append((e, mb))
                else:
                    row.append("–")
            if all(r == "–" for r in row):
                continue
            k_m = slope(mems)
            lines.append(f"| {method} | {stage} | {' | '.join(row)} | {fit(cpus)} | {fit(cpus[-2:])} | {fit(walls)} | "
                         f"{'–' if k_m is None else f'{k_m:.2f}'} |")
        totals = [(e, c["peak_mb_total"]) for e, c in sorted(mine.items()) if c["ok"]]
        k_total = slope(totals)
        lines.append(f"| {method} | whole run: peak RSS (MB) | "
                     + " | ".join(f"{mine[e]['peak_mb_total']:.0f}" if e in mine and mine[e]["ok"] else "–"
                                  for e in sizes)
                     + f" | – | – | – | {'–' if k_total is None else f'{k_total:.2f}'} |")
    return "\n".join(lines)


def plot(cells: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in METHODS if any(c["method"] == m and c["ok"] for c in cells)]
    cols = min(2, len(methods))
    rows = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.8 * cols, 3.6 * rows), sharey=True, squeeze=False)
    for ax, method in zip(axes.flat, methods, strict=False):  # a 2 × 2 grid may have a spare panel
        ok = sorted((c for c in cells if c["method"] == method and c["ok"]), key=lambda c: c["edges"])
        for stage in STAGES:
            pts = [(c["edges"], c["cpu_seconds"][stage]) for c in ok if stage in c["cpu_seconds"]]
            if pts and max(s for _, s in pts) >= MIN_SECONDS:
                style = {"color": "0.5", "linestyle": "--", "label": "reference: plain O(E) passes"} \
                    if stage == "reference" else {"color": STAGE_COLOURS[STAGES.index(stage)], "label": stage}
                ax.plot(*zip(*pts, strict=True), marker="o", **style)
        xs = [c["edges"] for c in ok]
        if xs:  # a reference line of slope 1 through the first size's largest stage
            y0 = max(ok[0]["cpu_seconds"].values())
            ax.plot(xs, [y0 * x / xs[0] for x in xs], "k:", label="∝ edges")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(method)
        ax.set_xlabel("undirected edges")
        ax.grid(True, which="both", alpha=0.3)
    for row in axes:
        row[0].set_ylabel("CPU seconds per stage")
    for ax in list(axes.flat)[len(methods):]:
        ax.set_visible(False)
    legend = {}  # one colour per stage in every panel, one legend for all of them
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    spare = list(axes.flat)[len(methods):]
    if spare:
        spare[0].set_visible(True)
        spare[0].axis("off")
        spare[0].legend(legend.values(), legend.keys(), loc="center", fontsize=9)
    else:
        axes.flat[0].legend(legend.values(), legend.keys(), fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6, 1e7], help="undirected edges")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--graph", default="csbm", choices=("csbm", "power_law"))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "graphveil-scale",
                    help="folder for the generated Parquet graphs (kept across runs)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "scale.jsonl")
    ap.add_argument("--plot", type=Path, help="write the log–log plot (PNG) here")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per cell")
    ap.add_argument("--max-rss-gb", type=float, default=8.0, help="kill a cell above this RSS")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per cell")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if not args.table_only:
        for size in sorted(int(s) for s in args.sizes):
            meta = make_graph(args.graph, size, args.work / f"{args.graph}-{size}-seed{args.seed}", args.seed)
            for method in args.methods:
                key = (method, args.graph, size)
                if any((c["method"], c["graph"], c["edges"]) == key for c in read_cells(args.out)):
                    continue
                spec = {"method": method, "threads": args.threads,
                        "config": run_config(method, meta["options"], meta)}
                load = os.getloadavg()[0]
                cell = run_cell(spec, args.timeout, args.max_rss_gb * 1024)
                cell = {"method": method, "graph": args.graph, "edges": size, "nodes": meta["nodes"],
                        "max_degree": meta["max_degree"], "load_before": load, "load_after": os.getloadavg()[0],
                        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "threads": args.threads,
                        "machine": f"{os.cpu_count()} cores, {platform.machine()}", **cell}
                args.out.parent.mkdir(parents=True, exist_ok=True)
                with args.out.open("a") as f:
                    f.write(json.dumps(cell) + "\n")
                what = (f"{sum(cell['seconds'].values()):.1f} s, peak {cell['peak_mb_total']:.0f} MB"
                        if cell["ok"] else f"FAILED in {cell['failed_stage']}: {cell['reason']}")
                print(f"{method:16s} {size:>10,d} edges: {what} (load {load:.1f})", flush=True)
    cells = [c for c in read_cells(args.out) if c["graph"] == args.graph]
    print(table(cells))
    if args.plot:
        plot(cells, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
