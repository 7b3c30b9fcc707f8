"""Degree capping to K by random edge dropping (paper 1, Alg. 3 "Initialize"; Daigavane et al. 2021, Alg. 1).

Edges are visited in a uniformly random order; an edge is kept iff both of its ends still
have fewer than K kept edges. Every node of the result has degree ≤ K, which is what the
coupled-sampling bound (paper 1, Thm 3, Eq. 3) needs: removing a node removes ≤ K records.

The greedy pass is sequential by definition; :func:`greedy_keep_mask` computes exactly the
same result in vectorised rounds. In each round, for every undecided edge e and each end x,

* ``lb`` = kept edges at x before e, ``ub`` = ``lb`` + undecided edges at x before e;
* e is kept if ``ub < K`` at both ends (whatever the undecided ones do), dropped if
  ``lb ≥ K`` at an end.

The earliest undecided edge is always decided, so rounds make progress; when a round decides
few edges, the remainder is finished by a plain loop that starts from the kept counts.
"""

from __future__ import annotations

import torch

from graphveil.errors import ConfigError, DataError


def _segment_starts(sorted_keys: torch.Tensor) -> torch.Tensor:
    """For each entry of a sorted 1-D tensor, the index where its run of equal keys starts."""
    idx = torch.arange(sorted_keys.numel())
    is_start = torch.ones_like(sorted_keys, dtype=torch.bool)
    is_start[1:] = sorted_keys[1:] != sorted_keys[:-1]
    return torch.cummax(torch.where(is_start, idx, torch.zeros_like(idx)), 0).values


def _segment_exclusive_cumsum(values: torch.Tensor, seg_start: torch.Tensor) -> torch.Tensor:
    """Exclusive cumulative sum of ``values`` restarting at each segment (``seg_start`` per entry)."""
    exclusive = torch.cumsum(values, 0) - values
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
    kept = torch.zeros(m, dtype=torch.bool)
    if m == 0:
        return kept
    # Incidences (u0, v0, u1, v1, ...) stably sorted by node: each node's incidences form a
    # segment in visiting order. Only incidences of open (undecided) edges are carried along;
    # ``base`` holds the kept edges before each incidence at its node among those dropped from
    # the arrays, so at the start of a round lb = base and ub = base + position in segment.
    flat = ordered_edges.reshape(-1)
    order = torch.sort(flat, stable=True).indices
    node, loc, end = flat[order], order // 2, order % 2
    base = torch.zeros(2 * m, dtype=torch.long)
    open_edges = torch.arange(m)  # visiting positions of open edges; local id = index here
    rounds = 0
    while open_edges.numel():
        if rounds >= max_rounds or open_edges.numel() <= loop_below:
            _finish_sequentially(kept, open_edges, ordered_edges, loc, end, base, K)
            break
        seg_start = _segment_starts(node)
        ub = base + (torch.arange(node.numel()) - seg_start)
        n_open = open_edges.numel()
        keep = torch.ones(n_open, dtype=torch.bool).scatter_reduce_(0, loc, ub < K, reduce="amin")
        drop = torch.zeros(n_open, dtype=torch.bool).scatter_reduce_(0, loc, base >= K, reduce="amax")
        kept[open_edges[keep]] = True
        still = ~(keep | drop)
        base = base + _segment_exclusive_cumsum(keep[loc].long(), seg_start)
        carry = still[loc]
        remap = torch.cumsum(still.long(), 0) - 1
        node, loc, end, base = node[carry], remap[loc[carry]], end[carry], base[carry]
        open_edges = open_edges[still]
        rounds += 1
        if open_edges.numel() > (1.0 - min_progress) * n_open:
            rounds = max_rounds
    return kept


def _finish_sequentially(
    kept: torch.Tensor,
    open_edges: torch.Tensor,
    ordered_edges: torch.Tensor,
    loc: torch.Tensor,
    end: torch.Tensor,
    base: torch.Tensor,
    K: int,
) -> None:
    """Decide the open edges in visiting order, starting from the kept counts ``base``."""
    lb = torch.empty(2 * open_edges.numel(), dtype=torch.long)
    lb[2 * loc + end] = base
    pairs = ordered_edges[open_edges].tolist()
    before = lb.view(-1, 2).tolist()
    extra: dict[int, int] = {}
    decided = []
    for (u, v), (lu, lv) in zip(pairs, before, strict=True):
        eu, ev = extra.get(u, 0), extra.get(v, 0)
        ok = lu + eu < K and lv + ev < K
        if ok:
            extra[u], extra[v] = eu + 1, ev + 1
        decided.append(ok)
    kept[open_edges] = torch.tensor(decided, dtype=torch.bool)


def cap_degrees(edges: torch.Tensor, num_nodes: int, K: int, generator: torch.Generator) -> torch.Tensor:
    """Ē: randomly drop edges so every node has degree ≤ K (Daigavane et al. 2021, Alg. 1).

    Edges are visited in the order ``torch.randperm(m, generator=generator)``; an edge is kept
    iff both ends have fewer than K kept edges at that moment. Kept edges are returned in
    their original relative order, so Ē ⊆ E keeps E's ``u < v`` layout.

    :param edges: ``(m, 2)`` int64 node indices in ``0..num_nodes-1``.
    :param K: the degree cap, ≥ 1.
    :returns: ``(m̄, 2)`` the kept edges.
    :raises ConfigError: if K < 1.
    :raises DataError: if ``edges`` is not ``(m, 2)`` or holds an index outside ``0..num_nodes-1``.
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
    keep = greedy_keep_mask(edges[perm], num_nodes, int(K))
    kept = perm[keep].sort().values
    return edges[kept]
