"""graphveil.transforms: out-degree bound, cSBM.

Statistical tests use fixed generator seeds, so they are deterministic; each also shows that a
wrong implementation (a biased choice, a skipped last node) fails the same check.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections import Counter

import pytest
import torch
from scipy import stats
from torch_geometric.data import Data
from torch_geometric.utils import homophily, to_undirected

from graphveil.data.synthetic import (
    _block_edges,
    class_insensitive_homophily,
    csbm,
    csbm_phi,
    phi_to_lambda_mu,
)
from graphveil.transforms import (
    EDGE_KEY_BYTES,
    OutDegreeBound,
    edge_priorities,
)

P_MIN = 1e-4  # chi-square p-value floor; the biased controls below reach < 1e-20


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def key(seed: int) -> bytes:
    """A fixed 32-byte key for reproducible tests (runs draw theirs from secrets)."""
    return hashlib.sha256(f"test key {seed}".encode()).digest()


def with_ids(edge_index: torch.Tensor, num_nodes: int, **extra: torch.Tensor) -> Data:
    """A graph whose edge_attr is each column's index, to check alignment after dropping."""
    num_edges = edge_index.size(1)
    return Data(edge_index=edge_index, num_nodes=num_nodes,
                edge_attr=torch.arange(num_edges, dtype=torch.float).view(-1, 1), **extra)


def random_directed(seed: int, num_nodes: int, num_edges: int) -> Data:
    g = gen(seed)
    # Skewed sources so that some nodes have many out-edges and some few.
    src = (torch.rand(num_edges, generator=g) ** 3 * num_nodes).long()
    dst = torch.randint(num_nodes, (num_edges,), generator=g)
    x = torch.randn(num_nodes, 3, generator=g)
    return with_ids(torch.stack([src, dst]), num_nodes, x=x)


def kept_ids(inp: Data, out: Data) -> torch.Tensor:
    """Input column of every output column; asserts the attributes stayed aligned."""
    ids = out.edge_attr.view(-1).long()
    assert torch.equal(out.edge_index, inp.edge_index[:, ids])
    assert bool((ids[1:] > ids[:-1]).all()), "kept columns must be distinct, in input order"
    return ids


def check_out_degree_bound(inp: Data, out: Data, d: int) -> None:
    """OutDegreeBound's guarantees: subset, aligned, every node keeps min(out-degree, D)."""
    kept_ids(inp, out)
    n = inp.num_nodes
    before = torch.bincount(inp.edge_index[0], minlength=n)
    after = torch.bincount(out.edge_index[0], minlength=n)
    assert bool((after <= d).all()), f"out-degree above D at {torch.nonzero(after > d).view(-1).tolist()}"
    assert torch.equal(after, before.clamp(max=d))


# --- OutDegreeBound -----------------------------------------------------------------------------

@pytest.mark.parametrize("d", [1, 2, 3, 7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_out_degree_bound_guarantees(d: int, seed: int) -> None:
    data = random_directed(seed, num_nodes=40, num_edges=400)
    transform = OutDegreeBound(d, key(100 + seed))
    out = transform(data)
    check_out_degree_bound(data, out, d)
    assert transform.last_dropped == data.num_edges - out.num_edges > 0
    assert out.x is data.x and out.num_nodes == data.num_nodes


def test_out_degree_bound_keeps_light_sources_and_handles_empty_graph() -> None:
    data = with_ids(torch.tensor([[0, 0, 1, 2, 2, 2], [1, 2, 0, 0, 1, 2]]), 4)
    out = OutDegreeBound(3, key(0))(data)
    assert torch.equal(out.edge_index, data.edge_index)
    empty = Data(edge_index=torch.zeros(2, 0, dtype=torch.long), num_nodes=5)
    transform = OutDegreeBound(1, key(0))
    assert transform(empty).num_edges == 0 and transform.last_dropped == 0


def test_out_degree_bound_bounds_the_last_node() -> None:
    """Only node N-1 exceeds D: a bound over arange(0, N-1) (GAP's) would leave it unbounded."""
    n, d = 12, 2
    star = torch.stack([torch.full((n - 1,), n - 1), torch.arange(n - 1)])
    light = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])
    data = with_ids(torch.cat([light, star], dim=1), n)
    out = OutDegreeBound(d, key(3))(data)
    check_out_degree_bound(data, out, d)
    assert int((out.edge_index[0] == n - 1).sum()) == d

    # The mutant that skips node N-1 fails the same check.
    src = data.edge_index[0]
    mutant_keep = (src == n - 1) | OutDegreeBound(d, key(3)).keep_mask(data.edge_index, n)
    with pytest.raises(AssertionError, match="out-degree above D"):
        check_out_degree_bound(data, data.edge_subgraph(mutant_keep), d)


