"""Synthetic graphs with features and labels: the contextual SBM of paper 4 (App. K), and the
class-insensitive homophily measure its Table 1 reports.

* :func:`csbm`, :func:`csbm_phi`, :func:`phi_to_lambda_mu` — contextual stochastic block model;
* :func:`class_insensitive_homophily` — Lim et al. (2021)'s measure.

Every random choice is drawn from one ``torch.Generator`` (reproducible for a seed; by default a
fresh one seeded from the OS's entropy).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch_geometric.data import Data

from graphveil.transforms import _generator, _positive_int

__all__ = ["class_insensitive_homophily", "csbm", "csbm_phi", "phi_to_lambda_mu"]


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
