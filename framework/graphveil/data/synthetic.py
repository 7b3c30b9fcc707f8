"""Synthetic graphs with features and labels: the contextual SBM of paper 4 (App. K), and the
class-insensitive homophily measure its Table 1 reports.

* :func:`csbm`, :func:`csbm_phi`, :func:`phi_to_lambda_mu` — contextual stochastic block model;
* :func:`class_insensitive_homophily` — Lim et al. (2021)'s measure;
* :func:`block_csbm` — a C-class contextual SBM sized by its number of edges, and
  :func:`power_law_graph` — a Chung–Lu graph with a power-law degree sequence, both with
  class-conditional Gaussian features, for scale benchmarks (``bench/scale.py``);
* :func:`write_parquet` — such a graph as the ``parquet`` source's two tables.

Every random choice is drawn from one ``torch.Generator`` (reproducible for a seed; by default a
fresh one seeded from the OS's entropy).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch_geometric.data import Data

from graphveil.transforms import _generator, _positive_int

__all__ = ["block_csbm", "class_insensitive_homophily", "csbm", "csbm_phi", "phi_to_lambda_mu",
           "power_law_graph", "write_parquet"]


def class_insensitive_homophily(
    edge_index: torch.Tensor, y: torch.Tensor, num_classes: int | None = None
) -> float:
    """Class-insensitive edge homophily (Lim et al. 2021, LINKX; paper 4, App. K and Table 1).

    ``(1 / (C-1)) · Σ_c max(0, h_c − |{i : y_i = c}| / n)`` where ``h_c`` is the fraction of the
    edges *into* class-c nodes (target ``edge_index[1]`` of class c) whose source is of class c
    (0 for a class with no such edge). In [0, 1]; 1 is the strongest homophily. This is LINKX's
    ``h_c`` and PyG's ``homophily(method="edge_insensitive")``; it gives Cora 0.7657, paper 4's
    Table 1 value. Paper 4 prints ``|E|`` as the denominator of ``h_c``, which would give 0 for
    a perfectly homophilous graph with two balanced classes, so the printed formula is a typo.
    """
    if y.dim() != 1 or y.numel() == 0 or y.dtype.is_floating_point:
        raise ValueError("y must be a non-empty integer (n,) tensor of class ids")
    num_classes = int(y.max()) + 1 if num_classes is None else num_classes
    _positive_int("num_classes", num_classes, minimum=2)
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= num_classes):
        raise ValueError(f"y must hold class ids in 0..{num_classes - 1}")
    src, dst = edge_index
    into = torch.bincount(y[dst], minlength=num_classes).double()
    same = torch.bincount(y[dst][y[src] == y[dst]], minlength=num_classes).double()
    h = same / into.clamp(min=1)
    share = torch.bincount(y, minlength=num_classes).double() / y.numel()
    return float((h - share).clamp(min=0).sum() / (num_classes - 1))

def phi_to_lambda_mu(
    phi: float, *, num_nodes: int, num_features: int, epsilon: float = 3.25
) -> tuple[float, float]:
    """cSBM parameters (λ, μ) for ϕ ∈ [−1, 1] on the arc λ² + μ²/ξ = 1 + ε, ξ = n/f.

    ``λ = √(1+ε) · sin(ϕπ/2)``, ``μ = √(ξ(1+ε)) · cos(ϕπ/2)``: Chien et al., "Adaptive Universal
    Generalized PageRank Graph Neural Network" (GPR-GNN, ICLR 2021), Sec. 5.1 and their
    cSBM generator, which paper 4's code uses unchanged (``core/datasets/cSBM_dataset.py``,
    ``parameterized_Lambda_and_mu``). It satisfies paper 4's App. K arc exactly
    (sin² + cos² = 1); |ϕ| → 1 puts the information in the graph (μ → 0), ϕ → 0 in the
    features (λ → 0), and the sign of ϕ is the sign of λ (homophily +, heterophily −).
    Paper 4 uses n = 10,000, f = 200 (ξ = 50), ε = 3.25.
    """
    if not isinstance(phi, float | int) or not -1.0 <= phi <= 1.0:
        raise ValueError(f"phi must be in [-1, 1], got {phi!r}")
    _positive_int("num_nodes", num_nodes, minimum=2)
    _positive_int("num_features", num_features)
    if not isinstance(epsilon, float | int) or not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    xi = num_nodes / num_features
    angle = phi * math.pi / 2
    return math.sqrt(1 + epsilon) * math.sin(angle), math.sqrt(xi * (1 + epsilon)) * math.cos(angle)

def _distinct_keys(
    k: int, m: int, draw: Callable[[int], torch.Tensor], generator: torch.Generator
) -> torch.Tensor:
    """A uniformly random k-subset of ``0..m-1`` from ``draw(s)`` (s i.i.d. uniform keys).

    Given how many distinct keys s draws produced, they are a uniform subset of that size; a
    uniform k-subset of it is a uniform k-subset of ``0..m-1``. Too few → a fresh, larger try.
    """
    if k == 0:
        return torch.zeros(0, dtype=torch.long)
    size = k + (k * k) // m + 16  # covers the expected number of repeats, k²/(2m)
    while True:
        keys = torch.unique(draw(size))
        if keys.numel() >= k:
            return keys[torch.randperm(keys.numel(), generator=generator)[:k]]
        size *= 2

def _block_edges(
    a: int, b: int | None, p: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent Bernoulli(p) edges between block-local indices: unordered pairs in one block
    of size a (b is None), or all a × b pairs between two blocks. Binomial count, then a uniform
    set of that many distinct pairs — the same law, without an a × b matrix."""
    m = a * (a - 1) // 2 if b is None else a * b
    if m == 0 or p == 0.0:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    k = int(torch.binomial(torch.tensor(float(m), dtype=torch.float64),
                           torch.tensor(p, dtype=torch.float64), generator=generator))
    if b is None:
        def draw(s: int) -> torch.Tensor:  # an unordered pair {i, j}, i != j, is 2 of a(a-1) cells
            i = torch.randint(a, (s,), generator=generator)
            j = torch.randint(a - 1, (s,), generator=generator)
            j = j + (j >= i).long()
            return torch.minimum(i, j) * a + torch.maximum(i, j)
        keys = _distinct_keys(k, m, draw, generator)
        return keys // a, keys % a

    def draw_cross(s: int) -> torch.Tensor:
        return (torch.randint(a, (s,), generator=generator) * b
                + torch.randint(b, (s,), generator=generator))
    keys = _distinct_keys(k, m, draw_cross, generator)
    return keys // b, keys % b

