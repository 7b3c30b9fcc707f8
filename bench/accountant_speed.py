"""Speed of the coupled-sampling RDP bounds over the full default order grid (paper 1, App. D).

Paper setting: n = 1e6 nodes, m = 5e6 edges, K = 5, k_neg = 4, γ = 1e-5, σ = 0.5, T = 7812 steps,
δ = 1/m. Goals: Thm 3 well under 1 s, Thm C.1 under 10 s (the paper's code: ~7 s and > 1 h).
Reports wall and CPU time of a cold call (best of ``--repeat``), and ε after T steps.

    python bench/accountant_speed.py [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
from graphveil.privacy import DEFAULT_ORDERS, rdp_to_epsilon

PAPER = dict(sigma=0.5, gamma=1e-5, m=5_000_000, n=1_000_000, K=5, k_neg=4)
STEPS = 7812


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per theorem (best is kept)")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args()
    orders = np.asarray(DEFAULT_ORDERS)
    delta = 1.0 / PAPER["m"]
    results = {}
    for name, fn in (("thm3", thm3_rdp), ("thm_c1", thmc1_rdp)):
        walls, cpus = [], []
        for _ in range(args.repeat):
            w0, c0 = time.perf_counter(), time.process_time()
            rdp = fn(orders, **PAPER)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
        eps, alpha = rdp_to_epsilon(orders, STEPS * rdp, delta)
        results[name] = {"wall_s": min(walls), "cpu_s": min(cpus), "epsilon": eps, "alpha": alpha}
    if args.json:
        print(json.dumps({"setting": {**PAPER, "steps": STEPS, "delta": delta, "orders": len(orders)}, **results}))
        return
    print(f"paper setting {PAPER}, T={STEPS}, delta=1/m={delta:.1e}, {len(orders)} orders (best of {args.repeat})")
    print(f"{'bound':<8} {'wall s':>8} {'cpu s':>8} {'epsilon':>10} {'alpha':>6}")
    for name, r in results.items():
        print(f"{name:<8} {r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['epsilon']:>10.4f} {r['alpha']:>6g}")


if __name__ == "__main__":
    main()
