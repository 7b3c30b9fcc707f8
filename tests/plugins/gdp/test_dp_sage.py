"""DP-SAGE: rooted subgraphs on the out-degree-bounded graph, the hypergeometric accountant, and
the output perturbation (plugins/graphveil/plugins/gdp/rooted*.py, plugins/graphveil/plugins/gdp/dp_sage.py).

* replacing one node changes at most G = 2·Σ_{i≤L} Dⁱ − 1 rooted examples on random graphs of
  out-degree ≤ D (a larger graph is refused: tests/plugins/gdp/test_gdp_degree_class.py), and a tree reaches G exactly (so an understated G fails too);
* the accountant reduces to the Gaussian at σ/(2·min(G, n)) for full batches, bounds
  dp-accounting's sampled-without-replacement Gaussian for G = 1, equals an independent sum
  over the hypergeometric law, and grows with G;
* a run composes its steps and the output release as by hand; the released scores are the
  model's, clipped, plus noise of std σ·scale·2c√G;
* wrong units, models, hop counts, missing releases and the per-node accountant are refused.
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch
from _gdp_runs import BATCH, sage_config
from _gdp_runs import SAGE_D as D
from _gdp_runs import SAGE_HOPS as HOPS
from _graphs import node_graph_within
from hypothesis import given, settings
from hypothesis import strategies as st

from graphveil.contract.errors import ConfigError, PrivacyError
from graphveil.contract.host import PluginHost
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.plugins.gdp.dp_sage import OUTPUTS
from graphveil.plugins.gdp.rooted import (
    RootSubgraphParams,
    RootSubgraphSampler,
    changed_examples,
    reached_roots,
)
from graphveil.plugins.gdp.rooted_accountant import RootedRdpAccountant, rooted_step_rdp
from graphveil.privacy.conversion import rdp_to_epsilon
from graphveil.run.session import TrainingSession
from graphveil.subgraph_batch import rooted_subgraphs
from graphveil.transforms import OutDegreeBound

NeighborRel = dp_accounting.privacy_accountant.NeighboringRelation
ORDERS = [1.25, 1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 64.0]


def unit(d: int) -> PrivacyUnit:
    return PrivacyUnit.parse(f"node/replacement/D={d}/predictions")


# ----------------------------------------------------------------------------- examples a node reaches


def examples(x: torch.Tensor, edges: torch.Tensor, hops: int) -> list[tuple]:
    """Every node as a root: a comparable fingerprint of its subgraph (node ids, edges, features)."""
    batch = rooted_subgraphs(x, edges, torch.arange(x.shape[0]), hops)
    out = []
    for i in range(batch.size):
        g = batch.graphs.get_example(i)
        ids = g.n_id.tolist()
        pairs = sorted((ids[a], ids[b]) for a, b in g.edge_index.t().tolist())
        out.append((tuple(ids), tuple(pairs), tuple(map(tuple, g.x.tolist()))))
    return out


@st.composite
def bounded_replacement(draw: st.DrawFn) -> tuple[int, int, int, torch.Tensor, torch.Tensor, int]:
    """A directed graph with out-degree ≤ D and a neighbour replacing node r's edges both ways."""
    n, d, hops = draw(st.integers(4, 12)), draw(st.integers(1, 3)), draw(st.integers(1, 2))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    dense = torch.randint(0, n, (2, 4 * n), generator=gen)
    key = bytes(torch.randint(0, 256, (32,), generator=gen).tolist())
    edges = OutDegreeBound(d, key)(_data(dense, n)).edge_index
    r = int(torch.randint(n, (1,), generator=gen))
    kept = edges[:, (edges[0] != r) & ((edges[1] != r) | (torch.rand(edges.shape[1], generator=gen) < 0.5))]
    fresh = torch.stack([torch.full((d,), r), torch.randint(0, n, (d,), generator=gen)])
    # new in-edges of r come only from nodes with spare out-degree: the neighbour obeys D too,
    # and no edge that does not touch r may change
    spare = (torch.bincount(kept[0], minlength=n) < d).nonzero().view(-1)
    spare = spare[(spare != r) & (torch.rand(spare.numel(), generator=gen) < 0.5)]
    new_in = torch.stack([spare, torch.full_like(spare, r)])
    replaced = torch.cat([kept, fresh, new_in], dim=1)
    return n, d, hops, edges, replaced, r


