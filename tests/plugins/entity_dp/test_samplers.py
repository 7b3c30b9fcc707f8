"""The three relational samplers: structure of their batches, their profiles and their refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _graphs import graphs, make_graph
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from scipy import stats

from graphveil.contract.errors import ConfigError, DataError, PrivacyError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind
from graphveil.contract.sampler import TupleBatch
from graphveil.data.graph import RelationalGraph
from graphveil.plugins import edge_dp, entity_dp
from graphveil.plugins.edge_dp.sampler import PoissonDecoupledSampler
from graphveil.plugins.entity_dp.degree_cap import cap_degrees
from graphveil.plugins.entity_dp.sampler import PoissonWithReplacementNegSampler, PoissonWORSampler

SAMPLERS = [PoissonWORSampler, PoissonWithReplacementNegSampler, PoissonDecoupledSampler]


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def build(cls: type, **params: int):  # noqa: ANN202 - returns the sampler under test
    return cls(cls.Params(**params))


def check_structure(batch: TupleBatch, records: torch.Tensor, n: int, k: int) -> None:
    """Positives are distinct prepared records; negatives are nodes; anchors are ends of eᵢ⁺."""
    assert batch.positives.shape[1] == 2 and batch.negatives.shape == (batch.size, k)
    record_set = {tuple(r) for r in records.tolist()}
    pos = [tuple(r) for r in batch.positives.tolist()]
    assert set(pos) <= record_set and len(set(pos)) == len(pos)
    real = batch.negatives >= 0
    assert bool(((batch.negatives[real] >= 0) & (batch.negatives[real] < n)).all())
    assert bool(((batch.negatives == -1) == (batch.anchors == -1)).all())
    is_end = (batch.anchors == batch.positives[:, :1]) | (batch.anchors == batch.positives[:, 1:])
    assert bool(is_end[real].all())


@settings(max_examples=100, deadline=None)
@given(graph=graphs(), K=st.integers(1, 4), k=st.integers(0, 3), seed=st.integers(0, 2**31 - 1),
       fraction=st.floats(0.05, 1.0))
def test_wor_batches(graph: RelationalGraph, K: int, k: int, seed: int, fraction: float) -> None:
    n = graph.num_nodes
    m_bar = cap_degrees(graph.edges, n, K, gen(seed)).shape[0]
    b = max(1, min(m_bar, math.floor(fraction * m_bar), n // max(k, 1)))
    sampler = build(PoissonWORSampler, batch_size=b, k_neg=k, degree_cap=K)
    g = gen(seed)
    profile = sampler.prepare(graph, g)
    assert profile.kind is SamplingKind.COUPLED_POISSON_WOR
    assert (profile.num_records, profile.num_nodes, profile.degree_cap, profile.k_neg) == (m_bar, n, K, k)
    assert profile.rate == pytest.approx(b / m_bar)
    assert int(torch.bincount(sampler.records.reshape(-1)).max()) <= K
    for _ in range(5):
        batch = sampler.sample(g)
        check_structure(batch, sampler.records, n, k)
        drawn = batch.negatives[batch.negatives >= 0]
        assert drawn.unique().numel() == drawn.numel(), "NEG-SAMPLE-WOR: each node at most once"
        wanted = batch.size * k
        assert drawn.numel() == min(wanted, n)
        assert int((batch.negatives == -1).sum()) == max(0, wanted - n)


def test_wor_padding_when_the_poisson_count_overshoots() -> None:
    # n = 10, b·k = 10 passes the check, but l ~ Binomial(20, 1/4) often exceeds 5.
    graph = make_graph(10, [(i, j) for i in range(10) for j in range(i + 1, 10)][:20])
    sampler = build(PoissonWORSampler, batch_size=5, k_neg=2, degree_cap=9)
    g = gen(0)
    sampler.prepare(graph, g)
    overshoots = 0
    for _ in range(50):
        batch = sampler.sample(g)
        check_structure(batch, sampler.records, 10, 2)
        if batch.size * 2 > 10:
            overshoots += 1
            assert sorted(batch.negatives[batch.negatives >= 0].tolist()) == list(range(10))
            assert int((batch.negatives == -1).sum()) == batch.size * 2 - 10
            # Padding sits in the last slots, never in front of a real negative.
            flat = batch.negatives.reshape(-1)
            assert bool((flat[10:] == -1).all())
    assert overshoots > 0


def test_wor_negatives_are_uniform_over_nodes() -> None:
    graph = make_graph(30, [(i, (i + 1) % 30) for i in range(30)])
    sampler = build(PoissonWORSampler, batch_size=6, k_neg=2, degree_cap=2)
    g = gen(1)
    sampler.prepare(graph, g)
    counts = np.zeros(30)
    for _ in range(2000):
        neg = sampler.sample(g).negatives
        counts += np.bincount(neg[neg >= 0].numpy(), minlength=30)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_with_replacement_sampler_can_repeat_a_negative() -> None:
    graph = make_graph(8, [(i, (i + 1) % 8) for i in range(8)])
    sampler = build(PoissonWithReplacementNegSampler, batch_size=6, k_neg=3, degree_cap=2)
    g = gen(0)
    profile = sampler.prepare(graph, g)
    assert profile.kind is SamplingKind.COUPLED_POISSON_WR and sampler.unit is PrivacyUnit.NODE
    repeated = False
    for _ in range(20):
        batch = sampler.sample(g)
        check_structure(batch, sampler.records, 8, 3)
        neg = batch.negatives.reshape(-1)
        repeated |= neg.unique().numel() < neg.numel()
    assert repeated


@settings(max_examples=50, deadline=None)
@given(graph=graphs(), k=st.integers(0, 4), seed=st.integers(0, 2**31 - 1))
def test_decoupled_sampler_uses_every_edge(graph: RelationalGraph, k: int, seed: int) -> None:
    b = max(1, graph.num_edges // 2)
    sampler = build(PoissonDecoupledSampler, batch_size=b, k_neg=k)
    g = gen(seed)
    profile = sampler.prepare(graph, g)
    assert profile.kind is SamplingKind.POISSON_DECOUPLED and sampler.unit is PrivacyUnit.EDGE
    assert (profile.num_records, profile.num_nodes, profile.degree_cap, profile.k_neg) == (
        graph.num_edges, graph.num_nodes, None, k)
    assert profile.rate == pytest.approx(b / graph.num_edges)
    assert torch.equal(sampler.records, graph.edges)
    for _ in range(3):
        check_structure(sampler.sample(g), graph.edges, graph.num_nodes, k)


@pytest.mark.parametrize("cls", SAMPLERS)
def test_same_seed_same_batches(cls: type) -> None:
    graph = make_graph(60, torch.randint(0, 60, (300, 2), generator=gen(9)))

    def run(seed: int) -> list[torch.Tensor]:
        sampler = build(cls, batch_size=8, k_neg=2)
        g = gen(seed)
        sampler.prepare(graph, g)
        return [t for _ in range(3) for t in vars(sampler.sample(g)).values()]

    assert all(torch.equal(a, b) for a, b in zip(run(4), run(4), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(run(4), run(5), strict=True))


@pytest.mark.parametrize("cls", SAMPLERS)
def test_refusals(cls: type) -> None:
    graph = make_graph(6, [(0, 1), (1, 2), (2, 3)])
    with pytest.raises(ConfigError, match="batch_size"):
        build(cls, batch_size=4).prepare(graph, gen(0))
    with pytest.raises(DataError, match="no edges"):
        build(cls, batch_size=1).prepare(make_graph(3, []), gen(0))
    with pytest.raises(RuntimeError, match="prepare"):
        build(cls, batch_size=1).sample(gen(0))
    for bad in ({"batch_size": 0}, {"batch_size": 1, "k_neg": -1}, {"batch_size": 1, "typo": 1}):
        with pytest.raises(ValidationError):
            cls.Params(**bad)


def test_wor_refuses_more_negatives_than_nodes() -> None:
    graph = make_graph(6, [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)])
    with pytest.raises(ConfigError, match=r"k_neg \* sampler.batch_size = 2 \* 4 = 8 exceeds the 6"):
        build(PoissonWORSampler, batch_size=4, k_neg=2).prepare(graph, gen(0))
    with pytest.raises(ValidationError):
        PoissonWORSampler.Params(batch_size=1, degree_cap=0)
    # The with-replacement sampler has no such limit.
    build(PoissonWithReplacementNegSampler, batch_size=4, k_neg=2).prepare(graph, gen(0))


def test_degree_cap_reduces_the_records_and_the_rate_uses_them() -> None:
    star = make_graph(11, [(0, i) for i in range(1, 11)])
    sampler = build(PoissonWORSampler, batch_size=2, k_neg=1, degree_cap=3)
    profile = sampler.prepare(star, gen(0))
    assert profile.num_records == 3 and profile.rate == pytest.approx(2 / 3)
    with pytest.raises(ConfigError, match="after any degree capping"):
        build(PoissonWORSampler, batch_size=4, k_neg=1, degree_cap=3).prepare(star, gen(0))


def test_plugins_register_these_classes() -> None:
    assert entity_dp.graphveil_samplers() == {
        "entity_poisson_wor": PoissonWORSampler, "entity_poisson_wr": PoissonWithReplacementNegSampler}
    assert edge_dp.graphveil_samplers() == {"edge_poisson_decoupled": PoissonDecoupledSampler}


@settings(max_examples=40, deadline=None)
@given(graph=graphs(), K=st.integers(1, 4), seed=st.integers(0, 2**31 - 1))
def test_prepare_with_stored_records_reuses_them(graph: RelationalGraph, K: int, seed: int) -> None:
    """A stored Ē (records store) is taken as is after validation; the profile matches."""
    first = build(PoissonWORSampler, batch_size=1, k_neg=0, degree_cap=K)
    profile = first.prepare(graph, gen(seed))
    assert first.preprocessing_params() == {"degree_cap": K}
    again = build(PoissonWORSampler, batch_size=1, k_neg=0, degree_cap=K)
    flipped = first.records.flip(1)  # either orientation is accepted
    assert again.prepare(graph, gen(seed + 1), records=flipped) == profile
    assert torch.equal(again.records, first.records)
    if K > 1 and int(graph.degrees().max()) > K - 1 and first.records.shape[0] > 0:
        tighter = build(PoissonWORSampler, batch_size=1, k_neg=0, degree_cap=K - 1)
        degrees = torch.bincount(first.records.reshape(-1), minlength=graph.num_nodes)
        if int(degrees.max()) > K - 1:
            with pytest.raises(PrivacyError, match=f"degree cap K={K - 1}"):
                tighter.prepare(graph, gen(seed), records=first.records)


def test_stored_records_shape_and_range_checked() -> None:
    graph = make_graph(4, [(0, 1), (1, 2), (2, 3)])
    s = build(PoissonDecoupledSampler, batch_size=1, k_neg=0)
    assert s.preprocessing_params() is None
    for bad, match in [(torch.tensor([0, 1]), r"\(m, 2\) tensor"), (torch.tensor([[0.0, 1.0]]), "integers"),
                       (torch.tensor([[0, 9]]), "outside 0..3"), (torch.tensor([[0, 2]]), "not a relation")]:
        with pytest.raises(PrivacyError, match=match):
            s.prepare(graph, gen(0), records=bad)


# --------------------------------------------------------------------------------------------
# a public size floor (min_records): what is accounted holds public numbers only
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "floor"), [(40, 10), (40, 40), (10, 40), (0, 40)])
def test_size_floor_states_public_numbers_and_samples_at_most_that_rate(m: int, floor: int) -> None:
    graph = make_graph(200, [(i, i + 100) for i in range(m)])
    b = 5
    sampler = build(PoissonDecoupledSampler, batch_size=b, k_neg=1, min_records=floor)
    public = sampler.public_profile()
    g = gen(3)
    profile = sampler.prepare(graph, g)  # never fails on the private m (0 included)
    assert (profile.rate, profile.num_records, profile.expected_batch_size) == (b / floor, floor, b)
    assert (public.rate, public.num_records, public.kind) == (profile.rate, profile.num_records, profile.kind)
    # the realised inclusion probability is b/max(m, m₀) ≤ the stated b/m₀
    draws = 4000
    counts = torch.tensor([sampler.sample(g).size for _ in range(draws)], dtype=torch.float64)
    want = m * b / max(m, floor)
    sd = math.sqrt(want * (1 - b / max(m, floor)) / draws) if m else 0.0
    assert abs(float(counts.mean()) - want) <= 6 * sd + 1e-12  # false failure < 1e-8


def test_without_a_floor_nothing_is_public_and_a_floor_below_the_batch_is_refused() -> None:
    assert build(PoissonDecoupledSampler, batch_size=3).public_profile() is None
    assert build(PoissonWORSampler, batch_size=3).public_profile() is None
    with pytest.raises(ValidationError, match="exceeds min_records"):
        PoissonDecoupledSampler.Params(batch_size=5, min_records=4)
    with pytest.raises(ValidationError):  # node level has no floor: its accountants need |Ē| and n
        PoissonWORSampler.Params(batch_size=5, min_records=40)


@pytest.mark.parametrize("sigma", [0.6, 1.0, 3.0])
def test_accounting_at_the_floor_rate_bounds_every_smaller_rate(sigma: float) -> None:
    """The garbling argument of PoissonDecoupledSampler, checked with dp-accounting's own RDP and
    PLD analyses: ε at the stated rate b/m₀ is never below ε at the realised b/m (m ≥ m₀)."""
    import dp_accounting

    def eps(rate: float, pld: bool) -> float:
        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), 200)
        acc = (dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-3) if pld
               else dp_accounting.rdp.RdpAccountant())
        return float(acc.compose(event).get_epsilon(1e-6))

    for pld in (False, True):
        stated = eps(0.01, pld)
        for realised in (0.0099, 0.005, 0.001):
            assert eps(realised, pld) <= stated * (1 + 1e-9)
