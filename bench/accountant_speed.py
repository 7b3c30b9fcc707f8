"""Speed of the coupled-sampling RDP bounds over the full default order grid (paper 1, App. D),
and of σ calibration to a target ε for each RDP accountant.

Paper setting: n = 1e6 nodes, m = 5e6 edges, K = 5, k_neg = 4, γ = 1e-5, σ = 0.5, T = 7812 steps,
δ = 1/m. Goals (issue 10): Thm 3 < 0.1 s, Thm C.1 < 2 s (the paper's code: ~7 s and > 1 h), and
σ calibration < 2 s per accountant. Reports wall and CPU time of a cold call (best of
``--repeat``), and ε after T steps; CPU time is the fairer number on a shared machine.
Calibration rows (``--calibrate``): ``accountant.calibrate`` alone, one call on a fresh accountant
(no cached curve), then σ and the ε of the full curve at that σ.

    python bench/accountant_speed.py [--repeat 3] [--calibrate] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import numpy as np

from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
from graphveil.privacy import DEFAULT_ORDERS, rdp_to_epsilon

PAPER = dict(sigma=0.5, gamma=1e-5, m=5_000_000, n=1_000_000, K=5, k_neg=4)
STEPS = 7812


def _calibration_cases() -> dict[str, tuple]:
    """(accountant factory, target ε, δ, steps): realistic settings for each RDP accountant."""
    from graphveil.contract.profiles import (
        PrivacyUnit,
        SamplingKind,
        SamplingProfile,
        SensitivityKind,
        SensitivityProfile,
    )
    from graphveil.plugins.dp_gcn.accountant import SplitRdpAccountant
    from graphveil.plugins.dp_gcn.units import SPLIT_REPLACE
    from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
    from graphveil.plugins.edge_dp.pld_accountant import EdgePldAccountant
    from graphveil.plugins.entity_dp.accountant import CoupledRdpAccountant
    from graphveil.plugins.gdp.rooted_accountant import RootedRdpAccountant
    from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant
    from graphveil.plugins.node_dp.units import NODE_GDP

    def bound(cls, sampling, kind, unit):
        def make():
            acc = cls()
            if cls is RootedRdpAccountant:
                acc.unit = unit
            acc.bind(sampling, SensitivityProfile(kind, unit, 1.0))
            return acc
        return make

    coupled = SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, PAPER["gamma"], PAPER["m"], PAPER["n"],
                              PAPER["K"], PAPER["k_neg"])
    edge = SamplingProfile(SamplingKind.POISSON_DECOUPLED, 1e-3, PAPER["m"])
    cora = SamplingProfile(SamplingKind.UNIFORM_WOR, 64 / 2708, 2708, batch_size=64)  # Cora, batch 64
    rooted_unit = PrivacyUnit.parse("node/replacement/D=100/predictions")
    rooted = SamplingProfile(SamplingKind.UNIFORM_WOR, 64 / 2708, 2708, batch_size=64, examples_per_unit=10)
    splits = SamplingProfile(SamplingKind.UNIFORM_WOR, 1 / 10, 10, batch_size=1)  # DP-GCN, 10 splits
    delta_m = 1.0 / PAPER["m"]
    return {
        "coupled_rdp Thm 3": (bound(CoupledRdpAccountant, coupled, SensitivityKind.FREQ_CLIP_NODE,
                                    PrivacyUnit.NODE), 4.0, delta_m, STEPS),
        "coupled_rdp Thm C.1": (bound(CoupledRdpAccountant, coupled, SensitivityKind.STANDARD_TUPLE_NODE,
                                      PrivacyUnit.NODE), 8.0, delta_m, STEPS),
        "edge_rdp": (bound(EdgeRdpAccountant, edge, SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE),
                     4.0, delta_m, 10_000),
        "edge_pld": (bound(EdgePldAccountant, edge, SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE),
                     4.0, delta_m, 10_000),
        "node_rdp": (bound(NodeReplaceRdpAccountant, cora, SensitivityKind.PER_EXAMPLE, NODE_GDP),
                     4.0, 1e-4, 4_300),
        "rooted_rdp": (bound(RootedRdpAccountant, rooted, SensitivityKind.PER_EXAMPLE, rooted_unit),
                       8.0, 1e-4, 4_300),
        "split_rdp": (bound(SplitRdpAccountant, splits, SensitivityKind.PER_EXAMPLE, SPLIT_REPLACE),
                      4.0, 1e-4, 500),
    }


def _pld_bisection(acc, *, target_epsilon: float, delta: float, num_steps: int) -> float:
    """edge_pld's calibration before issue 10 item 5b, timed beside today's: a log-bisection of
    min(ε_PLD, ε_RDP) on the accountant's own grid over [σ_RDP / 4, σ_RDP]."""
    from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
    from graphveil.privacy import bisect_sigma

    sigma_rdp = EdgeRdpAccountant.calibrate(acc, target_epsilon=target_epsilon, delta=delta, num_steps=num_steps)
    return bisect_sigma(lambda s: min(acc._epsilons({s: num_steps}, delta)), target_epsilon,
                        sigma_range=(max(acc.SIGMA_RANGE[0], sigma_rdp / 4.0), sigma_rdp), rtol=acc.CALIBRATE_RTOL)


def _calibrations() -> dict[str, dict]:
    """One call each, the first in the process for its accountant: dp-accounting's leaf curves are
    cached per process (graphveil.privacy.rdp_accountant.dp_event_rdp), so a repeat would time the cache.
    ``edge_pld (bisection)`` is edge_pld's previous calibration, for the before/after ratio."""
    out = {}
    cases = _calibration_cases()
    cases["edge_pld (bisection)"] = cases["edge_pld"]
    for name, (make, target, delta, steps) in cases.items():
        acc = make()
        calibrate = functools.partial(_pld_bisection, acc) if name == "edge_pld (bisection)" else acc.calibrate
        w0, c0 = time.perf_counter(), time.process_time()
        sigma = calibrate(target_epsilon=target, delta=delta, num_steps=steps)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        acc.step(noise_multiplier=sigma, num_steps=steps)
        out[name] = {"wall_s": wall, "cpu_s": cpu, "target": target, "delta": delta,
                     "steps": steps, "sigma": sigma, "epsilon": acc.get_epsilon(delta)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed calls per theorem (best is kept)")
    parser.add_argument("--calibrate", action="store_true", help="also time σ calibration for each accountant")
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
    calibrations = _calibrations() if args.calibrate else {}
    if args.json:
        print(json.dumps({"setting": {**PAPER, "steps": STEPS, "delta": delta, "orders": len(orders)}, **results,
                          "calibrate": calibrations}))
        return
    print(f"paper setting {PAPER}, T={STEPS}, delta=1/m={delta:.1e}, {len(orders)} orders (best of {args.repeat})")
    print(f"{'bound':<8} {'wall s':>8} {'cpu s':>8} {'epsilon':>10} {'alpha':>6}")
    for name, r in results.items():
        print(f"{name:<8} {r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['epsilon']:>10.4f} {r['alpha']:>6g}")
    if calibrations:
        print("\nσ calibration (accountant.calibrate, one cold call each)")
        print(f"{'accountant':<20} {'wall s':>8} {'cpu s':>8} {'target':>7} {'steps':>6} {'sigma':>10} {'epsilon':>9}")
        for name, r in calibrations.items():
            print(f"{name:<20} {r['wall_s']:>8.3f} {r['cpu_s']:>8.3f} {r['target']:>7g} {r['steps']:>6} "
                  f"{r['sigma']:>10.6g} {r['epsilon']:>9.5g}")


if __name__ == "__main__":
    main()