def _data(edges: torch.Tensor, n: int) -> Any:
    from torch_geometric.data import Data

    return Data(edge_index=edges, num_nodes=n)


@given(bounded_replacement(), st.integers(0, 2**31))
@settings(max_examples=60, deadline=None)
def test_a_replaced_node_changes_at_most_g_rooted_examples(case: Any, seed: int) -> None:
    n, d, hops, edges, replaced, r = case
    assert int(torch.bincount(replaced[0], minlength=n).max()) <= d
    x = torch.randn(n, 2, generator=torch.Generator().manual_seed(seed))
    x2 = x.clone()
    x2[r] = torch.randn(2)
    before, after = examples(x, edges, hops), examples(x2, replaced, hops)
    changed = sum(a != b for a, b in zip(before, after, strict=True))
    assert changed <= changed_examples(d, hops)
    holding_r = sum(r in ids for ids, _, _ in before)
    assert holding_r <= reached_roots(d, hops)


def test_a_tree_reaches_g_exactly() -> None:
    # r = 0 sends to a D-ary tree of depth L before and to a disjoint one after: 2·N_L − 1 roots change
    d, hops = 2, 2

    def tree(root: int, first: int) -> tuple[list[tuple[int, int]], int]:
        pairs, frontier, nxt = [], [root], first
        for _ in range(hops):
            new = []
            for u in frontier:
                for _ in range(d):
                    pairs.append((u, nxt))
                    new.append(nxt)
                    nxt += 1
            frontier = new
        return pairs, nxt

    a, nxt = tree(0, 1)
    b, n = tree(0, nxt)
    a_only = [p for p in a] + [(u, v) for u, v in b if u != 0]  # second tree present, not reached from 0
    b_only = [(u, v) for u, v in a if u != 0] + b
    x = torch.eye(n)
    before = examples(x, torch.tensor(a_only).t(), hops)
    x2 = x.clone()
    x2[0] = -x2[0]
    after = examples(x2, torch.tensor(b_only).t(), hops)
    assert sum(p != q for p, q in zip(before, after, strict=True)) == changed_examples(d, hops) == 13


def test_reached_roots_and_changed_examples_formulas() -> None:
    assert reached_roots(100, 1) == 101 and changed_examples(100, 1) == 201  # DPDGC's 2D + 1 at L = 1
    assert changed_examples(100, 2) == 20201 and changed_examples(5, 0) == 1
    with pytest.raises(PrivacyError):
        reached_roots(0, 2)


# ----------------------------------------------------------------------------- accountant


def test_full_batches_are_the_gaussian_of_the_whole_group() -> None:
    for n, group in ((50, 3), (50, 80)):
        mine = rooted_step_rdp(ORDERS, n, n, group, 7.0)
        acc = dp_accounting.rdp.RdpAccountant(orders=ORDERS, neighboring_relation=NeighborRel.REPLACE_ONE)
        acc.compose(dp_accounting.GaussianDpEvent(7.0 / (2 * min(group, n))))
        np.testing.assert_allclose(mine, acc._rdp, rtol=1e-12)


@pytest.mark.parametrize(("n", "b", "group", "sigma"), [(1000, 64, 1, 2.0), (60, 10, 6, 3.0), (200, 20, 30, 8.0)])
def test_the_bound_is_above_the_exact_divergence_of_a_worst_case_pair(n: int, b: int, group: int, sigma: float) -> None:
    # one dimension, every changed example at +1 on one graph and −1 on the other (2C apart):
    # P = Σ_ρ h(ρ)·N(ρ, σ²), Q = Σ_ρ h(ρ)·N(−ρ, σ²); Ψ_α(P‖Q) by quadrature must not exceed the bound
    from scipy.special import logsumexp
    from scipy.stats import hypergeom, norm

    rho = np.arange(0, min(group, b) + 1)
    log_h = hypergeom.logpmf(rho, n, group, b)
    x = np.linspace(-min(group, b) - 12 * sigma, min(group, b) + 12 * sigma, 200_001)
    log_p = logsumexp(log_h[:, None] + norm.logpdf(x[None, :], rho[:, None], sigma), axis=0)
    log_q = logsumexp(log_h[:, None] + norm.logpdf(x[None, :], -rho[:, None], sigma), axis=0)
    bound = rooted_step_rdp(ORDERS, n, b, group, sigma)
    for alpha, value in zip(ORDERS, bound, strict=True):
        exact = (logsumexp(alpha * log_p + (1 - alpha) * log_q) + math.log(x[1] - x[0])) / (alpha - 1)
        assert exact <= value * (1 + 1e-6) + 1e-9


