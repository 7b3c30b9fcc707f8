"""Exact, sparse randomized response (RR) on the adjacency of an undirected graph.

This is the mechanism behind RandEdge (paper 4, shared/papers/dp-decoupled-graph-convolutions-gdp.txt,
"RandEdge+SAGE", edge-level GDP) and paper 2's RR baseline (shared/papers/
privately-learning-from-graphs-llm-finetuning.txt, Sec. 4): every entry of the adjacency is
reported truthfully with probability 1 − p and flipped with probability p = 1/(1 + e^ε).

**One decision per unordered pair.** An undirected graph on n nodes has N = n(n−1)/2 entries,
one per unordered pair {u, v}, u ≠ v. Each is randomized exactly once here and reported as
(u, v) with u < v. (A known public implementation flips (u, v) and (v, u) independently and
symmetrizes; one undirected edge then influences two randomized entries and the release is
only 2ε-DP, and a pair's presence probability becomes 1 − p² or 1 − (1 − p)² instead of 1 − p
or p.) For each pair the output bit b̃ given the true bit b satisfies
P[b̃ | b] / P[b̃ | 1 − b] ≤ (1 − p)/p = e^ε, and the pairs are randomized independently, so
adding or removing one undirected edge — one entry — changes the output distribution by a
factor of at most e^ε: the release is ε-edge-DP (pure, δ = 0).

**Exact and sparse.** The output is distributed exactly as N independent coin flips, but costs
O(m + K) random draws and memory (m true edges, K ≈ N₀·p flipped non-edges), not O(n²):

* each true edge is kept by its own Bernoulli(1 − p) draw (float64 uniforms, resolution 2⁻⁵³);
* the number of non-edges that become edges is K ~ Binomial(N₀, p), N₀ = N − m, drawn with
  ``numpy.random.Generator.binomial``, which takes an int64 count and samples with exact
  algorithms in double precision (inversion when N₀·p < 30, else the BTPE rejection sampler of
  Kachitvichyanukul & Schmeiser 1988). ``torch.distributions.Binomial`` is not used: it holds the
  count as a float tensor and samples by a float approximation, inexact for N₀ ~ 10¹⁰ and
  beyond;
* K distinct non-edges are then chosen uniformly among all K-subsets of non-edges by rejection
  (:func:`sample_non_edge_indices`). Given K = k, every k-subset is equally likely, so
  P[non-edge set = S] = P[K = |S|] / C(N₀, |S|) = p^|S| (1 − p)^(N₀ − |S|) — exactly independent
  Bernoulli(p) flips of the non-edges.

**Randomness.** By default (``generator=None``) every draw that decides which pairs are
released — each true edge's keep coin and the uniform candidates of the non-edge sampler — comes
from an OS-keyed AES-256-CTR keystream, as the Gaussian noise
(:func:`graphveil.engine.noise.csprng_bytes`): 53-bit uniforms, and integers below N by
rejection of 64-bit words (:func:`uniform_below`, exact). Only the count K is drawn by numpy's
exact binomial sampler on a ``PCG64`` seeded with 256 fresh bits from ``os.urandom`` and used for
that one draw: K is visible in the release's size anyway, and nothing else is drawn from that
stream. With a ``torch.Generator`` (a configured seed, for reproducible research) all draws come
from a ``PCG64`` seeded from it instead: one torch seed reproduces the whole release, and whoever
knows the seed can recompute every coin.

**Pair indices.** Pairs are numbered in colexicographic order, index(u, v) = v(v−1)/2 + u for
u < v, a bijection between {(u, v): 0 ≤ u < v < n} and [0, n(n−1)/2) (:func:`pair_index`,
:func:`index_to_pair`). The inverse starts from a float square root and is then corrected with
integer arithmetic only, so it is exact for every n whose n(n−1)/2 fits in int64 (n ≤ 2³²).

**Order.** The released pairs are sorted (by u, then v), so the order of the output reveals
nothing about which pairs were true edges (concatenating kept edges and flipped non-edges would
leak exactly that).

**Accounting.** :func:`rr_event` returns dp-accounting's ``RandomizedResponseDpEvent`` with
``num_buckets=2`` and ``noise_parameter=2/(1+e^ε)``: that event answers uniformly at random with
probability q and truthfully otherwise, so it keeps the input bucket with probability
1 − q + q/2 = 1 − 1/(1+e^ε) = e^ε/(1+e^ε) — exactly this binary RR. Its exact replace-one RDP
curve tends to ε at high orders and is never above the generic pure-ε curve min(ε, αε²/2).
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

__all__ = [
    "MAX_NUM_NODES",
    "EdgeRandomizedResponse",
    "flip_probability",
    "index_to_pair",
    "num_pairs",
    "pair_index",
    "randomized_response_edges",
    "rr_event",
    "sample_non_edge_indices",
]

_INT64_MAX = 2**63 - 1
#: Largest n whose n(n−1)/2 unordered pairs are numbered in int64 (2³²: 2⁶³ − 2³¹ pairs).
MAX_NUM_NODES = 2**32
#: Largest v the inverse may consider (v < n ≤ 2³²); T(v + 1) then still fits in int64.
_MAX_V = MAX_NUM_NODES - 1
#: Candidates drawn per rejection round at most (bounds the sampler's temporary memory).
_MAX_BATCH = 1 << 24


# ---------------------------------------------------------------------------- ε and p
def _check_epsilon(epsilon: Any) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    eps = float(epsilon)
    if not (math.isfinite(eps) and eps > 0.0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    return eps


def flip_probability(epsilon: float) -> float:
    """p = 1/(1 + e^ε), the probability that randomized response flips one adjacency entry.

    Computed as e^−ε/(1 + e^−ε), which neither overflows nor loses precision for large ε.

    :raises ValueError: unless ε is a finite number > 0.
    """
    eps = _check_epsilon(epsilon)
    tail = math.exp(-eps)
    return tail / (1.0 + tail)


def rr_event(epsilon: float) -> Any:
    """The accounting event of one randomized response over all pairs at ``epsilon``.

    ``dp_accounting.RandomizedResponseDpEvent(noise_parameter=2/(1+e^ε), num_buckets=2)``:
    dp-accounting's k-bucket RR answers a uniformly random bucket with probability q (the noise
    parameter) and the true bucket otherwise, so with k = 2 it keeps the true bit with probability
    1 − q/2; q = 2/(1+e^ε) = 2·:func:`flip_probability` makes that e^ε/(1+e^ε), exactly the
    mechanism of :func:`randomized_response_edges`. Under replace-one adjacency (the relation
    GraphVeil's accountants use for this event: adding or removing an edge replaces one entry's
    value) its RDP at order ∞ is log(2/q − 1) = ε, its pure-DP guarantee; at finite orders it is
    the exact Rényi divergence of Bernoulli(e^ε/(1+e^ε)) from Bernoulli(1/(1+e^ε)), below both ε
    and the generic pure-ε curve min(ε, αε²/2) of :class:`~graphveil.privacy.events.PureDpEvent`.
    One event covers the whole release: the pairs are randomized independently and one edge is
    one pair.

    :raises ValueError: unless ε is a finite number > 0.
    """
    import dp_accounting  # costs seconds at start-up: imported where the event is built

    return dp_accounting.RandomizedResponseDpEvent(noise_parameter=2.0 * flip_probability(epsilon),
                                                   num_buckets=2)


# ---------------------------------------------------------------------------- pair indices
def num_pairs(num_nodes: int) -> int:
    """n(n−1)/2, the number of unordered pairs of distinct nodes (a Python int).

    :raises ValueError: if n is not an int ≥ 0 or the count does not fit in int64 (n > 2³²).
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, (int, np.integer)):
        raise ValueError(f"num_nodes must be an int >= 0, got {num_nodes!r}")
    n = int(num_nodes)
    if n < 0:
        raise ValueError(f"num_nodes must be an int >= 0, got {num_nodes!r}")
    total = n * (n - 1) // 2
    if total > _INT64_MAX:
        raise ValueError(f"num_nodes={n:,} has {total:,} node pairs, beyond the int64 range "
                         f"(at most {MAX_NUM_NODES:,} nodes): pair indices cannot be represented")
    return total


