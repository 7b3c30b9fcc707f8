"""dp-gnn's preprocessing of node-classification graphs (paper 4's protocol, used for DP-MLP on Cora).

What the authors' code does (github.com/thupchnsky/dp-gnn, the repository the paper links;
``core/datasets/loader.py``, transforms from its base repository sisaman/GAP,
``core/data/transforms/filter_class.py`` and ``remove_isolated_nodes.py``), in this order:

1. ``RandomNodeSplit(num_val=0.1, num_test=0.15)`` on the full graph (our split is keyed per
   node id instead, so splitting before or after the node removals below gives every
   surviving node the same side; see :mod:`graphveil.data.node_split`);
2. ``FilterClassByCount(min_count=50, remove_unlabeled=True)``: classes with fewer than 50
   nodes, counted over all nodes, are dropped with their nodes (induced subgraph) and the
   remaining classes re-indexed in their order;
3. ``RemoveSelfLoops``;
4. ``RemoveIsolatedNodes``: nodes without any edge after steps 2-3 are removed;
5. ``ToSparseTensor`` (a format change). The graph is not symmetrised there: PyG's Planetoid
   graphs already hold both directions of every edge. A :class:`NodeGraph` is symmetric and
   loop-free by construction (:func:`~graphveil.data.node_graph.node_graph_from_pyg` drops
   self-loops and adds missing reverse edges, counting both), so steps 3 and the
   symmetrisation are done when the graph is built and recorded in its notes.

On Cora every class has at least 180 nodes and no node is isolated, so the preprocessing
changes nothing (2708 nodes, 5278 undirected edges, 7 classes, 1433 features); on CiteSeer it
removes the 48 isolated nodes (3327 → 3279).
"""

from __future__ import annotations

import logging

import torch

from graphveil.contract.errors import DataError
from graphveil.data.node_graph import NodeGraph, relabel_classes

log = logging.getLogger(__name__)

#: dp-gnn's ``FilterClassByCount(min_count=50)`` for Cora, PubMed, Photo, Computers, ...
DP_GNN_MIN_CLASS_SIZE = 50

#: Keys of ``NodeGraph.notes`` written by :func:`dp_gnn_preprocess`.
SMALL_CLASSES = "dropped_small_classes"
SMALL_CLASS_NODES = "dropped_small_class_nodes"
ISOLATED_NODES = "dropped_isolated_nodes"


def dp_gnn_preprocess(graph: NodeGraph, *, min_class_size: int = DP_GNN_MIN_CLASS_SIZE) -> NodeGraph:
    """Drop classes with fewer than ``min_class_size`` nodes (and their nodes), then the nodes
    left without any edge; counts in ``notes`` (see the module docstring for dp-gnn's code).

    :raises DataError: if no class is large enough or no node keeps an edge.
    """
    counts = torch.bincount(graph.y, minlength=graph.num_classes)
    keep_class = counts >= min_class_size
    if not keep_class.any():
        raise DataError(f"{graph.name}: no class has {min_class_size} or more nodes "
                        f"(largest: {int(counts.max())}); nothing left after dp-gnn preprocessing")
    in_kept = keep_class[graph.y]
    g = graph.subgraph(in_kept, name=graph.name)
    g = relabel_classes(g, keep_class)
    linked = g.degrees() > 0
    if not linked.any():
        raise DataError(f"{graph.name}: no edge left between nodes of the kept classes")
    out = g.subgraph(linked, name=graph.name)
    out.notes = {
        **graph.notes,
        SMALL_CLASSES: int((~keep_class).sum()),
        SMALL_CLASS_NODES: int((~in_kept).sum()),
        ISOLATED_NODES: int((~linked).sum()),
    }
    log.info("%s: dp-gnn preprocessing kept %d of %d nodes, %d of %d classes (%d isolated node(s) removed)",
             graph.name, out.num_nodes, graph.num_nodes, out.num_classes, graph.num_classes,
             out.notes[ISOLATED_NODES])
    return out
