"""The built-in one-shot mechanism ``noisy_features`` (paper 4's DP-Emb idea on the features) in a run.

* sensitivity: replacing one node's features by arbitrary values moves the row-clipped matrix
  in that row only, by at most 2 = ``sensitivity()``, and the bound is attained (property test);
* accounting: the composed event is the Gaussian with sensitivity 2 and std s, RDP 2α/s² at
  every order, read back from the accountant's total;
* noise: the released residual has variance s² per entry (statistical bound, CSPRNG noise,
  nothing seeded) and a second release draws fresh noise;
* isolation: a session whose task reads ``released:noisy_features`` never reads ``dataset.x``
  after the release (x replaced by NaNs behind a read counter; the raw-features session is the
  control that shows the counter and the NaNs would catch it);
* composition: release + DP-SGD steps costs more ε than the steps alone, and equals composing
  both RDP curves by hand with dp-accounting.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphveil.contract.errors import ConfigError
from graphveil.contract.host import PluginHost
from graphveil.contract.profiles import (
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.data.node_graph import NodeGraph
from graphveil.plugins.node_classification.task import NodeClassification, NodeClassificationParams
from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant
from graphveil.plugins.node_dp.mechanisms import NoisyFeatures, NoisyFeaturesParams, clip_rows
from graphveil.plugins.node_dp.units import NODE_GDP
from graphveil.privacy.conversion import rdp_to_epsilon
from graphveil.run.config import config_from_dict
from graphveil.run.session import TrainingSession

NeighborRel = dp_accounting.privacy_accountant.NeighboringRelation


class ConstantNoise:
    """Stands in for GaussianNoise where the deterministic part of a release is under test:
    adds ``value`` in place (so a release aliasing the dataset's x would change x)."""

    def __init__(self, value: float = 0.0) -> None:
        self.value, self.stds = value, []

    def add_(self, tensors: Any, std: float) -> None:
        self.stds.append(std)
        for t in tensors:
            t.add_(self.value)


def release(x: torch.Tensor, noise: Any, s: float = 1.0) -> torch.Tensor:
    return NoisyFeatures(NoisyFeaturesParams(noise_std=s)).release(SimpleNamespace(dataset=SimpleNamespace(x=x)), noise)


def node_graph(n: int = 150, f: int = 6, classes: int = 3, seed: int = 0) -> NodeGraph:
    """Class-dependent Gaussian features on a ring (both directions of every edge)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    centres = torch.randn(classes, f, generator=gen) * 2
    x = centres[y] + torch.randn(n, f, generator=gen)
    u = torch.arange(n)
    v = (u + 1) % n
    edges = torch.stack([torch.cat([u, v]), torch.cat([v, u])])
    return NodeGraph("ring", x, y, edges, [f"v{i}" for i in range(n)], [f"c{c}" for c in range(classes)])


def run_config(features: str = "released:noisy_features", mechanisms: list | None = None,
               sigma: float = 1.5, steps: int = 6, batch_size: int = 16) -> Any:
    if mechanisms is None:
        mechanisms = [{"name": "noisy_features", "noise_std": 1.0}]
    return config_from_dict({
        "name": "noisy-features", "seed": 0,
        "data": {"split": {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.2, "seed": 0}},
        "sampler": {"name": "node_uniform_wor", "batch_size": batch_size},
        "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
        "accountant": {"name": "node_rdp"},
        "task": {"name": "node_classification", "features": features},
        "model": {"name": "mlp", "hidden": 16, "seed": 0},
        "mechanisms": mechanisms,
        "training": {"steps": steps, "lr": 0.05},
        "privacy": {"noise_multiplier": sigma},
        "output": {"progress": False},
    })


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


# ----------------------------------------------------------------------------- sensitivity

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 12), scale=st.floats(1e-3, 1e3),
       row=st.lists(finite, min_size=5, max_size=5), pick=st.integers(0, 11))
def test_replacing_one_node_moves_the_clipped_release_by_at_most_2(seed: int, n: int, scale: float,
                                                                  row: list[float], pick: int) -> None:
    x = torch.randn(n, 5, generator=torch.Generator().manual_seed(seed)) * scale
    r = pick % n
    neighbour = x.clone()
    neighbour[r] = torch.tensor(row)  # node r replaced by a node with arbitrary features
    a, b = release(x, ConstantNoise()), release(neighbour, ConstantNoise())
    others = torch.arange(n) != r
    assert torch.equal(a[others], b[others])
    assert float((a - b).norm()) <= NoisyFeatures(NoisyFeaturesParams(noise_std=1.0)).sensitivity() * (1 + 1e-6)
    assert bool((a.norm(dim=1) <= 1 + 1e-6).all())


def test_the_sensitivity_bound_2_is_attained_and_rows_inside_the_ball_are_kept() -> None:
    x = torch.tensor([[3.0, 4.0, 0.0], [0.1, 0.2, 0.2]])
    a, b = release(x, ConstantNoise()), release(-x, ConstantNoise())  # node 0 replaced by its negative
    assert float((a[0] - b[0]).norm()) == pytest.approx(2.0)
    assert NoisyFeatures(NoisyFeaturesParams(noise_std=1.0)).sensitivity() == 2.0
    torch.testing.assert_close(a, torch.tensor([[0.6, 0.8, 0.0], [0.1, 0.2, 0.2]]))
    inside = torch.tensor([[0.1, 0.2, 0.2]])
    noise = ConstantNoise(1.0)
    shifted = release(inside, noise, s=0.25)
    assert noise.stds == [0.25] and torch.equal(inside, torch.tensor([[0.1, 0.2, 0.2]]))  # x itself untouched
    torch.testing.assert_close(shifted, inside + 1.0)
    torch.testing.assert_close(clip_rows(torch.zeros(2, 3), 1.0), torch.zeros(2, 3))  # no 0/0


@pytest.mark.parametrize("bad", [{"noise_std": 0}, {"noise_std": -1.0}, {"noise_std": float("inf")},
                                 {"noise_std": 1.0, "clip": 2.0}])
def test_bad_options_are_refused_naming_the_field(host: PluginHost, bad: dict) -> None:
    with pytest.raises(ConfigError, match=r"mechanisms\[0\]\.(noise_std|clip)"):
        host.create("mechanism", "noisy_features", bad, where="mechanisms[0]")


# ----------------------------------------------------------------------------- accounting


@pytest.mark.parametrize("s", [0.5, 1.0, 4.0])
def test_the_event_is_the_gaussian_with_sensitivity_2_rdp_2_alpha_over_s2(s: float) -> None:
    acc = NodeReplaceRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 0.1, 100, batch_size=10),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, NODE_GDP, 1.0))
    mechanism = NoisyFeatures(NoisyFeaturesParams(noise_std=s))
    assert mechanism.unit == NODE_GDP
    acc.compose_event(mechanism.event(), "noisy_features")
    expected = acc.orders * mechanism.sensitivity() ** 2 / (2 * s**2)  # α·Δ²/(2s²), Δ = 2
    np.testing.assert_allclose(acc.total_rdp(), expected, rtol=1e-9)
    np.testing.assert_allclose(expected, 2 * acc.orders / s**2)
    assert acc.get_epsilon(1e-5) == pytest.approx(rdp_to_epsilon(acc.orders, expected, 1e-5)[0])
    assert acc.report(1e-5)["releases"] == ["noisy_features"]


# ----------------------------------------------------------------------------- noise


def test_the_release_adds_fresh_gaussian_noise_of_variance_s2() -> None:
    from graphveil.engine.noise import GaussianNoise

    s, n, f = 0.7, 2000, 50
    x = torch.randn(n, f, generator=torch.Generator().manual_seed(3)) * 3
    noise = GaussianNoise()  # the OS CSPRNG, as in a session: nothing is seeded
    first = release(x, noise, s)
    residual = (first - clip_rows(x, 1.0)).double().flatten()
    count = residual.numel()
    # sample variance of N(0, s²): relative standard error √(2/N) ≈ 0.0045; 7 SE ⇒ false alarm < 1e-11
    assert abs(float(residual.var()) / s**2 - 1) < 7 * math.sqrt(2 / count)
    assert abs(float(residual.mean())) < 7 * s / math.sqrt(count)
    second = release(x, noise, s)
    assert float((second - first).abs().min()) > 0  # fresh noise in every entry


# ----------------------------------------------------------------------------- in a session


class CountingX:
    """``dataset.x`` as NaNs behind a read counter (installed on one NodeGraph instance)."""

    def __init__(self, nan: torch.Tensor) -> None:
        self.nan, self.reads = nan, 0

    def install(self, graph: NodeGraph) -> None:
        counter = self

        class Guarded(type(graph)):
            @property
            def x(self) -> torch.Tensor:  # a data descriptor wins over the instance attribute
                counter.reads += 1
                return counter.nan

        graph.__class__ = Guarded


@pytest.mark.parametrize("features", ["released:noisy_features", "raw"])
def test_a_task_on_released_features_never_reads_dataset_x_after_the_release(host: PluginHost,
                                                                             features: str) -> None:
    graph = node_graph()
    session = TrainingSession(run_config(features), host=host, graph=graph)
    session.assemble()
    session.prepare()
    assert tuple(session.released["noisy_features"].shape) == tuple(graph.x.shape)
    guard = CountingX(torch.full_like(graph.x, float("nan")))
    guard.install(graph)
    if features == "raw":  # the control: the guard sees the raw path, and the NaNs reach the steps
        nonfinite: list[int] = []  # (each such example is left out of the clipped sum, not an error)
        session.train(on_step=lambda step, metrics: nonfinite.append(metrics["nonfinite"]))
        assert guard.reads > 0 and sum(nonfinite) > 0
        return
    train = session.train()
    evaluation = session.evaluate()
    assert guard.reads == 0
    assert math.isfinite(train["loss"]) and train["steps"] == 6
    assert all(math.isfinite(evaluation[k]) for k in ("test_accuracy", "val_accuracy"))
    assert all(bool(torch.isfinite(p.detach()).all()) for p in session.encoder.parameters())
    assert session.privacy_report()["dataset"]["features"] == "released:noisy_features"


def test_a_release_the_run_does_not_make_is_refused_before_data_is_read(host: PluginHost) -> None:
    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"data read: {name}")

    config = run_config("released:pma", mechanisms=[{"name": "noisy_features", "noise_std": 1.0}])
    with pytest.raises(ConfigError, match=r"task\.features.*'pma'.*releases \['noisy_features'\] before"):
        TrainingSession(config, host=host, graph=Untouchable()).assemble()
    for bad in ("released:", "released:Bad Name", "noisy", "x"):
        with pytest.raises(ValueError, match="released:<mechanism name>"):
            NodeClassificationParams(features=bad)
    task = NodeClassification(NodeClassificationParams(features="released:noisy_features"))
    task.setup(node_graph(n=30), run_config().data.split)
    with pytest.raises(ConfigError, match="has released nothing yet"):
        task.features()
    task.released = {"noisy_features": torch.zeros(29, 6)}
    with pytest.raises(ConfigError, match=r"released \(29, 6\), not an \(30, F\)"):
        task.features()


def test_release_plus_steps_costs_more_and_equals_both_curves_composed_by_hand(host: PluginHost) -> None:
    sigma, steps, s, b = 1.5, 6, 1.0, 16
    sessions = {}
    for label, mechanisms, features in (("both", None, "released:noisy_features"), ("steps", [], "raw")):
        session = TrainingSession(run_config(features, mechanisms, sigma, steps, b), host=host, graph=node_graph())
        session.assemble()
        session.prepare()
        session.train()
        sessions[label] = session
    both, only_steps = sessions["both"], sessions["steps"]
    delta, n = both.delta, both.num_units
    assert (only_steps.delta, only_steps.num_units, both.noise_multiplier) == (delta, n, sigma)

    by_hand = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in both.accountant.orders],
                                              neighboring_relation=NeighborRel.REPLACE_ONE)
    by_hand.compose(dp_accounting.SampledWithoutReplacementDpEvent(
        n, b, dp_accounting.GaussianDpEvent(sigma / 2)), steps)  # per-node clipping: sensitivity 2C
    steps_rdp = np.asarray(by_hand.rdp).copy()
    by_hand.compose(dp_accounting.GaussianDpEvent(s / 2))  # the release: sensitivity 2, std s

    np.testing.assert_allclose(only_steps.accountant.total_rdp(), steps_rdp, rtol=1e-9)
    np.testing.assert_allclose(both.accountant.total_rdp(), by_hand.rdp, rtol=1e-9)
    eps_both, eps_steps = both.epsilon(), only_steps.epsilon()
    assert eps_both > eps_steps > 0
    assert eps_both == pytest.approx(by_hand.get_epsilon(delta), rel=1e-9)
    report = both.privacy_report()
    assert report["epsilon"] == pytest.approx(eps_both)
