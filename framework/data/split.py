"""The transfer split: train on relations among one set of entities, evaluate zero-shot on another.

Paper 2 (privately-learning-from-graphs-llm-finetuning, Sec. 4.1 and Appx. C, "Inference
Setting") fine-tunes on the relations of a training graph and deploys the model zero-shot on a
test domain whose relations it never saw. We split the *entities* into two disjoint sets with a
seeded permutation; each side keeps only the relations inside it, and relations crossing the
two sides are discarded (neither training data nor test data).
"""

from __future__ import annotations

import logging

import torch

from graphveil.data.graph import RelationalGraph
from graphveil.errors import ConfigError, DataError

log = logging.getLogger(__name__)

CROSS_EDGES = "dropped_cross_edges"


def transfer_split(
    graph: RelationalGraph, train_fraction: float, seed: int
) -> tuple[RelationalGraph, RelationalGraph]:
    """Split ``graph`` into a training side and a disjoint zero-shot test side.

    The first ``round(train_fraction·n)`` entities of ``torch.randperm(n)`` under a fresh
    ``torch.Generator`` seeded with ``seed`` (independent of the run's generator) form the
    training side, the rest the test side. Each side is the induced subgraph
    (:meth:`RelationalGraph.subgraph`: entity order of ``graph`` kept, ids unchanged).

    :returns: ``(train_graph, test_graph)``; both carry ``notes["dropped_cross_edges"]``.
    :raises ConfigError: if ``train_fraction`` is not in (0, 1).
    :raises DataError: if either side would have no entity or no relation.
    """
    if not 0 < train_fraction < 1:
        raise ConfigError(f"data.split.train_fraction must be in (0, 1), got {train_fraction!r}")
    n = graph.num_nodes
    n_train = round(train_fraction * n)
    if not 0 < n_train < n:
        raise DataError(
            f"{graph.name}: train_fraction {train_fraction} of {n} entities leaves a side empty"
        )
    generator = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=generator)
    train = graph.subgraph(perm[:n_train], name=f"{graph.name}/train")
    test = graph.subgraph(perm[n_train:], name=f"{graph.name}/test")
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
        "transfer split (seed %d): train %d entities / %d relations, test %d / %d, "
        "%d cross relations discarded",
        seed, train.num_nodes, train.num_edges, test.num_nodes, test.num_edges, cross,
    )
    return train, test