def star_forest(num_stars: int, leaves: int, seed: int) -> Data:
    """num_stars disjoint stars, center -> leaves, columns shuffled (no star is contiguous)."""
    centers = torch.arange(num_stars).repeat_interleave(leaves)
    leaf = num_stars + torch.arange(num_stars * leaves)
    perm = torch.randperm(num_stars * leaves, generator=gen(seed))
    return with_ids(torch.stack([centers, leaf])[:, perm], num_stars * (leaves + 1))


def subset_counts(data: Data, out: Data, num_stars: int, leaves: int) -> list[int]:
    """How often each subset of leaf positions (1st..m-th leaf of a star) was kept."""
    position = (data.edge_index[1] - num_stars) % leaves
    chosen: dict[int, list[int]] = {}
    for center, pos in zip(out.edge_index[0].tolist(), position[kept_ids(data, out)].tolist(),
                           strict=True):
        chosen.setdefault(center, []).append(pos)
    counts = Counter(tuple(sorted(v)) for v in chosen.values())
    return [counts[s] for s in itertools.combinations(range(leaves), len(next(iter(counts))))]


def test_out_degree_bound_draws_uniform_subsets() -> None:
    """12,000 stars of 6 leaves, D = 2: each of the 15 kept pairs ~800 times (chi-square)."""
    num_stars, leaves, d = 12_000, 6, 2
    data = star_forest(num_stars, leaves, seed=5)
    out = OutDegreeBound(d, key(6))(data)
    counts = subset_counts(data, out, num_stars, leaves)
    assert len(counts) == math.comb(leaves, d) and sum(counts) == num_stars
    assert stats.chisquare(counts).pvalue > P_MIN
    # Control: a deterministic choice (the D lowest leaf ids of each center, as "sort by
    # (source, target), keep the first D" gives) fails the same test.
    position = (data.edge_index[1] - num_stars) % leaves
    lowest = data.edge_subgraph(position < d)
    assert stats.chisquare(subset_counts(data, lowest, num_stars, leaves)).pvalue < 1e-20


def test_out_degree_bound_is_a_function_of_the_key_and_does_not_mutate() -> None:
    data = random_directed(7, num_nodes=30, num_edges=300)
    snapshot = data.edge_index.clone(), data.edge_attr.clone()
    a = OutDegreeBound(2, key(9))(data)
    b = OutDegreeBound(2, key(9))(data)
    c = OutDegreeBound(2, key(10))(data)
    assert torch.equal(a.edge_index, b.edge_index) and not torch.equal(a.edge_index, c.edge_index)
    assert torch.equal(data.edge_index, snapshot[0]) and torch.equal(data.edge_attr, snapshot[1])
    fresh = OutDegreeBound(2), OutDegreeBound(2)  # default: 32 fresh bytes from secrets each
    assert fresh[0].key != fresh[1].key and len(fresh[0].key) == EDGE_KEY_BYTES
    assert fresh[0](data).num_edges == a.num_edges


