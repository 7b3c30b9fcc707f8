"""Speed-up of data-parallel DP-SGD within one site on CPU (issue 28 point 2): steps/s of one
process against two gloo processes (``graphveil run --nproc 2``), interleaved in one run.

Each row trains the same relational run (CiteSeer's first entities, MiniLM + LoRA by default, a
fixed sampling seed and σ, so every row draws the same batches): a fresh process group per
measurement (``torch.multiprocessing.spawn``, gloo over a file rendezvous; one process is spawned
the same way and runs without a group), a few warm-up steps, then ``--steps`` timed steps between
two barriers. Rows, interleaved ``--repeat`` times so that a change of the machine's load hits
all of them alike:

* ``1 proc × 1 thread`` and ``1 proc × 2 threads``: one process, intra-op threads as given;
* ``2 procs × 1 thread``: torchrun's default (``OMP_NUM_THREADS=1``), each rank differentiates
  half of every logical batch, one all-reduce of the clipped sums per step.

The speed-up is the median steps/s of the two-process row over each one-process row; the CPU
seconds per step (summed over the processes) say what the split costs in work. The load average
(1 min) before and after the run is printed beside: on a machine loaded by other jobs the
scheduler gives each runnable thread a share, so two processes may get more than one process's
share of the cores and the wall-clock speed-up overstates what an idle machine would show.

    python bench/ddp_speed.py [--steps 8] [--warmup 2] [--repeat 3] [--batch 32] [--model minilm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

ROWS = (("1 proc × 1 thread", 1, 1), ("1 proc × 2 threads", 1, 2), ("2 procs × 1 thread", 2, 1))


def run_config(batch: int, model: str) -> dict[str, Any]:
    """The measured run: the demo's CiteSeer MiniLM + LoRA setting at a fixed σ and seed."""
    return {
        "name": "ddp-speed",
        "data": {"source": "citeseer", "max_entities": 1000, "split": {"train_fraction": 0.8}},
        "sampler": {"name": "edge_poisson_decoupled", "batch_size": batch, "k_neg": 4},
        "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_rdp"},
        "encoder": {"name": "hf_lora", "model": model, "max_length": 32, "lora_layers": 1, "lora_rank": 8,
                    "seed": 0},
        "training": {"steps": 1000, "optimizer": "adam", "lr": 0.01},
        "privacy": {"noise_multiplier": 1.0, "delta": 1e-5},
        "output": {"progress": False},
        "seed": 1,
    }


def _worker(rank: int, world: int, threads: int, init_file: str, out: str, raw: dict[str, Any],
            warmup: int, steps: int) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    from graphveil.engine.data_parallel import DataParallel
    from graphveil.run.config import config_from_dict
    from graphveil.run.session import TrainingSession

    torch.set_num_threads(threads)
    group = None
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(minutes=10))
        group = DataParallel(rank, world, torch.device("cpu"))
    try:
        session = TrainingSession(config_from_dict(raw), data_parallel=group)
        session.prepare()
        session.train(warmup)
        if group is not None:
            dist.barrier()
        start, cpu = time.perf_counter(), time.process_time()
        session.train(steps)
        cpu = time.process_time() - cpu  # this rank's CPU time in the steps (all its threads)
        if group is not None:
            dist.barrier()
        seconds = time.perf_counter() - start
        Path(f"{out}.{rank}").write_text(json.dumps({"seconds": seconds, "cpu": cpu}))
    finally:
        if group is not None:
            group.close()


def measure(world: int, threads: int, raw: dict[str, Any], warmup: int, steps: int) -> tuple[float, float]:
    """Steps per second (wall clock) of one fresh run of ``world`` processes with ``threads``
    threads each, and the CPU seconds per step summed over its processes."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        mp.spawn(_worker, args=(world, threads, str(Path(tmp) / "rendezvous"), str(out), raw, warmup, steps),
                 nprocs=world, join=True)
        ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(world)]
        return steps / ranks[0]["seconds"], sum(r["cpu"] for r in ranks) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32, help="sampler.batch_size (expected tuples per step)")
    parser.add_argument("--model", default="minilm", help="hf_lora model (minilm, tiny-bert)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line too")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    raw = run_config(args.batch, args.model)
    load_before = os.getloadavg()[0]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in ROWS}
    cpu: dict[str, list[float]] = {name: [] for name, _, _ in ROWS}
    for _ in range(args.repeat):
        for name, world, threads in ROWS:
            rate, seconds = measure(world, threads, raw, args.warmup, args.steps)
            rates[name].append(rate)
            cpu[name].append(seconds)
    load_after = os.getloadavg()[0]
    two = statistics.median(rates[ROWS[2][0]])
    print(f"relational DP-SGD, hf_lora {args.model}, batch {args.batch} (+4 negatives each), "
          f"{args.steps} timed steps after {args.warmup}, {args.repeat} interleaved repeats")
    print(f"{'row':<20} {'steps/s (median)':>17} {'all runs':>22} {'2 procs speed-up':>17} "
          f"{'CPU s/step (median)':>20}")
    for name, _, _ in ROWS:
        median = statistics.median(rates[name])
        runs = " ".join(f"{r:.2f}" for r in rates[name])
        print(f"{name:<20} {median:>17.2f} {runs:>22} {two / median:>16.2f}× {statistics.median(cpu[name]):>20.2f}")
    print(f"load average (1 min): {load_before:.2f} before, {load_after:.2f} after; {os.cpu_count()} cores")
    if args.json:
        print(json.dumps({"rates": rates, "cpu_per_step": cpu, "load": [load_before, load_after],
                          "args": vars(args)}))


if __name__ == "__main__":
    main()
