"""Small random graphs for the sampler, degree-cap and clipping tests (hypothesis strategy + builder)."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from graphveil.data.graph import RelationalGraph


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
