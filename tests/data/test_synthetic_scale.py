"""The scale generators of graphveil.data.synthetic: block_csbm, power_law_graph, write_parquet
(small sizes only; bench/scale.py runs them at 10⁷ edges)."""

from __future__ import annotations

import math

import pytest
import torch

from graphveil.data.synthetic import block_csbm, power_law_graph, write_parquet


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def check_simple_undirected(data, n: int) -> None:
    """Both directions of every edge, sorted by (source, target), no self-loop, no repeat."""
    u, v = data.edge_index
    assert data.edge_index.dtype == torch.long
    assert int(u.min()) >= 0 and int(torch.maximum(u, v).max()) < n
    assert not bool((u == v).any())
    keys = u * n + v
    assert bool((keys[1:] > keys[:-1]).all())  # strictly increasing: sorted, no duplicate column
    assert torch.equal(torch.sort(v * n + u).values, keys)  # the reverse of every column is there


@pytest.mark.parametrize("make", [block_csbm, power_law_graph])
def test_shapes_and_determinism(make):
    n, e = 2_000, 10_000
    data = make(n, e, num_classes=4, num_features=8, generator=gen(3))
    assert data.x.shape == (n, 8) and data.x.dtype == torch.float32
    assert data.y.shape == (n,) and set(data.y.tolist()) == {0, 1, 2, 3}
    assert torch.bincount(data.y).tolist() == [500] * 4  # equal classes
    check_simple_undirected(data, n)
    again = make(n, e, num_classes=4, num_features=8, generator=gen(3))
    other = make(n, e, num_classes=4, num_features=8, generator=gen(4))
    for key in ("x", "y", "edge_index"):
        assert torch.equal(data[key], again[key])
    assert not torch.equal(data.edge_index, other.edge_index)


def test_block_csbm_edge_count_and_homophily():
    n, e, h = 6_000, 60_000, 0.7
    data = block_csbm(n, e, num_classes=3, homophily=h, generator=gen(0))
    m = data.edge_index.shape[1] // 2
    # a sum of independent Bernoulli pairs with mean e: within 5 standard deviations (≤ √e)
    assert abs(m - e) < 5 * math.sqrt(e)
    u, v = data.edge_index
    same = float((data.y[u] == data.y[v]).double().mean())
    assert abs(same - h) < 0.02
    # the pairs inside a block are uniform: each block holds its share of the intra edges
    intra = data.y[u][data.y[u] == data.y[v]]
    assert torch.bincount(intra, minlength=3).double().div(intra.numel()).sub(1 / 3).abs().max() < 0.02


def test_block_csbm_features_carry_the_class():
    data = block_csbm(3_000, 6_000, num_classes=3, num_features=16, signal=3.0, generator=gen(1))
    means = torch.stack([data.x[data.y == c].mean(0) for c in range(3)])
    nearest = torch.cdist(data.x, means).argmin(1)  # nearest class mean classifies most nodes
    assert float((nearest == data.y).double().mean()) > 0.8
    flat = block_csbm(3_000, 6_000, num_classes=3, num_features=16, signal=0.0, generator=gen(1))
    means = torch.stack([flat.x[flat.y == c].mean(0) for c in range(3)])
    assert float((torch.cdist(flat.x, means).argmin(1) == flat.y).double().mean()) < 0.45


def ccdf_exponent(degrees: torch.Tensor, low: float, high: float) -> float:
    """γ of P(d) ∝ d^(−γ) from the least-squares slope 1 − γ of log P(D ≥ x) on log x, x in [low, high]."""
    d = degrees.double()
    xs = torch.logspace(math.log10(low), math.log10(high), 12, dtype=torch.float64)
    lx = xs.log()
    ly = torch.stack([(d >= x).double().mean() for x in xs]).log()
    return 1.0 - float(((lx - lx.mean()) * (ly - ly.mean())).sum() / (lx - lx.mean()).square().sum())


@pytest.mark.parametrize("gamma", [2.3, 3.0])
def test_power_law_degrees(gamma):
    n, e = 50_000, 250_000  # mean degree 10
    data = power_law_graph(n, e, exponent=gamma, generator=gen(0))
    assert data.edge_index.shape[1] == 2 * e  # exactly num_edges undirected edges
    deg = torch.bincount(data.edge_index[0], minlength=n)
    # the tail between 2 and 20 times the mean degree (above, the √(2E) cap bends it)
    assert abs(ccdf_exponent(deg, 20, 200) - gamma) < 0.2
    assert int(deg.max()) <= 2 * math.sqrt(2 * e)  # the hub's weight is capped at √(2E)
    # a block model of the same size has Poisson-like degrees: no node near 10 times the mean
    flat = torch.bincount(block_csbm(n, e, generator=gen(0)).edge_index[0], minlength=n)
    assert int(flat.max()) < 50 and int((deg >= 100).sum()) > 100


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_nodes": 100, "num_edges": 3_000}, "quarter of the 4950 node pairs"),
    ({"num_nodes": 100, "num_edges": 50, "num_classes": 1}, "num_classes must be an integer >= 2"),
    ({"num_nodes": 100, "num_edges": 50, "homophily": 1.5}, r"homophily must be in \[0, 1\]"),
    ({"num_nodes": 100, "num_edges": 1_000, "num_classes": 50, "homophily": 1.0}, "probability above 1"),
])
def test_block_csbm_refuses(kwargs, match):
    with pytest.raises(ValueError, match=match):
        block_csbm(**kwargs)


def test_power_law_refuses_exponent():
    with pytest.raises(ValueError, match="exponent must be > 2"):
        power_law_graph(100, 50, exponent=2.0)


def test_write_parquet_round_trips_through_the_parquet_source(tmp_path):
    from graphveil.data import load_data
    from graphveil.run.config import DataConfig

    data = block_csbm(500, 2_000, num_features=6, generator=gen(2))
    options = write_parquet(data, tmp_path / "g", row_group_size=300)  # several row groups
    graph = load_data(DataConfig.model_validate(options))
    assert graph.node_ids == [str(i) for i in range(500)]
    assert torch.equal(graph.x, data.x)
    assert torch.equal(graph.y, data.y)  # labels 0..4 are the class names "0".."4", in order
    assert graph.class_names == ["0", "1", "2", "3", "4"]
    assert torch.equal(graph.edge_index, data.edge_index)


def test_the_synthetic_source_gives_the_generated_node_graph():
    from graphveil.contract.errors import DataError
    from graphveil.data import NodeGraph, load_data
    from graphveil.run.config import DataConfig

    graph = load_data(DataConfig.model_validate(
        {"source": "synthetic", "num_nodes": 400, "num_edges": 1_500, "num_classes": 3, "num_features": 5,
         "seed": 7}))
    data = block_csbm(400, 1_500, num_classes=3, num_features=5, generator=gen(7))
    assert isinstance(graph, NodeGraph) and graph.class_names == ["0", "1", "2"]
    assert torch.equal(graph.edge_index, data.edge_index) and torch.equal(graph.x, data.x)
    assert torch.equal(graph.y, data.y) and graph.node_ids[:2] == ["0", "1"]
    power = load_data(DataConfig.model_validate(
        {"source": "synthetic", "kind": "power_law", "num_nodes": 400, "num_edges": 1_500, "exponent": 3}))
    assert power.num_undirected_edges == 1_500
    with pytest.raises(DataError, match=r"source synthetic, kind csbm\): num_edges=30000 is more than a quarter"):
        load_data(DataConfig.model_validate({"source": "synthetic", "num_nodes": 100, "num_edges": 30_000}))
