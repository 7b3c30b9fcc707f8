"""Speed of accounting: per-step RDP curves and σ calibration for every accountant, on the paper's
and the demos' settings, beside the goals (issue 29 point 4).

Goals: **σ calibration of every accountant < 0.5 s** (cold, unloaded) on the paper and demo
settings; **Thm 3's full grid (159 orders) < 0.1 s** at the paper's setting (n = 1e6, m = 5e6,
K = 5, k_neg = 4, γ = 1e-5, σ = 0.5). The paper's own code needs ~7 s (Thm 3) and over an hour
(Thm C.1).

What is timed (wall clock; CPU time beside, the fairer number on a shared machine):

* **cold**: the first call in a fresh process (``python`` started per row), interpreter start and
  imports excluded: the accountant's module is imported and the accountant bound before the clock
  starts. Libraries an accountant imports lazily on its first call (dp-accounting, ~0.35 s) are
  imported before the clock too, and timed alone in the ``import`` column: a process pays that
  once, whichever accounting call comes first.
* **warm**: the same call again in the same process, on a freshly bound accountant (numpy and
  dp-accounting warmed; dp-accounting's leaf curves are cached per process, so node_rdp's and
  split_rdp's warm rows replay a cache).
* **curve**: one per-step RDP curve on the full grid at the calibrated σ, the first in the
  process (what a run computes after calibrating, for its ε and report).
* plans with releases (:data:`PLANS`, GAP's at the node demo's setting) time their accountant's
  ``calibrate`` inside ``graphveil.run.planning.planned_account`` (the host and the session's
  assembly untimed; no curve column).

Every row also gives σ, and ε of the full curve at σ after the steps (≤ the target), and the
load average when it ran (``os.getloadavg``, 1 min): on a shared machine a row measured under a
load above ~1 is slower than the goal's "unloaded".

    python bench/accountant_speed.py [--rows NAME,...] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: calibration goal (s) and Thm 3's full-grid goal (s)
CALIBRATE_GOAL = 0.5
THM3_GOAL = 0.1
PAPER = dict(gamma=1e-5, m=5_000_000, n=1_000_000, K=5, k_neg=4)
PAPER_SIGMA = 0.5
PAPER_STEPS = 7812
#: the relational demo's Cora setting (graphveil demo, cora-features): batch 256 of 1867 capped
#: records, 1865 training entities, 100 steps, δ = 1e-5; edge level: 256 of 2531 relations
DEMO = dict(gamma=256 / 1867, m=1867, n=1865, K=5, k_neg=4)
DEMO_EDGE = dict(gamma=256 / 2531, m=2531)


@dataclass(frozen=True)
class Row:
    """One calibration: the accountant (built and bound by ``make``), the target, δ and steps."""

    name: str
    setting: str
    make: Callable[[], Any]
    target: float
    delta: float
    steps: int


def _bound(cls_path: str, sampling: dict[str, Any], kind: str, unit: str) -> Callable[[], Any]:
    """A factory of a fresh accountant ``cls_path`` bound to the sampling profile and C = 1."""

    def make() -> Any:
        import importlib

        from graphveil.contract.profiles import (
            PrivacyUnit,
            SamplingKind,
            SamplingProfile,
            SensitivityKind,
            SensitivityProfile,
        )

        module, name = cls_path.rsplit(".", 1)
        cls = getattr(importlib.import_module(module), name)
        if "." in unit:  # a unit object a plugin defines
            unit_obj = getattr(importlib.import_module(unit.rsplit(".", 1)[0]), unit.rsplit(".", 1)[1])
        else:
            unit_obj = PrivacyUnit.parse(unit)
        acc = cls()
        if getattr(cls, "mechanism", "") == "rooted_rdp":
            acc.unit = unit_obj
        profile = SamplingProfile(SamplingKind(sampling["kind"]), sampling["rate"], sampling["records"],
                                  sampling.get("nodes", 0), sampling.get("K"), sampling.get("k_neg", 0),
                                  batch_size=sampling.get("batch", 0),
                                  examples_per_unit=sampling.get("per_unit", 1))
        acc.bind(profile, SensitivityProfile(SensitivityKind(kind), unit_obj, 1.0))
        return acc

    return make


def _rows() -> list[Row]:
    coupled = "graphveil.plugins.entity_dp.accountant.CoupledRdpAccountant"
    edge = "graphveil.plugins.edge_dp.accountant.EdgeRdpAccountant"
    pld = "graphveil.plugins.edge_dp.pld_accountant.EdgePldAccountant"
    node = "graphveil.plugins.node_dp.accountant.NodeReplaceRdpAccountant"
    rooted = "graphveil.plugins.gdp.rooted_accountant.RootedRdpAccountant"
    split = "graphveil.plugins.dp_gcn.accountant.SplitRdpAccountant"
    node_gdp = "graphveil.plugins.node_dp.units.NODE_GDP"
    split_unit = "graphveil.plugins.dp_gcn.units.SPLIT_REPLACE"

    def entity(numbers: dict[str, Any]) -> dict[str, Any]:
        return {"kind": "coupled_poisson_wor", "rate": numbers["gamma"], "records": numbers["m"],
                "nodes": numbers["n"], "K": numbers["K"], "k_neg": numbers["k_neg"]}

    def wor(n: int, b: int, per_unit: int = 1) -> dict[str, Any]:
        return {"kind": "uniform_wor", "rate": b / n, "records": n, "batch": b, "per_unit": per_unit}

    paper_edge = {"kind": "poisson_decoupled", "rate": 1e-3, "records": PAPER["m"]}
    demo_edge = {"kind": "poisson_decoupled", "rate": DEMO_EDGE["gamma"], "records": DEMO_EDGE["m"]}
    freq, standard = "freq_clip_node", "standard_tuple_node"
    delta_m = 1.0 / PAPER["m"]
    return [
        Row("coupled_rdp Thm 3", "paper", _bound(coupled, entity(PAPER), freq, "node"), 4.0, delta_m, PAPER_STEPS),
        Row("coupled_rdp Thm 3", "demo ε=10", _bound(coupled, entity(DEMO), freq, "node"), 10.0, 1e-5, 100),
        Row("coupled_rdp Thm 3", "demo ε=1", _bound(coupled, entity(DEMO), freq, "node"), 1.0, 1e-5, 100),
        Row("coupled_rdp Thm C.1", "paper", _bound(coupled, entity(PAPER), standard, "node"), 8.0, delta_m,
            PAPER_STEPS),
        Row("coupled_rdp Thm C.1", "demo ε=10", _bound(coupled, entity(DEMO), standard, "node"), 10.0, 1e-5, 100),
        Row("coupled_rdp Thm C.1", "demo ε=1", _bound(coupled, entity(DEMO), standard, "node"), 1.0, 1e-5, 100),
        Row("edge_rdp", "paper", _bound(edge, paper_edge, "per_tuple_edge", "edge"), 4.0, delta_m, 10_000),
        Row("edge_rdp", "demo ε=10", _bound(edge, demo_edge, "per_tuple_edge", "edge"), 10.0, 1e-5, 100),
        Row("edge_pld", "paper", _bound(pld, paper_edge, "per_tuple_edge", "edge"), 4.0, delta_m, 10_000),
        Row("edge_pld", "demo ε=10", _bound(pld, demo_edge, "per_tuple_edge", "edge"), 10.0, 1e-5, 100),
        # DP-MLP (paper 4): Cora 2708 nodes, batch 64; the demo's node rows: 2031 training nodes, 20 epochs
        Row("node_rdp", "paper 4", _bound(node, wor(2708, 64), "per_example", node_gdp), 4.0, 1e-4, 4_300),
        Row("node_rdp", "demo ε=16", _bound(node, wor(2031, 64), "per_example", node_gdp), 16.0, 1e-5, 635),
        Row("node_rdp", "example ε=1", _bound(node, wor(2031, 64), "per_example", node_gdp), 1.0, 1e-5, 3_174),
        Row("rooted_rdp", "bench", _bound(rooted, wor(2708, 64, 10), "per_example", "node/replacement/D=100/predictions"),
            8.0, 1e-4, 4_300),
        Row("rooted_rdp", "demo ε=16", _bound(rooted, wor(2031, 64, 337), "per_example",
                                              "node/replacement/D=168/predictions"), 16.0, 1e-5, 318),
        Row("split_rdp", "bench", _bound(split, wor(10, 1), "per_example", split_unit), 4.0, 1e-4, 500),
        Row("split_rdp", "example ε=2", _bound(split, wor(10, 1), "per_example", split_unit), 2.0, 1e-5, 5_000),
    ]


#: plans with releases, calibrated through graphveil.run.planning as `graphveil privacy calibrate
#: --method NAME --nodes N --epochs E --target-epsilon T` does: (method, setting, nodes, epochs, target)
PLANS = [("gap", "demo ε=16", 2031, 20, 16.0)]


def _planned_one(index: int) -> dict[str, Any]:
    """Plan ``index`` of :data:`PLANS` in this (fresh) process: its accountant's ``calibrate``
    timed inside :func:`graphveil.run.planning.planned_account` (the host and the session's assembly
    are not timed), cold and again."""
    import copy

    from graphveil.apps.cli_privacy import METHOD_CONFIGS
    from graphveil.contract.host import default_host
    from graphveil.privacy import RdpAccountantBase
    from graphveil.run.config import config_from_dict
    from graphveil.run.planning import PublicSizes, planned_account

    method, setting, nodes, epochs, target = PLANS[index]
    raw = copy.deepcopy(METHOD_CONFIGS[method])
    raw["training"] = {"epochs": epochs}
    raw["privacy"] = {**raw.get("privacy", {}), "enabled": True, "target_epsilon": target, "noise_multiplier": None}
    host = default_host()
    __import__("dp_accounting")
    calls: list[tuple[float, float, float, str, int]] = []
    calibrate = RdpAccountantBase.calibrate

    def timed(self: Any, **kwargs: Any) -> float:
        sigma, wall, cpu = _timed(lambda: calibrate(self, **kwargs))
        calls.append((sigma, wall, cpu, self.mechanism, kwargs["num_steps"]))
        return sigma

    RdpAccountantBase.calibrate = timed  # type: ignore[method-assign]
    load = os.getloadavg()[0]
    out = planned_account(config_from_dict(copy.deepcopy(raw), f"bench {method}"), PublicSizes(nodes=nodes), host=host)
    planned_account(config_from_dict(copy.deepcopy(raw), f"bench {method}"), PublicSizes(nodes=nodes), host=host)
    (sigma, cold, cold_cpu, mechanism, steps), (_, warm, warm_cpu, _, _) = calls
    return {"row": f"{mechanism} ({method})", "setting": setting, "target": target, "delta": out["delta"],
            "steps": steps, "sigma": sigma, "epsilon": out["epsilon"], "same_sigma_warm": calls[1][0] == sigma,
            "import_s": 0.0, "cold_s": cold, "cold_cpu_s": cold_cpu, "warm_s": warm, "warm_cpu_s": warm_cpu,
            "curve_s": math.nan, "curve_cpu_s": math.nan, "load": load}


def _timed(call: Callable[[], Any]) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = call()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _one(index: int) -> dict[str, Any]:
    """Row ``index`` in this (fresh) process: cold and warm calibration, then one full curve at σ."""
    row = _rows()[index]
    acc = row.make()
    _, imported, _ = _timed(lambda: __import__("dp_accounting"))  # lazily imported by some accountants
    kwargs = dict(target_epsilon=row.target, delta=row.delta, num_steps=row.steps)
    load = os.getloadavg()[0]
    sigma, cold, cold_cpu = _timed(lambda: acc.calibrate(**kwargs))
    again = row.make()
    sigma_warm, warm, warm_cpu = _timed(lambda: again.calibrate(**kwargs))
    _, curve_wall, curve_cpu = _timed(lambda: acc.rdp_curve(sigma))
    acc.step(noise_multiplier=sigma, num_steps=row.steps)
    eps = acc.get_epsilon(row.delta)  # edge_pld: min(ε_PLD, ε_RDP), what calibration met
    return {"row": row.name, "setting": row.setting, "target": row.target, "delta": row.delta, "steps": row.steps,
            "sigma": sigma, "epsilon": eps, "same_sigma_warm": sigma_warm == sigma, "import_s": imported,
            "cold_s": cold, "cold_cpu_s": cold_cpu, "warm_s": warm, "warm_cpu_s": warm_cpu,
            "curve_s": curve_wall, "curve_cpu_s": curve_cpu, "load": load}


def _paper_curves(repeat: int) -> dict[str, Any]:
    """Thm 3 and Thm C.1 on the full default grid at the paper's setting, σ = 0.5: the first call
    in this process (cold) and the best of ``repeat`` more (warm)."""
    import numpy as np

    from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
    from graphveil.privacy import DEFAULT_ORDERS, rdp_to_epsilon

    orders = np.asarray(DEFAULT_ORDERS)
    out = {}
    for name, fn in (("Thm 3", thm3_rdp), ("Thm C.1", thmc1_rdp)):
        load = os.getloadavg()[0]
        rdp, cold, cold_cpu = _timed(lambda fn=fn: fn(orders, sigma=PAPER_SIGMA, **PAPER))
        runs = [_timed(lambda fn=fn: fn(orders, sigma=PAPER_SIGMA, **PAPER))[1:] for _ in range(repeat)]
        eps, alpha = rdp_to_epsilon(orders, PAPER_STEPS * rdp, 1.0 / PAPER["m"])
        out[name] = {"cold_s": cold, "cold_cpu_s": cold_cpu, "warm_s": min(w for w, _ in runs),
                     "warm_cpu_s": min(c for _, c in runs), "epsilon": eps, "alpha": alpha, "load": load}
    return out


def _in_fresh_process(args: list[str]) -> Any:
    """Run this file with ``args`` in a new interpreter and read its one JSON line."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"bench row {args} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", help="comma-separated row names or settings to run (default: all), "
                                       "e.g. 'Thm C.1,edge_pld'")
    parser.add_argument("--repeat", type=int, default=3, help="warm full-grid curves per theorem (best kept)")
    parser.add_argument("--json", action="store_true", help="print JSON lines instead of tables")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one row, this process
    parser.add_argument("--plan", type=int, help=argparse.SUPPRESS)  # internal: one plan, this process
    parser.add_argument("--curves", action="store_true", help=argparse.SUPPRESS)  # internal
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(_one(args.one)))
        return
    if args.plan is not None:
        print(json.dumps(_planned_one(args.plan)))
        return
    if args.curves:
        print(json.dumps(_paper_curves(args.repeat)))
        return
    wanted = [w.strip() for w in args.rows.split(",")] if args.rows else None
    rows = [i for i, r in enumerate(_rows())
            if wanted is None or any(w in r.name or w in r.setting for w in wanted)]
    curves = _in_fresh_process(["--curves", "--repeat", str(args.repeat)])
    results = [_in_fresh_process(["--one", str(i)]) for i in rows]
    results += [_in_fresh_process(["--plan", str(i)]) for i, plan in enumerate(PLANS)
                if wanted is None or any(w in plan[0] or w in plan[1] for w in wanted)]
    if args.json:
        print(json.dumps({"curves": curves}))
        for r in results:
            print(json.dumps(r))
        return
    print(f"Full grid (159 orders), paper setting {PAPER}, σ={PAPER_SIGMA}: cold = first call in a fresh "
          f"process, warm = best of {args.repeat}; goal Thm 3 < {THM3_GOAL} s")
    print(f"{'bound':<9} {'cold s':>7} {'cpu':>6} {'warm s':>7} {'cpu':>6} {'goal':>6} {'ε(T=7812)':>10} {'load':>5}")
    for name, r in curves.items():
        goal = f"<{THM3_GOAL}" if name == "Thm 3" else "-"
        print(f"{name:<9} {r['cold_s']:>7.3f} {r['cold_cpu_s']:>6.3f} {r['warm_s']:>7.3f} {r['warm_cpu_s']:>6.3f} "
              f"{goal:>6} {r['epsilon']:>10.4f} {r['load']:>5.2f}")
    print(f"\nσ calibration (accountant.calibrate): cold = first call in a fresh process (dp-accounting "
          f"imported before, its import timed alone), warm = again on a fresh accountant; curve = the full "
          f"grid at σ; goal calibration < {CALIBRATE_GOAL} s")
    head = (f"{'accountant':<20} {'setting':<12} {'cold s':>7} {'cpu':>6} {'warm s':>7} {'goal':>5} {'curve s':>8} "
            f"{'import':>6} {'target':>6} {'steps':>5} {'sigma':>10} {'epsilon':>8} {'load':>5}")
    print(head)
    for r in results:
        curve = "-" if math.isnan(r["curve_s"]) else f"{r['curve_s']:.3f}"
        print(f"{r['row']:<20} {r['setting']:<12} {r['cold_s']:>7.3f} {r['cold_cpu_s']:>6.3f} {r['warm_s']:>7.3f} "
              f"{'<' + format(CALIBRATE_GOAL, 'g'):>5} {curve:>8} {r['import_s']:>6.2f} {r['target']:>6g} "
              f"{r['steps']:>5} {r['sigma']:>10.6g} {r['epsilon']:>8.5g} {r['load']:>5.2f}")


if __name__ == "__main__":
    main()