@pytest.mark.parametrize(("n", "b", "group", "sigma"), [(40, 8, 5, 3.0), (300, 64, 201, 40.0), (30, 29, 2, 1.5)])
def test_the_bound_equals_an_independent_hypergeometric_sum(n: int, b: int, group: int, sigma: float) -> None:
    log_total = math.log(math.comb(n, b))
    for alpha, value in zip(ORDERS, rooted_step_rdp(ORDERS, n, b, group, sigma), strict=True):
        logs = [math.log(math.comb(group, rho) * math.comb(n - group, b - rho)) - log_total
                + alpha * (alpha - 1) * (2 * rho) ** 2 / (2 * sigma**2)
                for rho in range(0, min(group, b) + 1) if math.comb(n - group, b - rho)]
        top = max(logs)
        log_psi = top + math.log(sum(math.exp(v - top) for v in logs))
        assert value == pytest.approx(log_psi / (alpha - 1), rel=1e-9)


def test_more_examples_per_node_cost_more() -> None:
    curves = [rooted_step_rdp(ORDERS, 500, 32, g, 10.0) for g in (1, 5, 50, 500)]
    for low, high in zip(curves, curves[1:], strict=False):
        assert np.all(high > low)


def bound(group: int | None, d: int | None = 10) -> RootedRdpAccountant:
    acc = RootedRdpAccountant()
    if d is not None:
        acc.unit = unit(d)
    sampling = SamplingProfile(SamplingKind.UNIFORM_WOR, 0.1, 200, batch_size=20, examples_per_unit=group)
    acc.bind(sampling, SensitivityProfile(SensitivityKind.PER_EXAMPLE, acc.unit, 1.0))
    return acc


def test_the_accountant_reads_g_from_the_profile_and_refuses_none() -> None:
    acc = bound(21)
    np.testing.assert_array_equal(acc.per_step_rdp(5.0), rooted_step_rdp(acc.orders, 200, 20, 21, 5.0))
    assert acc.report(1e-5)["profile"]["examples_per_unit"] == 21
    for acc in (bound(None), bound(21, d=None)):  # binds (a non-private run does), never answers
        with pytest.raises(PrivacyError, match="out-degree bound"):
            acc.calibrate(target_epsilon=1.0, delta=1e-5, num_steps=10)
        with pytest.raises(PrivacyError, match="out-degree bound"):
            acc.per_step_rdp(5.0)


def test_the_sampler_states_g_of_its_unit_and_hops() -> None:
    sampler = RootSubgraphSampler(RootSubgraphParams(batch_size=4, num_hops=2))
    sampler.unit = unit(3)
    profile = sampler.prepare(torch.arange(30), torch.Generator().manual_seed(0))
    assert profile.examples_per_unit == changed_examples(3, 2) == 25 and profile.batch_size == 4
    batch = sampler.sample(torch.Generator().manual_seed(1))
    assert batch.size == 4 and batch.num_hops == 2 and len(set(batch.nodes.tolist())) == 4
    assert sampler.accepts_unit(unit(3)) and not sampler.accepts_unit(PrivacyUnit.parse("k_neighbor/replacement/k=1/D=3/predictions"))


def test_the_per_node_accountant_refuses_shared_examples() -> None:
    from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant

    acc = NodeReplaceRdpAccountant()
    sampling = SamplingProfile(SamplingKind.UNIFORM_WOR, 0.1, 200, batch_size=20, examples_per_unit=7)
    with pytest.raises(PrivacyError, match="rooted_rdp"):
        acc.bind(sampling, SensitivityProfile(SensitivityKind.PER_EXAMPLE, acc.unit, 1.0))


# ----------------------------------------------------------------------------- runs

#: the runs' graph: hub_node_graph with degrees ≤ D, inside node level's class (a graph above D
#: is refused: tests/plugins/gdp/test_gdp_degree_class.py)
class_graph = node_graph_within(D)


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


