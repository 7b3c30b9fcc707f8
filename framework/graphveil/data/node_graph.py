"""The node-feature graph: every node has a feature vector and a class label or none (node classification).

Where :class:`~graphveil.data.graph.RelationalGraph` stores each relation once (``u < v``), a
:class:`NodeGraph` keeps PyG's layout: ``edge_index`` holds both directions of every
undirected edge, so :meth:`NodeGraph.to_pyg` is a plain ``Data`` a GNN can use as is.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.validate import check_index_range

log = logging.getLogger(__name__)

#: Keys of ``NodeGraph.notes`` written by :func:`node_graph_from_pyg`.
SELF_LOOPS = "dropped_self_loops"
DUPLICATES = "dropped_duplicate_edges"
REVERSE_EDGES = "added_reverse_edges"


@dataclass(frozen=True)
class PublicSplit:
    """A dataset's published train / validation / test nodes, by node id, as its files define
    them (Planetoid: the first 140 (Cora) or 120 (CiteSeer) nodes train, the next 500 validate,
    the test index file names the 1000 test nodes). Ids are those of the graph as read: a
    preprocessed or truncated graph keeps the split of its source, whose nodes it may lack."""

    train: tuple[str, ...]
    val: tuple[str, ...]
    test: tuple[str, ...]


@dataclass(eq=False)
class NodeGraph:
    """Nodes ``0..n-1`` with features and labels, and undirected edges stored in both directions.

    Checked on construction (:class:`~graphveil.contract.errors.DataError` naming the graph and the
    problem): at least one node; ``x`` a real ``(n, F)`` tensor with finite entries (converted
    to float32); ``y`` an integer ``(n,)`` tensor with ``0 <= y < len(class_names)``, or ``-1``
    for an unlabelled node (it carries features and edges, but no split side holds it);
    ``edge_index`` an integer ``(2, E)`` tensor with endpoints in ``0..n-1``, no self-loop, no
    duplicate column, and the reverse ``(v, u)`` of every column ``(u, v)``; ``node_ids``
    ``n`` distinct non-empty strings; ``class_names`` distinct strings.

    :param name: used in reports and error messages.
    :param x: ``(n, F)`` float32 node features.
    :param y: ``(n,)`` int64 class index of every node, ``-1`` if it has none.
    :param edge_index: ``(2, E)`` int64, both directions of each undirected edge.
    :param node_ids: external id of every node (the random node split is keyed on it).
    :param class_names: class index → name.
    :param notes: counts of what loading or preprocessing removed (for reports).
    :param public_split: the dataset's published split, if it has one (Planetoid; a PyG
        ``Data``'s ``train_mask`` / ``val_mask`` / ``test_mask``).
    """

    name: str
    x: torch.Tensor
    y: torch.Tensor
    edge_index: torch.Tensor
    node_ids: list[str]
    class_names: list[str]
    notes: dict[str, int] = field(default_factory=dict)
    public_split: PublicSplit | None = None

    def __post_init__(self) -> None:
        src = self.name or "<NodeGraph>"
        self.node_ids = _check_ids(self.node_ids, src)
        n = len(self.node_ids)
        self.class_names = _check_class_names(self.class_names, src)
        self.x = _check_x(self.x, n, src)
        self.y = _check_y(self.y, n, self.class_names, self.node_ids, src)
        self.edge_index = _check_edge_index(self.edge_index, n, self.node_ids, src)

    # ------------------------------------------------------------------------------ sizes
    @property
    def num_nodes(self) -> int:
        return len(self.node_ids)

    @property
    def num_features(self) -> int:
        return int(self.x.shape[1])

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_edges(self) -> int:
        """Columns of ``edge_index`` (PyG's count: each undirected edge counts twice)."""
        return int(self.edge_index.shape[1])

    @property
    def num_undirected_edges(self) -> int:
        return self.num_edges // 2

    @property
    def labelled(self) -> torch.Tensor:
        """``(n,)`` bool: the nodes with a class (the ones a split may place on a side)."""
        return self.y >= 0

    def degrees(self) -> torch.Tensor:
        """``(n,)`` number of neighbours of every node."""
        return torch.bincount(self.edge_index[0], minlength=self.num_nodes)

    # ------------------------------------------------------------------------------ views
    def subgraph(self, nodes: torch.Tensor, name: str | None = None) -> NodeGraph:
        """The graph induced on ``nodes`` (indices or an ``(n,)`` bool mask), node order kept,
        re-indexed ``0..k-1``; ids, classes, notes and the public split (by id) unchanged."""
        nodes = torch.as_tensor(nodes)
        if nodes.dtype == torch.bool:
            nodes = nodes.nonzero().flatten()
        nodes = nodes.to(torch.long).unique(sorted=True)
        remap = torch.full((self.num_nodes,), -1, dtype=torch.long)
        remap[nodes] = torch.arange(nodes.numel())
        ends = remap[self.edge_index]
        inside = (ends >= 0).all(dim=0)
        return NodeGraph(
            name=name or f"{self.name}[{nodes.numel()}]",
            x=self.x[nodes], y=self.y[nodes], edge_index=ends[:, inside],
            node_ids=[self.node_ids[i] for i in nodes.tolist()],
            class_names=list(self.class_names), notes=dict(self.notes), public_split=self.public_split,
        )

    def to_pyg(self) -> Any:
        """A ``torch_geometric.data.Data`` with ``x``, ``y``, ``edge_index`` (tensors shared)."""
        from torch_geometric.data import Data

        return Data(x=self.x, y=self.y, edge_index=self.edge_index, num_nodes=self.num_nodes)

    def to_relational(self) -> RelationalGraph:
        """The same graph as a feature-only :class:`RelationalGraph` (each edge once, ``u < v``)."""
        u, v = self.edge_index
        edges = self.edge_index.t()[u < v]  # (m, 2), one row gather
        keys = edges[:, 0] * self.num_nodes + edges[:, 1]
        if not bool((keys[1:] > keys[:-1]).all()):  # the builders' edge_index is sorted: no argsort
            edges = edges[torch.argsort(keys)]
        return RelationalGraph(
            name=self.name, entity_ids=list(self.node_ids), edges=edges.contiguous(),
            features=self.x, labels=self.y, label_names=list(self.class_names), notes=dict(self.notes),
        )

    def __repr__(self) -> str:
        return (f"NodeGraph({self.name!r}, nodes={self.num_nodes}, edges={self.num_undirected_edges} "
                f"undirected, features={self.num_features}, classes={self.num_classes})")


# ---------------------------------------------------------------------------------- checks


def _check_ids(node_ids: Sequence[str], src: str) -> list[str]:
    ids = list(node_ids)
    if not ids:
        raise DataError(f"{src}: no nodes")
    # the common case in C (a set of the ids): ~4× faster than the loop, which names a problem
    if set(map(type, ids)) == {str} and len(distinct := set(ids)) == len(ids) and "" not in distinct:
        return ids
    seen: dict[str, int] = {}
    for i, nid in enumerate(ids):
        if not isinstance(nid, str) or not nid:
            raise DataError(f"{src}: node {i} has id {nid!r}; node ids must be non-empty strings")
        if nid in seen:
            raise DataError(f"{src}: duplicate node id {nid!r} (nodes {seen[nid]} and {i})")
        seen[nid] = i
    return ids


def _check_class_names(class_names: Sequence[str], src: str) -> list[str]:
    names = list(class_names)
    if not names:
        raise DataError(f"{src}: no class names")
    if not all(isinstance(c, str) for c in names):
        raise DataError(f"{src}: class names must be strings, got {names!r}")
    if len(set(names)) != len(names):
        dup = next(c for c in names if names.count(c) > 1)
        raise DataError(f"{src}: duplicate class name {dup!r}")
    return names


def _check_x(x: Any, n: int, src: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise DataError(f"{src}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.shape[0] != n:
        raise DataError(f"{src}: x must be ({n}, F) for {n} nodes, got shape {tuple(x.shape)}")
    if x.is_complex():
        raise DataError(f"{src}: x must be real, got {x.dtype}")
    if x.is_sparse or x.layout != torch.strided:
        raise DataError(f"{src}: x must be a dense tensor, got layout {x.layout}")
    x = x.to(torch.float32)  # after the cast: a float64 value beyond float32's range becomes inf
    bad = ~torch.isfinite(x)
    if bad.any():
        rows = bad.any(dim=1).nonzero().flatten()
        row = int(rows[0])
        col = int(bad[row].nonzero()[0])
        raise DataError(f"{src}: x has a non-finite value ({float(x[row, col])}) at node {row}, "
                        f"feature {col}; {rows.numel()} node(s) affected")
    return x


def _check_y(y: Any, n: int, class_names: list[str], ids: list[str], src: str) -> torch.Tensor:
    if not isinstance(y, torch.Tensor):
        raise DataError(f"{src}: y must be a torch.Tensor, got {type(y).__name__}")
    if y.dim() != 1 or y.shape[0] != n:
        raise DataError(f"{src}: y must be ({n},) for {n} nodes, got shape {tuple(y.shape)}")
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        raise DataError(f"{src}: y must hold integer class indices, got {y.dtype}")
    y = y.to(torch.long)
    bad = ((y < -1) | (y >= len(class_names))).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise DataError(f"{src}: label {int(y[i])} of node {ids[i]!r} is outside 0..{len(class_names) - 1} "
                        f"({len(class_names)} classes; -1: unlabelled); {bad.numel()} node(s) affected")
    if not bool((y >= 0).any()):
        raise DataError(f"{src}: no node has a label")
    return y


def _check_edge_index(edge_index: Any, n: int, ids: list[str], src: str) -> torch.Tensor:
    if not isinstance(edge_index, torch.Tensor):
        raise DataError(f"{src}: edge_index must be a torch.Tensor, got {type(edge_index).__name__}")
    ei = torch.as_tensor(edge_index)
    in_range = (ei.dim() == 2 and ei.shape[0] == 2 and ei.dtype == torch.long
                and (ei.numel() == 0 or (int(ei.min()) >= 0 and int(ei.max()) < n)))
    # the common case is checked by min / max without copies (10⁷ edges: 320 MB per copy);
    # anything else gets check_index_range's message (shape, integer dtype, range)
    ei = ei.contiguous() if in_range else check_index_range(edge_index, n, src).t().contiguous()
    u, v = ei
    loops = (u == v).nonzero().flatten()
    if loops.numel():
        j = int(loops[0])
        raise DataError(f"{src}: edge_index has a self-loop at node {ids[int(u[j])]!r} (column {j}); "
                        f"{loops.numel()} self-loop(s)")
    keys = u * n + v
    if not bool((keys[1:] > keys[:-1]).all()):  # the builders give sorted, repeat-free columns: no sort
        keys = torch.sort(keys).values
    repeated = keys[1:] == keys[:-1]
    if repeated.any():
        dup = int(keys[1:][repeated][0])
        raise DataError(f"{src}: edge_index holds edge ({ids[dup // n]!r}, {ids[dup % n]!r}) more than "
                        f"once; {int(repeated.sum())} duplicate column(s)")
    del repeated
    # distinct keys: every reverse is present iff the sorted reverse keys are the keys themselves
    if torch.equal(torch.sort(v * n + u).values, keys):
        return ei
    missing = ~torch.isin(v * n + u, keys)
    if missing.any():
        j = int(missing.nonzero()[0])
        raise DataError(f"{src}: edge_index has ({ids[int(u[j])]!r}, {ids[int(v[j])]!r}) but not its "
                        f"reverse; store both directions of every edge ({int(missing.sum())} missing)")
    return ei


# ---------------------------------------------------------------------------------- builders


def undirected_edge_index(edge_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, dict[str, int]]:
    """``(2, k)`` in-range index pairs → both directions of every edge, no self-loops, no
    duplicates, sorted by (source, target); with the counts of what changed."""
    u, v = edge_index.to(torch.long)
    loops = u == v
    u, v = u[~loops], v[~loops]
    directed = torch.unique(u * num_nodes + v)
    both = torch.unique(torch.cat([directed, (directed % num_nodes) * num_nodes + directed // num_nodes]))
    notes = {SELF_LOOPS: int(loops.sum()), DUPLICATES: int(u.numel() - directed.numel()),
             REVERSE_EDGES: int(both.numel() - directed.numel())}
    return torch.stack([both // num_nodes, both % num_nodes]), notes


def node_graph_from_pyg(
    data: Any,
    *,
    name: str,
    source: str | None = None,
    node_ids: list[str] | None = None,
    class_names: list[str] | None = None,
) -> NodeGraph:
    """A :class:`NodeGraph` from a homogeneous ``torch_geometric.data.Data`` with ``x``, ``y``
    and ``edge_index``. Self-loops and duplicate edges are dropped and missing reverse edges
    added (counted in ``notes``; none of the three happens on PyG's Planetoid graphs).

    :param source: names the data in error messages (default: ``name``).
    :param node_ids: default ``"0".."n-1"`` (the row in ``data``).
    :param class_names: default ``"0".."C-1"`` with ``C = max(y) + 1``.
    """
    src = source or name
    for attr in ("x", "y", "edge_index"):
        if getattr(data, attr, None) is None:
            raise DataError(f"{src}: the Data object has no {attr}")
    n = int(data.num_nodes)
    y = torch.as_tensor(data.y)
    if y.dim() == 2 and y.shape[1] == 1:
        y = y.flatten()
    if class_names is None:
        if y.numel() and y.is_floating_point():
            raise DataError(f"{src}: y must hold integer class indices, got {y.dtype}")
        class_names = [str(c) for c in range(int(y.max()) + 1 if y.numel() else 0)]
    edge_index, notes = undirected_edge_index(check_index_range(data.edge_index, n, src).t(), n)
    if any(notes.values()):
        log.info("%s: dropped %d self-loop(s), %d duplicate edge(s); added %d reverse edge(s)",
                 src, notes[SELF_LOOPS], notes[DUPLICATES], notes[REVERSE_EDGES])
    return NodeGraph(
        name=name, x=torch.as_tensor(data.x), y=y, edge_index=edge_index,
        node_ids=node_ids if node_ids is not None else [str(i) for i in range(n)],
        class_names=class_names, notes=notes,
    )


def relabel_classes(graph: NodeGraph, keep: torch.Tensor, name: str | None = None) -> NodeGraph:
    """``graph`` with only the classes where ``keep`` (a ``(C,)`` bool mask) is true, their
    order kept and re-indexed ``0..C'-1``; every node must be in a kept class."""
    if not bool(keep[graph.y].all()):
        raise DataError(f"{graph.name}: cannot drop a class that still has nodes")
    index = torch.cumsum(keep.to(torch.long), 0) - 1
    names = [c for c, k in zip(graph.class_names, keep.tolist(), strict=True) if k]
    return replace(graph, name=name or graph.name, y=index[graph.y], class_names=names)
