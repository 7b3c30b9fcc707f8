"""Small random graphs for the sampler, degree-cap and clipping tests (hypothesis strategy + builder)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph


def make_graph(num_nodes: int, pairs: list[tuple[int, int]] | torch.Tensor, name: str = "g") -> RelationalGraph:
    """A bare graph: pairs normalised to u < v, self-loops and duplicates removed."""
    e = torch.as_tensor(pairs, dtype=torch.long).reshape(-1, 2)
    e = torch.stack([e.min(1).values, e.max(1).values], 1)
    e = e[e[:, 0] != e[:, 1]]
    e = torch.unique(e, dim=0) if e.numel() else e
    return RelationalGraph(name, [f"n{i}" for i in range(num_nodes)], e)


@st.composite
def graphs(draw: st.DrawFn, min_nodes: int = 3, max_nodes: int = 16, max_edges: int = 60) -> RelationalGraph:
    """A graph with at least one edge; dense enough for nodes to share several tuples."""
    n = draw(st.integers(min_nodes, max_nodes))
    node = st.integers(0, n - 1)
    pairs = draw(st.lists(st.tuples(node, node).filter(lambda p: p[0] != p[1]), min_size=1, max_size=max_edges))
    return make_graph(n, pairs)


def hub_node_graph(n: int = 160, f: int = 24, classes: int = 3, seed: int = 0,
                   max_degree: int | None = None) -> NodeGraph:
    """A homophilous random graph with some high-degree hubs (degree up to ~20). With
    ``max_degree`` = D, a pair whose end already has D neighbours is skipped: a graph inside
    node-level GDP's class (out-degree ≤ D, both directions stored), for runs at node level."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = (torch.randn(classes, f, generator=gen) * 1.5)[y] + torch.randn(n, f, generator=gen)
    pairs: set[tuple[int, int]] = set()
    degree = [0] * n
    for u in range(n):
        for _ in range(12 if u < 4 else 2):
            v = int(torch.randint(n, (1,), generator=gen))
            if v != u and (y[u] == y[v] or bool(torch.rand(1, generator=gen) < 0.2)):
                pair = (min(u, v), max(u, v))
                if pair in pairs or (max_degree is not None and max(degree[u], degree[v]) >= max_degree):
                    continue
                pairs.add(pair)
                degree[u] += 1
                degree[v] += 1
    e = torch.tensor(sorted(pairs)).t()
    edges = torch.cat([e, e.flip(0)], dim=1)
    return NodeGraph("hubs", x, y, edges, [f"v{i}" for i in range(n)], [f"c{c}" for c in range(classes)])


def node_graph_within(d: int = 3):  # noqa: ANN201 - a builder with hub_node_graph's signature
    """``hub_node_graph`` with its degrees capped at ``d`` (node level's class for D = d)."""

    def build(n: int = 160, f: int = 24, classes: int = 3, seed: int = 0) -> NodeGraph:
        return hub_node_graph(n, f, classes, seed, max_degree=d)

    return build
