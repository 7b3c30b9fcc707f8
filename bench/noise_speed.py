"""Cost of safe DP noise: CSPRNG 4-sum noise vs seeded ``torch.randn``, in the same run.

GraphVeil draws every DP noise coordinate as (z₁+z₂+z₃+z₄)/2 of four standard normals from the
CSPRNG (AES-256-CTR under a fresh ``os.urandom`` key, Box–Muller on 53-bit uniforms; the floating-point-safe recipe of
Opacus' secure mode, Holohan & Braghin 2021). This times it against one seeded ``torch.randn``
draw (what the old default did: fast, reproducible and subtractable) and against a seeded 4-sum
(the research-seed mode), for 1e4, 1e6 and 1e7 coordinates, and prints the ratios.

For scale: the LoRA adapters of the demo (rank 8 on query/value of one MiniLM layer) have
4·8·384 = 12 288 trainable coordinates, so one DP step draws ~1e4 noise coordinates.

    python bench/noise_speed.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from graphveil.engine.noise import GaussianNoise


def best_of(fn, repeats: int) -> float:  # noqa: ANN001 - a thunk
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e6, 1e7])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    csprng = GaussianNoise()
    research = GaussianNoise(research_seed=0)
    seeded = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; best (median) of {args.repeats}")
    print(f"{'coords':>10} | {'randn (s)':>18} | {'seeded 4-sum (s)':>18} | {'CSPRNG 4-sum (s)':>18} | "
          f"{'CSPRNG/randn':>12} | {'CSPRNG/seeded 4-sum':>19}")
    for size in args.sizes:
        n = int(size)
        shape = (n,)
        t_randn = best_of(lambda: torch.randn(shape, generator=seeded) * 1.5, args.repeats)  # noqa: B023
        t_seed4 = best_of(lambda: research.sample(shape, 1.5), args.repeats)  # noqa: B023
        t_csprng = best_of(lambda: csprng.sample(shape, 1.5), args.repeats)  # noqa: B023
        print(f"{n:>10.0e} | {t_randn[0]:>8.5f} ({t_randn[1]:.5f}) | {t_seed4[0]:>8.5f} ({t_seed4[1]:.5f}) | "
              f"{t_csprng[0]:>8.5f} ({t_csprng[1]:.5f}) | {t_csprng[0] / t_randn[0]:>12.1f} | "
              f"{t_csprng[0] / t_seed4[0]:>19.1f}")


if __name__ == "__main__":
    main()
