"""Clipping and its sensitivity under the neighbouring mini-batches of paper 1, Sec. 4.1.

B′ ~ B for a removed node u*: tuples whose positive edge contains u* (B⁺(u*), "R") are
removed; tuples where u* is only a negative (B⁻(u*), "N") keep their positive edge, u* is
replaced by another node z, and they get arbitrary new gradients; the other tuples (B₀) keep
their gradients. Clipping is recomputed on each batch with that batch's own frequencies.

Findings on paper 1's Alg. 1 *as published* (norm C, :class:`PaperAlg1`, a reference written
here — the ``test_paper_alg1_*`` tests document the gap in Prop. 4.1):

* standard clipping moves the sum by ≤ (|R| + 2|N|)·C (Eq. 2);
* Alg. 1 + NEG-SAMPLE-WOR moves it by ≤ C *if B₀'s clipped gradients were the same in B
  and B′* — the step Prop. 4.1's proof (App. A) takes;
* with each batch's own frequencies B₀'s thresholds change too; the movement is then only
  bounded by (C/4)·(2 + 3|N| + |R|·(1 + k_neg)) (proved in
  :func:`graphveil.plugins.entity_dp.clipping.sensitivity_bound`), exceeds C on batches the
  real WOR sampler draws, and reaches C·(1 + K(1 + k_neg)/4) on constructed WOR batches
  (:func:`test_paper_alg1_sensitivity_grows_with_k_and_k_neg`);
* Alg. 1 with with-replacement negatives exceeds C even with B₀ held fixed.

The product's :class:`FreqClipper` runs Alg. 1 at C·κ, κ = 4 / (5 + K(1 + k_neg)), once bound
to the sampler's profile; ``test_bound_freq_clip_*`` check that its sum moves by ≤ C.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from _graphs import graphs, make_graph
from hypothesis import assume, given, settings, target
from hypothesis import strategies as st

from graphveil.contract.clipper import per_tuple_factors
from graphveil.contract.errors import GraphVeilError, PrivacyError, ProfileMismatchError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind, SamplingProfile, SensitivityKind
from graphveil.contract.sampler import TupleBatch
from graphveil.data.graph import RelationalGraph
from graphveil.plugins import edge_dp, entity_dp
from graphveil.plugins.edge_dp.clipping import PerTupleEdgeClipper
from graphveil.plugins.edge_dp.sampler import PoissonDecoupledSampler
from graphveil.plugins.entity_dp.clipping import (
    FreqClipper,
    StandardNodeClipper,
    max_frequencies,
    sensitivity_bound,
)
from graphveil.plugins.entity_dp.degree_cap import cap_degrees
from graphveil.plugins.entity_dp.sampler import PoissonWithReplacementNegSampler, PoissonWORSampler
from graphveil.plugins.standard.no_clip import NoClip

C = 1.0
SLACK = 1e-9
DIM = 4


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------ references


def naive_max_freq(batch: TupleBatch) -> list[int]:
    """Paper 1, Alg. 1 lines 2–5 with Python sets."""
    node_sets = [{x for x in row if x >= 0} for row in batch.entities().tolist()]
    freq: dict[int, int] = {}
    for nodes in node_sets:
        for v in nodes:
            freq[v] = freq.get(v, 0) + 1
    return [max(freq[v] for v in nodes) for nodes in node_sets]


class PaperAlg1:
    """Paper 1, Alg. 1 exactly as published: clip Tᵢ to C / (2·max-freq(Tᵢ)) — no κ."""

    def __init__(self, clip_norm: float = C) -> None:
        self.clip_norm = clip_norm

    def factors(self, batch: TupleBatch, norms: torch.Tensor) -> torch.Tensor:
        mf = torch.tensor(naive_max_freq(batch), dtype=torch.float64)
        return per_tuple_factors(norms, self.clip_norm / (2 * mf))


def wor_profile(K: int, k: int) -> SamplingProfile:
    return SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, rate=1.0, num_records=1, num_nodes=1,
                           degree_cap=K, k_neg=k)


def bound_freq_clip(K: int, k: int) -> FreqClipper:
    """The product's FREQ-CLIP, bound for degree cap K and k_neg negatives (κ = 4/(5 + K(1 + k)))."""
    clip = FreqClipper(FreqClipper.Params(clip_norm=C))
    clip.bind(wor_profile(K, k))
    return clip