def test_out_degree_bound_order_depends_on_each_edge_alone() -> None:
    """The kept set of a node is the same whatever the column order and the other nodes' edges:
    the order is the key's, not the positions' (a position-based shuffle fails this)."""
    data = random_directed(11, num_nodes=30, num_edges=300)
    k = key(12)
    kept = {tuple(e) for e in OutDegreeBound(2, k)(data).edge_index.t().tolist()}
    perm = torch.randperm(data.num_edges, generator=gen(13))
    extra = torch.stack([torch.randint(30, (50,), generator=gen(14)) + 30, torch.randint(60, (50,), generator=gen(15))])
    moved = Data(edge_index=torch.cat([extra, data.edge_index[:, perm]], dim=1), num_nodes=60)
    kept_moved = {tuple(e) for e in OutDegreeBound(2, k)(moved).edge_index.t().tolist()}
    assert {e for e in kept_moved if e[0] < 30} == kept


def test_edge_priorities_are_aes_256_of_the_pair() -> None:
    """FIPS-197 App. C.3: AES-256, key 00..1f, block 00112233..ff → 8ea2b7ca516745bf...; the
    block of edge (src, dst) is src ‖ dst, 8 bytes little-endian each; the priority is the first
    8 bytes of the cipher block read little-endian."""
    block = bytes.fromhex("00112233445566778899aabbccddeeff")
    src, dst = (int.from_bytes(block[i:i + 8], "little", signed=True) for i in (0, 8))
    got = edge_priorities(torch.tensor([[src], [dst]]), bytes(range(32)))
    assert int(got[0]) == int.from_bytes(bytes.fromhex("8ea2b7ca516745bf"), "little")


def test_out_degree_bound_is_directed() -> None:
    """On an undirected star the center keeps D out-edges while every leaf keeps its edge to it."""
    data = Data(edge_index=to_undirected(torch.stack([torch.zeros(5, dtype=torch.long),
                                                      torch.arange(1, 6)])), num_nodes=6)
    out = OutDegreeBound(2, key(0))(data)
    assert int((out.edge_index[0] == 0).sum()) == 2 and int((out.edge_index[1] == 0).sum()) == 5


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_out_degree_bound_rejects_bad_max_degree(bad: object) -> None:
    with pytest.raises(ValueError, match="max_degree"):
        OutDegreeBound(bad)  # type: ignore[arg-type]


def test_transforms_reject_bad_graphs() -> None:
    with pytest.raises(ValueError, match="edge_index"):
        OutDegreeBound(1, key(0))(Data(edge_index=torch.tensor([[0], [5]]), num_nodes=3))
    with pytest.raises(ValueError, match="edge_index"):
        OutDegreeBound(1, key(0))(Data(x=torch.zeros(3, 1)))
    for bad in (42, b"short", "x" * 32):
        with pytest.raises(ValueError, match="key must be 32 bytes"):
            OutDegreeBound(1, bad)  # type: ignore[arg-type]


def column_multiset(edge_index: torch.Tensor) -> Counter[tuple[int, int]]:
    return Counter(map(tuple, edge_index.t().tolist()))


# --- homophily --------------------------------------------------------------------------------------

def test_homophily_hand_values() -> None:
    path = to_undirected(torch.tensor([[0, 1, 2], [1, 2, 3]]))
    y = torch.tensor([0, 0, 1, 1])
    # h_0 = h_1 = 2/3 (of the 3 edges into each class, 2 come from the same class); shares 1/2.
    assert class_insensitive_homophily(path, y) == pytest.approx(1 / 3)
    same = to_undirected(torch.tensor([[0, 2], [1, 3]]))
    cross = to_undirected(torch.tensor([[0, 1], [2, 3]]))
    assert class_insensitive_homophily(same, y) == pytest.approx(1.0)
    assert class_insensitive_homophily(cross, y) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="num_classes"):
        class_insensitive_homophily(path, torch.zeros(4, dtype=torch.long))


def test_homophily_matches_pyg_edge_insensitive() -> None:
    g = gen(3)
    for _ in range(5):
        edge_index = torch.randint(50, (2, 300), generator=g)
        y = torch.randint(4, (50,), generator=g)
        ours = class_insensitive_homophily(edge_index, y)
        assert ours == pytest.approx(homophily(edge_index, y, method="edge_insensitive"), abs=1e-6)


