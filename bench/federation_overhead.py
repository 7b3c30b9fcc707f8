"""Federation overhead: a three-site loopback federation vs the sites' local training.

Run from a source checkout (it starts SuperLink/SuperNodes through ``deploy/scripts``)::

    python bench/federation_overhead.py [--rounds 3] [--local-steps 5] [--model tiny-bert]

Each site holds a third of the bundled CiteSeer text graph. Three measurements of one round:

* ``federated``   wall time of a server round (send the adapter, every site runs its round in a
                  ClientApp process of its own, replies, aggregation), from the server's round
                  log; measured with the guard's spare ClientApp process (imported before the
                  task arrives) and, in the same run, without it (``GRAPHVEIL_CLIENTAPP_SPARE=0``:
                  the process starts when the task arrives); ``--spare on|off`` runs one only;
* ``local-fresh`` the same site work without Flower: three fresh Python processes, started
                  together, each doing what a ClientApp does (import, load and prepare the
                  site's graph, the local DP steps, held-out evaluation) — wall time, best of
                  two tries before and two after the federation;
* ``train-only``  the local DP steps alone, in a warm single-threaded process, summed over the
                  three sites (best of 2 each).

Overhead share = 1 − local-fresh / federated: the part of a round spent in Flower (process
start-up of the SuperExec/ClientApp machinery, messaging over TLS, serialisation, aggregation,
the ledger). Results: a table on stdout and ``federation_overhead.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS, LOCAL_STEPS = 3, 5


def _site_config(node_config: Path, run_config: dict, seed: int = 0):
    from graphveil.connectors.flower.settings import (
        FederationSettings,
        SiteSettings,
        site_run_config,
    )

    return site_run_config(FederationSettings.from_run_config(run_config), SiteSettings.from_toml(node_config), seed=seed)


def _app_run_config(overrides: dict) -> dict:
    import tomllib

    from flwr.common.config import flatten_dict

    from graphveil.connectors.flower.loopback import APP

    raw = tomllib.loads((APP / "pyproject.toml").read_text())
    return {**flatten_dict(raw["tool"]["flwr"]["app"]["config"]), **overrides}


def local_round(node_config: Path, run_config_json: str, steps: int) -> None:
    """One site round without Flower (the ``--local-round`` mode, run in a fresh process)."""
    from graphveil.session import TrainingSession

    config = _site_config(node_config, json.loads(run_config_json))
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    session = TrainingSession(config)
    session.prepare()
    session.train(steps)
    session.evaluate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--local-steps", type=int, default=LOCAL_STEPS)
    parser.add_argument("--model", default="tiny-bert", help="encoder model: tiny-bert or minilm")
    parser.add_argument("--batch-size", type=int, default=32, help="sampler batch size")
    parser.add_argument("--out", help="folder for the federation's files and the JSON result")
    parser.add_argument("--spare", choices=("both", "on", "off"), default="both",
                        help="federate with the guard's spare ClientApp process, without it, or both (default)")
    parser.add_argument("--local-round", nargs=3, metavar=("NODE_CONFIG", "RUN_CONFIG_JSON", "STEPS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.local_round:
        local_round(Path(args.local_round[0]), args.local_round[1], int(args.local_round[2]))
        return 0

    import torch

    from graphveil.connectors.flower.guard import SPARE_ENV
    from graphveil.connectors.flower.loopback import LoopbackFederation, write_node_config
    from graphveil.connectors.flower.partition import write_partition
    from graphveil.data import load_bundled_citeseer
    from graphveil.session import TrainingSession

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="graphveil-fed-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    sites = ("site-1", "site-2", "site-3")
    overrides = {
        "num-server-rounds": args.rounds, "local-steps": args.local_steps, "min-sites": len(sites),
        "task.encoder.model": args.model, "task.encoder.max_length": 16 if args.model == "tiny-bert" else 32,
        "task.sampler.batch_size": args.batch_size, "task.privacy.noise_multiplier": 1.0,
        "output-dir": str(root / "server-out"),
    }
    run_config = _app_run_config(overrides)
    parts = write_partition(load_bundled_citeseer(), len(sites), root / "data", seed=0)
    configs = {
        name: write_node_config(root / f"{name}.toml", {
            "site-name": name, "data-source": "edge_list", "data-path": str(edges),
            "data-entities": str(entities), "epsilon-budget": 1e4, "delta": 1e-5, "privacy-unit": "edge",
            "ledger": str(root / "ledgers" / f"{name}.sqlite"), "threads": 1})
        for name, (edges, entities) in zip(sites, parts, strict=True)
    }

    # train-only: the DP steps in a warm process (best of 2 per site)
    torch.set_num_threads(1)
    train_only = 0.0
    for name in sites:
        session = TrainingSession(_site_config(configs[name], run_config))
        session.prepare()
        best = math.inf
        for _ in range(2):
            started = time.perf_counter()
            session.train(args.local_steps)
            best = min(best, time.perf_counter() - started)
        train_only += best

    # local-fresh: three fresh processes at once, each one site's round without Flower; measured
    # before and after the federation (the machine's load drifts), best of all tries.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    fresh: list[float] = []

    def local_rounds(tries: int) -> None:
        for _ in range(tries):
            started = time.perf_counter()
            procs = [subprocess.Popen([sys.executable, __file__, "--local-round", str(configs[n]),
                                       json.dumps(run_config), str(args.local_steps)], env=env) for n in sites]
            codes = [p.wait() for p in procs]
            if any(codes):
                raise SystemExit(f"local round failed: exit codes {codes}")
            fresh.append(time.perf_counter() - started)

    load_before = os.getloadavg()[0]
    local_rounds(2)

    def federate(spare: bool) -> tuple[list[float], float]:
        """Per-round seconds and the whole run's, spare ClientApp process on or off."""
        with LoopbackFederation(root / f"federation-spare-{'on' if spare else 'off'}") as loop:
            loop.env["OMP_NUM_THREADS"] = "1"
            loop.env[SPARE_ENV] = "1" if spare else "0"
            loop.make_credentials(sites)
            loop.start_server()
            loop.register(sites)
            for name in sites:
                loop.start_site(name, configs[name])
            loop.wait_online(len(sites))
            time.sleep(20 if spare else 0)  # let the spares import, as between runs at a real site
            run_dir, total, _ = loop.run({**overrides, "output-dir": str(root / f"server-out-{int(spare)}")})
        rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
        return [r["seconds"] for r in rounds], total

    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.spare]
    federations = {("spare" if m else "no_spare"): federate(m) for m in modes}
    local_rounds(2)
    local_fresh = min(fresh)
    load_after = os.getloadavg()[0]
    per_round, total = federations["spare" if modes[0] else "no_spare"]
    federated = statistics.median(per_round)
    result = {
        "sites": len(sites), "rounds": args.rounds, "local_steps": args.local_steps, "model": args.model,
        "spare": modes[0],
        "federated_round_seconds": per_round, "federated_round_median": federated,
        "federation_run_seconds": total,
        **{f"{k}_round_seconds": v[0] for k, v in federations.items()},
        **{f"{k}_round_median": statistics.median(v[0]) for k, v in federations.items()},
        **{f"{k}_run_seconds": v[1] for k, v in federations.items()},
        "local_fresh_round_seconds": local_fresh, "local_fresh_all_tries": fresh,
        "train_only_seconds_all_sites": train_only,
        "overhead_share_vs_local_fresh": 1 - local_fresh / federated,
        "overhead_share_vs_train_only": 1 - train_only / federated,
        "load_average_before_after": [load_before, load_after],
    }
    (root / "federation_overhead.json").write_text(json.dumps(result, indent=2))
    print(f"three-site loopback federation, {args.model}, {args.local_steps} local steps per round "
          f"({args.rounds} rounds; TLS + SuperNode auth on; 2-core machine shared by all processes)")
    for key, (secs, run_total) in federations.items():
        label = "with spare ClientApp" if key == "spare" else "no spare (fresh)"
        print(f"  federated round, {label:20s} {statistics.median(secs):7.2f} s median   rounds: "
              f"{', '.join(f'{s:.2f}' for s in secs)}   whole run {run_total:.2f} s")
    print(f"  local round, 3 fresh processes  {local_fresh:7.2f} s   (import + prepare + steps + eval, no Flower)")
    print(f"  local DP steps only, 3 sites    {train_only:7.2f} s   (warm process, summed)")
    print(f"  overhead share vs local round   {result['overhead_share_vs_local_fresh']:7.1%}")
    print(f"  overhead share vs steps only    {result['overhead_share_vs_train_only']:7.1%}")
    print(f"  1-min load average before/after {load_before:.1f} / {load_after:.1f} (2 cores)")
    print(f"results: {root / 'federation_overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