def _tri(v: np.ndarray) -> np.ndarray:
    """T(v) = v(v−1)/2 in int64 without overflow for 0 ≤ v ≤ 2³² (halve the even factor first)."""
    even = (v & 1) == 0
    return np.where(even, (v >> 1) * (v - 1), v * ((v - 1) >> 1))


def _np_pair_index(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    return _tri(v) + u


def _np_index_to_pair(index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact inverse of T(v) + u: v is the largest integer with T(v) ≤ index."""
    index = np.asarray(index, dtype=np.int64)
    # float estimate v ≈ (1 + √(8·index + 1))/2, off by at most a few near 2⁶³ (53-bit mantissa) ...
    est = np.floor((1.0 + np.sqrt(8.0 * index.astype(np.float64) + 1.0)) / 2.0)
    v = np.clip(est, 1, _MAX_V).astype(np.int64)
    # ... then corrected with integer arithmetic only until T(v) ≤ index < T(v + 1)
    for _ in range(64):
        high = _tri(v) > index
        low = _tri(v + 1) <= index
        if not (high.any() or low.any()):
            break
        v = v - high + low
    else:  # pragma: no cover - the float estimate is never that far off
        raise AssertionError("pair index inversion did not converge")
    return index - _tri(v), v


def _as_numpy_int64(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise ValueError(f"{name} must hold integers, got dtype {x.dtype}")
        return x.detach().cpu().numpy().astype(np.int64, copy=False)
    arr = np.asarray(x)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def pair_index(u: Any, v: Any) -> torch.Tensor:
    """Index v(v−1)/2 + u of the unordered pairs (u, v), u < v (tensors or arrays, elementwise).

    The numbering does not depend on n: the pairs of n nodes take indices [0, n(n−1)/2).

    :raises ValueError: unless 0 ≤ u < v < 2³².
    """
    uu, vv = np.broadcast_arrays(_as_numpy_int64(u, "u"), _as_numpy_int64(v, "v"))
    if uu.size and not (bool((uu >= 0).all()) and bool((uu < vv).all()) and bool((vv <= _MAX_V).all())):
        raise ValueError(f"pair_index needs 0 <= u < v < {MAX_NUM_NODES}")
    return torch.from_numpy(np.ascontiguousarray(_np_pair_index(uu, vv)))


def index_to_pair(index: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, v) with u < v for each pair index (inverse of :func:`pair_index`), exact in int64.

    :raises ValueError: unless 0 ≤ index < 2³²(2³² − 1)/2.
    """
    idx = _as_numpy_int64(index, "index")
    if idx.size and not (bool((idx >= 0).all()) and bool((idx < num_pairs(MAX_NUM_NODES)).all())):
        raise ValueError(f"pair indices must lie in [0, {num_pairs(MAX_NUM_NODES)})")
    u, v = _np_index_to_pair(idx)
    return torch.from_numpy(np.ascontiguousarray(u)), torch.from_numpy(np.ascontiguousarray(v))


# ---------------------------------------------------------------------------- sampling
def _isin_sorted(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    if sorted_set.size == 0 or values.size == 0:
        return np.zeros(values.shape, dtype=bool)
    pos = np.searchsorted(sorted_set, values)
    pos[pos == sorted_set.size] = 0
    return sorted_set[pos] == values


def sample_non_edge_indices(rng: np.random.Generator | _Draws, edge_indices: np.ndarray, total_pairs: int,
                            k: int) -> np.ndarray:
    """k distinct pair indices from [0, total_pairs) outside ``edge_indices``, uniform over k-subsets.

    ``rng`` is a numpy ``Generator`` or the mechanism's draws (:class:`_Draws`, CSPRNG by default).

    ``edge_indices`` must be sorted and unique. Candidates are drawn i.i.d. uniformly from the
    whole index space and taken in draw order; a candidate is rejected if it is an edge or was
    already accepted. Why the result is a uniform k-subset of the N₀ = total_pairs − m non-edges:
    given the accepted set A (|A| = j < k), the next accepted candidate is the first draw that
    falls in the set R of non-edges outside A, and a uniform draw conditioned on landing in R is
    uniform on R. So every ordered sequence of k distinct non-edges is accepted with probability
    ∏_{j<k} 1/(N₀ − j), the same for all, and the unordered set is uniform over the C(N₀, k)
    subsets. Batching keeps this: within a batch only first occurrences count, in draw order, and
    the batch is cut after the first ``k − j`` survivors (keeping, say, the smallest survivors
    instead would bias the subset towards small indices).

    Expected draws: Σ_{j<k} N/(N₀ − j) = N·(H(N₀) − H(N₀ − k)), i.e. O(m + k) when k ≤ N₀/2 and
    the non-edges are not a vanishing fraction of the pairs (k ≈ p·N₀ with p ≤ 1/2 here).
    Returns the indices sorted, as int64.

    :raises ValueError: if k exceeds the number of non-edges.
    """
    m = int(edge_indices.size)
    n0 = total_pairs - m
    if k < 0 or k > n0:
        raise ValueError(f"cannot choose {k} distinct non-edges among {n0}")
    draws = rng if isinstance(rng, _Draws) else _Draws(rng)
    chosen = np.empty(0, dtype=np.int64)
    while chosen.size < k:
        need = k - int(chosen.size)
        available = n0 - int(chosen.size)
        expected_draws = need * (total_pairs / available)
        batch = int(min(_MAX_BATCH, math.ceil(1.1 * expected_draws) + 64))
        cand = draws.below(total_pairs, batch)
        _, first = np.unique(cand, return_index=True)
        cand = cand[np.sort(first)]  # first occurrences, still in draw order
        cand = cand[~_isin_sorted(cand, edge_indices)]
        cand = cand[~_isin_sorted(cand, chosen)]
        chosen = np.sort(np.concatenate([chosen, cand[:need]]))
    return chosen


def _check_edges(edges: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(u, v) as int64 numpy arrays, after checking the (2, m) u < v < n, unique layout."""
    if not isinstance(edges, torch.Tensor):
        raise ValueError(f"edges must be a LongTensor of shape (2, m), got {type(edges).__name__}")
    if edges.dim() != 2 or edges.size(0) != 2:
        raise ValueError(f"edges must have shape (2, m), got {tuple(edges.shape)}")
    arr = _as_numpy_int64(edges, "edges")
    u, v = arr[0], arr[1]
    if u.size:
        if int(u.min()) < 0 or int(v.max()) >= n:
            raise ValueError(f"edges must name nodes in [0, {n}), got ids in "
                             f"[{int(min(u.min(), v.min()))}, {int(max(u.max(), v.max()))}]")
        if not bool((u < v).all()):
            bad = int(np.argmax(~(u < v)))
            raise ValueError(f"edges must list each undirected pair once as (u, v) with u < v "
                             f"(no self loops), got ({int(u[bad])}, {int(v[bad])}) at column {bad}")
    return u, v


def _expected_output(m: int, n0: int, p: float) -> float:
    return m * (1.0 - p) + n0 * p


def _size_refusal(n: int, m: int, n0: int, eps: float, p: float, expected: float,
                  max_output_edges: int) -> str:
    msg = (f"randomized response at epsilon={eps:g} on n={n:,} nodes would release about "
           f"{expected:,.0f} edges ({m:,} true edges each kept with probability {1 - p:.4g}, plus "
           f"each of the {n0:,} non-edge pairs turned into an edge with probability "
           f"p=1/(1+e^epsilon)={p:.4g}), above max_output_edges={max_output_edges:,}. ")
    if max_output_edges > m and n0 > m:
        # expected = m + p·(N₀ − m) ≤ M  ⇔  p ≤ (M − m)/(N₀ − m)  ⇔  ε ≥ log(1/p − 1)
        p_max = (max_output_edges - m) / (n0 - m)
        eps_min = math.log1p(-p_max) - math.log(p_max) if p_max < 0.5 else 0.0
        msg += (f"Use a larger epsilon (epsilon >= {eps_min:.3f} fits this graph) or a smaller "
                f"graph (e.g. split it into subgraphs), or raise max_output_edges if the memory "
                f"is there.")
    else:
        msg += ("No epsilon fits: the kept true edges alone exceed the limit. Use a smaller graph "
                "(e.g. split it into subgraphs) or raise max_output_edges.")
    return msg


def _numpy_rng(generator: torch.Generator) -> np.random.Generator:
    words = torch.randint(0, _INT64_MAX, (4,), generator=generator, device=generator.device)
    return np.random.default_rng(np.random.SeedSequence([int(w) for w in words.tolist()]))


def uniform_below(words: np.ndarray, high: int) -> np.ndarray:
    """The accepted draws of integers uniform on [0, high) from uniform 64-bit ``words`` (uint64).

    A word w is accepted iff w < 2⁶⁴ − (2⁶⁴ mod high), the largest multiple of ``high`` that fits,
    and maps to w mod high: each value then has exactly (2⁶⁴ − (2⁶⁴ mod high))/high preimages,
    so the accepted draws are exactly uniform (plain w mod high would favour the small values).
    Returns int64 values, in the order of their words.
    """
    if not 1 <= high <= _INT64_MAX:
        raise ValueError(f"high must be in [1, 2^63 - 1], got {high}")
    limit = np.uint64(2**64 - (2**64 % high)) if 2**64 % high else None  # None: every word fits
    accepted = words if limit is None else words[words < limit]
    return (accepted % np.uint64(high)).astype(np.int64)


class _Draws:
    """Where one release's randomness comes from (module note **Randomness**).

    ``rng=None``: the CSPRNG keystream (deployment); a numpy ``Generator``: that stream (seeded).
    """

    def __init__(self, rng: np.random.Generator | None) -> None:
        self.rng = rng

    def _words(self, n: int) -> np.ndarray:
        from graphveil.engine.noise import csprng_bytes

        if self.rng is not None:
            return self.rng.integers(0, 2**64, size=n, dtype=np.uint64, endpoint=False)
        return np.frombuffer(csprng_bytes(8 * n), dtype=np.uint64)

    def uniform(self, n: int) -> np.ndarray:
        """n float64 uniforms on [0, 1), multiples of 2⁻⁵³ (the top 53 bits of each word)."""
        return (self._words(n) >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def below(self, high: int, n: int) -> np.ndarray:
        """n int64 integers uniform on [0, high) (:func:`uniform_below`, drawing until n are accepted)."""
        parts, got = [], 0
        while got < n:
            # a word is rejected with probability (2⁶⁴ mod high)/2⁶⁴: about high/2⁶⁴ for counts up
            # to 2⁶², below 1/3 for any count up to 2⁶³ − 1; the loop draws what is still missing
            need = n - got
            part = uniform_below(self._words(need + (need >> 4) + 64), high)[:need]
            parts.append(part)
            got += part.size
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def binomial(self, n: int, p: float) -> int:
        """K ~ Binomial(n, p) by numpy's exact sampler (on a one-off stream seeded from os.urandom
        unless a seeded stream was given)."""
        rng = self.rng if self.rng is not None else np.random.default_rng(int.from_bytes(os.urandom(32), "big"))
        return int(rng.binomial(n, p))


def randomized_response_edges(edges: torch.Tensor, num_nodes: int, epsilon: float,
                              generator: torch.Generator | None = None,
                              max_output_edges: int = 50_000_000) -> torch.Tensor:
    """ε-edge-DP randomized response on every unordered pair of ``num_nodes`` nodes, once.

    ``edges`` is a LongTensor (2, m) of the true undirected edges, each pair once as (u, v) with
    u < v, unique. Returns a LongTensor (2, m') of the released pairs, u < v, unique, sorted by
    (u, v), on ``edges``' device: each true edge survives with probability 1 − p, each other pair
    appears with probability p, p = 1/(1 + e^ε), all independently (see the module docstring for
    why this is exact and costs O(m + K), K ~ Binomial(N₀, p), instead of O(n²)).

    Before anything is drawn, the expected output size m(1 − p) + N₀·p is compared with
    ``max_output_edges``; RR densifies the graph at small ε (paper 2 found ε = 4 infeasible).

    ``generator``: None (default) draws from the CSPRNG; a seeded ``torch.Generator`` makes the
    release reproducible, and recomputable by whoever knows the seed (module note **Randomness**).

    :raises ValueError: on a bad ε, a malformed ``edges`` (shape, u ≥ v, ids outside [0, n),
        duplicates), n(n−1)/2 beyond int64, or an expected output above ``max_output_edges``.
    """
    eps = _check_epsilon(epsilon)
    p = flip_probability(eps)
    total = num_pairs(num_nodes)
    n = int(num_nodes)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None (CSPRNG), got {type(generator).__name__}")
    if isinstance(max_output_edges, bool) or not isinstance(max_output_edges, (int, np.integer)) \
            or max_output_edges < 0:
        raise ValueError(f"max_output_edges must be an int >= 0, got {max_output_edges!r}")
    u, v = _check_edges(edges, n)
    m = int(u.size)
    idx = np.sort(_np_pair_index(u, v))
    if m > 1 and bool((idx[1:] == idx[:-1]).any()):
        dup = int(idx[1:][idx[1:] == idx[:-1]][0])
        du, dv = _np_index_to_pair(np.array([dup]))
        raise ValueError(f"edges must be unique: the pair ({int(du[0])}, {int(dv[0])}) appears more than once")
    n0 = total - m
    expected = _expected_output(m, n0, p)
    if expected > max_output_edges:
        raise ValueError(_size_refusal(n, m, n0, eps, p, expected, int(max_output_edges)))

    draws = _Draws(None if generator is None else _numpy_rng(generator))
    # true edges: one Bernoulli(1 − p) each (float64 uniforms)
    kept = idx[draws.uniform(m) >= p]
    # non-edges: K ~ Binomial(N₀, p) exactly (int64 count), then a uniform K-subset of non-edges
    k = draws.binomial(n0, p) if n0 > 0 else 0
    flipped = sample_non_edge_indices(draws, idx, total, k) if k else np.empty(0, dtype=np.int64)
    out_u, out_v = _np_index_to_pair(np.concatenate([kept, flipped]))
    order = np.lexsort((out_v, out_u))  # canonical order: the position reveals nothing
    out = np.stack([out_u[order], out_v[order]])
    return torch.from_numpy(np.ascontiguousarray(out)).to(edges.device)


# ---------------------------------------------------------------------------- PyG transform
class EdgeRandomizedResponse(BaseTransform):
    """Randomized response on the undirected edges of a PyG ``Data`` (RandEdge's adjacency step).

    The input stores each undirected edge in both directions (symmetric ``edge_index``, no self
    loops, no repeated entries). Each unordered pair is randomized once by
    :func:`randomized_response_edges` — not each direction — and the result holds both directions
    of every released pair, sorted by (source, target). Node and graph attributes (``x``, ``y``,
    masks, …) are kept as they are. Per-edge attributes — the keys other than ``edge_index`` that
    ``Data.is_edge_attr`` classifies as edge-level, e.g. ``edge_attr``, ``edge_weight`` — are
    dropped: RR invents edges that have no attribute and its output must not reveal which
    released edges are true, so no per-edge value can survive it. Sparse adjacency layouts
    (``adj``, ``adj_t``) are refused; convert to ``edge_index`` first.

    ``generator`` (None: the CSPRNG) is used statefully: calling the transform twice gives two
    independent releases (and spends ε twice). :meth:`event` is the accounting event of one call.
    """

    def __init__(self, epsilon: float, generator: torch.Generator | None = None,
                 max_output_edges: int = 50_000_000) -> None:
        self.epsilon = _check_epsilon(epsilon)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator or None (CSPRNG), got {type(generator).__name__}")
        self.generator = generator
        self.max_output_edges = max_output_edges

    def event(self) -> Any:
        """:func:`rr_event` at this transform's ε (one call of the transform)."""
        return rr_event(self.epsilon)

    def forward(self, data: Data) -> Data:
        if not isinstance(data, Data):
            raise ValueError(f"EdgeRandomizedResponse takes a torch_geometric Data, got {type(data).__name__}")
        if "adj" in data or "adj_t" in data or "edge_index" not in data:
            raise ValueError("EdgeRandomizedResponse needs the graph as edge_index (both directions stored)")
        n = data.num_nodes
        if n is None:
            raise ValueError("EdgeRandomizedResponse needs data.num_nodes (or x) to know the node pairs")
        edge_index = data.edge_index
        arr = _as_numpy_int64(edge_index, "edge_index")
        if arr.ndim != 2 or arr.shape[0] != 2:
            raise ValueError(f"edge_index must have shape (2, E), got {tuple(edge_index.shape)}")
        src, dst = arr[0], arr[1]
        if src.size and bool((src == dst).any()):
            i = int(np.argmax(src == dst))
            raise ValueError(f"edge_index has a self loop ({int(src[i])}, {int(dst[i])}); "
                             f"randomized response covers pairs of distinct nodes only")
        fwd = src < dst
        lo_f, hi_f = src[fwd], dst[fwd]
        lo_b, hi_b = dst[~fwd], src[~fwd]
        a = np.lexsort((hi_f, lo_f))
        b = np.lexsort((hi_b, lo_b))
        for lo, hi, o in ((lo_f, hi_f, a), (lo_b, hi_b, b)):
            same = (lo[o][1:] == lo[o][:-1]) & (hi[o][1:] == hi[o][:-1])
            if same.any():
                i = o[1:][same][0]
                raise ValueError(f"edge_index repeats the undirected edge ({int(lo[i])}, {int(hi[i])}); "
                                 f"coalesce it first (torch_geometric.utils.coalesce)")
        if lo_f.size != lo_b.size or not (np.array_equal(lo_f[a], lo_b[b]) and np.array_equal(hi_f[a], hi_b[b])):
            raise ValueError("edge_index must be symmetric (each undirected edge stored as (u, v) and "
                             "(v, u) exactly once); apply torch_geometric.transforms.ToUndirected "
                             "(and coalesce) first")
        pairs = torch.from_numpy(np.stack([lo_f[a], hi_f[a]]))
        noisy = randomized_response_edges(pairs, int(n), self.epsilon, self.generator,
                                          self.max_output_edges).cpu().numpy()
        both_src = np.concatenate([noisy[0], noisy[1]])
        both_dst = np.concatenate([noisy[1], noisy[0]])
        order = np.lexsort((both_dst, both_src))
        out_index = torch.from_numpy(np.ascontiguousarray(np.stack([both_src[order], both_dst[order]])))

        per_edge = [key for key in data.keys() if key != "edge_index" and data.is_edge_attr(key)]
        out = Data()
        for key, value in data.items():
            if key not in per_edge and key != "edge_index":
                out[key] = value
        out.edge_index = out_index.to(edge_index.device)
        if "num_nodes" not in out:
            out.num_nodes = int(n)
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(epsilon={self.epsilon:g})"
