"""The transfer split: train on relations among one set of entities, evaluate zero-shot on another.

Paper 2 (privately-learning-from-graphs-llm-finetuning, Sec. 4.1 and Appx. C, "Inference
Setting") fine-tunes on the relations of a training graph and deploys the model zero-shot on a
test domain whose relations it never saw. We split the *entities* into two disjoint sets; each
side keeps only the relations inside it, and relations crossing the two sides are discarded
(neither training data nor test data).

The side of an entity depends on its own id and the split key only (a keyed hash), never on
the other entities: removing or adding one entity moves no other entity across the split, so
the training set of a neighbouring dataset is the neighbouring training set — which is what an
entity-level guarantee about "the training side" needs. (A permutation of all entities would
move most of them when one is removed.)
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable

import numpy as np
import torch

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data.graph import RelationalGraph

log = logging.getLogger(__name__)

CROSS_EDGES = "dropped_cross_edges"


def split_key(seed: int) -> bytes:
    """HMAC key of the split from ``data.split.seed`` (the split key)."""
    return f"graphveil-transfer-split:{int(seed)}".encode()


def split_position(key: bytes, entity_id: str) -> float:
    """HMAC-SHA256(key, entity id as UTF-8), first 64 bits as an integer, ÷ 2⁶⁴: in [0, 1).
    (``hmac.digest``: OpenSSL's one-shot HMAC, one C call; ``hmac.new`` costs ~4× more per id,
    which at 10⁶ entities was most of the split, issue 28.)"""
    return int.from_bytes(hmac.digest(key, str(entity_id).encode("utf-8"), "sha256")[:8], "big") / 2.0**64


def split_positions(key: bytes, entity_ids: Iterable[str]) -> torch.Tensor:
    """:func:`split_position` of every id, as an ``(n,)`` float64 tensor, the same values: the
    standard library's HMAC-SHA256 keyed once and copied per id (the key's padded states are
    not hashed again), the digests' first 64 bits read as big-endian words in one pass
    (issue 28: 10⁶ entities took 1.6 CPU s with a one-shot HMAC and a Python int per id)."""
    copy = hmac.new(key, digestmod="sha256").copy

    def digest(entity_id: str) -> bytes:
        h = copy()
        h.update(str(entity_id).encode("utf-8"))
        return h.digest()

    raw = b"".join([digest(e) for e in entity_ids])
    top = np.frombuffer(raw, dtype=">u8").reshape(-1, 4)[:, 0]  # 32-byte digests: word 0 of each
    return torch.from_numpy(top.astype(np.float64) / 2.0**64)  # exact: one rounding, as int / 2.0**64


def transfer_split(
    graph: RelationalGraph, train_fraction: float, seed: int
) -> tuple[RelationalGraph, RelationalGraph]:
    """:func:`transfer_sides` without the mask."""
    train, test, _ = transfer_sides(graph, train_fraction, seed)
    return train, test


def transfer_sides(
    graph: RelationalGraph, train_fraction: float, seed: int
) -> tuple[RelationalGraph, RelationalGraph, torch.Tensor]:
    """Split ``graph`` into a training side and a disjoint zero-shot test side.

    Entity ``e`` is on the training side iff ``HMAC-SHA256(key, e) / 2⁶⁴ < train_fraction``
    with ``key`` = :func:`split_key` (``seed``) — independent of the run's generators and of
    every other entity, so the training side holds about ``train_fraction·n`` entities
    (Binomial). Each side is the induced subgraph (:meth:`RelationalGraph.subgraph`: entity
    order of ``graph`` kept, ids unchanged).

    :returns: ``(train_graph, test_graph, on_train)``; both graphs carry
        ``notes["dropped_cross_edges"]``; ``on_train`` is the ``(n,)`` bool mask of the training
        side's entities in ``graph`` (each side's entities in ``graph``'s order: the training
        side's entity ``i`` is ``graph``'s entity ``on_train.nonzero()[i]``).
    :raises ConfigError: if ``train_fraction`` is not in (0, 1).
    :raises DataError: if either side would have no entity or no relation.
    """
    if not 0 < train_fraction < 1:
        raise ConfigError(f"data.split.train_fraction must be in (0, 1), got {train_fraction!r}")
    n = graph.num_nodes
    key = split_key(seed)
    on_train = split_positions(key, graph.entity_ids) < train_fraction
    n_train = int(on_train.sum())
    if not 0 < n_train < n:
        raise DataError(
            f"{graph.name}: train_fraction {train_fraction} of {n} entities leaves a side empty "
            f"under split key {seed} ({n_train} training entities); use more entities or another "
            "train_fraction"
        )
    train = graph.subgraph(on_train, name=f"{graph.name}/train")
    test = graph.subgraph(~on_train, name=f"{graph.name}/test")
    cross = graph.num_edges - train.num_edges - test.num_edges
    for side in (train, test):
        side.notes = {**graph.notes, CROSS_EDGES: cross}
        if side.num_edges == 0:
            raise DataError(
                f"{side.name}: no relations inside this side of the split ({side.num_nodes} "
                f"entities; train_fraction={train_fraction}, seed={seed}); use more entities or "
                f"another train_fraction"
            )
    log.info(
        "transfer split (key %d): train %d entities / %d relations, test %d / %d, "
        "%d cross relations discarded",
        seed, train.num_nodes, train.num_edges, test.num_nodes, test.num_edges, cross,
    )
    return train, test, on_train
