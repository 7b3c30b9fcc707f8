"""Degree capping to K by random edge dropping (paper 1, Alg. 3 "Initialize"; Daigavane et al. 2021, Alg. 1).

Edges are visited in a uniformly random order; an edge is kept iff both of its ends still
have fewer than K kept edges. Every node of the result has degree ≤ K, which is what the
coupled-sampling bound (paper 1, Thm 3, Eq. 3) needs: removing a node removes ≤ K records.

The greedy pass is sequential by definition; :func:`greedy_keep_mask` computes exactly the
same result in vectorised rounds. A node of degree ≤ K can never block an edge, so only ends
at heavier nodes are tracked. In each round, for every undecided edge e and each such end x,

* ``lb`` = kept edges at x before e, ``ub`` = ``lb`` + undecided edges at x before e;
* e is kept if ``ub < K`` at both ends (whatever the undecided ones do), dropped if
  ``lb ≥ K`` at an end.

The earliest undecided edge is always decided, so rounds make progress; when a round decides
few edges, the remainder is finished by a plain loop that starts from the kept counts.
"""

from __future__ import annotations

import numpy as np
import torch

from graphveil.contract.errors import ConfigError, DataError


def _segment_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """For each entry of a sorted 1-D array, the index where its run of equal keys starts."""
    is_start = np.empty(sorted_keys.size, dtype=bool)
    is_start[:1] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=is_start[1:])
    idx = np.arange(sorted_keys.size, dtype=sorted_keys.dtype)
    idx[~is_start] = 0
    return np.maximum.accumulate(idx)


def _segment_exclusive_cumsum(values: np.ndarray, seg_start: np.ndarray) -> np.ndarray:
    """Exclusive cumulative sum of ``values`` restarting at each segment (``seg_start`` per entry)."""
    exclusive = np.cumsum(values, dtype=values.dtype)
    exclusive -= values
    return exclusive - exclusive[seg_start]


def greedy_keep_mask(
    ordered_edges: torch.Tensor,
    num_nodes: int,
    K: int,
    *,
    max_rounds: int = 64,
    min_progress: float = 0.02,
    loop_below: int = 4096,
) -> torch.Tensor:
    """Keep-mask of the greedy pass over ``ordered_edges`` (no self-loops) in the given order.

    Equal to: ``deg = 0``; for e = (u, v) in order: keep iff deg[u] < K and deg[v] < K, then
    increment both. The keyword options only choose how the result is computed: vectorised
    rounds while they decide at least ``min_progress`` of the open edges (at most
    ``max_rounds``, and while more than ``loop_below`` are open), then a plain loop.

    :returns: ``(m,)`` bool, aligned with ``ordered_edges``.
    """
    m = int(ordered_edges.shape[0])
    kept = np.zeros(m, dtype=bool)
    if m == 0:
        return torch.from_numpy(kept)
    small = 2 * m < np.iinfo(np.int32).max and num_nodes < np.iinfo(np.int32).max
    itype = np.int32 if small else np.int64
    pairs = ordered_edges.numpy().astype(itype, copy=False)
    flat = pairs.reshape(-1)
    # A node of degree ≤ K never blocks an edge; only incidences at heavier nodes are tracked.
    heavy_inc = (np.bincount(flat, minlength=num_nodes) > K)[flat]
    heavy_edge = heavy_inc.reshape(-1, 2).any(1)
    kept[~heavy_edge] = True
    open_edges = np.flatnonzero(heavy_edge).astype(itype)
    # Heavy incidences (u0, v0, u1, v1, ... order) stably sorted by node: each node's
    # incidences form a segment in visiting order. Only incidences of open (undecided) edges
    # are carried; ``base`` counts the kept edges before each incidence at its node among
    # those already dropped from the arrays, so in a round lb = base, ub = base + position.
    inc = np.flatnonzero(heavy_inc).astype(itype)
    node = flat[inc]
    order = torch.sort(torch.from_numpy(node), stable=True).indices.numpy()
    inc, node = inc[order], node[order]
    loc = (np.cumsum(heavy_edge, dtype=itype) - 1)[inc >> 1]
    end = (inc & 1).astype(np.int8)
    base = np.zeros(node.size, dtype=itype)
    rounds = 0
    while open_edges.size:
        if rounds >= max_rounds or open_edges.size <= loop_below:
            _finish_sequentially(kept, open_edges, pairs, loc, end, base, K)
            break
        seg_start = _segment_starts(node)
        ub = np.arange(node.size, dtype=itype) - seg_start + base
        n_open = open_edges.size
        keep = np.ones(n_open, dtype=bool)
        keep[loc[ub >= K]] = False
        drop = np.zeros(n_open, dtype=bool)
        drop[loc[base >= K]] = True
        kept[open_edges[keep]] = True
        still = ~(keep | drop)
        base += _segment_exclusive_cumsum(keep[loc].astype(itype), seg_start)
        carry = still[loc]
        remap = np.cumsum(still, dtype=itype) - 1
        node, loc, end, base = node[carry], remap[loc[carry]], end[carry], base[carry]
        open_edges = open_edges[still]
        rounds += 1
        if open_edges.size > (1.0 - min_progress) * n_open:
            rounds = max_rounds
    return torch.from_numpy(kept)


