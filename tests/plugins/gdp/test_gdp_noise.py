"""The noise actually in paper 4's GDP releases, measured against what the accountant was told.

Each private release runs inside a real session whose Gaussian noise object is
:class:`MeasuredNoise`: the run's own generator (research noise seed, so the test is
deterministic), keeping for every call the exact noise it added (tensor after − before). Then:

* the release is recomputed here from its noiseless inputs plus that recorded noise and must
  equal the artifact — so the measured noise is the noise IN the release, not a side copy;
* the noise divided by the std the accountant's composed event implies (its Gaussian's
  multiplier σ_event × the ℓ2 sensitivity the multiplier is relative to, from the unit in the
  privacy report) must be N(0, 1): ‖z‖² inside the χ²_d quantiles at 1e-9 on each side and a KS
  p-value above 1e-7. With fresh noise a correct release fails a group with probability
  < 2e-9 + 1e-7; a std off by a factor 2 (3 for DP-Emb's noise_scale) puts ‖z‖²/d at 1/4 (1/9),
  ≥ 13 standard deviations (sd √(2/d)) out for the d ≥ 598 coordinates of every group (GAP's
  node-level encoder; the hops, DP-Emb and Z have d ≥ 1280: ≥ 19);
* the event is the one the accountant composed: its RDP curve on the accountant's orders equals
  the curve the accountant recorded for that release name.

Levels: edge, undirected edge, and node level with D = 7, the test graph's largest out-degree,
so that the degree bound keeps every edge and the recomputation reads the graph as it is.

RandEdge: the released pairs against the true ones, kept and flipped counts inside the binomial
quantiles at 1e-9 on each side of p = 1/(1 + e^ε), ε the pure ε in the run's privacy report.
(Paper 2's RR baseline: tests/plugins/edge_dp/test_rr_baseline.py.)
"""

from __future__ import annotations

import math
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch
from _gdp_runs import EDGE, NODE, UNDIRECTED, gdp_config, rand_edge_config
from _graphs import hub_node_graph
from scipy import stats

from graphveil.contract.host import PluginHost
from graphveil.contract.units import PrivacyUnit
from graphveil.engine import noise as noise_module
from graphveil.plugins.gdp.common import row_normalise
from graphveil.plugins.gdp.levels import GdpLevel
from graphveil.run.config import config_from_dict
from graphveil.run.runner import planned_unit
from graphveil.run.session import TrainingSession

#: each tail of every two-sided bound (χ², binomial); KS p-values must exceed KS_P
TAIL, KS_P = 1e-9, 1e-7


class MeasuredNoise(noise_module.GaussianNoise):
    """The run's Gaussian noise, keeping each call's added noise (float64, one tensor per input)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[list[torch.Tensor]] = []

    def add_(self, tensors: Any, std: float) -> None:
        tensors = list(tensors)
        before = [t.detach().clone() for t in tensors]
        super().add_(tensors, std)
        self.calls.append([(t.detach() - b).double() for t, b in zip(tensors, before, strict=True)])


def assert_standard_normal(noise: torch.Tensor, std: float, what: str) -> None:
    """``noise / std`` is N(0, 1): χ² and KS bounds of the module note."""
    z = (noise.reshape(-1) / std).numpy()
    d, chi2 = z.size, float((z**2).sum())
    low, high = stats.chi2.ppf(TAIL, d), stats.chi2.isf(TAIL, d)
    assert low < chi2 < high, f"{what}: ‖z‖²/d = {chi2 / d:.4f} outside [{low / d:.4f}, {high / d:.4f}] (d = {d})"
    assert stats.kstest(z, "norm").pvalue > KS_P, what


def assert_binomial(count: int, trials: int, p: float, what: str) -> None:
    low, high = stats.binom.ppf(TAIL, trials, p), stats.binom.isf(TAIL, trials, p)
    assert low <= count <= high, f"{what}: {count} of {trials} outside [{low:.0f}, {high:.0f}] at p = {p:.4g}"


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


def prepared(cfg: Any, host: PluginHost, monkeypatch: pytest.MonkeyPatch) -> TrainingSession:
    """A session whose releases ran with :class:`MeasuredNoise` (the session builds its noise in prepare)."""
    monkeypatch.setattr(noise_module, "GaussianNoise", MeasuredNoise)
    session = TrainingSession(cfg, host=host, graph=hub_node_graph())
    session.prepare()
    assert isinstance(session.noise, MeasuredNoise)
    return session


def accounted_event(session: TrainingSession, name: str) -> Any:
    """The event of release ``name`` at the run's σ, checked to be the one the accountant composed."""
    mechanism = next(r.mechanism for r in session.plan.releases if r.name == name)
    event = mechanism.event_at(session.noise_multiplier)
    recorded = {n: np.asarray(c) for n, c in session.accountant.state_dict()["releases"]}[name]
    np.testing.assert_allclose(session.accountant.event_rdp(event, name), recorded, rtol=1e-12)
    return event


