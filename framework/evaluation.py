"""Zero-shot relation prediction: PREC@1 and MRR with in-batch negatives.

Held-out relations are ranked in batches (256 by default, as in both relational papers): for
each relation (u, v) the candidates are the targets of every relation in its batch; a
candidate that is the same entity as the true target is not counted as a negative.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


@torch.no_grad()
def rank_in_batch(src: torch.Tensor, dst: torch.Tensor, dst_ids: torch.Tensor) -> torch.Tensor:
    """1-based rank of each true target among the batch's candidates (ties count against).

    :param src: ``(B, d)`` source embeddings.
    :param dst: ``(B, d)`` target embeddings; row ``i`` is the true target of source ``i``.
    :param dst_ids: ``(B,)`` entity ids of the targets (duplicates are not negatives).
    """
    scores = src @ dst.T
    true = scores.diagonal().unsqueeze(1)
    is_negative = dst_ids.unsqueeze(0) != dst_ids.unsqueeze(1)
    return 1 + ((scores >= true) & is_negative).sum(dim=1)


@torch.no_grad()
def relation_prediction(
    edges: torch.Tensor,
    embed_all: Callable[[], torch.Tensor],
    *,
    batch_size: int = 256,
    max_edges: int | None = None,
    seed: int = 0,
) -> dict[str, float]:
    """PREC@1 and MRR of ranking each held-out relation's target in its batch.

    :param edges: ``(m, 2)`` held-out relations, entity indices into ``embed_all()``.
    :param embed_all: returns ``(n, d)`` embeddings of every entity (computed once).
    :param batch_size: candidates per ranking batch; the whole set if smaller.
    :param max_edges: evaluate a seeded random subset of at most this many relations.
    :param seed: fixes the order, orientation and subset, so methods share the same batches.
    """
    if edges.numel() == 0:
        raise ValueError("no held-out relations to evaluate")
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(edges.shape[0], generator=gen)
    if max_edges is not None:
        order = order[:max_edges]
    pairs = edges[order]
    flip = torch.rand(pairs.shape[0], generator=gen) < 0.5
    pairs = torch.where(flip.unsqueeze(1), pairs.flip(1), pairs)
    z = torch.nn.functional.normalize(embed_all().float(), dim=-1)
    ranks = []
    for start in range(0, pairs.shape[0], batch_size):
        chunk = pairs[start : start + batch_size]
        if chunk.shape[0] < 2 and ranks:  # a lone leftover has no candidates: fold it in
            chunk = pairs[-batch_size:]
            ranks.append(rank_in_batch(z[chunk[:, 0]], z[chunk[:, 1]], chunk[:, 1])[-1:])
            break
        ranks.append(rank_in_batch(z[chunk[:, 0]], z[chunk[:, 1]], chunk[:, 1]))
    r = torch.cat(ranks).double()
    return {
        "prec1": float((r == 1).double().mean()),
        "mrr": float((1.0 / r).mean()),
        "num_relations": int(r.numel()),
    }
