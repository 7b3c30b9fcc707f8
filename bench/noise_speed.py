"""Cost of safe DP noise: the CSPRNG noise vs seeded ``torch.randn``, per coordinate, in one run.

GraphVeil draws every DP noise coordinate j as (r_j sin φ_j + r_{j+1} cos φ_{j+1})/√2, a chain of
Box–Muller pairs (four 53-bit uniforms behind each coordinate, 16 bytes of keystream per
coordinate) from an AES-256 counter-mode keystream under a fresh ``os.urandom`` key per draw (the
floating-point defence of Holohan & Braghin 2021 at its n = 2 strength; see
``graphveil.engine.noise``), in chunks across ``torch.get_num_threads()`` threads, written
straight into the target tensor. This times it against seeded ``torch.randn`` (fast,
reproducible and subtractable: NOT private) in the same process, the modes interleaved in every
repeat so that load from other processes hits them alike:

* ``sample``: ``GaussianNoise().sample(shape, σ)`` vs ``torch.randn(shape) * σ`` (a new tensor);
* ``add_``: ``GaussianNoise().add_([buffer], σ)`` vs ``buffer.add_(torch.randn(shape), alpha=σ)``
  (what a DP step does to a gradient buffer);
* the research-seed mode's ``sample`` (the same pipeline keyed from a seeded generator);
* ``add_`` once more with the torch transform (the fused C kernel of
  ``graphveil.engine.noise_kernel`` switched off), where the install has the kernel;
* the draw of a full fine-tuning step of the packaged MiniLM: ``add_`` over its 95 trainable
  gradient tensors (22 563 072 coordinates; shapes below) vs ``randn`` added to each.

Goal (issue 29): CSPRNG noise ≤ 3× ``torch.randn`` per coordinate at 10⁶ and 10⁷ coordinates;
printed beside each measured ratio (ratio of the best times; the median ratio in brackets).

    python bench/noise_speed.py [--repeats 7] [--threads 2] [--sizes 1e4 1e6 1e7]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch

from graphveil.engine import noise_kernel
from graphveil.engine.noise import GaussianNoise

GOAL = 3.0
GOAL_FROM = 10**6  # coordinates: below, per-call overhead dominates and no goal is set

#: MiniLM-L6-H384 (the packaged model) under ``finetune: full``: every weight but the pooler and
#: the attention key biases (their gradient is exactly zero; see the hf_lora encoder).
HIDDEN, FFN, LAYERS = 384, 1536, 6
MINILM_FULL = (
    [(30522, HIDDEN), (512, HIDDEN), (2, HIDDEN), (HIDDEN,), (HIDDEN,)]
    + LAYERS * [(HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN,),  # q, k, v
                (HIDDEN, HIDDEN), (HIDDEN,), (HIDDEN,), (HIDDEN,),  # attention output, LayerNorm
                (FFN, HIDDEN), (FFN,), (HIDDEN, FFN), (HIDDEN,), (HIDDEN,), (HIDDEN,)]  # FFN, LayerNorm
)
MINILM_FULL_WEIGHTS = 22_563_072


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """(best, median) seconds of each thunk; each repeat runs every thunk once, order rotated."""
    names, times = list(fns), {name: [] for name in fns}
    for i in range(repeats):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - start)
    return {name: (min(t), statistics.median(t)) for name, t in times.items()}


def ratio_cell(ours: tuple[float, float], base: tuple[float, float], n: int) -> str:
    best, median = ours[0] / base[0], ours[1] / base[1]
    goal = f"≤ {GOAL:.0f}× {'met' if best <= GOAL else 'NOT met'}" if n >= GOAL_FROM else "no goal"
    return f"{best:5.2f}× ({median:5.2f}×)  {goal}"


def torch_transform(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` with the fused noise kernel switched off (the torch transform of the same noise)."""
    def run() -> None:
        kept, noise_kernel.KERNEL = noise_kernel.KERNEL, None
        try:
            fn()
        finally:
            noise_kernel.KERNEL = kept
    return run


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e6, 1e7])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--std", type=float, default=1.5)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    assert sum(torch.Size(s).numel() for s in MINILM_FULL) == MINILM_FULL_WEIGHTS
    csprng, research = GaussianNoise(), GaussianNoise(research_seed=0)
    seeded = torch.Generator().manual_seed(0)
    std = args.std
    print(f"{datetime.date.today()}  {cpu_model()}, {os.cpu_count()} CPUs; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; best (median) of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.2f}")
    kernel = noise_kernel.KERNEL
    print(f"noise transform: {noise_kernel.transform_name()}")
    print(f"{'coords':>10} | {'randn·σ':>17} | {'CSPRNG sample':>17} | {'research sample':>17} | "
          f"{'sample: CSPRNG/randn':>34} | {'buf.add_(randn)':>17} | {'CSPRNG add_':>17} | "
          f"{'add_: CSPRNG/randn':>34}")
    for size in args.sizes:
        n = int(size)
        buf_r, buf_c = torch.zeros(n), torch.zeros(n)
        t = interleaved({
            "randn": lambda n=n: torch.randn(n, generator=seeded) * std,
            "csprng": lambda n=n: csprng.sample((n,), std),
            "research": lambda n=n: research.sample((n,), std),
            "randn_add": lambda b=buf_r, n=n: b.add_(torch.randn(n, generator=seeded), alpha=std),
            "csprng_add": lambda b=buf_c: csprng.add_([b], std),
            **({"torch_add": torch_transform(lambda b=buf_c: csprng.add_([b], std))} if kernel else {}),
        }, args.repeats)

        def cell(name: str, t: dict = t) -> str:
            return f"{t[name][0]:8.5f} ({t[name][1]:.5f})"

        print(f"{n:>10.2e} | {cell('randn')} | {cell('csprng')} | {cell('research')} | "
              f"{ratio_cell(t['csprng'], t['randn'], n):>34} | {cell('randn_add')} | {cell('csprng_add')} | "
              f"{ratio_cell(t['csprng_add'], t['randn_add'], n):>34}"
              + (f" | torch transform add_ {cell('torch_add')}: {t['torch_add'][0] / t['randn_add'][0]:.2f}× randn"
                 if kernel else ""))
    grads_r = [torch.zeros(s) for s in MINILM_FULL]
    grads_c = [torch.zeros(s) for s in MINILM_FULL]

    def randn_grads() -> None:
        for g in grads_r:
            g.add_(torch.randn(g.shape, generator=seeded), alpha=std)

    t = interleaved({"randn": randn_grads, "csprng": lambda: csprng.add_(grads_c, std)}, args.repeats)
    print(f"MiniLM full fine-tuning step, {len(MINILM_FULL)} gradient tensors, {MINILM_FULL_WEIGHTS:,} coords: "
          f"randn {t['randn'][0]:.4f} s ({t['randn'][1]:.4f}), CSPRNG add_ {t['csprng'][0]:.4f} s "
          f"({t['csprng'][1]:.4f}): {ratio_cell(t['csprng'], t['randn'], MINILM_FULL_WEIGHTS)}")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