def reported_level(session: TrainingSession) -> GdpLevel:
    """The GDP level of the unit the privacy report states."""
    unit = PrivacyUnit.parse(session.privacy_report()["unit"])
    return GdpLevel.of(unit, method="test", needs_degree_bound=False)


def adjacency(edges: torch.Tensor, n: int) -> torch.Tensor:
    """Dense A (float64): A[i, j] = 1 for an edge j → i (row i sums node i's in-neighbours)."""
    a = torch.zeros(n, n, dtype=torch.float64)
    a[edges[1], edges[0]] = 1.0
    return a


#: node level on the test graph without bounding anything: D = its largest out-degree (7)
NODE_UNBOUNDED = NODE.format(D=7)
UNITS = [EDGE, UNDIRECTED, NODE_UNBOUNDED]


def stage_gaussian(event: Any) -> tuple[float, int]:
    """(σ of the per-step Gaussian, steps T) of a DP-SGD stage event SelfComposed(step, T), where
    the step is SampledWithoutReplacement(n, b, Gaussian) or Gaussian."""
    assert isinstance(event, dp_accounting.SelfComposedDpEvent)
    step = event.event
    if isinstance(step, dp_accounting.SampledWithoutReplacementDpEvent):
        step = step.event
    assert isinstance(step, dp_accounting.GaussianDpEvent)
    return step.noise_multiplier, event.count


def step_std(event: Any, clip: float, group: int, batch: int) -> tuple[float, int]:
    """(noise std of each step, T) that a stage's accounted event implies: a step's clipped sum
    moves by ≤ 2C per changed example (replacement) and at most min(g, b) of a unit's g changed
    examples are in a batch, so the step's Gaussian is relative to 2C·min(g, b)."""
    sigma, steps = stage_gaussian(event)
    return sigma * 2 * clip * min(group, batch), steps


def unbounded_adjacency(session: TrainingSession) -> torch.Tensor:
    """A of the whole graph, after checking the level's bound (if any) drops nothing from it."""
    data, bound = session.task.dataset, reported_level(session).degree_bound
    assert bound is None or int(torch.bincount(data.edge_index[0]).max()) <= bound
    return adjacency(data.edge_index, data.num_nodes)


# ----------------------------------------------------------------------------- GAP


@pytest.mark.parametrize("unit", UNITS)
def test_gap_hops_carry_the_accounted_noise(unit: str, host: PluginHost, monkeypatch: pytest.MonkeyPatch) -> None:
    session = prepared(gdp_config("gap", unit, hops=2), host, monkeypatch)
    hops = accounted_event(session, "gap_aggregates")
    assert isinstance(hops, dp_accounting.SelfComposedDpEvent)
    assert isinstance(hops.event, dp_accounting.GaussianDpEvent)
    level = reported_level(session)
    calls = session.noise.calls
    encoder_calls, hop_calls = calls[:-hops.count], calls[-hops.count:]

    # the encoder's DP-SGD: noiseless at edge level (public features), per-node steps otherwise
    encoder = session.plan.releases[0].mechanism
    if level.edge_level:
        assert not encoder_calls and accounted_event(session, "gap_encoder") == dp_accounting.NoOpDpEvent()
    else:
        training = encoder.params.encoder_training
        std, steps = step_std(accounted_event(session, "gap_encoder"), training.clip_norm, 1,
                              min(training.batch_size, int(session.task.split.train.numel())))
        assert encoder_calls and len(encoder_calls) % steps == 0  # one call (a draw per parameter) per step
        assert_standard_normal(torch.cat([t.reshape(-1) for call in encoder_calls for t in call]), std,
                               f"GAP encoder's DP-SGD at {unit}")

    # H⁽ˡ⁾ = normalise(A·H⁽ˡ⁻¹⁾ + N); the Gaussian is relative to sensitivity 1: N's std is σ_event · Δ
    a = unbounded_adjacency(session)
    width = session.released["gap_encoder"].shape[1]
    z = session.released["gap_aggregates"].double()
    previous = session.released["gap_encoder"].double()
    for hop, (added,) in enumerate(hop_calls, start=1):
        torch.testing.assert_close(z[:, hop * width: (hop + 1) * width], row_normalise(a @ previous + added),
                                   rtol=1e-4, atol=1e-5)
        previous = z[:, hop * width: (hop + 1) * width]
    assert_standard_normal(torch.cat([c[0].reshape(-1) for c in hop_calls]),
                           hops.event.noise_multiplier * level.aggregation_sensitivity(), f"GAP hops at {unit}")


