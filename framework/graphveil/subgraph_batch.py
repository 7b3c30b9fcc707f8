"""Batches of per-example graphs: rooted computation subgraphs or disjoint components.

A :class:`SubgraphBatch` wraps a ``torch_geometric.data.Batch`` in which graph ``i`` is example
``i`` (one clipping unit): the ``num_hops``-hop computation subgraph of a root node
(:class:`~graphveil.contract.profiles.ExampleStructure` ``root_subgraphs``, built by
:func:`rooted_subgraphs`), or one of disjoint components of a graph (``components``, paper 3's
graph splits, e.g. :meth:`SubgraphBatch.from_data_list` of induced subgraphs).

Why the per-example gradients of one backward are exact: PyG batches graphs block-diagonally —
every node row belongs to one graph (the ``batch`` vector, which is :attr:`SubgraphBatch.groups`)
and no edge joins two graphs. Message passing (and GCN's degree normalisation, self-loops
included) then only combines rows of the same example, so each row of every layer's input and
output gradient belongs to exactly one example, and the engine's segment sums over
``groups`` (:meth:`~graphveil.engine.per_tuple.PerTupleGrad.record` with ``groups=``) give
``g(Eᵢ)`` — provided example ``i``'s loss reads only its own rows (its root's output, or a pool
over its rows). The constructor checks the block structure: a batch with an edge between two
examples is refused (:class:`ValueError`), since one backward could not separate them.

Exactness of the decomposition is not a privacy claim: in ``root_subgraphs`` one node lies in
the subgraphs of many roots, so node-level sensitivity needs a degree bound and a sampler and
accountant that analyse it (not provided here).

Roots are stored per graph as ``root_index`` (PyG offsets keys containing ``index`` by the
graph's node count when batching and undoes it in ``get_example``), so :attr:`roots` is the
row of each example's root in the batch; ``y`` (labels) and ``n_id`` (each row's node id in
the source graph) are carried when present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch_geometric.data import Batch as PygBatch
from torch_geometric.data import Data
from torch_geometric.utils import k_hop_subgraph

__all__ = ["SubgraphBatch", "rooted_subgraphs"]


class SubgraphBatch:
    """Examples that are graphs: a PyG ``Batch`` whose graph ``i`` is example ``i``.

    Satisfies :class:`graphveil.contract.task.Batch` (``size``, ``select``) and offers ``groups`` (row →
    example), so :func:`~graphveil.engine.dp_step.dp_step` clips per graph, micro-batched or not.

    :param graphs: a ``torch_geometric.data.Batch`` (``Batch.from_data_list``) with
        ``edge_index``; optionally ``root_index`` (one root row per graph), ``y``, ``n_id``.
    :raises ValueError: an edge joins two examples; a ``batch`` vector, edge or root out of
        range; a root outside its own example's rows.
    """

    def __init__(self, graphs: PygBatch) -> None:
        if not isinstance(graphs, PygBatch):
            raise ValueError(f"SubgraphBatch wraps a torch_geometric.data.Batch, got {type(graphs).__name__}")
        self.graphs = graphs
        _check_blocks(graphs)

    @classmethod
    def from_data_list(cls, graphs: Sequence[Data]) -> SubgraphBatch:
        """Batch per-example graphs (at least one; :meth:`select` makes empty batches)."""
        if not graphs:
            raise ValueError("from_data_list needs at least one graph")
        return cls(PygBatch.from_data_list(list(graphs)))

    @property
    def size(self) -> int:
        """Number of examples (graphs)."""
        return int(self.graphs.num_graphs)

    @property
    def groups(self) -> torch.Tensor:
        """Row → example map: PyG's ``batch`` vector (node row ``r`` belongs to graph ``batch[r]``)."""
        return self.graphs.batch

    @property
    def num_nodes(self) -> int:
        return int(self.graphs.num_nodes)

    @property
    def sizes(self) -> torch.Tensor:
        """``(size,)`` node count of every example."""
        return torch.bincount(self.groups, minlength=self.size)

    @property
    def roots(self) -> torch.Tensor | None:
        """``(size,)`` row of each example's root in the batch (``None`` for components)."""
        return getattr(self.graphs, "root_index", None)

    @property
    def labels(self) -> torch.Tensor | None:
        """The graphs' ``y`` (per root for :func:`rooted_subgraphs`), if present."""
        return getattr(self.graphs, "y", None)

    @property
    def node_ids(self) -> torch.Tensor | None:
        """``(num_nodes,)`` each row's node in the source graph (``n_id``), if present."""
        return getattr(self.graphs, "n_id", None)

    def select(self, index: torch.Tensor) -> SubgraphBatch:
        """The graphs at positions ``index`` (1-D long), in that order (micro-batching)."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.size):
            raise IndexError(f"select: positions must be in [0, {self.size}), got {index.tolist()}")
        if not index.numel():
            return SubgraphBatch(_empty_like(self.graphs))
        if getattr(self.graphs, "_slice_dict", None) is None:
            raise ValueError("select needs a batch made by Batch.from_data_list (it keeps the graphs' slices)")
        return SubgraphBatch(PygBatch.from_data_list(self.graphs.index_select(index)))

    def __repr__(self) -> str:
        return f"SubgraphBatch(size={self.size}, num_nodes={self.num_nodes}, rooted={self.roots is not None})"


def _check_blocks(graphs: PygBatch) -> None:
    """The batch is block-diagonal: rows map to graphs, edges and roots stay inside their graph."""
    b, n = int(graphs.num_graphs), int(graphs.num_nodes or 0)
    groups, edge_index = getattr(graphs, "batch", None), getattr(graphs, "edge_index", None)
    if groups is None or groups.dim() != 1 or groups.numel() != n:
        raise ValueError(f"the batch needs a (num_nodes,) batch vector mapping its {n} rows to graphs")
    if n and (int(groups.min()) < 0 or int(groups.max()) >= b):
        raise ValueError(f"batch vector values must be in [0, {b})")
    if edge_index is None or edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError("the batch needs a (2, E) edge_index")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= n):
        raise ValueError(f"edge_index endpoints must be rows in [0, {n})")
    src, dst = groups[edge_index[0]], groups[edge_index[1]]
    crossing = (src != dst).nonzero().flatten()
    if crossing.numel():
        e = int(crossing[0])
        raise ValueError(
            f"edge {e} ({int(edge_index[0, e])} → {int(edge_index[1, e])}) joins example "
            f"{int(src[e])} to example {int(dst[e])} ({crossing.numel()} such edges): message "
            "passing would mix examples, so their gradients cannot be separated; every edge must "
            "stay inside one example's graph"
        )
    roots = getattr(graphs, "root_index", None)
    if roots is not None:
        if roots.shape != (b,):
            raise ValueError(f"root_index must hold one root per graph ({b},), got {tuple(roots.shape)}")
        if b and (int(roots.min()) < 0 or int(roots.max()) >= n):
            raise ValueError(f"root rows must be in [0, {n})")
        wrong = (groups[roots] != torch.arange(b, device=groups.device)).nonzero().flatten()
        if wrong.numel():
            i = int(wrong[0])
            raise ValueError(f"the root of example {i} (row {int(roots[i])}) lies in example {int(groups[roots[i]])}")


def _empty_like(graphs: PygBatch) -> PygBatch:
    """A batch of zero graphs with the same attributes (each sliced to length 0 on its cat dim)."""
    template = graphs.get_example(0)
    empty = PygBatch()
    for key, value in template.items():
        if isinstance(value, torch.Tensor):
            dim = template.__cat_dim__(key, value)
            empty[key] = value.narrow(dim if dim is not None else 0, 0, 0)
    empty.batch = torch.zeros(0, dtype=torch.long, device=graphs.batch.device)
    empty.ptr = torch.zeros(1, dtype=torch.long, device=graphs.batch.device)
    empty._num_graphs = 0
    return empty


def rooted_subgraphs(
    graph_x: torch.Tensor,
    edge_index: torch.Tensor,
    roots: torch.Tensor | Sequence[int],
    num_hops: int,
    y: torch.Tensor | None = None,
) -> SubgraphBatch:
    """One example per root: its ``num_hops``-hop in-neighbourhood, relabelled, batched in root order.

    Per root, ``k_hop_subgraph`` (flow ``source_to_target``: the nodes whose messages reach the
    root within ``num_hops`` steps) gives the node set and every edge between those nodes; the
    root's row is recorded (:attr:`SubgraphBatch.roots`), with ``n_id`` (source node of each row)
    and, if ``y`` is given, the root's label. A root may repeat (one example each time).

    A message-passing model with at most ``num_hops`` layers that aggregates in-neighbours
    (mean/sum/max, e.g. ``SAGEConv``) computes the same root output on this subgraph as on the
    whole graph; a normalisation reading source degrees (``GCNConv``) sees the outermost hop's
    degrees truncated to the subgraph.

    :param graph_x: ``(n, F)`` node features of the whole graph.
    :param edge_index: ``(2, E)`` edges ``source → target`` of the whole graph.
    :param roots: root node ids (1-D, at least one).
    :param num_hops: ``≥ 0`` (0: the root alone).
    :param y: ``(n,)`` node labels (optional); example ``i`` gets ``y[roots[i]]``.
    """
    roots = torch.as_tensor(roots, dtype=torch.long)
    n = int(graph_x.shape[0])
    if roots.dim() != 1 or not roots.numel():
        raise ValueError(f"roots must be a non-empty 1-D list of node ids, got shape {tuple(roots.shape)}")
    if int(roots.min()) < 0 or int(roots.max()) >= n:
        raise ValueError(f"roots must be node ids in [0, {n})")
    if isinstance(num_hops, bool) or not isinstance(num_hops, int) or num_hops < 0:
        raise ValueError(f"num_hops must be an int >= 0, got {num_hops!r}")
    if y is not None and y.shape[:1] != (n,):
        raise ValueError(f"y must hold one label per node ({n}, ...), got {tuple(y.shape)}")
    graphs = []
    for root in roots.tolist():
        subset, sub_edges, mapping, _ = k_hop_subgraph(
            root, num_hops, edge_index, relabel_nodes=True, num_nodes=n, flow="source_to_target"
        )
        data: dict[str, Any] = {"x": graph_x[subset], "edge_index": sub_edges, "root_index": mapping.view(1),
                                "n_id": subset}
        if y is not None:
            data["y"] = y[root : root + 1]
        graphs.append(Data(**data))
    return SubgraphBatch.from_data_list(graphs)
