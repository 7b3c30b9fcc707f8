"""Federated node classification vs local-only vs centralised training, at the same ε per site.

Bundled Cora split among ``--sites`` sites (``graphveil.data.partition``, random nodes by default).
Per method (DP-MLP, GAP) and seed:

* **local-only**: each site trains alone on its part, ``rounds × local-steps`` steps (GAP: its
  encoder and aggregates once), σ calibrated so that the site's ε is the target;
* **federated**: the real site code (``handle_train``: policy, ledger reservation, DP rounds)
  for ``rounds`` rounds of ``local-steps`` steps, the server's FedAvg in between (round 1 from
  the task's seeded initialisation); GAP shares its encoder with the classifier (each round a
  site trains the encoder from the server's, round 1 from ``encoder_seed``) and recomputes its
  aggregates at the site, so its σ is calibrated to ``rounds`` times those releases plus all the
  steps; each site's ledger is checked to hold at most the target; each site is evaluated on the
  aggregates of its last round with the final global classifier;
* **centralised**: one run on the union of the parts (the same nodes, the edges the partition
  cut included), ``rounds × local-steps`` steps, σ calibrated for the target on the whole graph.

Accuracy is on the test nodes, pooled over the sites: each site's part as its ClientApp reads
it (``graph.pt``: node ids ``0..n-1`` of the part), split by the keyed ``random_node`` rule (15 %
test, a site's default), so the sites' test nodes are a random 15 % of each part, and the
centralised run's a random 15 % of Cora keyed on Cora's ids — the same rule, not the same nodes. Local-only and
federated runs share each site's split. Mean ± 95 % CI over the seeds.

    python bench/fed_node_comparison.py --seeds 0 1 2 --epsilon 8 [--by random] [--methods dp_mlp gap]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
DELTA = 1e-4
D = 168  # Cora's largest out-degree: paper 4's node-level class holds the graph and every part

MLP_TASK: dict[str, Any] = {
    "task": {"name": "node_classification"},
    "model": {"name": "mlp", "hidden": 64, "layers": 2, "activation": "selu"},
    "sampler": {"name": "node_uniform_wor", "batch_size": 64},
    "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
    "accountant": {"name": "node_rdp"},
    "training": {"optimizer": "adam", "lr": 0.01},
}
GAP_TASK: dict[str, Any] = {
    **MLP_TASK,
    "method": {"name": "gap", "hops": 2, "hidden": 32, "encoder_layers": 1,
               "encoder_training": {"epochs": 5, "batch_size": 64, "lr": 0.01, "clip_norm": 1.0}},
    "task": {"name": "node_classification", "features": "released:gap_aggregates"},
    "model": {"name": "mlp", "hidden": 32, "layers": 2, "activation": "selu"},
}
TASKS = {"dp_mlp": MLP_TASK, "gap": GAP_TASK}


def _config(task: dict[str, Any], *, sigma: float, steps: int, seed: int) -> Any:
    from graphveil.run.config import config_from_dict

    raw = {**task, "name": "fed-node-bench", "seed": seed,
           "data": {"source": "planetoid", "split": {"kind": "random_node"}},  # 10 % val, 15 % test: a site's default
           "model": {**task["model"], "seed": seed},
           **({"method": {**task["method"], "encoder_seed": seed}} if "method" in task else {}),
           "training": {**task["training"], "steps": steps},
           "privacy": {"noise_multiplier": sigma, "delta": DELTA, "unit": f"node/replacement/D={D}/predictions"},
           "output": {"progress": False}}
    return config_from_dict(raw, "bench")


def _session(task: dict[str, Any], graph: Any, *, sigma: float, steps: int, seed: int) -> Any:
    from graphveil.run.session import TrainingSession

    return TrainingSession(_config(task, sigma=sigma, steps=steps, seed=seed), graph=graph)


def calibrate(task: dict[str, Any], graphs: list[Any], *, target: float, steps: int, release_times: int) -> float:
    """Smallest σ (to 0.5 %) whose ε on every graph is ≤ ``target``: ``release_times`` × the plan's
    releases before training plus ``steps`` DP-SGD steps, composed in RDP."""
    from graphveil.privacy.conversion import rdp_to_epsilon

    sessions = []
    for graph in graphs:
        s = _session(task, graph, sigma=1.0, steps=steps, seed=0)
        s.prepare_accounting()
        sessions.append(s)

    def epsilon(sigma: float) -> float:
        worst = 0.0
        for s in sessions:
            s.noise_multiplier = sigma
            releases = s.planned_rdp(0)
            curve = release_times * releases + (s.planned_rdp(steps) - releases)
            worst = max(worst, rdp_to_epsilon(s.accountant.orders, curve, DELTA)[0])
        return worst

    lo, hi = 0.05, 500.0
    while hi / lo > 1.005:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if epsilon(mid) <= target else (mid, hi)
    return hi


def _as_site_reads(path: Path) -> Any:
    """A site's ``graph.pt`` as its ClientApp reads it (``data-source = "pyg"``)."""
    from graphveil.connectors.flower.partition import load_source
    from graphveil.connectors.flower.site import _as_node_graph
    from graphveil.data import NodeGraph

    graph = load_source(source="pyg", path=str(path))
    return graph if isinstance(graph, NodeGraph) else _as_node_graph(graph)


