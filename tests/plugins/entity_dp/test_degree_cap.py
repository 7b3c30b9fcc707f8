"""Degree capping (paper 1, Alg. 3; Daigavane et al. 2021, Alg. 1) against a naive sequential reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _graphs import graphs, make_graph
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data.graph import RelationalGraph
from graphveil.plugins.entity_dp.degree_cap import cap_degrees, greedy_keep_mask

# Ways of computing the same mask: pure loop, pure rounds, rounds then loop, the default.
STRATEGIES = [
    {"max_rounds": 0},
    {"loop_below": 0, "min_progress": 0.0, "max_rounds": 10**9},
    {"loop_below": 0, "max_rounds": 1},
    {"loop_below": 0, "max_rounds": 3},
    {},
]


def naive_keep(ordered: torch.Tensor, K: int) -> torch.Tensor:
    """The definition: visit in order, keep iff both ends have < K kept edges."""
    deg: dict[int, int] = {}
    keep = []
    for u, v in ordered.tolist():
        ok = deg.get(u, 0) < K and deg.get(v, 0) < K
        if ok:
            deg[u], deg[v] = deg.get(u, 0) + 1, deg.get(v, 0) + 1
        keep.append(ok)
    return torch.tensor(keep, dtype=torch.bool)


def rows(e: torch.Tensor) -> list[tuple[int, int]]:
    return [tuple(r) for r in e.tolist()]


@settings(max_examples=100, deadline=None)
@given(graph=graphs(max_nodes=25, max_edges=120), K=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_cap_matches_definition_and_bounds_degree(graph: RelationalGraph, K: int, seed: int) -> None:
    n, edges = graph.num_nodes, graph.edges
    capped = cap_degrees(edges, n, K, torch.Generator().manual_seed(seed))
    # Same visiting order as cap_degrees documents: randperm(m) from the same generator state.
    perm = torch.randperm(edges.shape[0], generator=torch.Generator().manual_seed(seed))
    expected = edges[perm[naive_keep(edges[perm], K)].sort().values]
    assert torch.equal(capped, expected)
    # Properties that hold whatever the order: degree ≤ K, subset in original order, maximal.
    deg = torch.bincount(capped.reshape(-1), minlength=n)
    assert int(deg.max()) <= K
    original = rows(edges)
    kept = rows(capped)
    positions = [original.index(r) for r in kept]
    assert positions == sorted(positions)
    for u, v in set(original) - set(kept):
        assert deg[u] == K or deg[v] == K, "a dropped edge must have had a full end (greedy is maximal)"


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 30),
    data=st.data(),
    K=st.integers(1, 4),
    choice=st.sampled_from(range(len(STRATEGIES))),
)
def test_vectorised_mask_equals_sequential_loop(n: int, data: st.DataObject, K: int, choice: int) -> None:
    node = st.integers(0, n - 1)
    pairs = data.draw(st.lists(st.tuples(node, node).filter(lambda p: p[0] != p[1]), max_size=200))
    ordered = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)  # any order, repeats allowed
    assert torch.equal(greedy_keep_mask(ordered, n, K, **STRATEGIES[choice]), naive_keep(ordered, K))


@pytest.mark.parametrize("K", [1, 3, 10])
def test_vectorised_mask_on_a_larger_skewed_graph(K: int) -> None:
    g = torch.Generator().manual_seed(K)
    n, m = 3000, 30_000
    hubs = torch.multinomial(1.0 / torch.arange(1, n + 1).float(), m, replacement=True, generator=g)
    graph = make_graph(n, torch.stack([hubs, torch.randint(0, n, (m,), generator=g)], 1))
    ordered = graph.edges[torch.randperm(graph.num_edges, generator=g)]
    reference = naive_keep(ordered, K)
    for strategy in STRATEGIES[1:]:
        assert torch.equal(greedy_keep_mask(ordered, n, K, **strategy), reference)


def test_large_cap_is_identity() -> None:
    graph = make_graph(50, torch.randint(0, 50, (400, 2), generator=torch.Generator().manual_seed(0)))
    K = int(graph.degrees().max())
    assert torch.equal(cap_degrees(graph.edges, 50, K, torch.Generator().manual_seed(1)), graph.edges)
    assert cap_degrees(graph.edges, 50, K - 1, torch.Generator().manual_seed(1)).shape[0] < graph.num_edges


def test_star_keeps_a_uniformly_random_set_of_spokes() -> None:
    # Centre 0 with 8 spokes, K = 2: each spoke survives with probability 2/8, uniformly.
    spokes, K, trials = 8, 2, 4000
    graph = make_graph(spokes + 1, [(0, i) for i in range(1, spokes + 1)])
    counts = np.zeros(spokes)
    g = torch.Generator().manual_seed(0)
    for _ in range(trials):
        capped = cap_degrees(graph.edges, spokes + 1, K, g)
        assert capped.shape[0] == K
        counts[capped[:, 1].numpy() - 1] += 1
    assert stats.chisquare(counts).pvalue > 1e-4


def test_same_seed_same_result_and_empty_graph() -> None:
    graph = make_graph(40, torch.randint(0, 40, (300, 2), generator=torch.Generator().manual_seed(2)))
    a = cap_degrees(graph.edges, 40, 2, torch.Generator().manual_seed(7))
    assert torch.equal(a, cap_degrees(graph.edges, 40, 2, torch.Generator().manual_seed(7)))
    empty = torch.empty(0, 2, dtype=torch.long)
    assert cap_degrees(empty, 5, 1, torch.Generator()).shape == (0, 2)


def test_bad_input_is_refused() -> None:
    edges = torch.tensor([[0, 1], [1, 2]])
    g = torch.Generator()
    for K in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="degree_cap"):
            cap_degrees(edges, 3, K, g)  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"\(m, 2\)"):
        cap_degrees(torch.tensor([0, 1, 2]), 3, 1, g)
    with pytest.raises(DataError, match="0..2"):
        cap_degrees(torch.tensor([[0, 3]]), 3, 1, g)
    with pytest.raises(DataError, match="0..2"):
        cap_degrees(torch.tensor([[-1, 2]]), 3, 1, g)
    with pytest.raises(DataError, match="self-loop"):
        cap_degrees(torch.tensor([[1, 1]]), 3, 1, g)