def test_homophily_of_cora_is_paper_table_1() -> None:
    from graphveil.plugins.standard.sources.planetoid import load_planetoid

    cora = load_planetoid("cora", preprocess="none").to_pyg()
    assert class_insensitive_homophily(cora.edge_index, cora.y) == pytest.approx(0.7657, abs=1e-4)


# --- cSBM -------------------------------------------------------------------------------------------

def test_phi_to_lambda_mu_is_on_the_arc() -> None:
    n, f, eps = 10_000, 200, 3.25
    for phi in (-1.0, -0.6, -0.1, 0.0, 0.3, 0.75, 1.0):
        lam, mu = phi_to_lambda_mu(phi, num_nodes=n, num_features=f, epsilon=eps)
        assert lam**2 + mu**2 / (n / f) == pytest.approx(1 + eps)
        assert math.copysign(1, lam) == math.copysign(1, phi) or lam == 0
    assert phi_to_lambda_mu(0, num_nodes=n, num_features=f) == pytest.approx((0, math.sqrt(50 * 4.25)))
    lam, mu = phi_to_lambda_mu(1, num_nodes=n, num_features=f)
    assert (lam, mu) == pytest.approx((math.sqrt(4.25), 0), abs=1e-12)
    for bad in (1.01, -2, float("nan")):
        with pytest.raises(ValueError, match="phi"):
            phi_to_lambda_mu(bad, num_nodes=n, num_features=f)
    with pytest.raises(ValueError, match="epsilon"):
        phi_to_lambda_mu(0.5, num_nodes=n, num_features=f, epsilon=0)