def _test_hits(session: Any, state: dict[str, torch.Tensor] | None = None) -> tuple[float, int, float]:
    """Correct test predictions, test nodes, and the hits of predicting the training majority class.
    ``state``: the global model's weights (a release's shared weights, GAP's encoder, are left out:
    the site's aggregates were computed in its last round)."""
    from graphveil.run.session import RELEASE_KEY

    if state is not None:
        session.load_trainable_state({k: v for k, v in state.items() if RELEASE_KEY not in k})
    scores = session.evaluate()
    n = int(session.task.split.test.numel())
    return scores["test_accuracy"] * n, n, scores["majority_accuracy"] * n


def local_only(task: dict[str, Any], parts: list[Any], *, target: float, steps: int, seed: int) -> dict[str, float]:
    sigma = calibrate(task, parts, target=target, steps=steps, release_times=1)
    hits = total = majority = 0.0
    for part in parts:
        s = _session(task, part, sigma=sigma, steps=steps, seed=seed)
        s.train(steps)
        h, n, m = _test_hits(s)
        hits, total, majority = hits + h, total + n, majority + m
    return {"accuracy": hits / total, "sigma": sigma, "majority": majority / total}


def centralised(task: dict[str, Any], graph: Any, *, target: float, steps: int, seed: int) -> dict[str, float]:
    sigma = calibrate(task, [graph], target=target, steps=steps, release_times=1)
    s = _session(task, graph, sigma=sigma, steps=steps, seed=seed)
    s.train(steps)
    h, n, m = _test_hits(s)
    return {"accuracy": h / n, "sigma": sigma, "majority": m / n}


