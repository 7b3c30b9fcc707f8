"""Sampling primitives: Poisson subsets are exactly Poisson, WOR samples are uniform k-permutations.

Statistical checks use fixed seeds, so they are deterministic; thresholds are p > 1e-4.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from graphveil import sampling
from graphveil.sampling import (
    pair_with_random_ends,
    poisson_subset,
    random_ends,
    sample_without_replacement,
)

P_MIN = 1e-4


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def chi2_uniform_p(counts: np.ndarray) -> float:
    return float(stats.chisquare(counts).pvalue)


# ------------------------------------------------------------------------------ poisson_subset


def test_poisson_count_follows_binomial_chi_square() -> None:
    m, rate, draws = 60, 0.15, 6000
    g = gen(0)
    sizes = np.array([poisson_subset(m, rate, g).numel() for _ in range(draws)])
    # Bins: 0..hi, with the tails folded into the end bins so every expected count is >= 5.
    pmf = stats.binom(m, rate)
    lo, hi = int(pmf.ppf(0.001)), int(pmf.ppf(0.999))
    observed = np.array([np.sum(sizes <= lo)] + [np.sum(sizes == k) for k in range(lo + 1, hi)] + [np.sum(sizes >= hi)])
    expected = np.array([pmf.cdf(lo)] + [pmf.pmf(k) for k in range(lo + 1, hi)] + [pmf.sf(hi - 1)]) * draws
    assert expected.min() >= 5
    assert stats.chisquare(observed, expected).pvalue > P_MIN


def test_poisson_count_moments_on_a_five_million_record_set() -> None:
    m, b, draws = 5_000_000, 1024, 3000
    rate = b / m
    g = gen(1)
    sizes = np.array([poisson_subset(m, rate, g).numel() for _ in range(draws)], dtype=float)
    mean, var = m * rate, m * rate * (1 - rate)
    assert abs(sizes.mean() - mean) < 5 * math.sqrt(var / draws)
    # Sample variance of ~normal data: sd ≈ var·sqrt(2/(N-1)).
    assert abs(sizes.var(ddof=1) - var) < 5 * var * math.sqrt(2 / (draws - 1))


def test_poisson_inclusion_is_independent_with_probability_rate() -> None:
    m, rate, draws = 40, 0.25, 8000
    g = gen(2)
    hits = np.zeros((draws, m), dtype=bool)
    for t in range(draws):
        hits[t, poisson_subset(m, rate, g).numpy()] = True
    counts = hits.sum(0)
    # Each index's count ~ Binomial(draws, rate), independently: Σ z² ~ χ²(m).
    z2 = ((counts - draws * rate) ** 2 / (draws * rate * (1 - rate))).sum()
    assert stats.chi2(m).sf(z2) > P_MIN
    # Pairwise independence: joint inclusion ≈ rate² (a fixed-size sampler would give less).
    for i, j in [(0, 1), (5, 17), (38, 39)]:
        joint = (hits[:, i] & hits[:, j]).mean()
        p = rate * rate
        assert abs(joint - p) < 5 * math.sqrt(p * (1 - p) / draws)


def test_poisson_subset_is_distinct_in_range_and_reproducible() -> None:
    for seed in range(20):
        idx = poisson_subset(1000, 0.3, gen(seed))
        assert idx.dtype == torch.long
        assert idx.unique().numel() == idx.numel()
        assert int(idx.min()) >= 0 and int(idx.max()) < 1000
        assert torch.equal(idx, poisson_subset(1000, 0.3, gen(seed)))
    assert not torch.equal(poisson_subset(1000, 0.3, gen(0)), poisson_subset(1000, 0.3, gen(1)))


def test_poisson_subset_edge_cases() -> None:
    assert poisson_subset(0, 0.5, gen(0)).numel() == 0
    assert poisson_subset(10, 0.0, gen(0)).numel() == 0
    full = poisson_subset(10, 1.0, gen(0))
    assert sorted(full.tolist()) == list(range(10))
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="rate"):
            poisson_subset(10, bad, gen(0))
    with pytest.raises(ValueError):
        poisson_subset(-1, 0.5, gen(0))


# ------------------------------------------------------------------ sample_without_replacement


@pytest.mark.parametrize(("n", "k"), [(1, 1), (5, 0), (5, 5), (100, 3), (100, 60), (10_000, 2_000), (1_000_000, 50_000)])
def test_wor_distinct_in_range(n: int, k: int) -> None:
    out = sample_without_replacement(n, k, gen(n + k))
    assert out.shape == (k,) and out.dtype == torch.long
    assert out.unique().numel() == k
    if k:
        assert int(out.min()) >= 0 and int(out.max()) < n


@pytest.mark.parametrize(("n", "k"), [(6, 2), (12, 2)])  # randperm path, draw-and-dedupe path
def test_wor_ordered_samples_are_uniform(n: int, k: int) -> None:
    cells = {p: i for i, p in enumerate(itertools.permutations(range(n), k))}
    draws = 120 * len(cells)
    g = gen(n)
    counts = np.zeros(len(cells))
    for _ in range(draws):
        counts[cells[tuple(sample_without_replacement(n, k, g).tolist())]] += 1
    assert chi2_uniform_p(counts) > P_MIN


def test_wor_top_up_path_is_uniform(monkeypatch: pytest.MonkeyPatch) -> None:
    # With no over-draw the first round yields only 16 values: the loop must top up repeatedly.
    monkeypatch.setattr(sampling, "_OVERDRAW", 0.0)
    n, k, draws = 400, 100, 1500
    g = gen(3)
    first = np.zeros(n)
    last = np.zeros(n)
    for _ in range(draws):
        out = sample_without_replacement(n, k, g)
        assert out.unique().numel() == k
        first[int(out[0])] += 1
        last[int(out[-1])] += 1
    # Coarsen to 20 bins so expected counts are large.
    assert chi2_uniform_p(first.reshape(20, -1).sum(1)) > P_MIN
    assert chi2_uniform_p(last.reshape(20, -1).sum(1)) > P_MIN


def test_wor_errors() -> None:
    with pytest.raises(ValueError, match="distinct"):
        sample_without_replacement(3, 4, gen(0))
    with pytest.raises(ValueError):
        sample_without_replacement(3, -1, gen(0))
    with pytest.raises(ValueError):
        sample_without_replacement(3, 1.5, gen(0))  # type: ignore[arg-type]


def test_wor_reproducible() -> None:
    assert torch.equal(sample_without_replacement(10_000, 300, gen(5)), sample_without_replacement(10_000, 300, gen(5)))


# ----------------------------------------------------------------------------- random ends


def test_random_ends_pick_either_end_evenly() -> None:
    positives = torch.tensor([[0, 1], [2, 3], [4, 5]]).repeat(2000, 1)
    anchors = random_ends(positives, 4, gen(0))
    assert anchors.shape == (6000, 4)
    assert bool(((anchors == positives[:, :1]) | (anchors == positives[:, 1:])).all())
    first = (anchors == positives[:, :1]).float().mean().item()
    assert abs(first - 0.5) < 5 * math.sqrt(0.25 / anchors.numel())


def test_pair_with_random_ends_masks_padding() -> None:
    positives = torch.tensor([[0, 1], [2, 3]])
    negatives = torch.tensor([[5, 6], [7, -1]])
    batch = pair_with_random_ends(positives, negatives, gen(0))
    assert batch.anchors[1, 1] == -1
    assert bool((batch.anchors[negatives >= 0] >= 0).all())
    empty = pair_with_random_ends(torch.empty(0, 2, dtype=torch.long), torch.empty(0, 3, dtype=torch.long), gen(0))
    assert empty.size == 0 and empty.anchors.shape == (0, 3)
