"""Speed and memory of one DP step vs the non-private step vs an Opacus per-sample baseline.

One configuration (default: the packaged MiniLM with the hf_lora encoder's default settings —
LoRA r=8 on query/value of the top 2 layers, 32 tokens — b=32 tuples, k_neg=4) and the SAME
batches of tuples for every mode. Modes:

* ``nonprivate`` — :func:`graphveil.engine.dp_step.nonprivate_step` (mean loss, backward, Adam);
* ``dp``         — :func:`graphveil.engine.dp_step.dp_step` (per-tuple norms from one backward
  via ghost/book-keeping, per-tuple clipping, the secure noise, DP-Adam);
* ``dp_randn``   — the same with the noise drawn by ``torch.randn`` (NOT private: a measuring
  device that shows the engine's cost with the noise at ``torch.randn`` speed);
* ``opacus``     — opacus ``GradSampleModule`` over the encoder's trainable top layers:
  per-SEQUENCE gradients (one per entity occurrence), summed into tuples, clipped, the secure
  noise (drawn as ``dp_step`` draws it: :func:`graphveil.engine.dp_step.add_noise`), Adam. Its hooks are added for each of its steps and removed after, so the other modes
  run without them.

Time: ONE subprocess runs the modes interleaved step by step (order rotated), so load from
other processes on the machine hits them alike; reported are the median and minimum wall time
and the median process CPU time per step, and the median over steps of the PAIRED ratio to the
non-private step on the same batch (robust to load that drifts during the run), beside the goal
of issue 29 (DP ≤ 1.03× non-private) and the 1-minute load average before and after.
Phases (``--phase-reps`` > 0, same process, after the timed steps): the median over repetitions
of each phase of one step (module ``step_phases``) — non-private forward, backward, Adam; the DP
step's forward (recording), backward + per-tuple norms, clipping factors, clipped sums, noise,
Adam; Opacus' forward, backward (per-sample hooks), per-tuple clipping, noise, Adam.
Memory: each mode alone in a fresh subprocess; the kernel's peak resident set (VmHWM from
/proc/self/status) during the timed steps only — the peak is reset by writing 5 to
/proc/self/clear_refs after setup — next to the RSS when the steps started.

    python bench/dp_step_speed.py [--batch 32] [--k-neg 4] [--steps 10] [--micro-batch 8] [--json out.json]
                                  [--device cuda]

``--device`` (``bench/_device.py``): model, batches and noise on that device; each timed step and
phase ends when the device's queued work does. The peak RSS is host memory only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from _device import add_device_argument, batches_to, place, synchronize
from step_phases import phase_table

MODES = ("nonprivate", "dp", "dp_randn", "opacus")
GOAL = 1.03  # issue 29: DP step / non-private step, MiniLM + LoRA


def _rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def setup(args: argparse.Namespace):
    """(step functions by mode, the fixed list of batches, trainable count, phase functions)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(args.threads)
    from step_phases import RandnNoise, dp_phases, nonprivate_phases, timed

    from graphveil.contract.sampler import TupleBatch
    from graphveil.data.loaders import load_bundled_citeseer
    from graphveil.engine.dp_step import (
        GaussianNoise,
        add_noise,
        build_optimizer,
        dp_step,
        nonprivate_step,
    )
    from graphveil.engine.per_tuple import PerTupleGrad
    from graphveil.plugins.edge_dp.clipping import PerTupleEdgeClipper  # the clipper a run uses
    from graphveil.plugins.hf_lora.encoder import HfLoraEncoder, HfLoraParams
    from graphveil.plugins.relational.losses import LossSpec, tuple_losses
    from graphveil.run.config import TrainingConfig

    graph = load_bundled_citeseer().subgraph(torch.arange(args.entities))
    params = {"model": args.model}
    if args.lora_layers:
        params["lora_layers"] = args.lora_layers
    encoder = place(HfLoraEncoder(HfLoraParams(**params)), args.device)
    encoder.prepare(graph)
    encoder.train()  # as in a training session (opacus only records activations in train mode)
    training = TrainingConfig(optimizer="adam", lr=1e-4)
    loss = LossSpec.from_config(training)
    optimizer = build_optimizer(encoder.trainable_parameters(), training)
    clipper, noise = PerTupleEdgeClipper(PerTupleEdgeClipper.Params(clip_norm=args.clip)), GaussianNoise()  # OS CSPRNG, 4-sum (the cost a real run pays)
    trainable = list(encoder.trainable_parameters())
    std = args.sigma * clipper.clip_norm

    # The same batches in every mode: positives from the graph's edges, uniform negatives.
    data = torch.Generator().manual_seed(1234)
    batches = []
    for _ in range(args.warmup + args.steps):
        pos = graph.edges[torch.randint(0, graph.num_edges, (args.batch,), generator=data)]
        neg = torch.randint(0, graph.num_nodes, (args.batch, args.k_neg), generator=data)
        which = torch.randint(0, 2, (args.batch, args.k_neg), generator=data)
        batches.append(TupleBatch(pos, neg, torch.gather(pos, 1, which)))
    batches = batches_to(batches, args.device)

    def ours(fn, noise):
        def step(batch: TupleBatch) -> None:
            fn(encoder, batch, clipper=clipper, noise_multiplier=args.sigma, expected_batch_size=args.batch,
               optimizer=optimizer, loss=loss, noise=noise, micro_batch_size=args.micro_batch or None)

        return step

    steps = {"nonprivate": ours(nonprivate_step, None), "dp": ours(dp_step, noise),
             "dp_randn": ours(dp_step, RandnNoise())}
    engine = PerTupleGrad(encoder, verify=False)
    phase_fns = {
        "nonprivate": lambda series, batch: nonprivate_phases(series, encoder, batch, loss, optimizer),
        "dp": lambda series, batch: dp_phases(series, encoder, engine, batch, loss, clipper, noise, std, optimizer),
    }
    if "opacus" in args.modes:
        import warnings

        from opacus import GradSampleModule

        warnings.filterwarnings("ignore", module="opacus")
        warnings.filterwarnings("ignore", message="Full backward hook")
        gsm = GradSampleModule(encoder.top, batch_first=True, loss_reduction="sum")
        gsm.remove_hooks()  # hooks (even disabled ones) only while an opacus step runs

        def opacus_step(batch: TupleBatch, series=None) -> None:
            gsm.add_hooks(loss_reduction="sum", batch_first=True)
            b, s = batch.size, 2 + batch.k_neg
            anchors_pos = (batch.anchors == batch.positives[:, 1:]).long()
            optimizer.zero_grad(set_to_none=True)

            def forward():
                emb = gsm(*encoder.cached_inputs(batch.entities().reshape(-1))).reshape(b, s, -1)
                mask = torch.ones(b, batch.k_neg, dtype=torch.bool, device=emb.device)
                return tuple_losses(emb, anchors_pos, mask, kind=loss.kind, temperature=loss.temperature)

            losses = timed(series, "forward", forward)
            timed(series, "backward", lambda: losses.sum().backward())

            def clip():  # per-sequence gradients → per-tuple sums → norms → clipped sums
                per_tuple = [p.grad_sample.reshape(b, s, *p.shape).sum(1) for p in trainable]
                norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per_tuple))
                factors = clipper.factors(batch, norms)
                with torch.no_grad():
                    for p, g in zip(trainable, per_tuple, strict=True):
                        p.grad = torch.tensordot(factors, g, dims=1)
                        p.grad_sample = None

            timed(series, "clipped sums", clip)
            timed(series, "noise", lambda: add_noise([p.grad for p in trainable], noise, std))  # as dp_step
            with torch.no_grad():
                for p in trainable:
                    p.grad.div_(args.batch)
            timed(series, "adam", optimizer.step)
            gsm.remove_hooks()

        steps["opacus"] = opacus_step
        phase_fns["opacus"] = lambda series, batch: opacus_step(batch, series)
    return steps, batches, sum(p.numel() for p in trainable), phase_fns