# ----------------------------------------------------------------------------- DPDGC


@pytest.mark.parametrize("unit", UNITS)
def test_dpdgc_trains_dp_emb_and_releases_z_with_the_accounted_noise(
        unit: str, host: PluginHost, monkeypatch: pytest.MonkeyPatch) -> None:
    c, clip = 0.5, 1.0
    session = prepared(gdp_config("dpdgc", unit, row_norm=c, noise_scale=3.0), host, monkeypatch)
    event = accounted_event(session, "dpdgc_embedding")
    assert isinstance(event, dp_accounting.ComposedDpEvent)
    training, release = event.events
    level = reported_level(session)
    mechanism = session.plan.releases[0].mechanism
    calls = session.noise.calls

    # DP-Emb: one unit changes g = level.changed_rows() examples (rows of A)
    batch = min(mechanism.params.embedding_training.batch_size, int(session.task.split.train.numel()))
    std, steps = step_std(training, clip, level.changed_rows(), batch)
    params = len(list(mechanism.model.trainable_parameters()))
    # one call per step with one draw per parameter, then Z
    assert len(calls) == steps + 1 and all(len(call) == params for call in calls[:-1])
    assert_standard_normal(torch.cat([t.reshape(-1) for call in calls[:-1] for t in call]), std,
                           f"DP-Emb's DP-SGD at {unit}")

    # Z = A W + b + N, row-normalised, next to the public features
    assert isinstance(release, dp_accounting.GaussianDpEvent)
    (z_noise,) = calls[-1]
    data = session.task.dataset
    weight, bias = mechanism.model.linear.weight.detach().double(), mechanism.model.linear.bias.detach().double()
    expected = row_normalise(unbounded_adjacency(session) @ weight.t() + z_noise + bias)
    x = session.released["dpdgc_embedding"].double()
    features = data.x.shape[1]
    assert torch.equal(x[:, :features], data.x.double())
    torch.testing.assert_close(x[:, features:], expected, rtol=1e-4, atol=1e-5)
    assert_standard_normal(z_noise, release.noise_multiplier * level.embedding_sensitivity(c), f"Z at {unit}")


# ----------------------------------------------------------------------------- RandEdge


def pairs(edges: torch.Tensor) -> set[tuple[int, int]]:
    return {(min(u, v), max(u, v)) for u, v in edges.t().tolist()}


@pytest.mark.parametrize(("unit", "seed"), [(EDGE, 11), (UNDIRECTED, 12)])
def test_rand_edge_keeps_and_flips_pairs_at_the_reported_epsilon(
        unit: str, seed: int, host: PluginHost) -> None:
    raw = rand_edge_config(unit, 2.0).model_dump(mode="json", exclude_none=True)
    raw["privacy"]["research_noise_seed"] = seed
    cfg = config_from_dict(raw)
    session = TrainingSession(cfg, host=host, graph=hub_node_graph())
    session.prepare()
    report = session.privacy_report()
    assert report["unit"] == unit == planned_unit(cfg, host)  # what the benchmarks' unit columns read
    eps = report["epsilon"]  # pure ε of the composed RR event (basic composition)
    p = 1.0 / (1.0 + math.exp(eps))
    true, released = pairs(session.task.dataset.edge_index), pairs(session.released["rand_edge"])
    n = session.task.dataset.num_nodes
    non_edges = n * (n - 1) // 2 - len(true)
    assert_binomial(len(released & true), len(true), 1.0 - p, f"kept true edges at {unit}")
    assert_binomial(len(released - true), non_edges, p, f"flipped non-edges at {unit}")
