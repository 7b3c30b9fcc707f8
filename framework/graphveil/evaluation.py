"""Evaluation metrics: relation prediction (PREC@1, MRR with in-batch negatives, bootstrap
intervals over held-out relations, paired differences against a base) and single-label
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
from typing import Any

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
def relation_ranks(
    edges: torch.Tensor,
    embed_all: Callable[[], torch.Tensor],
    *,
    batch_size: int = 256,
    max_edges: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """``(m,)`` 1-based rank of each held-out relation's target in its batch (float64), in a
    seeded order: two models evaluated with the same ``edges`` and ``seed`` rank the same
    relations in the same batches, position by position (what a paired comparison needs).

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
    return torch.cat(ranks).double()


#: Bootstrap resamples behind every confidence interval, and the interval's coverage.
BOOTSTRAP_RESAMPLES = 2000
CONFIDENCE = 0.95
#: Resampled indices drawn at once by :func:`bootstrap_ci` (int64: 128 MB).
BOOTSTRAP_CHUNK = 1 << 24
#: At most this many distinct values: :func:`bootstrap_ci` resamples their counts (≤ 33 MB of counts).
BOOTSTRAP_DISTINCT = 2048


def bootstrap_ci(values: torch.Tensor, *, seed: int = 0, resamples: int = BOOTSTRAP_RESAMPLES,
                 confidence: float = CONFIDENCE) -> list[float]:
    """Percentile bootstrap interval ``[low, high]`` of the mean of ``values`` (one per held-out
    relation), resampling relations with replacement under a seeded generator.

    Values taking few distinct values (hits: 2; reciprocal ranks: at most the ranking batch size;
    at most :data:`BOOTSTRAP_DISTINCT`) are resampled by their counts: how often a resample of m
    draws with replacement holds each distinct value is Multinomial(m, its share), so a
    resample's mean is drawn exactly in O(K) for K distinct values instead of O(m) (numpy's
    multinomial, seeded by ``seed``). At 10⁷ edges the m-index resampling took most of the
    relational evaluation (issue 28). Other values are resampled by index, a few resamples at a time.

    For a paired comparison pass the per-relation differences of two models on the same
    relations (:func:`paired_delta`). Relations ranked in one batch share candidates, so they
    are not quite independent; the interval treats them as if they were.
    """
    x = values.double().reshape(-1)
    if x.numel() == 0:
        raise ValueError("no values to bootstrap")
    m = x.numel()
    distinct, counts = torch.unique(x, return_counts=True)
    if distinct.numel() <= BOOTSTRAP_DISTINCT:
        import numpy as np

        shares = counts.double().numpy() / m
        draws = np.random.default_rng(seed).multinomial(m, shares, size=resamples)
        means = torch.from_numpy(draws).double() @ distinct / m
    else:
        gen = torch.Generator().manual_seed(seed)
        means = torch.empty(resamples, dtype=torch.float64)
        # at most 250 resamples and BOOTSTRAP_CHUNK indices at a time: 250 · m int64 indices would
        # be 6 GB for 3·10⁶ held-out relations
        per_chunk = max(1, min(250, BOOTSTRAP_CHUNK // m))
        for start in range(0, resamples, per_chunk):
            count = min(per_chunk, resamples - start)
            idx = torch.randint(0, m, (count, m), generator=gen)
            means[start : start + count] = x[idx].mean(1)
    tail = (1.0 - confidence) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=torch.float64))
    return [float(low), float(high)]


def rank_metrics(ranks: torch.Tensor, *, seed: int = 0) -> dict[str, Any]:
    """PREC@1 and MRR of per-relation ranks, each with its 95 % bootstrap interval."""
    hits, reciprocal = (ranks == 1).double(), 1.0 / ranks.double()
    return {
        "prec1": float(hits.mean()), "prec1_ci": bootstrap_ci(hits, seed=seed),
        "mrr": float(reciprocal.mean()), "mrr_ci": bootstrap_ci(reciprocal, seed=seed),
        "num_relations": int(ranks.numel()),
    }


def paired_delta(ranks: torch.Tensor, base_ranks: torch.Tensor, *, seed: int = 0) -> dict[str, Any]:
    """Paired difference of a model vs a base on the SAME held-out relations (position by
    position, as :func:`relation_ranks` orders them): ΔPREC@1 and ΔMRR with the 95 % paired
    bootstrap interval (the same resampled relations for both models).

    :raises ValueError: if the two rank vectors do not have the same length.
    """
    if ranks.shape != base_ranks.shape:
        raise ValueError(f"paired comparison needs the same held-out relations: {ranks.numel()} ranks "
                         f"vs {base_ranks.numel()} for the base")
    d_hit = (ranks == 1).double() - (base_ranks == 1).double()
    d_rr = 1.0 / ranks.double() - 1.0 / base_ranks.double()
    return {"prec1_delta": float(d_hit.mean()), "prec1_delta_ci": bootstrap_ci(d_hit, seed=seed),
            "mrr_delta": float(d_rr.mean()), "mrr_delta_ci": bootstrap_ci(d_rr, seed=seed)}


@torch.no_grad()
def relation_prediction(
    edges: torch.Tensor,
    embed_all: Callable[[], torch.Tensor],
    *,
    batch_size: int = 256,
    max_edges: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """PREC@1 and MRR (with 95 % bootstrap intervals) of ranking each held-out relation's target
    in its batch (:func:`relation_ranks`, same parameters)."""
    ranks = relation_ranks(edges, embed_all, batch_size=batch_size, max_edges=max_edges, seed=seed)
    return rank_metrics(ranks, seed=seed)


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
