"""Sampler speed on a synthetic graph (default: 5M edges, 1M nodes, skewed degrees).

Times ``prepare()`` (degree capping included for the node-level samplers) and ``sample()`` of
every built-in relational sampler, the Poisson primitive against a one-Bernoulli-per-record
mask, and FREQ-CLIP's batch frequencies. A benchmark, not a test: it prints numbers.

    python bench/sampler_speed.py [--edges 5000000 --nodes 1000000 --batch-size 1024 --k-neg 4]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from graphveil.data.graph import RelationalGraph
from graphveil.plugins.edge_dp.sampler import PoissonDecoupledSampler
from graphveil.plugins.entity_dp.clipping import FreqClipper
from graphveil.plugins.entity_dp.degree_cap import cap_degrees
from graphveil.plugins.entity_dp.sampler import PoissonWithReplacementNegSampler, PoissonWORSampler
from graphveil.sampling import poisson_subset


def synthetic_graph(num_edges: int, num_nodes: int, seed: int) -> RelationalGraph:
    """Unique undirected edges u < v; one end drawn ∝ 1/rank^0.8 (hubs), the other uniformly."""
    g = torch.Generator().manual_seed(seed)
    draws = int(num_edges * 1.1) + 1000
    weights = torch.arange(1, num_nodes + 1, dtype=torch.float64) ** -0.8
    hub = torch.multinomial(weights, draws, replacement=True, generator=g)
    other = torch.randint(0, num_nodes, (draws,), generator=g)
    u, v = torch.minimum(hub, other), torch.maximum(hub, other)
    keys = torch.unique((u * num_nodes + v)[u != v])
    keys = keys[torch.randperm(keys.numel(), generator=g)[:num_edges]].sort().values
    edges = torch.stack([keys // num_nodes, keys % num_nodes], 1)
    return RelationalGraph("synthetic", [f"n{i}" for i in range(num_nodes)], edges)


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median, mean) seconds over ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), statistics.fmean(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", type=int, default=5_000_000)
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--k-neg", type=int, default=4)
    parser.add_argument("--degree-cap", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)

    start = time.perf_counter()
    graph = synthetic_graph(args.edges, args.nodes, args.seed)
    deg = graph.degrees()
    print(f"graph: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, max degree {int(deg.max()):,}, "
          f"{int((deg > args.degree_cap).sum()):,} nodes above K={args.degree_cap} "
          f"(built in {time.perf_counter() - start:.1f} s; torch threads {torch.get_num_threads()})")

    g = torch.Generator().manual_seed(args.seed)
    for K in sorted({1, args.degree_cap, 20}):
        start = time.perf_counter()
        kept = cap_degrees(graph.edges, graph.num_nodes, K, g)
        print(f"cap_degrees K={K:>2}: {time.perf_counter() - start:6.2f} s -> {kept.shape[0]:,} edges")

    b, k = args.batch_size, args.k_neg
    rate = b / graph.num_edges
    med, _ = timed(lambda: poisson_subset(graph.num_edges, rate, g), args.steps)
    bern, _ = timed(lambda: torch.nonzero(torch.rand(graph.num_edges, generator=g) < rate), 20)
    print(f"poisson_subset(m={graph.num_edges:,}, γ={rate:.2e}): {med * 1e3:.3f} ms "
          f"(one Bernoulli per record: {bern * 1e3:.1f} ms)")

    print(f"\nsamplers (b={b}, k_neg={k}, K={args.degree_cap}); sample() over {args.steps} steps")
    print(f"{'sampler':<36}{'prepare s':>10}{'m':>12}{'median ms':>11}{'mean ms':>9}{'mean l':>8}")
    clip = FreqClipper(FreqClipper.Params(clip_norm=1.0))
    last = None
    for cls, params in [
        (PoissonWORSampler, {"degree_cap": args.degree_cap}),
        (PoissonWithReplacementNegSampler, {"degree_cap": args.degree_cap}),
        (PoissonDecoupledSampler, {}),
    ]:
        sampler = cls(cls.Params(batch_size=b, k_neg=k, **params))
        start = time.perf_counter()
        profile = sampler.prepare(graph, g)
        prep = time.perf_counter() - start
        sizes: list[int] = []

        def draw(sampler=sampler, sizes=sizes) -> None:  # noqa: ANN001
            sizes.append(sampler.sample(g).size)

        med, mean = timed(draw, args.steps)
        print(f"{cls.__name__:<36}{prep:>10.2f}{profile.num_records:>12,}{med * 1e3:>11.3f}{mean * 1e3:>9.3f}"
              f"{statistics.fmean(sizes):>8.0f}")
        if cls is PoissonWORSampler:
            last = sampler.sample(g)
            clip.bind(profile)
    assert last is not None
    norms = torch.rand(last.size)
    med, _ = timed(lambda: clip.factors(last, norms), args.steps)
    print(f"\nFreqClipper.factors on a {last.size}-tuple WOR batch: {med * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