@pytest.mark.parametrize("n", [9, 10])
def test_csbm_structure(n: int) -> None:
    data = csbm(n, 3, 4.0, 1.0, 2.0, gen(0))
    assert data.x.shape == (n, 3) and data.x.dtype == torch.float32 and data.num_nodes == n
    assert sorted(torch.bincount(data.y, minlength=2).tolist()) == [n // 2, n - n // 2]
    assert int(data.y.sum()) == n - n // 2  # v = +1 is label 1, the larger class
    e = data.edge_index
    key = e[0] * n + e[1]
    assert bool((key[1:] > key[:-1]).all())  # sorted, no duplicates
    assert bool((e[0] != e[1]).all())
    assert column_multiset(e) == column_multiset(e.flip(0))
    again = csbm(n, 3, 4.0, 1.0, 2.0, gen(0))
    assert torch.equal(again.edge_index, e) and torch.equal(again.x, data.x)


def test_csbm_degree_and_block_probabilities() -> None:
    n, d, lam = 10_000, 5.0, 1.0
    data = csbm(n, 8, d, lam, 1.0, gen(1))
    src, dst = data.edge_index
    mean_degree = src.numel() / n
    expected = d - (d + lam * math.sqrt(d)) / n
    assert abs(mean_degree - expected) < 0.15  # sd ≈ 0.03
    same = int((data.y[src] == data.y[dst]).sum()) // 2
    cross = src.numel() // 2 - same
    half = n // 2
    assert same / (2 * math.comb(half, 2)) == pytest.approx((d + lam * math.sqrt(d)) / n, rel=0.05)
    assert cross / half**2 == pytest.approx((d - lam * math.sqrt(d)) / n, rel=0.08)


@pytest.mark.parametrize(("a", "b", "p"), [(5, None, 0.3), (3, 4, 0.2), (6, None, 0.95)])
def test_block_edges_are_independent_bernoulli(a: int, b: int | None, p: float) -> None:
    """Per pair frequency p, and the count per draw Binomial(m, p) (chi-square both)."""
    g, trials = gen(21), 4000
    pairs = list(itertools.combinations(range(a), 2)) if b is None \
        else list(itertools.product(range(a), range(b)))
    m = len(pairs)
    per_pair: Counter[tuple[int, int]] = Counter()
    per_draw = Counter()
    for _ in range(trials):
        i, j = _block_edges(a, b, p, g)
        got = list(zip(i.tolist(), j.tolist(), strict=True))
        assert len(set(got)) == len(got) and set(got) <= set(pairs)
        per_pair.update(got)
        per_draw[len(got)] += 1
    z2 = sum((per_pair[q] - trials * p) ** 2 / (trials * p * (1 - p)) for q in pairs)
    assert stats.chi2.sf(z2, m) > P_MIN
    expected = [trials * stats.binom.pmf(c, m, p) for c in range(m + 1)]
    observed = [per_draw[c] for c in range(m + 1)]
    # Pool the sparse tail into its neighbour so every expected count is >= 5.
    while expected[0] < 5:
        low_e, low_o = expected.pop(0), observed.pop(0)
        expected[0], observed[0] = expected[0] + low_e, observed[0] + low_o
    while expected[-1] < 5:
        high_e, high_o = expected.pop(), observed.pop()
        expected[-1], observed[-1] = expected[-1] + high_e, observed[-1] + high_o
    assert stats.chisquare(observed, expected).pvalue > P_MIN


def test_csbm_features_follow_the_model() -> None:
    n, f, mu = 2000, 50, 100.0
    data = csbm(n, f, 3.0, 0.0, mu, gen(2))
    diff = data.x[data.y == 1].mean(0) - data.x[data.y == 0].mean(0)
    # E||diff||² = 4(μ/n)||u||² + noise ≈ 0.2 (||u||² ≈ 1 ± 0.2) + 0.002
    assert 0.1 < float(diff.pow(2).sum()) < 0.35
    # E[x²] per entry = (μ/n) u_j² + 1/f, so f · mean(x²) ≈ 1 + (μ/n)||u||² ≈ 1.05
    assert abs(f * float(data.x.pow(2).mean()) - 1.05) < 0.03
    flat = csbm(n, f, 3.0, 0.0, 0.0, gen(2))
    no_signal = flat.x[flat.y == 1].mean(0) - flat.x[flat.y == 0].mean(0)
    assert float(no_signal.pow(2).sum()) < 0.02


def test_csbm_phi_sets_homophily_and_degree() -> None:
    high = csbm_phi(0.9, generator=gen(3))
    low = csbm_phi(-0.9, generator=gen(4))
    mid = csbm_phi(0.0, generator=gen(5))
    assert high.num_nodes == 10_000 and high.x.shape == (10_000, 200)
    assert (high.lambda_, high.mu, high.phi) == pytest.approx(
        (*phi_to_lambda_mu(0.9, num_nodes=10_000, num_features=200), 0.9))
    # Intra-class share of edges (d + λ√d)/2d: 0.955 at ϕ = 0.9 → homophily ≈ 0.91.
    assert class_insensitive_homophily(high.edge_index, high.y) > 0.85
    assert class_insensitive_homophily(low.edge_index, low.y) < 0.02
    assert class_insensitive_homophily(mid.edge_index, mid.y) < 0.05
    for g in (high, low, mid):
        assert abs(g.num_edges / g.num_nodes - 5.0) < 0.15


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"num_nodes": 1}, "num_nodes"),
    ({"num_features": 0}, "num_features"),
    ({"avg_degree": -1.0}, "avg_degree"),
    ({"avg_degree": float("nan")}, "avg_degree"),
    ({"mu": -0.5}, "mu"),
    ({"lambda_": 3.0}, "lambda_"),   # d − λ√d < 0
    ({"lambda_": -3.0}, "lambda_"),  # d + λ√d < 0
    ({"num_nodes": 10, "avg_degree": 9.0, "lambda_": 1.0}, "lambda_"),  # (d + λ√d)/n > 1
])
def test_csbm_rejects_bad_arguments(kwargs: dict, name: str) -> None:
    args = {"num_nodes": 100, "num_features": 4, "avg_degree": 5.0, "lambda_": 1.0, "mu": 1.0}
    with pytest.raises(ValueError, match=name):
        csbm(**{**args, **kwargs}, generator=gen(0))
