"""Wall time and peak memory of ``graphveil fed simulate`` (Flower's Simulation Engine on Ray).

    python bench/simulation.py [--config examples/simulation/dp_mlp_cora.yaml] [--sites 10] [--rounds 2]
                               [--cpus-per-site 1] [--out DIR]

Runs the command as a user would (a process of its own) and samples, every 0.2 s, the memory of
its whole process tree: the command itself, and Ray's processes it starts (GCS, raylet, the
ClientApp actors, Ray's helpers). Peak RSS sums the resident sets (shared pages counted in every
process that maps them: an upper bound); peak PSS shares them out (what the tree costs the
machine). Also the driver's own peak RSS, the simulation's seconds inside Flower's runtime
(the command's summary) and the machine's load average. Prints a table and writes
``simulation.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _sample(procs: list[psutil.Process]) -> tuple[int, int]:
    rss = pss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        rss += info.rss
        pss += getattr(info, "pss", info.rss)
    return rss, pss


def measure(config: Path, sites: int, rounds: int, cpus_per_site: float, out: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    argv = [str(BIN / "graphveil"), "fed", "simulate", str(config), "--sites", str(sites), "--rounds", str(rounds),
            "--cpus-per-site", str(cpus_per_site), "--out", str(out / "run"), "--json"]
    load_before = os.getloadavg()
    started = time.monotonic()
    with (out / "stdout.txt").open("w") as stdout, (out / "stderr.txt").open("w") as stderr:
        proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr)
        handle = psutil.Process(proc.pid)
        peak_rss = peak_pss = driver = 0
        peak_procs = 0
        while proc.poll() is None:
            procs = _tree(handle)
            rss, pss = _sample(procs)
            peak_rss, peak_pss, peak_procs = max(peak_rss, rss), max(peak_pss, pss), max(peak_procs, len(procs))
            try:
                driver = max(driver, handle.memory_info().rss)
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.2)
    seconds = time.monotonic() - started
    text = (out / "stdout.txt").read_text()
    if proc.returncode != 0:
        raise SystemExit(f"graphveil fed simulate exited {proc.returncode}:\n{(out / 'stderr.txt').read_text()[-4000:]}")
    summary = json.loads(text[text.index("{"):])
    return {
        "command": " ".join(argv[1:]), "sites": sites, "rounds": rounds, "cpus-per-site": cpus_per_site,
        "cores": len(os.sched_getaffinity(0)), "wall-seconds": seconds, "runtime-seconds": summary["seconds"],
        "peak-tree-rss-mib": peak_rss / 2**20, "peak-tree-pss-mib": peak_pss / 2**20,
        "peak-driver-rss-mib": driver / 2**20, "peak-processes": peak_procs,
        "load-average-before": load_before, "load-average-after": os.getloadavg(),
        "status": summary["status"],
        "site-ledgers": {n: s["entries"] for n, s in summary["site-ledgers"].items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO / "examples" / "simulation" / "dp_mlp_cora.yaml")
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus-per-site", type=float, default=1.0)
    parser.add_argument("--out", type=Path, help="folder for the run and simulation.json (default: a temporary one)")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="gv-sim-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    result = measure(args.config.resolve(), args.sites, args.rounds, args.cpus_per_site, out)
    (out / "simulation.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(f"graphveil {result['command']}")
    print(f"{'sites':>5} {'rounds':>6} {'wall s':>7} {'in runtime s':>12} {'peak RSS tree MiB':>17} "
          f"{'peak PSS tree MiB':>17} {'driver RSS MiB':>14} {'processes':>9}")
    print(f"{result['sites']:>5} {result['rounds']:>6} {result['wall-seconds']:>7.1f} {result['runtime-seconds']:>12.1f} "
          f"{result['peak-tree-rss-mib']:>17.0f} {result['peak-tree-pss-mib']:>17.0f} "
          f"{result['peak-driver-rss-mib']:>14.0f} {result['peak-processes']:>9}")
    print(f"{result['cores']} cores; load average before {result['load-average-before'][0]:.2f}, after "
          f"{result['load-average-after'][0]:.2f}; status {result['status']}; results in {out / 'simulation.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
