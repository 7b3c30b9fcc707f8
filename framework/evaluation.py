"""Evaluation metrics: relation prediction (PREC@1, MRR with in-batch negatives) and single-label
classification (accuracy, macro-F1, a few-shot linear probe on frozen embeddings).

Held-out relations are ranked in batches (256 by default, as in both relational papers): for
each relation (u, v) the candidates are the targets of every relation in its batch; a
candidate that is the same entity as the true target is not counted as a negative.

For single-label multi-class data micro-F1 equals accuracy (scikit-learn's
``f1_score(average='micro')``); paper 3's "F1" column is that number.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


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


def accuracy(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Share of equal entries (= micro-F1 for single-label classes); nan for no entries."""
    return float((pred == target).double().mean()) if target.numel() else float("nan")


def macro_f1(pred: torch.Tensor, target: torch.Tensor) -> float:
    """Unweighted mean over classes of F1 = 2TP / (2TP + FP + FN), over the classes that occur in
    ``target`` or ``pred`` (scikit-learn's ``f1_score(average='macro')`` with default labels);
    nan for no entries."""
    if not target.numel():
        return float("nan")
    pred, target = pred.reshape(-1).long(), target.reshape(-1).long()
    classes = torch.unique(torch.cat([pred, target]))
    tp = torch.stack([((pred == c) & (target == c)).sum() for c in classes]).double()
    fp = torch.stack([((pred == c) & (target != c)).sum() for c in classes]).double()
    fn = torch.stack([((pred != c) & (target == c)).sum() for c in classes]).double()
    return float((2 * tp / (2 * tp + fp + fn)).mean())


#: L2 penalties the probe chooses from by validation macro-F1 (the first of equals wins)
PROBE_PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1)


def fit_linear_probe(x: torch.Tensor, y: torch.Tensor, num_classes: int, penalty: float) -> torch.nn.Linear:
    """Multinomial logistic regression ``x → y`` with ``penalty · ‖W‖²`` (L-BFGS, full batch: the
    problem is convex and a few-shot set is tiny)."""
    head = torch.nn.Linear(x.shape[1], num_classes, dtype=x.dtype)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    opt = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(head(x), y) + penalty * head.weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return head


@torch.no_grad()
def few_shot_classification(
    z: torch.Tensor, labels: torch.Tensor, *, per_class: int, draws: int, seed: int,
) -> dict[str, float]:
    """Macro- and micro-F1 of a linear head on frozen embeddings from ``per_class`` labelled
    entities per class (as many again choose the L2 penalty), tested on every other labelled one.

    ``z``: ``(n, d)`` embeddings (L2-normalised here, as relation scores use cosine); ``labels``:
    ``(n,)`` class indices, ``-1`` unlabelled. Classes with fewer than ``2·per_class + 1`` labelled
    entities are left out (logged), so every class the head knows is tested. Each of ``draws``
    draws samples the few-shot examples afresh (seeded by ``seed`` and the draw); the metrics are
    means over draws.

    :raises ValueError: if fewer than two classes have enough labelled entities.
    """
    need = 2 * per_class + 1
    present = labels[labels >= 0].unique()
    counts = {int(c): int((labels == c).sum()) for c in present}
    classes = [c for c, k in counts.items() if k >= need]
    skipped = sorted(set(counts) - set(classes))
    if len(classes) < 2:
        raise ValueError(f"entity classification needs two classes with at least {need} labelled "
                         f"entities each on the evaluated side; class sizes there: {counts}")
    if skipped:
        log.warning("entity classification: classes %s have fewer than %d labelled entities and are "
                    "left out", skipped, need)
    z = torch.nn.functional.normalize(z.double(), dim=-1)
    remap = torch.full((int(labels.max()) + 1,), -1, dtype=torch.long)
    remap[torch.tensor(classes)] = torch.arange(len(classes))
    keep = (labels >= 0).nonzero().flatten()
    keep = keep[remap[labels[keep]] >= 0]
    x, y = z[keep], remap[labels[keep]]
    macro, micro = [], []
    for draw in range(draws):
        gen = torch.Generator().manual_seed(1_000_003 * seed + draw)
        train, val = [], []
        for c in range(len(classes)):
            members = (y == c).nonzero().flatten()
            members = members[torch.randperm(members.numel(), generator=gen)]
            train.append(members[:per_class])
            val.append(members[per_class : 2 * per_class])
        tr, va = torch.cat(train), torch.cat(val)
        test = torch.ones(y.numel(), dtype=torch.bool)
        test[tr] = test[va] = False
        best = max(((macro_f1(fit_linear_probe(x[tr], y[tr], len(classes), p)(x[va]).argmax(1), y[va]), -i, p)
                    for i, p in enumerate(PROBE_PENALTIES)))
        head = fit_linear_probe(x[tr], y[tr], len(classes), best[2])
        pred = head(x[test]).argmax(1)
        macro.append(macro_f1(pred, y[test]))
        micro.append(accuracy(pred, y[test]))
    return {"ec_macro_f1": sum(macro) / draws, "ec_micro_f1": sum(micro) / draws,
            "ec_classes": len(classes), "ec_test_entities": int(test.sum())}