def clipped(clipper, batch: TupleBatch, grads: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """``(b, d)`` clipped per-tuple gradients factorᵢ·gᵢ."""
    return clipper.factors(batch, grads.norm(dim=1))[:, None] * grads


@dataclass
class Neighbours:
    batch: TupleBatch
    grads: torch.Tensor
    removed: torch.Tensor  # R = B⁺(u*), mask over B
    replaced: torch.Tensor  # N = B⁻(u*), mask over B
    other: TupleBatch  # B′ = B₀ ∪ N′ in B's order
    other_grads: torch.Tensor
    replaced_in_other: torch.Tensor  # N′, mask over B′


def neighbour(batch: TupleBatch, grads: torch.Tensor, u: int, z: int | list[int], fresh: torch.Tensor) -> Neighbours:
    """B′ of Sec. 4.1: drop B⁺(u), replace u in B⁻(u) and give those tuples ``fresh`` gradients.

    ``z``: the replacement node, or one per occurrence of u (row-major order, cycled).
    """
    removed = (batch.positives == u).any(1)
    replaced = (batch.negatives == u).any(1) & ~removed
    keep = ~removed
    negatives = batch.negatives[keep].clone()
    slots = negatives == u
    zs = torch.tensor([z] if isinstance(z, int) else z, dtype=torch.long)
    negatives[slots] = zs[torch.arange(int(slots.sum())) % zs.numel()]
    other = TupleBatch(batch.positives[keep], negatives, batch.anchors[keep])
    n_prime = replaced[keep]
    other_grads = grads[keep].clone()
    other_grads[n_prime] = fresh[: int(n_prime.sum())]
    return Neighbours(batch, grads, removed, replaced, other, other_grads, n_prime)


def gradients(b: int, seed: int, aligned: bool, sign: torch.Tensor | None = None) -> torch.Tensor:
    """Per-tuple gradients with norms C·10^[-1, 3] (clipping mostly active).

    ``aligned``: all along one direction with per-tuple ``sign`` — the adversarial case where
    the triangle inequality in Eq. (2) is tight.
    """
    g = gen(seed)
    norms = C * 10 ** (4 * torch.rand(b, generator=g, dtype=torch.float64) - 1)
    if aligned:
        direction = torch.zeros(b, DIM, dtype=torch.float64)
        direction[:, 0] = 1.0 if sign is None else sign
    else:
        direction = torch.randn(b, DIM, generator=g, dtype=torch.float64)
        direction /= direction.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return direction * norms[:, None]


# ------------------------------------------------------------------------------ batch drawing


@st.composite
def sampled_batch(draw: st.DrawFn, sampler_cls: type) -> tuple[TupleBatch, SamplingProfile]:
    """A non-empty batch from a real node-level sampler on a random graph, and its profile."""
    graph: RelationalGraph = draw(graphs(min_nodes=4, max_nodes=14, max_edges=50))
    n = graph.num_nodes
    K = draw(st.integers(1, 4))
    k = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    m_bar = cap_degrees(graph.edges, n, K, gen(seed)).shape[0]
    b = max(1, min(m_bar, n // max(k, 1)))  # as large as NEG-SAMPLE-WOR allows: many shared nodes
    sampler = sampler_cls(sampler_cls.Params(batch_size=b, k_neg=k, degree_cap=K))
    g = gen(seed)
    profile = sampler.prepare(graph, g)
    batch = sampler.sample(g)
    assume(batch.size > 0)
    return batch, profile


def replacements(batch: TupleBatch, u: int, n: int) -> list[int]:
    """Candidates for z: nodes ≠ u that are no negative of B (keeps B′ a valid WOR draw)."""
    used = set(batch.negatives.reshape(-1).tolist())
    fresh = [v for v in range(n) if v != u and v not in used]
    return fresh or [v for v in range(n) if v != u]


@st.composite
def sampled_case(draw: st.DrawFn, sampler_cls: type) -> tuple[TupleBatch, int, int]:
    """A batch from a real node-level sampler on a random graph, plus u* and z."""
    batch, profile = draw(sampled_batch(sampler_cls))
    present = sorted({x for x in batch.entities().reshape(-1).tolist() if x >= 0})
    u = draw(st.sampled_from(present))
    z = draw(st.sampled_from(replacements(batch, u, profile.num_nodes)))
    return batch, u, z


def signs_for(batch: TupleBatch, u: int) -> torch.Tensor:
    """+1 for B₀, -1 for tuples containing u: the adversarial orientation."""
    touches = (batch.entities() == u).any(1)
    return torch.where(touches, -1.0, 1.0).to(torch.float64)


def case_neighbours(batch: TupleBatch, u: int, z: int, seed: int, aligned: bool) -> Neighbours:
    grads = gradients(batch.size, seed, aligned, signs_for(batch, u))
    fresh = gradients(batch.size, seed + 1, aligned)  # N′ along +direction when aligned
    return neighbour(batch, grads, u, z, fresh)


# ------------------------------------------------------------------------------ per_tuple_factors


def test_per_tuple_factors() -> None:
    norms = torch.tensor([0.0, 0.5, 1.0, 4.0], dtype=torch.float64)
    assert per_tuple_factors(norms, 1.0).tolist() == [1.0, 1.0, 1.0, 0.25]
    assert per_tuple_factors(norms, torch.tensor([1.0, 0.25, 0.5, 8.0], dtype=torch.float64)).tolist() == [
        1.0, 0.5, 0.5, 1.0]
    assert per_tuple_factors(torch.zeros(0), 1.0).shape == (0,)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(GraphVeilError, match="NaN or infinite"):
            per_tuple_factors(torch.tensor([1.0, bad]), 1.0)
    with pytest.raises(ValueError):
        per_tuple_factors(torch.tensor([1.0, 2.0]), torch.tensor([1.0]))
    with pytest.raises(ValueError):
        per_tuple_factors(torch.tensor([1.0]), 0.0)


@settings(max_examples=100, deadline=None)
@given(norms=st.lists(st.floats(0, 1e6), min_size=1, max_size=20), threshold=st.floats(1e-3, 1e3))
def test_post_clip_norm_is_min_of_norm_and_threshold(norms: list[float], threshold: float) -> None:
    t = torch.tensor(norms, dtype=torch.float64)
    f = per_tuple_factors(t, threshold)
    assert bool(((f > 0) & (f <= 1)).all())
    assert torch.allclose(f * t, torch.minimum(t, torch.tensor(threshold, dtype=torch.float64)), rtol=1e-12)


# ------------------------------------------------------------------------------ FREQ-CLIP (Alg. 1)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(2, 12), b=st.integers(0, 8), k=st.integers(0, 4), data=st.data())
def test_max_frequencies_match_algorithm_1(n: int, b: int, k: int, data: st.DataObject) -> None:
    # Arbitrary batches: repeated nodes inside a tuple, -1 padding, repeated negatives.
    node = st.integers(0, n - 1)
    pos = data.draw(st.lists(st.tuples(node, node), min_size=b, max_size=b))
    neg = data.draw(st.lists(st.lists(st.integers(-1, n - 1), min_size=k, max_size=k), min_size=b, max_size=b))
    positives = torch.tensor(pos, dtype=torch.long).reshape(b, 2)
    negatives = torch.tensor(neg, dtype=torch.long).reshape(b, k)
    batch = TupleBatch(positives, negatives, torch.where(negatives >= 0, positives[:, :1], -1))
    assert max_frequencies(batch).tolist() == (naive_max_freq(batch) if b else [])


@settings(max_examples=100, deadline=None)
@given(case=sampled_case(PoissonWORSampler), seed=st.integers(0, 2**20), aligned=st.booleans())
def test_paper_alg1_recomputed_frequencies_bound(case: tuple[TupleBatch, int, int], seed: int, aligned: bool) -> None:
    # UNSCALED Alg. 1 (norm C, as published): documents what Prop. 4.1 misses.
    batch, u, z = case
    nb = case_neighbours(batch, u, z, seed, aligned)
    clip = PaperAlg1(C)
    g_b = clipped(clip, batch, nb.grads)
    g_o = clipped(clip, nb.other, nb.other_grads)
    R, N = int(nb.removed.sum()), int(nb.replaced.sum())
    k = batch.k_neg
    assert N <= 1, "NEG-SAMPLE-WOR keeps |B⁻(u)| ≤ 1"
    # Every clipped tuple obeys its Alg. 1 threshold C / (2·max-freq).
    for bb, gg in ((batch, g_b), (nb.other, g_o)):
        limit = C / (2 * torch.tensor(naive_max_freq(bb), dtype=torch.float64))
        assert bool((gg.norm(dim=1) <= limit * (1 + 1e-12)).all())
    # Prop. 4.1 as proved (App. A): B₀'s clipped gradients taken equal in B and B′ → ≤ C.
    frozen = g_b[nb.removed | nb.replaced].sum(0) - g_o[nb.replaced_in_other].sum(0)
    assert float(frozen.norm()) <= C + SLACK
    # Each batch clipped with its own frequencies: B₀'s thresholds move as well. With c = C/2,
    # ‖Δ‖ ≤ c(1 + |N|) [R ∪ N, N′] + c·Σ_v |Δfreq(v)| / max(freq, freq′) [B₀]
    #      ≤ c(1 + |N|) + (c/2)(|R|(1 + k) + |N|) = (C/4)(2 + 3|N| + |R|(1 + k))
    # (the proof is in sensitivity_bound's docstring).
    delta = g_b.sum(0) - g_o.sum(0)
    assert float(delta.norm()) <= C / 4 * (2 + 3 * N + R * (1 + k)) + SLACK


def worst_case_delta(batch: TupleBatch, clip, n: int) -> float:  # noqa: ANN001
    """max over u* of ‖Δ‖ with adversarial aligned gradients (huge norms) and a fresh z."""
    worst = 0.0
    present = {x for x in batch.entities().reshape(-1).tolist() if x >= 0}
    z = min(set(range(n)) - present)
    for u in present:
        sign = signs_for(batch, u)
        grads = torch.zeros(batch.size, DIM, dtype=torch.float64)
        grads[:, 0] = 1e6 * sign
        fresh = torch.zeros(batch.size, DIM, dtype=torch.float64)
        fresh[:, 0] = 1e6
        nb = neighbour(batch, grads, u, z, fresh)
        delta = clipped(clip, batch, grads).sum(0) - clipped(clip, nb.other, nb.other_grads).sum(0)
        worst = max(worst, float(delta.norm()))
    return worst


def test_paper_alg1_can_exceed_c_on_sampled_batches() -> None:
    # The gap in Prop. 4.1's proof, on batches the real WOR sampler draws. Graph: u* = 0 with
    # neighbours 1, 2 (K = 2), each of which has one more edge; plus an edge (5, 6) whose tuple
    # can get u* as its negative. Removing u* drops freq(1), freq(2) from 2 to 1 and doubles
    # the thresholds of tuples (1, 3) and (2, 4).
    graph = make_graph(12, [(0, 1), (0, 2), (1, 3), (2, 4), (5, 6)])
    sampler = PoissonWORSampler(PoissonWORSampler.Params(batch_size=5, k_neg=1, degree_cap=2))
    g = gen(0)
    profile = sampler.prepare(graph, g)
    assert profile.rate == 1.0  # every edge in every batch
    bound = FreqClipper(FreqClipper.Params(clip_norm=C))
    bound.bind(profile)
    assert bound.kappa == pytest.approx(4 / 9)
    batches = [sampler.sample(g) for _ in range(40)]
    worst = [worst_case_delta(batch, PaperAlg1(C), 12) for batch in batches]
    assert max(worst) == pytest.approx(1.5 * C)
    assert sum(w > C + 1e-9 for w in worst) >= 5  # 16 of these 40 batches with seed 0
    # The product's FREQ-CLIP (norm C·κ) on the same batches: ≤ C, here exactly κ·worst.
    bound_worst = [worst_case_delta(batch, bound, 12) for batch in batches]
    assert bound_worst == pytest.approx([bound.kappa * w for w in worst])
    assert max(bound_worst) <= C + SLACK


def star_counterexample(K: int, k: int) -> tuple[TupleBatch, torch.Tensor, int]:
    """A WOR batch where removing u* = 0 moves the FREQ-CLIP sum by C·(1 + K(1 + k)/4).

    u* has K positive tuples (u*, wᵢ | yᵢ₁..yᵢₖ); every other node x of those tuples has one
    more tuple (x, qₓ | fresh nodes), so freq(x) drops from 2 to 1 and that tuple's threshold
    doubles; one tuple (a, b | u*, fresh…) holds u* as a negative. Returns the batch, the
    adversarial signs (−1 on u*'s tuples) and a fresh replacement node z.
    """
    counter = iter(range(1, 10**6))
    positives, negatives, signs, shared = [], [], [], []
    for _ in range(K):
        w, ys = next(counter), [next(counter) for _ in range(k)]
        positives.append([0, w])
        negatives.append(ys)
        signs.append(-1.0)
        shared += [w, *ys]
    for x in shared:
        positives.append([x, next(counter)])
        negatives.append([next(counter) for _ in range(k)])
        signs.append(1.0)
    positives.append([next(counter), next(counter)])
    negatives.append([0] + [next(counter) for _ in range(k - 1)])
    signs.append(-1.0)
    pos = torch.tensor(positives)
    batch = TupleBatch(pos, torch.tensor(negatives), pos[:, :1].repeat(1, k))
    return batch, torch.tensor(signs, dtype=torch.float64), next(counter)


@pytest.mark.parametrize(("K", "k"), [(2, 1), (3, 2), (5, 1), (5, 4)])
def test_paper_alg1_sensitivity_grows_with_k_and_k_neg(K: int, k: int) -> None:
    batch, signs, z = star_counterexample(K, k)
    # The batch is one NEG-SAMPLE-WOR can draw: its positives form a graph of max degree ≤ K
    # (so capping keeps them all and γ = 1 samples them all), its negatives are distinct.
    assert int(torch.bincount(batch.positives.reshape(-1)).max()) <= K
    assert batch.negatives.unique().numel() == batch.negatives.numel()
    grads = torch.zeros(batch.size, DIM, dtype=torch.float64)
    grads[:, 0] = 1e6 * signs
    fresh = torch.zeros(batch.size, DIM, dtype=torch.float64)
    fresh[:, 0] = 1e6
    nb = neighbour(batch, grads, 0, z, fresh)
    assert (int(nb.removed.sum()), int(nb.replaced.sum())) == (K, 1)

    def move(clip) -> float:  # noqa: ANN001
        return float((clipped(clip, batch, grads).sum(0) - clipped(clip, nb.other, nb.other_grads).sum(0)).norm())

    delta = move(PaperAlg1(C))  # UNSCALED Alg. 1, as published
    assert delta == pytest.approx(C * (1 + K * (1 + k) / 4))
    assert delta <= sensitivity_bound(K, k) * C + SLACK  # the proved bound, for |R| = K, |N| = 1
    # For K = 5, k_neg = 4 it even exceeds standard clipping's worst case (K + 2)·C.
    if (K, k) == (5, 4):
        assert delta > (K + 2) * C
    # The product's FREQ-CLIP, bound for (K, k): the same batch moves it by κ·delta < C.
    bound = bound_freq_clip(K, k)
    assert move(bound) == pytest.approx(C * (4 + K * (1 + k)) / (5 + K * (1 + k)))
    assert move(bound) <= C + SLACK


def test_paper_alg1_with_replacement_negatives_exceeds_c() -> None:
    # u* the negative of several tuples: |B⁻(u*)| > 1, so even Prop. 4.1's own bound
    # (1 + |B⁻(u*)|)·C/2 exceeds C. This is why (coupled_poisson_wr, freq_clip) is refused,
    # by the accountant and by FreqClipper.bind.
    graph = make_graph(200, [(2 * i, 2 * i + 1) for i in range(100)])
    sampler = PoissonWithReplacementNegSampler(
        PoissonWithReplacementNegSampler.Params(batch_size=50, k_neg=1, degree_cap=1))
    clip = PaperAlg1(C)
    g = gen(0)
    profile = sampler.prepare(graph, g)
    with pytest.raises(ProfileMismatchError, match="NEG-SAMPLE-WOR.*coupled_poisson_wr"):
        FreqClipper(FreqClipper.Params(clip_norm=C)).bind(profile)
    worst_frozen = 0.0
    for _ in range(60):
        batch = sampler.sample(g)
        in_pos = set(batch.positives.reshape(-1).tolist())
        counts = torch.bincount(batch.negatives.reshape(-1), minlength=200)
        for u in torch.nonzero(counts >= 2).flatten().tolist():
            if u in in_pos:
                continue
            used = set(batch.negatives.reshape(-1).tolist()) | in_pos
            z = [v for v in range(200) if v not in used][: int(counts[u])]  # one fresh node per slot
            grads = gradients(batch.size, 0, True, signs_for(batch, u)) * 1e3
            nb = neighbour(batch, grads, u, z, gradients(batch.size, 1, True) * 1e3)
            g_b, g_o = clipped(clip, batch, nb.grads), clipped(clip, nb.other, nb.other_grads)
            frozen = g_b[nb.replaced].sum(0) - g_o[nb.replaced_in_other].sum(0)
            worst_frozen = max(worst_frozen, float(frozen.norm()))
    assert worst_frozen >= 1.5 * C


# ------------------------------------------------------------------------------ FREQ-CLIP as shipped (C·κ)


def adversarial_neighbours(batch: TupleBatch, u: int, z: int) -> tuple[Neighbours, float]:
    """B′ for (u, z) with the gradients maximising ‖Δ‖ for any norm (Alg. 1 at any C), and that max at C.

    All gradients along one axis with norm 10⁶ (every threshold active): a tuple of B₀ moves
    by tᵢ − t′ᵢ, so its sign is chosen to point the same way as the removed tuples (−tᵢ, sign
    −1) and the replaced ones (−t′ᵢ, sign +1). Then ‖Δ‖ = Σ_{R∪N} t + Σ_{N′} t′ + Σ_{B₀} |t − t′|,
    the triangle-inequality maximum over all gradients; returned for Alg. 1 at norm C.
    """
    probe = neighbour(batch, torch.zeros(batch.size, DIM), u, z, torch.zeros(batch.size, DIM))
    t = C / (2 * torch.tensor(naive_max_freq(batch), dtype=torch.float64))
    t_other = torch.zeros(batch.size, dtype=torch.float64)
    t_other[~probe.removed] = C / (2 * torch.tensor(naive_max_freq(probe.other), dtype=torch.float64))
    b0 = ~(probe.removed | probe.replaced)
    sign = torch.where(b0 & (t_other < t), -1.0, 1.0).to(torch.float64)
    sign[probe.removed | probe.replaced] = -1.0
    grads = torch.zeros(batch.size, DIM, dtype=torch.float64)
    grads[:, 0] = 1e6 * sign
    fresh = torch.zeros(batch.size, DIM, dtype=torch.float64)
    fresh[:, 0] = 1e6
    sup = float(t[probe.removed | probe.replaced].sum() + t_other[probe.replaced].sum()
                + (t - t_other)[b0].abs().sum())
    return neighbour(batch, grads, u, z, fresh), sup


@settings(max_examples=150, deadline=None)
@given(drawn=sampled_batch(PoissonWORSampler), data=st.data())
def test_bound_freq_clip_sensitivity_at_most_c(drawn: tuple[TupleBatch, SamplingProfile], data: st.DataObject) -> None:
    # Every node u* of a batch the real WOR sampler drew, worst-case gradients, frequencies
    # recomputed on B and on B′: the product's FreqClipper (bound to the sampler's profile)
    # moves its clipped sum by at most C.
    batch, profile = drawn
    clip = FreqClipper(FreqClipper.Params(clip_norm=C))
    clip.bind(profile)
    K, k = profile.degree_cap, profile.k_neg
    assert clip.kappa == pytest.approx(4 / (5 + K * (1 + k))) and clip.profile.clip_norm == C
    paper = PaperAlg1(C)
    scaled = PaperAlg1(C * clip.kappa)
    worst = 0.0
    for u in sorted({x for x in batch.entities().reshape(-1).tolist() if x >= 0}):
        z = data.draw(st.sampled_from(replacements(batch, u, profile.num_nodes)))
        nb, sup = adversarial_neighbours(batch, u, z)
        R, N = int(nb.removed.sum()), int(nb.replaced.sum())
        assert R <= K and N <= 1
        for bb, gg in ((batch, nb.grads), (nb.other, nb.other_grads)):  # C·κ in Alg. 1's threshold
            assert torch.allclose(clip.factors(bb, gg.norm(dim=1)), scaled.factors(bb, gg.norm(dim=1)), rtol=1e-12)

        def move(c, nb=nb) -> float:  # noqa: ANN001
            return float((clipped(c, nb.batch, nb.grads).sum(0) - clipped(c, nb.other, nb.other_grads).sum(0)).norm())

        # The adversary attains the maximum, which obeys the proved bound; κ scales it to ≤ C.
        assert move(paper) == pytest.approx(sup, rel=1e-9)
        assert sup <= C / 4 * (2 + 3 * N + R * (1 + k)) + SLACK
        assert move(clip) == pytest.approx(clip.kappa * sup, rel=1e-9)
        assert move(clip) <= C + SLACK
        worst = max(worst, move(clip))
        # Random gradients (norms 0.1·C … 1000·C, random directions) stay below the maximum.
        rnd = neighbour(batch, gradients(batch.size, u, False), u, z, gradients(batch.size, u + 1, False))
        assert move(clip, rnd) <= clip.kappa * sup + SLACK
    target(worst / C, label="max ||delta|| / C of the bound FreqClipper")  # steer towards the worst batches


def test_bound_freq_clip_bind() -> None:
    clip = FreqClipper(FreqClipper.Params(clip_norm=2.0))
    batch = TupleBatch(torch.tensor([[0, 1], [1, 2]]), torch.tensor([[3], [4]]), torch.tensor([[0], [1]]))
    norms = torch.tensor([100.0, 100.0], dtype=torch.float64)
    with pytest.raises(PrivacyError, match="not bound.*bind"):
        clip.factors(batch, norms)
    with pytest.raises(PrivacyError, match="not bound"):
        _ = clip.kappa
    clip.bind(wor_profile(5, 4))
    assert clip.kappa == pytest.approx(4 / 30) and sensitivity_bound(5, 4) == 7.5
    # freq(1) = 2: both tuples clipped to C·κ / 4.
    assert clip.factors(batch, norms).tolist() == pytest.approx([2.0 * 4 / 30 / 4 / 100] * 2)
    assert clip.profile.clip_norm == 2.0  # the noise stays σ·C
    clip.bind(wor_profile(1, 0))  # re-binding recalibrates
    assert clip.kappa == pytest.approx(4 / 6)
    with pytest.raises(PrivacyError, match="k_neg=0.*k_neg=1"):
        clip.factors(batch, norms)
    for K in (None, 0, -1, 1.5, True):
        with pytest.raises(PrivacyError, match="degree cap K"):
            clip.bind(wor_profile(K, 1))  # type: ignore[arg-type]
    with pytest.raises(PrivacyError, match="k_neg"):
        clip.bind(wor_profile(2, -1))
    for kind in set(SamplingKind) - {SamplingKind.COUPLED_POISSON_WOR}:
        with pytest.raises(ProfileMismatchError, match=kind.value):
            clip.bind(SamplingProfile(kind, rate=1.0, num_records=1, num_nodes=1, degree_cap=2, k_neg=1))
    # The default Clipper.bind is a no-op.
    for other in (StandardNodeClipper(StandardNodeClipper.Params()), NoClip(NoClip.Params())):
        assert other.bind(wor_profile(2, 1)) is None


# ------------------------------------------------------------------------------ standard clipping


@settings(max_examples=100, deadline=None)
@given(
    case=st.one_of(sampled_case(PoissonWORSampler), sampled_case(PoissonWithReplacementNegSampler)),
    seed=st.integers(0, 2**20),
    aligned=st.booleans(),
)
def test_standard_clipping_node_sensitivity(case: tuple[TupleBatch, int, int], seed: int, aligned: bool) -> None:
    batch, u, z = case
    nb = case_neighbours(batch, u, z, seed, aligned)
    clip = StandardNodeClipper(StandardNodeClipper.Params(clip_norm=C))
    g_b, g_o = clipped(clip, batch, nb.grads), clipped(clip, nb.other, nb.other_grads)
    assert bool((g_b.norm(dim=1) <= C * (1 + 1e-12)).all())
    R, N = int(nb.removed.sum()), int(nb.replaced.sum())
    assert float((g_b.sum(0) - g_o.sum(0)).norm()) <= (R + 2 * N) * C + SLACK


# ------------------------------------------------------------------------------ edge level


@settings(max_examples=50, deadline=None)
@given(graph=graphs(), k=st.integers(0, 3), seed=st.integers(0, 2**20), data=st.data())
def test_per_tuple_edge_clipping_sensitivity(graph: RelationalGraph, k: int, seed: int, data: st.DataObject) -> None:
    # Decoupled negatives: removing one relation removes exactly its tuple; the rest is unchanged.
    sampler = PoissonDecoupledSampler(PoissonDecoupledSampler.Params(batch_size=graph.num_edges, k_neg=k))
    g = gen(seed)
    sampler.prepare(graph, g)
    batch = sampler.sample(g)
    i = data.draw(st.integers(0, batch.size - 1))
    grads = gradients(batch.size, seed, aligned=False)
    clip = PerTupleEdgeClipper(PerTupleEdgeClipper.Params(clip_norm=C))
    keep = torch.arange(batch.size) != i
    other = TupleBatch(batch.positives[keep], batch.negatives[keep], batch.anchors[keep])
    delta = clipped(clip, batch, grads).sum(0) - clipped(clip, other, grads[keep]).sum(0)
    assert float(delta.norm()) <= C + SLACK


# ------------------------------------------------------------------------------ declarations


def test_declared_profiles_and_registration() -> None:
    cases = [
        (FreqClipper, SensitivityKind.FREQ_CLIP_NODE, PrivacyUnit.NODE),
        (StandardNodeClipper, SensitivityKind.STANDARD_TUPLE_NODE, PrivacyUnit.NODE),
        (PerTupleEdgeClipper, SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE),
    ]
    for cls, kind, unit in cases:
        clip = cls(cls.Params(clip_norm=2.5))
        assert clip.profile.kind is kind and clip.profile.unit is unit and clip.profile.clip_norm == 2.5
        with pytest.raises(ValueError, match="norms"):
            clip.factors(TupleBatch(torch.tensor([[0, 1]]), torch.empty(1, 0, dtype=torch.long),
                                    torch.empty(1, 0, dtype=torch.long)), torch.ones(2))
        for bad in (0.0, -1.0, math.inf, math.nan):
            with pytest.raises(ValueError):
                cls.Params(clip_norm=bad)
    assert entity_dp.graphveil_clippers() == {"freq_clip": FreqClipper, "standard_clip": StandardNodeClipper}
    assert edge_dp.graphveil_clippers() == {"per_tuple_clip": PerTupleEdgeClipper}


def test_no_clip_is_identity_and_claims_nothing() -> None:
    clip = NoClip(NoClip.Params())
    batch = TupleBatch(torch.tensor([[0, 1], [1, 2]]), torch.tensor([[3], [4]]), torch.tensor([[0], [1]]))
    assert clip.factors(batch, torch.tensor([1e9, 0.0])).tolist() == [1.0, 1.0]
    assert clip.sensitivity_kind is SensitivityKind.NONE and clip.profile.kind is SensitivityKind.NONE
