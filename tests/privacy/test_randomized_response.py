"""Exact, sparse randomized response on undirected adjacency (RandEdge, paper 2's RR baseline).

What these catch: a pair randomized twice (once per direction: presence 1 − (1 − p)² for a
non-edge, 1 − p² for an edge), wrong keep / flip rates, a non-edge sampler that is not uniform
over subsets (e.g. keeping the smallest candidates of a batch) or returns edges or duplicates, a
fixed instead of Binomial number of flips, a pair-index inverse trusting the float square root,
an unsorted output whose order reveals the true edges, the wrong dp-accounting noise parameter,
missing refusals. Statistical checks use fixed seeds and ≥ 5σ tolerances.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from graphveil.privacy.conversion import rdp_to_epsilon
from graphveil.privacy.randomized_response import (
    MAX_NUM_NODES,
    EdgeRandomizedResponse,
    flip_probability,
    index_to_pair,
    num_pairs,
    pair_index,
    randomized_response_edges,
    rr_event,
    sample_non_edge_indices,
    uniform_below,
)

Rel = dp_accounting.privacy_accountant.NeighboringRelation


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_graph(n: int, m: int, seed: int) -> torch.Tensor:
    """m distinct undirected pairs (u < v) of n nodes, as a (2, m) LongTensor."""
    rng = np.random.default_rng(seed)
    all_u, all_v = np.triu_indices(n, k=1)
    pick = rng.choice(all_u.size, size=m, replace=False)
    return torch.from_numpy(np.stack([all_u[pick], all_v[pick]]).astype(np.int64))


def pair_set(edges: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edges.t().tolist()))


def assert_canonical(out: torch.Tensor, n: int) -> None:
    """u < v < n, unique, sorted by (u, v)."""
    assert out.dtype == torch.int64 and out.dim() == 2 and out.size(0) == 2
    u, v = out[0], out[1]
    assert bool((u >= 0).all()) and bool((u < v).all()) and bool((v < n).all())
    key = [(a, b) for a, b in out.t().tolist()]
    assert key == sorted(set(key))


# ---------------------------------------------------------------------------- p and ε
@pytest.mark.parametrize("eps", [0.1, 1.0, 8.0, 50.0])
def test_flip_probability_is_one_over_one_plus_e_eps(eps: float) -> None:
    p = flip_probability(eps)
    assert p == pytest.approx(1.0 / (1.0 + math.exp(eps)), rel=1e-12)
    assert (1 - p) / p == pytest.approx(math.exp(eps), rel=1e-9)


def test_flip_probability_does_not_overflow_for_large_eps() -> None:
    assert 0.0 <= flip_probability(800.0) < 1e-300


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.nan, math.inf, -math.inf, "1", None, True])
def test_epsilon_is_validated_everywhere(bad) -> None:
    for call in (lambda: flip_probability(bad), lambda: rr_event(bad),
                 lambda: EdgeRandomizedResponse(bad, gen(0)),
                 lambda: randomized_response_edges(torch.tensor([[0], [1]]), 3, bad, gen(0))):
        with pytest.raises(ValueError, match="epsilon"):
            call()


# ---------------------------------------------------------------------------- pair indices
@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 50])
def test_pair_index_is_a_bijection_on_all_pairs_of_small_n(n: int) -> None:
    u, v = np.triu_indices(n, k=1)
    idx = pair_index(torch.from_numpy(u), torch.from_numpy(v))
    assert sorted(idx.tolist()) == list(range(num_pairs(n)))
    back_u, back_v = index_to_pair(idx)
    assert back_u.tolist() == u.tolist() and back_v.tolist() == v.tolist()


def exact_pair(i: int) -> tuple[int, int]:
    """Python big-int truth: v the largest integer with v(v−1)/2 ≤ i."""
    v = (1 + math.isqrt(8 * i + 1)) // 2
    return i - v * (v - 1) // 2, v


@pytest.mark.parametrize("n", [3_000_000_000, MAX_NUM_NODES])
def test_pair_index_is_exact_for_huge_n_near_the_int64_limit(n: int) -> None:
    total = num_pairs(n)
    assert total <= 2**63 - 1
    rng = np.random.default_rng(7)
    tri = [v * (v - 1) // 2 for v in list(range(n - 300, n + 1)) + rng.integers(2**20, n, 3000).tolist()]
    idx = [t + d for t in tri for d in (-1, 0, 1) if 0 <= t + d < total]
    idx += rng.integers(0, total, 5000).tolist() + [0, total - 1]
    arr = np.array(idx, dtype=np.int64)
    truth = [exact_pair(i) for i in idx]
    # the test has teeth: the plain float formula gets many of these wrong
    naive_v = np.floor((1 + np.sqrt(8.0 * arr.astype(np.float64) + 1)) / 2).astype(np.int64)
    assert int((naive_v != np.array([t[1] for t in truth])).sum()) > 100
    u, v = index_to_pair(torch.from_numpy(arr))
    assert list(zip(u.tolist(), v.tolist(), strict=True)) == truth
    assert bool((v < n).all()) and bool((u < v).all())
    assert pair_index(u, v).tolist() == idx
    assert index_to_pair(torch.tensor([total - 1])) == (torch.tensor([n - 2]), torch.tensor([n - 1]))


def test_pair_counts_beyond_int64_are_refused() -> None:
    assert num_pairs(MAX_NUM_NODES) == 2**63 - 2**31
    with pytest.raises(ValueError, match="int64"):
        num_pairs(MAX_NUM_NODES + 1)
    with pytest.raises(ValueError, match="int64"):
        randomized_response_edges(torch.empty(2, 0, dtype=torch.long), MAX_NUM_NODES + 1, 40.0, gen(0))
    with pytest.raises(ValueError):
        index_to_pair(torch.tensor([-1]))
    with pytest.raises(ValueError):
        pair_index(torch.tensor([3]), torch.tensor([3]))


def test_rr_runs_sparsely_on_the_largest_node_count() -> None:
    """2³² nodes, 2⁶³ − 2³¹ pairs: at ε = 40 about N·p ≈ 39 pairs appear, in milliseconds."""
    n = MAX_NUM_NODES
    edges = torch.tensor([[0, 5, n - 2], [1, n - 1, n - 1]])
    out = randomized_response_edges(edges, n, 40.0, gen(3))
    assert_canonical(out, n)
    expected = num_pairs(n) * flip_probability(40.0)
    assert abs(out.size(1) - 3 - expected) < 6 * math.sqrt(expected)


# ---------------------------------------------------------------------------- the non-edge sampler
def test_the_sampler_returns_k_distinct_non_edges_even_in_a_dense_graph() -> None:
    total = num_pairs(40)  # 780 pairs, 700 of them edges
    rng = np.random.default_rng(0)
    edges = np.sort(rng.choice(total, size=700, replace=False)).astype(np.int64)
    non_edges = np.setdiff1d(np.arange(total), edges)
    for k in (1, 37, 80):
        got = sample_non_edge_indices(rng, edges, total, k)
        assert got.size == k and np.unique(got).size == k
        assert np.isin(got, non_edges).all()
    assert np.array_equal(sample_non_edge_indices(rng, edges, total, 80), non_edges)
    with pytest.raises(ValueError):
        sample_non_edge_indices(rng, edges, total, 81)


def test_the_sampler_is_uniform_over_k_subsets() -> None:
    """N₀ = 6 non-edges, k = 2: each of the 15 subsets has probability 1/15."""
    edges = np.array([1, 2, 4, 7], dtype=np.int64)
    total = 10
    rng = np.random.default_rng(11)
    runs = 15_000
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(runs):
        key = tuple(sample_non_edge_indices(rng, edges, total, 2).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 15
    mean, sd = runs / 15, math.sqrt(runs * (1 / 15) * (14 / 15))
    assert all(abs(c - mean) < 5 * sd for c in counts.values()), counts


# ---------------------------------------------------------------------------- CSPRNG integers
def test_uniform_below_rejects_exactly_the_words_of_the_incomplete_last_block() -> None:
    # high = 3: 2⁶⁴ = 3·q + 1, so the one word 2⁶⁴ − 1 would map to 0 once too often: it is rejected
    top = np.uint64(2**64 - 1)
    words = np.array([0, 1, 2, 5, top - np.uint64(1), top], dtype=np.uint64)
    assert uniform_below(words, 3).tolist() == [0, 1, 2, 2, (2**64 - 2) % 3]
    # high = 2⁶² + 1: 2⁶⁴ = 3·high + (2⁶² − 3), so every word at or above 3·high is rejected
    high = 2**62 + 1
    limit = 2**64 - 2**64 % high
    words = np.array([limit - 1, limit, 2**64 - 1, high], dtype=np.uint64)
    assert uniform_below(words, high).tolist() == [(limit - 1) % high, 0]
    assert uniform_below(np.array([top], dtype=np.uint64), 2**32).tolist() == [2**32 - 1]  # 2^k: no rejection
    with pytest.raises(ValueError):
        uniform_below(words, 0)


def test_default_draws_come_from_the_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    from graphveil.engine import noise

    calls = []
    real = noise.csprng_bytes
    monkeypatch.setattr(noise, "csprng_bytes", lambda n: calls.append(n) or real(n))
    torch.manual_seed(0)
    np.random.seed(0)
    edges = random_graph(80, 300, seed=5)
    a = randomized_response_edges(edges, 80, 1.0)
    torch.manual_seed(0)
    np.random.seed(0)
    b = randomized_response_edges(edges, 80, 1.0)
    assert not torch.equal(a, b)  # fresh entropy, not the global generators
    # the keep coins (8 bytes per true edge) and the non-edge candidates both read the keystream
    assert calls[0] == 8 * 300 and len(calls) >= 4


# ---------------------------------------------------------------------------- the mechanism
@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
@pytest.mark.parametrize("seeded", [True, False])
def test_keep_and_flip_rates_match_one_minus_p_and_p(eps: float, seeded: bool) -> None:
    n, m, runs = 300, 3000, 10
    edges = random_graph(n, m, seed=1)
    true = pair_set(edges)
    n0 = num_pairs(n) - m
    p = flip_probability(eps)
    kept = flipped = 0
    g = gen(100 + int(eps * 10)) if seeded else None  # None: the CSPRNG
    for _ in range(runs):
        out = randomized_response_edges(edges, n, eps, g)
        assert_canonical(out, n)
        released = pair_set(out)
        k = len(released & true)
        kept += k
        flipped += len(released) - k
    keep_trials, flip_trials = runs * m, runs * n0
    assert abs(kept - keep_trials * (1 - p)) < 5 * math.sqrt(keep_trials * p * (1 - p))
    assert abs(flipped - flip_trials * p) < 5 * math.sqrt(flip_trials * p * (1 - p))


@pytest.mark.parametrize("seeded", [True, False])
def test_each_unordered_pair_is_decided_once_with_presence_probability_1_minus_p_or_p(seeded: bool) -> None:
    """Per-pair marginals on 6 nodes (15 pairs) over many runs, and pairwise independence."""
    n, eps, runs = 6, 1.0, 4000
    edges = torch.tensor([[0, 0, 1, 2, 3], [1, 4, 2, 5, 4]])
    true = pair_set(edges)
    p = flip_probability(eps)
    g = gen(5) if seeded else None
    presence = np.zeros((n, n))
    joint = 0  # both of the non-edges (0, 2) and (3, 5)
    sizes = []
    for _ in range(runs):
        released = pair_set(randomized_response_edges(edges, n, eps, g))
        for a, b in released:
            presence[a, b] += 1
        joint += ((0, 2) in released) and ((3, 5) in released)
        sizes.append(len(released - true))
    sd = math.sqrt(p * (1 - p) / runs)
    for a in range(n):
        for b in range(a + 1, n):
            target = 1 - p if (a, b) in true else p
            assert abs(presence[a, b] / runs - target) < 5 * sd, (a, b, presence[a, b] / runs)
    # the twice-flipped pair (independent flips of (u, v) and (v, u), then symmetrized) would give:
    assert abs((1 - (1 - p) ** 2) - p) > 15 * sd and abs((1 - p**2) - (1 - p)) > 15 * sd
    assert abs(joint / runs - p * p) < 5 * math.sqrt(p * p * (1 - p * p) / runs)
    # the number of flipped non-edges is Binomial(N₀, p): its variance, not just its mean
    n0 = num_pairs(n) - len(true)
    var = float(np.var(sizes))
    assert abs(var - n0 * p * (1 - p)) < 0.15 * n0 * p * (1 - p)


def test_output_order_is_canonical_and_does_not_put_true_edges_first() -> None:
    n = 60
    edges = random_graph(n, 200, seed=2)
    out = randomized_response_edges(edges, n, 2.0, gen(9))
    assert_canonical(out, n)
    true = pair_set(edges)
    flags = [pair in true for pair in map(tuple, out.t().tolist())]
    first_false = flags.index(False)
    assert any(flags[first_false:])  # true and flipped pairs are interleaved


def test_a_fixed_seed_reproduces_the_release() -> None:
    n = 120
    edges = random_graph(n, 400, seed=3)
    a = randomized_response_edges(edges, n, 3.0, gen(42))
    b = randomized_response_edges(edges, n, 3.0, gen(42))
    c = randomized_response_edges(edges, n, 3.0, gen(43))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_empty_and_trivial_graphs() -> None:
    empty = torch.empty(2, 0, dtype=torch.long)
    assert randomized_response_edges(empty, 0, 1.0, gen(0)).shape == (2, 0)
    assert randomized_response_edges(empty, 1, 1.0, gen(0)).shape == (2, 0)
    complete = torch.tensor([[0, 0, 1], [1, 2, 2]])  # no non-edge to flip
    out = randomized_response_edges(complete, 3, 0.2, gen(0))
    assert pair_set(out) <= pair_set(complete)


def test_the_expected_size_is_checked_before_anything_is_drawn() -> None:
    n, eps = 100_000, 1.0
    edges = random_graph(500, 1000, seed=4)
    g = gen(0)
    state = g.get_state()
    with pytest.raises(ValueError) as err:
        randomized_response_edges(edges, n, eps, g)
    msg = str(err.value)
    p = flip_probability(eps)
    expected = 1000 * (1 - p) + (num_pairs(n) - 1000) * p
    assert f"{expected:,.0f}" in msg and "n=100,000" in msg and "epsilon=1" in msg
    assert "larger epsilon" in msg and "smaller graph" in msg
    assert torch.equal(g.get_state(), state)  # refused before any draw


def test_the_suggested_epsilon_fits_and_no_epsilon_fits_is_said() -> None:
    n, m, limit = 2000, 1000, 20_000
    edges = random_graph(500, m, seed=4)
    with pytest.raises(ValueError) as err:
        randomized_response_edges(edges, n, 2.0, gen(0), max_output_edges=limit)
    suggested = float(str(err.value).split("epsilon >= ")[1].split()[0])

    def expected(eps: float) -> float:
        p = flip_probability(eps)
        return m * (1 - p) + (num_pairs(n) - m) * p

    assert expected(suggested + 1e-3) <= limit < expected(suggested - 1e-2)  # the boundary ε
    out = randomized_response_edges(edges, n, suggested + 1e-3, gen(0), max_output_edges=limit)
    assert_canonical(out, n)
    # a custom limit, and one no ε can meet
    with pytest.raises(ValueError, match="max_output_edges=100"):
        randomized_response_edges(edges, 500, 8.0, gen(0), max_output_edges=100)
    with pytest.raises(ValueError, match="No epsilon fits"):
        randomized_response_edges(edges, 500, 8.0, gen(0), max_output_edges=900)


@pytest.mark.parametrize("edges, message", [
    (torch.tensor([[1], [0]]), "u < v"),
    (torch.tensor([[2], [2]]), "u < v"),
    (torch.tensor([[0, 0], [1, 1]]), "unique"),
    (torch.tensor([[0], [5]]), r"\[0, 5\)"),
    (torch.tensor([[-1], [2]]), r"\[0, 5\)"),
    (torch.tensor([0, 1]), "shape"),
    (torch.tensor([[0.0], [1.0]]), "integers"),
])
def test_malformed_edges_are_refused(edges: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        randomized_response_edges(edges, 5, 1.0, gen(0))


# ---------------------------------------------------------------------------- the PyG transform
def symmetric(edges: torch.Tensor) -> torch.Tensor:
    return torch.cat([edges, edges.flip(0)], dim=1)


def test_the_transform_randomizes_each_undirected_pair_once_and_stores_both_directions() -> None:
    n = 80
    und = random_graph(n, 300, seed=5)
    ei = symmetric(und)[:, torch.randperm(600, generator=gen(1))]
    x, y = torch.randn(n, 4), torch.arange(n)
    data = Data(x=x, y=y, edge_index=ei, edge_attr=torch.randn(600, 3), train_mask=torch.ones(n, dtype=torch.bool))
    out = EdgeRandomizedResponse(2.0, gen(21))(data)
    src, dst = out.edge_index
    assert bool((src != dst).all())
    directed = pair_set(out.edge_index)
    assert len(directed) == out.edge_index.size(1)  # no repeated entries
    assert directed == {(b, a) for a, b in directed}  # symmetric
    # the upper half is exactly the function's release with the same seed: one decision per pair
    upper = out.edge_index[:, src < dst]
    assert torch.equal(upper, randomized_response_edges(und[:, np.lexsort((und[1].numpy(), und[0].numpy()))],
                                                        n, 2.0, gen(21)))
    assert out.x is x and out.y is y and out.train_mask is data.train_mask
    assert "edge_attr" not in out
    assert torch.equal(data.edge_index, ei) and "edge_attr" in data  # input untouched
    assert out.num_nodes == n


def test_the_transform_presence_probability_per_pair_is_1_minus_p_or_p() -> None:
    n, eps, runs = 5, 1.5, 3000
    und = torch.tensor([[0, 1, 3], [2, 4, 4]])
    data = Data(edge_index=symmetric(und), num_nodes=n)
    transform = EdgeRandomizedResponse(eps, gen(8))
    p = flip_probability(eps)
    counts = np.zeros((n, n))
    for _ in range(runs):
        for a, b in transform(data).edge_index.t().tolist():
            counts[a, b] += 1
    assert np.array_equal(counts, counts.T)
    sd = math.sqrt(p * (1 - p) / runs)
    true = pair_set(und)
    for a in range(n):
        for b in range(a + 1, n):
            target = 1 - p if (a, b) in true else p
            assert abs(counts[a, b] / runs - target) < 5 * sd, (a, b)


@pytest.mark.parametrize("edge_index, message", [
    (torch.tensor([[0, 1, 1], [1, 0, 2]]), "symmetric"),
    (torch.tensor([[0, 1, 0, 1], [1, 0, 1, 0]]), "repeats"),  # a repeated undirected edge
    (torch.tensor([[0, 1, 2], [1, 0, 2]]), "self loop"),
])
def test_the_transform_refuses_malformed_adjacency(edge_index: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EdgeRandomizedResponse(1.0, gen(0))(Data(edge_index=edge_index, num_nodes=4))


# ---------------------------------------------------------------------------- accounting
@pytest.mark.parametrize("eps", [0.3, 1.0, 4.0, 8.0])
def test_rr_event_is_exactly_binary_rr_and_composes_to_at_most_eps(eps: float) -> None:
    event = rr_event(eps)
    assert isinstance(event, dp_accounting.RandomizedResponseDpEvent) and event.num_buckets == 2
    q, p = event.noise_parameter, flip_probability(eps)
    assert 1 - q + q / 2 == pytest.approx(1 - p, rel=1e-12)  # keeps the true bit w.p. e^ε/(1+e^ε)

    orders = [1 + x / 10 for x in range(1, 100)] + [float(a) for a in range(11, 257)] + [1e3, 1e4, 1e5, 1e6, 1e7]
    acc = dp_accounting.rdp.RdpAccountant(orders=orders, neighboring_relation=Rel.REPLACE_ONE)
    acc.compose(event)
    curve = np.asarray(acc._rdp)
    alpha = np.asarray(orders)
    # the exact Rényi divergence of Bernoulli(1 − p) from Bernoulli(p), by hand
    # D_α = log((1 − p)^α p^(1−α) + p^α (1 − p)^(1−α))/(α − 1) with (1 − p)/p = e^ε, in a stable form
    by_hand = eps + np.log((1 - p) + p * np.exp(-2 * eps * (alpha - 1))) / (alpha - 1)
    np.testing.assert_allclose(curve, by_hand, rtol=1e-9)
    assert float(curve.max()) <= eps * (1 + 1e-12)
    assert curve[-1] == pytest.approx(eps, rel=1e-6)  # tends to ε: pure ε-DP, not better
    assert bool((curve <= np.minimum(eps, alpha * eps**2 / 2) * (1 + 1e-9)).all())  # never looser than PureDpEvent
    delta = 1e-6
    eps_dp = acc.get_epsilon(delta)
    assert 0.99 * eps <= eps_dp <= eps
    assert rdp_to_epsilon(orders, curve, delta)[0] <= eps