def _finish_sequentially(
    kept: np.ndarray,
    open_edges: np.ndarray,
    pairs: np.ndarray,
    loc: np.ndarray,
    end: np.ndarray,
    base: np.ndarray,
    K: int,
) -> None:
    """Decide the open edges in visiting order, starting from the kept counts ``base``."""
    before = np.full(2 * open_edges.size, -K, dtype=np.int64)  # light ends never block
    before[2 * loc.astype(np.int64) + end] = base
    extra: dict[int, int] = {}
    decided = []
    for (u, v), (lu, lv) in zip(pairs[open_edges].tolist(), before.reshape(-1, 2).tolist(), strict=True):
        eu, ev = extra.get(u, 0), extra.get(v, 0)
        ok = lu + eu < K and lv + ev < K
        if ok:
            extra[u], extra[v] = eu + 1, ev + 1
        decided.append(ok)
    kept[open_edges] = decided


def cap_degrees(edges: torch.Tensor, num_nodes: int, K: int, generator: torch.Generator) -> torch.Tensor:
    """Ē: randomly drop edges so every node has degree ≤ K (Daigavane et al. 2021, Alg. 1).

    Edges are visited in the order ``torch.randperm(m, generator=generator)``; an edge is kept
    iff both ends have fewer than K kept edges at that moment. Kept edges are returned in
    their original relative order, so Ē ⊆ E keeps E's ``u < v`` layout.

    :param edges: ``(m, 2)`` int64 node indices in ``0..num_nodes-1``.
    :param K: the degree cap, ≥ 1.
    :returns: ``(m̄, 2)`` the kept edges.
    :raises ConfigError: if K < 1.
    :raises DataError: if ``edges`` is not ``(m, 2)``, holds an index outside
        ``0..num_nodes-1`` or a self-loop.
    """
    if isinstance(K, bool) or int(K) != K or K < 1:
        raise ConfigError(f"sampler.degree_cap must be an integer >= 1, got {K!r}")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DataError(f"edges must be an (m, 2) tensor, got shape {tuple(edges.shape)}")
    edges = edges.to(torch.long)
    m = int(edges.shape[0])
    if m and (int(edges.min()) < 0 or int(edges.max()) >= num_nodes):
        raise DataError(f"edge endpoints must lie in 0..{num_nodes - 1}, "
                        f"got range {int(edges.min())}..{int(edges.max())}")
    if m and bool((edges[:, 0] == edges[:, 1]).any()):
        raise DataError("edges must not contain self-loops")
    perm = torch.randperm(m, generator=generator)
    keep = greedy_keep_mask(edges.index_select(0, perm), num_nodes, int(K))
    in_original_order = torch.zeros(m, dtype=torch.bool).index_fill_(0, perm[keep], True)
    return edges[in_original_order]