def test_a_run_composes_its_steps_and_the_output_release_as_by_hand(host: PluginHost) -> None:
    session = TrainingSession(sage_config(scale=2.0), host=host, graph=class_graph())
    session.train()
    metrics = session.evaluate()
    sigma, n = session.noise_multiplier, int(session.task.split.train.numel())
    group = changed_examples(D, HOPS)
    rdp = 4 * rooted_step_rdp(session.accountant.orders, n, BATCH, group, sigma)
    out = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in session.accountant.orders],
                                          neighboring_relation=NeighborRel.REPLACE_ONE)
    out.compose(dp_accounting.GaussianDpEvent(2.0 * sigma))
    expected = rdp_to_epsilon(session.accountant.orders, rdp + np.asarray(out.rdp), session.delta)[0]
    assert session.epsilon() == pytest.approx(expected, rel=1e-9)
    assert session.epsilon() == pytest.approx(8.0, rel=0.01)
    report = session.privacy_report()
    assert report["releases"] == [OUTPUTS] and report["sampling_profile"]["examples_per_unit"] == group
    assert 0.0 <= metrics["test_accuracy"] <= 1.0
    assert int(torch.bincount(session.task.bounded_edges[0]).max()) <= D


class RecordingNoise:
    """Adds nothing; records the std asked for (the release's arithmetic, seen from outside)."""

    def __init__(self) -> None:
        self.stds: list[float] = []

    def add_(self, tensors: list[torch.Tensor], std: float) -> None:
        self.stds.append(std)


def test_the_release_is_the_clipped_scores_plus_noise_of_the_stated_std(host: PluginHost) -> None:
    session = TrainingSession(sage_config(), host=host, graph=class_graph())
    session.train()
    mechanism = session.plan.releases[0].mechanism
    session.task.released = {**session.released, "model": session.encoder}
    noise = RecordingNoise()
    scores = mechanism.release(session.task, noise)
    raw = session.task.scores(session.encoder)
    norms = raw.norm(dim=1, keepdim=True)
    assert float(norms.max()) > 0.5  # the clip binds somewhere, so the test sees it
    torch.testing.assert_close(scores, raw * (0.5 / norms.clamp(min=0.5)))
    assert float(scores.norm(dim=1).max()) <= 0.5 + 1e-6
    expected = session.noise_multiplier * 1.0 * 2 * 0.5 * math.sqrt(changed_examples(D, HOPS))
    assert noise.stds == [pytest.approx(expected, rel=1e-12)]


def test_evaluation_reads_the_released_scores_only(host: PluginHost) -> None:
    session = TrainingSession(sage_config(), host=host, graph=class_graph())
    session.train()
    session.evaluate()
    released = session.released[OUTPUTS]
    assert torch.equal(session.task.predicted(session.encoder), released.argmax(dim=1))
    assert released.shape == (session.task.dataset.num_nodes, 3)


def test_full_graph_scores_equal_the_root_outputs_of_rooted_subgraphs(host: PluginHost) -> None:
    session = TrainingSession(sage_config(hops=2), host=host, graph=class_graph())
    session.prepare()
    task, model = session.task, session.encoder
    roots = torch.arange(0, 40)
    model.eval()
    with torch.no_grad():
        local = model(rooted_subgraphs(task.features(), task.bounded_edges, roots, 2))
    torch.testing.assert_close(task.scores(model)[roots], local, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"unit_label": "edge/replacement/predictions"}, PrivacyError, "not analysed by"),
    ({"unit_label": "node/replacement/predictions"}, PrivacyError, "not analysed by"),
    ({"sampler_hops": 2}, ConfigError, "num_hops: 1"),
    ({"predictions": None}, ConfigError, "dp_sage_outputs"),
])
def test_bad_runs_are_refused_before_data_is_read(host: PluginHost, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        TrainingSession(sage_config(**kwargs), host=host, graph=class_graph()).assemble()


def test_the_per_node_accountant_refuses_the_rooted_model(host: PluginHost) -> None:
    cfg = sage_config()
    cfg = cfg.model_copy(update={"accountant": cfg.accountant.model_copy(update={"name": "node_rdp"})})
    with pytest.raises(PrivacyError, match="root_subgraphs"):
        TrainingSession(cfg, host=host, graph=class_graph()).assemble()


def test_a_non_private_run_needs_no_bound_and_releases_the_raw_scores(host: PluginHost) -> None:
    session = TrainingSession(sage_config(privacy={"enabled": False}), host=host, graph=class_graph())
    session.train()
    metrics = session.evaluate()
    assert torch.equal(session.task.bounded_edges, session.task.dataset.edge_index)
    torch.testing.assert_close(session.released[OUTPUTS], session.task.scores(session.encoder))
    assert metrics["test_accuracy"] >= 0.0 and session.privacy_report()["epsilon"] == math.inf