def csbm(
    num_nodes: int,
    num_features: int,
    avg_degree: float,
    lambda_: float,
    mu: float,
    generator: torch.Generator | None = None,
) -> Data:
    """A contextual stochastic block model graph as paper 4, App. K describes (after [18, 19]).

    Two classes of ⌈n/2⌉ (``v = +1``, ``y = 1``) and ⌊n/2⌋ (``v = −1``, ``y = 0``) nodes, placed
    at uniformly random node indices. Features ``b_i = √(μ/n) v_i u + Z_i/√f`` with
    ``u ~ N(0, I/f)`` shared by all nodes and ``Z_i`` standard normal (float32, ``x``). Edges
    undirected and independent given the labels, no self-loops, each pair {i, j} with
    probability ``(d + λ√d)/n`` if ``v_i = v_j`` and ``(d − λ√d)/n`` otherwise; stored in both
    directions, sorted, without duplicates (``edge_index``). Sampled per block pair as a
    Binomial count placed uniformly without repetition: O(n f + E) time and memory, no n × n
    matrix. The expected degree is ``d − (d + λ√d)/n`` (≈ d).

    :raises ValueError: if an argument is out of range, in particular if a probability
        ``(d ± λ√d)/n`` falls outside [0, 1] (needs |λ| ≤ √d and d + |λ|√d ≤ n).
    """
    n = _positive_int("num_nodes", num_nodes, minimum=2)
    f = _positive_int("num_features", num_features)
    for name, value in (("avg_degree", avg_degree), ("lambda_", lambda_), ("mu", mu)):
        if not isinstance(value, float | int) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if avg_degree < 0:
        raise ValueError(f"avg_degree must be >= 0, got {avg_degree!r}")
    if mu < 0:
        raise ValueError(f"mu must be >= 0, got {mu!r}")
    d, spread = float(avg_degree), abs(lambda_) * math.sqrt(avg_degree)
    if d - spread < 0 or d + spread > n:
        raise ValueError(f"lambda_={lambda_} gives an edge probability (d ± λ√d)/n outside [0, 1] "
                         f"for avg_degree={avg_degree}, num_nodes={n}: need |lambda_| <= √d and "
                         f"d + |lambda_|·√d <= num_nodes")
    p_in = min(max((d + lambda_ * math.sqrt(d)) / n, 0.0), 1.0)
    p_out = min(max((d - lambda_ * math.sqrt(d)) / n, 0.0), 1.0)
    g = _generator(generator)

    size_pos = n - n // 2
    perm = torch.randperm(n, generator=g)
    pos, neg = perm[:size_pos], perm[size_pos:]
    v = torch.full((n,), -1.0)
    v[pos] = 1.0
    parts = []
    for (i, j), left, right in (
        (_block_edges(size_pos, None, p_in, g), pos, pos),
        (_block_edges(n // 2, None, p_in, g), neg, neg),
        (_block_edges(size_pos, n // 2, p_out, g), pos, neg),
    ):
        parts.append(torch.stack([left[i], right[j]]))
    one_way = torch.cat(parts, dim=1)
    both = torch.cat([one_way, one_way.flip(0)], dim=1)
    edge_index = both[:, torch.argsort(both[0] * n + both[1])]

    u = torch.randn(f, generator=g) / math.sqrt(f)
    z = torch.randn(n, f, generator=g)
    x = math.sqrt(mu / n) * v[:, None] * u + z / math.sqrt(f)
    return Data(x=x, edge_index=edge_index, y=(v > 0).long(), num_nodes=n)

def csbm_phi(
    phi: float,
    *,
    num_nodes: int = 10_000,
    num_features: int = 200,
    avg_degree: float = 5.0,
    epsilon: float = 3.25,
    generator: torch.Generator | None = None,
) -> Data:
    """:func:`csbm` at ϕ: (λ, μ) from :func:`phi_to_lambda_mu`, stored as ``data.lambda_``,
    ``data.mu`` and ``data.phi`` (floats). Defaults: paper 4, App. K (n = 10,000, f = 200,
    ε = 3.25). Paper 4 does not state d; 5 is GPR-GNN's cSBM choice (paper 4's code uses d = 10
    with n = 30,000, f = 2,000). With ε = 3.25, |ϕ| = 1 needs d ≥ 1 + ε = 4.25.
    """
    lambda_, mu = phi_to_lambda_mu(phi, num_nodes=num_nodes, num_features=num_features,
                                   epsilon=epsilon)
    data = csbm(num_nodes, num_features, avg_degree, lambda_, mu, generator)
    data.lambda_, data.mu, data.phi = lambda_, mu, float(phi)
    return data


def _both_directions(one_way: torch.Tensor, n: int) -> torch.Tensor:
    """``(2, m)`` undirected edges, each once → both directions, sorted by (source, target)."""
    both = torch.cat([one_way, one_way.flip(0)], dim=1)
    return both[:, torch.argsort(both[0] * n + both[1])]


def _labels(n: int, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """Classes of sizes ⌈n/C⌉ or ⌊n/C⌋ at uniformly random node indices."""
    y = torch.empty(n, dtype=torch.long)
    y[torch.randperm(n, generator=generator)] = torch.arange(n) % num_classes
    return y


def _gaussian_features(y: torch.Tensor, num_classes: int, num_features: int, signal: float,
                       generator: torch.Generator) -> torch.Tensor:
    """``x_i = m_{y_i} + z_i``: class means ``m_c ~ N(0, signal² I / f)`` and ``z_i ~ N(0, I / f)``
    (float32), so the class signal per node is ``signal`` times the noise (in norm)."""
    f = num_features
    means = torch.randn(num_classes, f, generator=generator) * (signal / math.sqrt(f))
    x = torch.randn(y.numel(), f, generator=generator).div_(math.sqrt(f))
    return x.add_(means[y])


def _check_sizes(num_nodes: int, num_edges: int, num_classes: int, num_features: int) -> None:
    _positive_int("num_nodes", num_nodes, minimum=2)
    _positive_int("num_edges", num_edges, minimum=0)
    _positive_int("num_classes", num_classes, minimum=2)
    _positive_int("num_features", num_features)
    if num_classes > num_nodes:
        raise ValueError(f"num_classes={num_classes} exceeds num_nodes={num_nodes}")
    if num_edges > num_nodes * (num_nodes - 1) // 4:
        raise ValueError(f"num_edges={num_edges} is more than a quarter of the {num_nodes * (num_nodes - 1) // 2} "
                         f"node pairs of num_nodes={num_nodes}: not a sparse graph")


def block_csbm(
    num_nodes: int,
    num_edges: int,
    *,
    num_classes: int = 5,
    num_features: int = 32,
    homophily: float = 0.8,
    signal: float = 1.0,
    generator: torch.Generator | None = None,
) -> Data:
    """A C-class contextual stochastic block model with about ``num_edges`` undirected edges.

    Classes of equal size (±1) at random node indices (``y``); features ``x`` class-conditional
    Gaussian (:func:`_gaussian_features`). Each unordered pair {i, j} (no self-loops) is an edge
    independently with probability ``p_in`` if ``y_i = y_j``, else ``p_out``, chosen so that
    ``homophily`` of the expected edges join nodes of one class and their expected number is
    ``num_edges``. Sampled per block pair as a Binomial count placed uniformly without
    repetition (:func:`_block_edges`): O(C² + n f + E log E), no pair enumerated. ``edge_index``
    holds both directions, sorted, no duplicates (PyG layout); ``data.num_edges`` counts columns.

    :raises ValueError: on a size out of range, ``homophily`` outside [0, 1], or a probability
        above 1 (too many edges for the blocks).
    """
    n, c = num_nodes, num_classes
    _check_sizes(n, num_edges, c, num_features)
    if not isinstance(homophily, float | int) or not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily!r}")
    g = _generator(generator)
    y = _labels(n, c, g)
    sizes = torch.bincount(y, minlength=c).tolist()
    members = [torch.nonzero(y == k).flatten() for k in range(c)]
    intra = sum(s * (s - 1) // 2 for s in sizes)
    inter = n * (n - 1) // 2 - intra
    p_in = homophily * num_edges / intra if intra else 0.0
    p_out = (1 - homophily) * num_edges / inter if inter else 0.0
    if p_in > 1 or p_out > 1:
        raise ValueError(f"num_edges={num_edges} with homophily={homophily} needs an edge probability "
                         f"above 1 ({max(p_in, p_out):.3g}) for {n} nodes in {c} classes")
    parts = []
    for a in range(c):
        for b in range(a, c):
            i, j = _block_edges(sizes[a], None if a == b else sizes[b], p_in if a == b else p_out, g)
            parts.append(torch.stack([members[a][i], members[b][j]]))
    edge_index = _both_directions(torch.cat(parts, dim=1), n)
    x = _gaussian_features(y, c, num_features, signal, g)
    return Data(x=x, edge_index=edge_index, y=y, num_nodes=n)


def power_law_graph(
    num_nodes: int,
    num_edges: int,
    *,
    exponent: float = 2.5,
    num_classes: int = 5,
    num_features: int = 32,
    signal: float = 1.0,
    generator: torch.Generator | None = None,
) -> Data:
    """A simple undirected graph of exactly ``num_edges`` edges with a power-law degree tail.

    Chung–Lu (Chung and Lu 2002) with the expected-degree weights ``w_i ∝ (i + i₀)^(−1/(γ−1))``
    of a degree distribution ``P(k) ∝ k^(−γ)`` (γ = ``exponent`` > 2; i₀ caps the largest weight
    at √(2E), the Chung–Lu condition max w² ≤ Σw), at random node indices. Departure from the
    model: instead of an independent Bernoulli per pair, endpoint pairs are drawn i.i.d. ∝
    ``w_u w_v`` (inverse-CDF on the cumulative weights), self-loops and repeats dropped, and
    draws repeated until ``num_edges`` distinct edges exist; a uniform subset of that size is
    kept. Degrees then follow the weights up to the repeats removed at the hubs. Labels uniform
    over ``num_classes`` (no homophily); features class-conditional Gaussian. O(n f + E log E).
    """
    n = num_nodes
    _check_sizes(n, num_edges, num_classes, num_features)
    if not isinstance(exponent, float | int) or not exponent > 2:
        raise ValueError(f"exponent must be > 2 (a finite mean degree), got {exponent!r}")
    g = _generator(generator)
    alpha = 1.0 / (exponent - 1.0)
    rank = torch.arange(n, dtype=torch.float64)
    offset = _chung_lu_offset(n, num_edges, alpha)
    weights = (rank + offset).pow(-alpha)
    weights = weights[torch.randperm(n, generator=g)]
    cdf = torch.cumsum(weights, 0)
    cdf = cdf / cdf[-1]
    keys = torch.zeros(0, dtype=torch.long)
    draw = num_edges + num_edges // 10 + 16
    while keys.numel() < num_edges:
        ends = torch.searchsorted(cdf, torch.rand(2, draw, generator=g, dtype=torch.float64)).clamp_(max=n - 1)
        u, v = ends
        u, v = u[u != v], v[u != v]
        keys = torch.unique(torch.cat([keys, torch.minimum(u, v) * n + torch.maximum(u, v)]))
        draw = max(2 * (num_edges - keys.numel()), 16)
    keys = keys[torch.randperm(keys.numel(), generator=g)[:num_edges]]
    edge_index = _both_directions(torch.stack([keys // n, keys % n]), n)
    y = _labels(n, num_classes, g)
    x = _gaussian_features(y, num_classes, num_features, signal, g)
    return Data(x=x, edge_index=edge_index, y=y, num_nodes=n)


def _chung_lu_offset(n: int, num_edges: int, alpha: float) -> float:
    """The least i₀ ≥ 1 with ``w_0 / mean(w) · 2E/n ≤ √(2E)`` for ``w_i = (i + i₀)^(−α)``: the
    hub's expected degree at most √(2E) (bisection; the ratio falls as i₀ grows)."""
    target = math.sqrt(2 * num_edges) * n / (2 * max(num_edges, 1))
    rank = torch.arange(n, dtype=torch.float64)

    def ratio(i0: float) -> float:
        w = (rank + i0).pow(-alpha)
        return float(w[0] / w.mean())

    lo, hi = 1.0, 1.0
    while ratio(hi) > target:
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(mid) > target else (lo, mid)
    return hi


def write_parquet(data: Data, folder: str | Path, *, row_group_size: int = 1 << 17) -> dict[str, str]:
    """``data`` (``x``, ``y``, ``edge_index`` both directions) as the ``parquet`` source's tables:
    ``nodes.parquet`` (``id`` int64, ``label`` int64, ``x`` list<float32>) and ``edges.parquet``
    (``source``, ``target`` int64, each undirected edge once, u < v), in row groups of
    ``row_group_size`` so a reader streams them. Returns the source's data options
    (``source``, ``path``, ``entities``, ``features_col``, ``label_col``)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    x = data.x.to(torch.float32).numpy()
    n, f = x.shape
    vec = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), f).cast(pa.list_(pa.float32()))
    nodes = pa.table({"id": pa.array(np.arange(n, dtype=np.int64)), "label": pa.array(data.y.numpy()),
                      "x": vec})
    pq.write_table(nodes, folder / "nodes.parquet", row_group_size=row_group_size)
    u, v = data.edge_index
    once = u < v
    edges = pa.table({"source": pa.array(u[once].numpy()), "target": pa.array(v[once].numpy())})
    pq.write_table(edges, folder / "edges.parquet", row_group_size=row_group_size)
    return {"source": "parquet", "path": str(folder / "edges.parquet"), "entities": str(folder / "nodes.parquet"),
            "features_col": "x", "label_col": "label"}
