"""Random graph splits (paper 3, Sec. 4.4): the training graph cut once into s disjoint subgraphs.

Paper 3 shuffles the training nodes and cuts the permutation into s near-equal groups; each
group's induced subgraph is one DP-SGD example, and edges between groups are masked out. Here a
node's split is a keyed hash of its own id::

    split(v) = ⌊ s · HMAC-SHA256(key, id(v)) / 2⁶⁴ ⌋

with the key drawn once per run, independently of the data (:func:`split_key`). The groups are
then near-equal in expectation (Multinomial(n, 1/s) sizes) rather than exactly, and — the
reason for the change — adding or removing one node moves no *other* node to another split
(with a cut permutation, one node more shifts every later group boundary), so one node's data
reaches one split only (:mod:`graphveil.plugins.dp_gcn.units`).

A :class:`SplitBatch` is what the sampler draws: the ids of b splits and the node → split map.
The task turns it into a :class:`~graphveil.subgraph_batch.SubgraphBatch` of the splits'
induced subgraphs (:meth:`SplitNodeClassification.lift
<graphveil.plugins.dp_gcn.task.SplitNodeClassification.lift>`), which refuses any edge joining
two examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from graphveil.data.split import split_position


def split_key(seed: int) -> bytes:
    """HMAC key of the split assignment for an integer seed (kept apart from the node split's key)."""
    return f"graphveil-gcn-graph-splits:{int(seed)}".encode()


def split_assignment(node_ids: Sequence[str], num_splits: int, key: bytes) -> torch.Tensor:
    """``(n,)`` int64 split of every node, ``⌊s · HMAC-SHA256(key, id)/2⁶⁴⌋`` in ``[0, s)``.

    A node's split depends on its id and the key only (not on the other nodes).

    :raises ValueError: if ``num_splits < 1``.
    """
    if isinstance(num_splits, bool) or int(num_splits) != num_splits or num_splits < 1:
        raise ValueError(f"num_splits must be an integer >= 1, got {num_splits!r}")
    position = torch.tensor([split_position(key, nid) for nid in node_ids], dtype=torch.float64)
    return (position * num_splits).floor().to(torch.long).clamp_(max=int(num_splits) - 1)


def split_members(assignment: torch.Tensor, num_splits: int) -> list[torch.Tensor]:
    """The sorted node indices of each split (``num_splits`` tensors, possibly empty)."""
    order = torch.argsort(assignment * assignment.numel() + torch.arange(assignment.numel()))
    counts = torch.bincount(assignment, minlength=num_splits).tolist()
    return list(torch.split(order, counts))


@dataclass
class SplitBatch:
    """A mini-batch of graph splits: each split is one example (one clipping unit).

    :param split_ids: ``(b,)`` ids of the drawn splits.
    :param assignment: ``(n,)`` split of every node of the training graph (shared, not copied).
    """

    split_ids: torch.Tensor
    assignment: torch.Tensor

    def __post_init__(self) -> None:
        if self.split_ids.dim() != 1:
            raise ValueError(f"split_ids must be (b,), got {tuple(self.split_ids.shape)}")

    @property
    def size(self) -> int:
        return int(self.split_ids.numel())

    def select(self, index: torch.Tensor) -> SplitBatch:
        """The splits at positions ``index`` (1-D long), in that order."""
        return SplitBatch(self.split_ids[index], self.assignment)