def worker(args: argparse.Namespace) -> dict:
    """``--mode timing``: all modes interleaved step by step (so load from other processes hits
    them alike), then the phase breakdown; ``--mode <m>``: one mode alone, for its peak memory."""
    from step_phases import medians

    modes = list(MODES) if args.mode == "timing" else [args.mode]
    args.modes = modes
    load_before = os.getloadavg()
    steps, batches, trainable, phase_fns = setup(args)
    for batch in batches[: args.warmup]:
        for mode in modes:
            steps[mode](batch)
    synchronize(args.device)
    rss_start = _rss_mb("VmRSS")
    exact_peak = _reset_peak()
    wall: dict[str, list[float]] = {m: [] for m in modes}
    cpu: dict[str, list[float]] = {m: [] for m in modes}
    for i, batch in enumerate(batches[args.warmup :]):
        for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:  # rotate the order
            t0, c0 = time.perf_counter(), time.process_time()
            steps[mode](batch)
            synchronize(args.device)
            wall[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
    base = modes[0]
    load_after = os.getloadavg()
    phases: dict[str, dict[str, list[float]]] = {}
    if args.mode == "timing":
        for rep in range(args.phase_reps):
            batch = batches[args.warmup + rep % args.steps]
            kinds = list(phase_fns)
            for kind in kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]:
                phase_fns[kind](phases.setdefault(kind, {}), batch)

    def paired(series: dict[str, list[float]], m: str) -> float:
        """Median over steps of this mode's time / the first mode's time on the same batch."""
        return statistics.median(x / y for x, y in zip(series[m], series[base], strict=True))

    return {
        "times": {
            m: {
                "median_s": statistics.median(wall[m]),
                "min_s": min(wall[m]),
                "cpu_median_s": statistics.median(cpu[m]),
                "paired_ratio": paired(wall, m),
                "paired_cpu_ratio": paired(cpu, m),
            }
            for m in modes
        },
        "phases_s": medians(phases),
        "loadavg": load_after,
        "loadavg_before": load_before,
        "rss_start_mb": rss_start,
        "peak_rss_mb": _rss_mb("VmHWM"),
        "peak_is_step_only": exact_peak,
        "trainable_params": trainable,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--lora-layers", type=int, default=0, help="0: the encoder's default")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--k-neg", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--entities", type=int, default=600)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clip", type=float, default=0.1)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="tuples per micro-batch of the dp and nonprivate steps (0: the whole batch)")
    parser.add_argument("--phase-reps", type=int, default=6, help="repetitions of the phase breakdown (0: none)")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-mode peak-memory subprocesses")
    parser.add_argument("--json", help="also write the results here")
    add_device_argument(parser)
    parser.add_argument("--mode", choices=(*MODES, "timing"), help=argparse.SUPPRESS)  # worker subprocess
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(worker(args)))
        return

    def run(mode: str) -> dict:
        out = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--mode", mode], capture_output=True, text=True, check=False
        )
        if out.returncode:
            sys.exit(f"{mode} worker failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    timing = run("timing")
    memory = {} if args.no_memory else {mode: run(mode) for mode in MODES}
    t = timing["times"]
    print(f"model={args.model} b={args.batch} k_neg={args.k_neg} sequences/step={args.batch * (2 + args.k_neg)} "
          f"threads={args.threads} trainable params={timing['trainable_params']} timed steps={args.steps}")
    print(f"{'mode':<11} {'wall med s':>10} {'paired x':>9} {'cpu med s':>9} {'paired x':>9} "
          f"{'wall min s':>10} {'RSS start MB':>12} {'peak RSS MB':>11}")
    for mode in MODES:
        r, m = t[mode], memory.get(mode, {"rss_start_mb": float("nan"), "peak_rss_mb": float("nan")})
        print(f"{mode:<11} {r['median_s']:>10.3f} {r['paired_ratio']:>9.2f} {r['cpu_median_s']:>9.3f} "
              f"{r['paired_cpu_ratio']:>9.2f} {r['min_s']:>10.3f} {m['rss_start_mb']:>12.0f} "
              f"{m['peak_rss_mb']:>11.0f}")
    met = "met" if t["dp"]["paired_ratio"] <= GOAL else "missed"
    print(f"goal (issue 29): DP / non-private ≤ {GOAL}× — measured {t['dp']['paired_ratio']:.2f}× ({met}), "
          f"Opacus per-sample {t['opacus']['paired_ratio']:.2f}×, DP with torch.randn noise "
          f"{t['dp_randn']['paired_ratio']:.2f}×; load average (1/5/15 min) before "
          f"{'/'.join(f'{x:.1f}' for x in timing['loadavg_before'])}, after "
          f"{'/'.join(f'{x:.1f}' for x in timing['loadavg'])}")
    if timing["phases_s"]:
        print(f"\nphases of one step (median s over {args.phase_reps} repetitions, same process):\n")
        print(phase_table(timing["phases_s"]))
    print("paired x: median over steps of (this mode's time / the non-private step's time on the same batch, "
          "run back to back in one process, order rotated); cpu: process CPU time. RSS start / peak RSS: "
          "resident set when the timed steps of that mode (alone, fresh process) started, and its peak "
          f"(VmHWM) during them. 1-min load average at the end of timing: {timing['loadavg'][0]:.1f} on {os.cpu_count()} CPUs.")
    if not all(m["peak_is_step_only"] for m in memory.values()):
        print("note: /proc/self/clear_refs not writable; peak RSS includes setup")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "timing": timing, "memory": memory}, f, indent=2)


if __name__ == "__main__":
    main()
