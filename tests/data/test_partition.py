"""graphveil.data.partition: per-site node splits (random, label skew, communities) and their cut.

Checked against independent counts: networkx for connectivity, a plain loop over the
relations for the cut, numpy for the class shares.
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data import NodeGraph, RelationalGraph
from graphveil.data.partition import KINDS, partition_graph


def planted(n: int = 600, blocks: int = 6, classes: int = 5, seed: int = 0) -> NodeGraph:
    """A planted-partition graph: dense inside ``blocks`` groups, sparse across; labels random."""
    rng = np.random.default_rng(seed)
    block = np.arange(n) % blocks
    members = [np.flatnonzero(block == b) for b in range(blocks)]
    pairs = set()
    for u in range(n):
        for v in rng.choice(members[block[u]], size=4):  # dense inside the block
            if u != v:
                pairs.add((min(u, int(v)), max(u, int(v))))
        if rng.random() < 0.1:  # sparse across
            v = int(rng.integers(n))
            if u != v:
                pairs.add((min(u, v), max(u, v)))
    e = torch.tensor(sorted(pairs)).t()
    return NodeGraph(name="planted", x=torch.randn(n, 4), y=torch.from_numpy(rng.integers(classes, size=n)),
                     edge_index=torch.cat([e, e.flip(0)], dim=1), node_ids=[f"v{i}" for i in range(n)],
                     class_names=[f"c{c}" for c in range(classes)])


def direct_cut(graph: NodeGraph, site: torch.Tensor) -> int:
    return sum(1 for u, v in graph.edge_index.t().tolist() if u < v and int(site[u]) != int(site[v]))


@pytest.mark.parametrize("kind", KINDS)
def test_every_node_goes_to_exactly_one_site_and_the_cut_is_counted_exactly(kind: str) -> None:
    g = planted()
    p = partition_graph(g, 4, kind=kind, seed=3, alpha=1.0)
    assert p.site.shape == (g.num_nodes,) and p.num_sites == 4
    nodes = [set(p.nodes(i).tolist()) for i in range(4)]
    assert set().union(*nodes) == set(range(g.num_nodes)) and sum(map(len, nodes)) == g.num_nodes
    assert all(nodes)
    assert p.cut_edges == direct_cut(g, p.site)
    assert p.num_edges == g.num_undirected_edges
    assert p.cut_fraction == pytest.approx(p.cut_edges / g.num_undirected_edges)
    parts = p.parts(g)
    # the parts keep exactly the relations inside one site: the cut ones are the only ones lost
    assert sum(part.num_undirected_edges for part in parts) == g.num_undirected_edges - p.cut_edges
    assert [part.num_nodes for part in parts] == p.summary()["nodes"]
    # the same seed gives the same split; another seed another one
    assert torch.equal(partition_graph(g, 4, kind=kind, seed=3, alpha=1.0).site, p.site)
    assert not torch.equal(partition_graph(g, 4, kind=kind, seed=4, alpha=1.0).site, p.site)


def test_random_sites_are_near_equal() -> None:
    sizes = partition_graph(planted(601), 4, seed=0).summary()["nodes"]
    assert max(sizes) - min(sizes) <= 1


def _class_shares(g: NodeGraph, site: torch.Tensor, num_sites: int) -> np.ndarray:
    counts = np.zeros((num_sites, g.num_classes))
    np.add.at(counts, (site.numpy(), g.y.numpy()), 1)
    return counts / counts.sum(axis=1, keepdims=True)


def test_label_skew_is_visible_at_small_alpha_and_vanishes_at_large_alpha() -> None:
    g = planted(n=3000, classes=5)
    overall = np.bincount(g.y.numpy(), minlength=5) / g.num_nodes
    skewed = _class_shares(g, partition_graph(g, 4, kind="labels", seed=0, alpha=0.05).site, 4)
    even = _class_shares(g, partition_graph(g, 4, kind="labels", seed=0, alpha=1000.0).site, 4)
    # total-variation distance of each site's class mix from the whole graph's
    tv = lambda shares: 0.5 * np.abs(shares - overall).sum(axis=1)  # noqa: E731
    assert tv(skewed).mean() > 0.4
    assert tv(even).max() < 0.05
    assert skewed.max(axis=1).mean() > 0.6  # most of a site's nodes are of one class


def test_label_skew_needs_labels_and_a_positive_alpha() -> None:
    g = planted()
    rel = RelationalGraph(name="nolabels", entity_ids=["a", "b", "c"], edges=torch.tensor([[0, 1]]),
                          texts=["a", "b", "c"])
    with pytest.raises(DataError, match="no labels"):
        partition_graph(rel, 2, kind="labels")
    with pytest.raises(ConfigError, match="alpha"):
        partition_graph(g, 2, kind="labels", alpha=0.0)


def test_communities_are_connected_whole_and_cut_fewer_relations_than_random_nodes() -> None:
    g = planted()
    p = partition_graph(g, 3, kind="communities", seed=0)
    nxg = nx.Graph(g.edge_index.t().tolist())
    nxg.add_nodes_from(range(g.num_nodes))
    for c in p.communities.unique().tolist():
        members = (p.communities == c).nonzero().flatten().tolist()
        assert nx.is_connected(nxg.subgraph(members)), f"community {c} is not connected"
        assert len({int(p.site[v]) for v in members}) == 1, f"community {c} is split across sites"
    random = partition_graph(g, 3, kind="random", seed=0)
    assert p.cut_fraction < 0.5 * random.cut_fraction
    assert max(p.summary()["nodes"]) <= 2 * min(p.summary()["nodes"])


def test_relational_and_node_graphs_split_alike() -> None:
    g = planted()
    rel = g.to_relational()
    for kind in KINDS:
        a = partition_graph(g, 3, kind=kind, seed=2)
        b = partition_graph(rel, 3, kind=kind, seed=2)
        assert torch.equal(a.site, b.site) and a.cut_edges == b.cut_edges == direct_cut(g, a.site)


def test_bad_requests_name_the_problem() -> None:
    g = planted(n=30)
    with pytest.raises(ConfigError, match="kind"):
        partition_graph(g, 2, kind="metis")
    with pytest.raises(ConfigError, match="1..30"):
        partition_graph(g, 31)
    with pytest.raises(DataError, match="without nodes"):
        partition_graph(g, 30, kind="labels", alpha=0.01)
