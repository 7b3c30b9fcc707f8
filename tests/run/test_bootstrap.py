"""Relation ranks, bootstrap intervals over held-out relations, paired Δ against a base."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graphveil.evaluation import (
    bootstrap_ci,
    paired_delta,
    rank_metrics,
    relation_prediction,
    relation_ranks,
)


def test_ranks_summarise_to_the_metrics_and_keep_one_order_per_seed() -> None:
    gen = torch.Generator().manual_seed(0)
    edges = torch.randint(0, 40, (300, 2), generator=gen)
    edges = edges[edges[:, 0] != edges[:, 1]]
    z1, z2 = torch.randn(40, 8, generator=gen), torch.randn(40, 8, generator=gen)
    r1 = relation_ranks(edges, lambda: z1, batch_size=32, seed=5)
    assert r1.shape == (edges.shape[0],) and r1.dtype == torch.float64 and bool((r1 >= 1).all())
    summary = relation_prediction(edges, lambda: z1, batch_size=32, seed=5)
    assert summary["mrr"] == pytest.approx(float((1 / r1).mean()))
    assert summary["prec1"] == pytest.approx(float((r1 == 1).double().mean()))
    assert summary["num_relations"] == r1.numel()
    # Same relations, same batches: a model equal to z1 on the entities relation i touches gets
    # the same rank at position i, whatever it does elsewhere.
    r2 = relation_ranks(edges, lambda: z2, batch_size=32, seed=5)
    assert not torch.equal(r1, r2)
    assert torch.equal(relation_ranks(edges, lambda: z1.clone(), batch_size=32, seed=5), r1)


def test_constant_values_give_a_point_interval_and_the_interval_holds_the_mean() -> None:
    assert bootstrap_ci(torch.full((50,), 0.25)) == [0.25, 0.25]
    values = torch.rand(200, generator=torch.Generator().manual_seed(1))
    lo, hi = bootstrap_ci(values, seed=3)
    assert lo < float(values.mean()) < hi
    assert bootstrap_ci(values, seed=3) == [lo, hi]  # seeded
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci(torch.zeros(0))


@pytest.mark.parametrize(("values", "chunk"), [
    ("continuous", None), ("continuous", 7 * 2000),  # by index: default, or 7 resamples per draw
    ("ranks", None), ("hits", None),  # few distinct values: by multinomial counts (issue 28)
])
def test_interval_agrees_with_an_independent_numpy_bootstrap_and_the_normal_width(
        values: str, chunk: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large n: the percentile interval is close to numpy's bootstrap with another generator and
    to mean ± 1.96·sd/√n; a wrong quantile (e.g. 90 %) or resampling without replacement fails.
    Drawn a few resamples at a time (the memory bound for millions of relations), or by the
    counts of few distinct values (reciprocal ranks, hits), the same."""
    import graphveil.evaluation as evaluation

    if chunk is not None:
        monkeypatch.setattr(evaluation, "BOOTSTRAP_CHUNK", chunk)
    if values == "continuous":  # 2000 distinct values: below the count path's limit, so lower it
        monkeypatch.setattr(evaluation, "BOOTSTRAP_DISTINCT", 100)
    rng = np.random.default_rng(7)
    x = {"continuous": lambda: rng.exponential(size=2000),
         "ranks": lambda: 1.0 / rng.geometric(0.3, size=2000),  # skewed, ~20 distinct values
         "hits": lambda: (rng.random(2000) < 0.2).astype(float)}[values]()
    lo, hi = bootstrap_ci(torch.from_numpy(x), seed=0, resamples=4000)
    means = x[rng.integers(0, x.size, size=(4000, x.size))].mean(1)
    np_lo, np_hi = np.quantile(means, [0.025, 0.975])
    half = 1.96 * x.std(ddof=1) / math.sqrt(x.size)
    assert hi - lo == pytest.approx(np_hi - np_lo, rel=0.08)
    assert hi - lo == pytest.approx(2 * half, rel=0.08)
    assert (lo + hi) / 2 == pytest.approx(x.mean(), abs=0.1 * half)


def test_paired_delta_uses_the_same_relations_for_both_models() -> None:
    gen = torch.Generator().manual_seed(2)
    base = torch.randint(1, 20, (400,), generator=gen).double()
    assert paired_delta(base, base) == {"prec1_delta": 0.0, "prec1_delta_ci": [0.0, 0.0],
                                        "mrr_delta": 0.0, "mrr_delta_ci": [0.0, 0.0]}
    # Better on half the relations by a little: the paired interval excludes zero, although the
    # two unpaired MRR intervals overlap (relations vary much more than the gain).
    better = torch.where(torch.rand(400, generator=gen) < 0.5, torch.clamp(base - 1, min=1), base)
    d = paired_delta(better, base, seed=1)
    gain = float((1 / better - 1 / base).mean())
    assert d["mrr_delta"] == pytest.approx(gain) and 0 < d["mrr_delta_ci"][0] <= gain <= d["mrr_delta_ci"][1]
    a, b = rank_metrics(better)["mrr_ci"], rank_metrics(base)["mrr_ci"]
    assert a[0] < b[1]
    d_hit = float(((better == 1).double() - (base == 1).double()).mean())
    assert d["prec1_delta"] == pytest.approx(d_hit)
    with pytest.raises(ValueError, match="same held-out relations"):
        paired_delta(better[:-1], base)
