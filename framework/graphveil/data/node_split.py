"""Node splits for node classification: the keyed random split, and Planetoid's public one.

dp-gnn (paper 4's code) splits with PyG's ``RandomNodeSplit(num_val=0.1, num_test=0.15)``, a
permutation of all nodes. We keep its fractions but key each node's side on its own id, like
the transfer split (:mod:`graphveil.data.split`): a node's side depends on HMAC-SHA256(key,
node id) only, so removing or replacing one node moves no other node between sides, and the
training side of a neighbouring graph is the neighbouring training side. Side sizes are then
Binomial around ``fraction · n`` rather than exact.

``planetoid_full`` (:func:`planetoid_full_split`) is the split published with the Planetoid
files, as PyG's ``Planetoid(split="full")`` builds it: the public split's 500 validation and
1000 test nodes, every other node trains (Cora: 1208 training nodes, the 140 public ones
among them). It is defined by node id, so it maps through dp-gnn's preprocessing (and
``max_entities``) exactly where those keep the validation and test nodes: a removed node can
only leave the training side, which is "every other node" either way. If one of the 1500
validation or test nodes was removed, the published split no longer exists on the loaded
graph and it is refused (on Cora dp-gnn's preprocessing removes no node).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data.node_graph import NodeGraph
from graphveil.data.split import split_positions

log = logging.getLogger(__name__)

TRAIN, VAL, TEST = 0, 1, 2
UNLABELLED = -1


@dataclass(frozen=True)
class NodeSplit:
    """Sorted int64 node indices of each side: disjoint, together every labelled node of the
    graph (an unlabelled node, ``y = -1``, is on no side: it only feeds its neighbours)."""

    train: torch.Tensor
    val: torch.Tensor
    test: torch.Tensor


def node_split_key(seed: int) -> bytes:
    """HMAC key of the random node split from ``data.split.seed`` (kept apart from the
    transfer split's key, so the two splits of one seed are unrelated)."""
    return f"graphveil-random-node-split:{int(seed)}".encode()


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """:raises ConfigError: naming the field unless ``0 <= val``, ``0 < test`` and ``val + test < 1``."""
    if not 0 <= val_fraction < 1:
        raise ConfigError(f"data.split.val_fraction must be in [0, 1), got {val_fraction!r}")
    if not 0 < test_fraction < 1:
        raise ConfigError(f"data.split.test_fraction must be in (0, 1), got {test_fraction!r}")
    if val_fraction + test_fraction >= 1:
        raise ConfigError(f"data.split.val_fraction + data.split.test_fraction must be < 1 to leave "
                          f"training nodes, got {val_fraction} + {test_fraction}")


def node_sides(node_ids: Sequence[str], val_fraction: float, test_fraction: float,
               key: int | bytes) -> torch.Tensor:
    """``(n,)`` side of every node (0 train, 1 val, 2 test): with ``p`` = HMAC-SHA256(key, id)
    / 2⁶⁴ (:func:`~graphveil.data.split.split_position`), test iff ``p < test_fraction``, val
    iff ``p < test_fraction + val_fraction``, else train. ``key``: ``data.split.seed`` (an int,
    through :func:`node_split_key`) or raw key bytes."""
    check_fractions(val_fraction, test_fraction)
    hkey = key if isinstance(key, bytes) else node_split_key(key)
    position = split_positions(hkey, node_ids)
    sides = torch.full((len(node_ids),), TRAIN, dtype=torch.long)
    sides[position < test_fraction + val_fraction] = VAL
    sides[position < test_fraction] = TEST
    return sides


def random_node_split(graph: NodeGraph, val_fraction: float, test_fraction: float,
                      key: int | bytes) -> NodeSplit:
    """Split the nodes of ``graph`` into train / val / test (:func:`node_sides`).

    :raises ConfigError: on fractions outside their ranges (see :func:`check_fractions`).
    :raises DataError: if the training or test side is empty, or the validation side is
        empty although ``val_fraction > 0``.
    """
    sides = node_sides(graph.node_ids, val_fraction, test_fraction, key)
    sides[~graph.labelled] = UNLABELLED  # keyed per id: no labelled node changes side
    train, val, test = ((sides == s).nonzero().flatten() for s in (TRAIN, VAL, TEST))
    for side, nodes, wanted in (("train", train, True), ("validation", val, val_fraction > 0),
                                ("test", test, True)):
        if wanted and nodes.numel() == 0:
            raise DataError(
                f"{graph.name}: the random node split leaves no {side} node among {graph.num_nodes} "
                f"(val_fraction={val_fraction}, test_fraction={test_fraction}, split key "
                f"{key if isinstance(key, int) else '<bytes>'}); use more nodes or other fractions"
            )
    log.info("random node split of %s: %d train, %d val, %d test nodes",
             graph.name, train.numel(), val.numel(), test.numel())
    return NodeSplit(train=train, val=val, test=test)


def planetoid_full_split(graph: NodeGraph) -> NodeSplit:
    """PyG's ``Planetoid(split="full")`` on ``graph``: validation and test nodes of its
    :attr:`~graphveil.data.node_graph.NodeGraph.public_split`, every other labelled node training
    (a ``pyg`` source's masks give the public split: its ``train_mask`` is not read).

    :raises ConfigError: if the graph has no public split (not a Planetoid source), or lacks one
        of its validation or test nodes (removed by preprocessing or ``max_entities``).
    """
    public = graph.public_split
    if public is None:
        raise ConfigError(f"data.split.kind planetoid_full: {graph.name} carries no public split (use "
                          f"data.source: planetoid, a pyg Data with val_mask and test_mask, or "
                          f"data.split.kind: random_node)")
    index = {nid: i for i, nid in enumerate(graph.node_ids)}
    sides = torch.full((graph.num_nodes,), TRAIN, dtype=torch.long)
    for side, ids, name in ((VAL, public.val, "validation"), (TEST, public.test, "test")):
        missing = [nid for nid in ids if nid not in index]
        if missing:
            raise ConfigError(
                f"data.split.kind planetoid_full: {len(missing)} of the {len(ids)} public {name} nodes "
                f"of {graph.name} are not in the loaded graph (first: node {missing[0]!r}; removed by "
                f"data.preprocess: dp_gnn or by data.max_entities), so the published split cannot be "
                f"kept exact; set data.preprocess: none and drop data.max_entities, or use random_node"
            )
        sides[[index[nid] for nid in ids]] = side
    sides[~graph.labelled] = UNLABELLED
    train, val, test = ((sides == s).nonzero().flatten() for s in (TRAIN, VAL, TEST))
    log.info("planetoid_full split of %s: %d train, %d val, %d test nodes",
             graph.name, train.numel(), val.numel(), test.numel())
    return NodeSplit(train=train, val=val, test=test)