def federated(task: dict[str, Any], parts: list[Any], files: list[Path], *, target: float, rounds: int,
              local_steps: int, seed: int, work: Path) -> dict[str, float]:
    """The real ClientApp round handling (policy, ledger, reservation) at each site; FedAvg between."""
    from flwr.supercore.task_identity import TaskIdentity

    from graphveil.connectors.flower import records
    from graphveil.connectors.flower.settings import _flatten
    from graphveil.connectors.flower.site import _real_session, handle_train
    from graphveil.ledger import PrivacyLedger, init_ledger

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0  # Messages outside a Flower task
    releases = 1 if "method" in task else 0
    sigma = calibrate(task, parts, target=target, steps=rounds * local_steps, release_times=rounds * releases)
    fed_task = {k: v for k, v in task.items()}
    fed_task["model"] = {**task["model"], "seed": seed}
    if "method" in task:  # GAP: every site's first encoder alike (later rounds: the server's)
        fed_task["method"] = {**task["method"], "encoder_seed": seed}
    fed_task["privacy"] = {"noise_multiplier": sigma}
    run_config = {"num-server-rounds": rounds, "local-steps": local_steps, "min-sites": len(parts),
                  **{f"task.{k}": v for k, v in _flatten(fed_task).items()}}
    sites, ledgers = [], Path(tempfile.mkdtemp(dir=work, prefix="ledgers-"))  # fresh ledgers per run
    for i, path in enumerate(files):
        cfg = {"site-name": f"site-{i + 1}", "data-source": "pyg", "data-path": str(path), "epsilon-budget": target,
               "delta": DELTA, "task-kind": "node_classification", "privacy-unit": "node", "degree-bound": D,
               "ledger": str(ledgers / f"site-{i + 1}.sqlite"), "min-noise-multiplier": 0.05,
               "seed": seed, "max-steps-per-round": local_steps}
        init_ledger(cfg["ledger"], site=cfg["site-name"]).close()
        sites.append(cfg)
    from flwr.app import Context, RecordDict

    state: dict[str, torch.Tensor] = {}
    last: list[Any] = []
    for server_round in range(1, rounds + 1):
        replies, last = [], []
        for i, cfg in enumerate(sites):
            def factory(config: Any, records_store: Any = None, sink: list[Any] = last) -> Any:
                sink.append(_real_session(config, records_store=records_store))
                return sink[-1]

            ctx = Context(run_id=1, node_id=i + 1, node_config=cfg, state=RecordDict(), run_config=run_config)
            reply = handle_train(records.train_content(records.arrays_from_state(state), server_round, local_steps),
                                 ctx, session_factory=factory)
            status = dict(reply.config_records[records.SITE])
            if status["status"] != records.TRAINED:
                raise RuntimeError(f"round {server_round}: {cfg['site-name']} {status}")
            replies.append(records.state_from_arrays(reply.array_records[records.ARRAYS]))
        state = {k: torch.stack([r[k] for r in replies]).mean(dim=0) for k in replies[0]}  # FedAvg, equal steps
    spent = []
    for cfg in sites:
        with PrivacyLedger(cfg["ledger"], create=False) as ledger:
            spent.append(ledger.spent_epsilon())
    if max(spent) > target * (1 + 1e-6):
        raise RuntimeError(f"a site's ledger holds ε={max(spent)} > target {target}")
    hits = total = majority = 0.0
    for session in last:  # each site's last-round session (GAP: its aggregates) with the final global model
        h, n, m = _test_hits(session, state)
        hits, total, majority = hits + h, total + n, majority + m
    return {"accuracy": hits / total, "sigma": sigma, "epsilon_max": max(spent), "majority": majority / total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epsilon", type=float, default=8.0, help="ε per site (δ = 1e-4)")
    parser.add_argument("--sites", type=int, default=3)
    parser.add_argument("--by", default="random", choices=("random", "labels", "communities"))
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--methods", nargs="+", default=["dp_mlp", "gap"], choices=sorted(TASKS))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--local-steps", type=int, default=25)
    parser.add_argument("--json", help="also write the cells here (JSON lines)")
    args = parser.parse_args(argv)

    from graphveil.connectors.flower.partition import load_source, write_node_graph
    from graphveil.data.partition import partition_graph
    from graphveil.run.runner import mean_ci95

    torch.set_num_threads(1)
    load_start, started = os.getloadavg(), time.time()
    cora = load_source(source="planetoid", name="cora")
    split = partition_graph(cora, args.sites, kind=args.by, seed=0, alpha=args.alpha)
    parts = split.parts(cora)
    work = Path(tempfile.mkdtemp(prefix="fed-node-bench-"))
    files = [write_node_graph(p, work / f"site-{i + 1}") for i, p in enumerate(parts)]
    parts = [_as_site_reads(f) for f in files]  # the parts as the sites read them (their node ids, splits)
    steps = args.rounds * args.local_steps
    rows, cells = [], []
    for method in args.methods:
        task = TASKS[method]
        results: dict[str, list[float]] = {"local-only": [], "federated": [], "centralised": []}
        sigmas: dict[str, float] = {}
        majority: dict[str, float] = {}
        for seed in args.seeds:
            for name in ("local-only", "federated", "centralised"):
                if name == "local-only":
                    out = local_only(task, parts, target=args.epsilon, steps=steps, seed=seed)
                elif name == "federated":
                    out = federated(task, parts, files, target=args.epsilon, rounds=args.rounds,
                                    local_steps=args.local_steps, seed=seed, work=work)
                else:
                    out = centralised(task, cora, target=args.epsilon, steps=steps, seed=seed)
                cell = {"method": method, "setting": name, "seed": seed, **out}
                cells.append(cell)
                results[name].append(cell["accuracy"])
                sigmas[name] = cell["sigma"]
                majority[name] = cell["majority"]
                print(json.dumps(cell), file=sys.stderr)
        rows.append((method, {k: mean_ci95(v) for k, v in results.items()}, sigmas, majority))
    load_end = os.getloadavg()
    print(f"Cora, {args.sites} sites ({args.by}{f', α={args.alpha}' if args.by == 'labels' else ''}: "
          f"cut {split.cut_edges} of {split.num_edges} edges, {split.cut_fraction:.1%}), ε = {args.epsilon} per site, "
          f"δ = {DELTA}, node level D = {D}; {args.rounds} rounds × {args.local_steps} local steps; "
          f"seeds {args.seeds}")
    print("\n| method | local-only | federated | centralised | σ (local / fed / central) | majority class "
          "(sites / central) |\n|---|---|---|---|---|---|")
    for method, stats, sigmas, majority in rows:
        cell = [f"{100 * m:.1f} ± {100 * h:.1f}" for m, h in (stats[k] for k in ("local-only", "federated", "centralised"))]
        sig = " / ".join(f"{sigmas[k]:.3g}" for k in ("local-only", "federated", "centralised"))
        print(f"| {method} | {cell[0]} | {cell[1]} | {cell[2]} | {sig} | {100 * majority['federated']:.1f} / "
              f"{100 * majority['centralised']:.1f} |")
    print(f"\n{platform.node()}: {os.cpu_count()} cores, load {load_start[0]:.2f} → {load_end[0]:.2f}, "
          f"{time.time() - started:.0f} s")
    if args.json:
        Path(args.json).write_text("".join(json.dumps(c) + "\n" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
