"""The method family: staged plans run against one accountant, one budget and one release store.

* one σ for the whole plan: a release that leaves its noise unset takes the run's calibrated σ,
  the plan (release + steps) meets the target ε, and the accountant's ε equals both curves
  composed by hand with dp-accounting; the same target without the release gives a smaller σ;
* the calibrated release really carries noise of std σ · sensitivity (statistical check);
* a plugin method with fixed and calibrated releases, post-processing before training (reading
  only the released store) and after it (the trained model in the store);
* a plan with releases and no training: σ calibrated for the releases alone, no steps;
* malformed plans and methods are refused before data is read.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any

import dp_accounting
import numpy as np
import pytest
import torch

from graphveil.contract.errors import ConfigError, PluginError, PrivacyError
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import MODEL_KEY, Method, Plan, PostProcess, Release, Train
from graphveil.data.node_graph import NodeGraph
from graphveil.plugins.node_dp.mechanisms import NoisyFeatures, NoisyFeaturesParams, clip_rows
from graphveil.privacy.conversion import rdp_to_epsilon
from graphveil.run.config import config_from_dict
from graphveil.run.session import TrainingSession

NeighborRel = dp_accounting.privacy_accountant.NeighboringRelation
TARGET, STEPS, BATCH = 4.0, 6, 16


def node_graph(n: int = 150, f: int = 40, classes: int = 3, seed: int = 0) -> NodeGraph:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % classes
    x = (torch.randn(classes, f, generator=gen) * 2)[y] + torch.randn(n, f, generator=gen)
    u = torch.arange(n)
    edges = torch.stack([torch.cat([u, (u + 1) % n]), torch.cat([(u + 1) % n, u])])
    return NodeGraph("ring", x, y, edges, [f"v{i}" for i in range(n)], [f"c{c}" for c in range(classes)])


def config(*, mechanisms: list | None = None, features: str = "released:noisy_features",
           method: str = "dp_sgd", privacy: dict | None = None, steps: int = STEPS) -> Any:
    return config_from_dict({
        "name": "methods", "seed": 0,
        "data": {"split": {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.2, "seed": 0}},
        "method": {"name": method},
        "sampler": {"name": "node_uniform_wor", "batch_size": BATCH},
        "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
        "accountant": {"name": "node_rdp"},
        "task": {"name": "node_classification", "features": features},
        "model": {"name": "mlp", "hidden": 16, "seed": 0},
        "mechanisms": [{"name": "noisy_features"}] if mechanisms is None else mechanisms,
        "training": {"steps": steps, "lr": 0.05},
        "privacy": privacy or {"target_epsilon": TARGET},
        "output": {"progress": False},
    })


def by_hand_epsilon(session: TrainingSession, steps: int, gaussians: list[float]) -> float:
    """ε of ``steps`` sampled-WOR steps (per-node clipping: multiplier σ/2) plus Gaussian releases
    with the given noise multipliers, composed by dp-accounting under replace-one adjacency."""
    acc = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in session.accountant.orders],
                                          neighboring_relation=NeighborRel.REPLACE_ONE)
    if steps:
        acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(
            session.num_units, BATCH, dp_accounting.GaussianDpEvent(session.noise_multiplier / 2)), steps)
    for multiplier in gaussians:
        acc.compose(dp_accounting.GaussianDpEvent(multiplier))
    return rdp_to_epsilon(session.accountant.orders, np.asarray(acc.rdp), session.delta)[0]


def run(cfg: Any, host: PluginHost, graph: NodeGraph | None = None) -> TrainingSession:
    session = TrainingSession(cfg, host=host, graph=graph or node_graph())
    session.train()
    session.evaluate()
    return session


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


# ----------------------------------------------------------------------------- one budget


def test_a_release_without_noise_takes_the_shared_sigma_and_the_plan_meets_the_target(host: PluginHost) -> None:
    both = run(config(), host)
    sigma = both.noise_multiplier
    epsilon = both.epsilon()
    assert epsilon <= TARGET and epsilon == pytest.approx(TARGET, rel=0.01)  # calibrated, conservative side
    # the release counted at multiplier σ (std σ·2 over sensitivity 2), the steps at σ/2
    assert epsilon == pytest.approx(by_hand_epsilon(both, STEPS, [sigma]), rel=1e-9)
    assert both.privacy_report()["releases"] == ["noisy_features"]
    steps_only = run(config(mechanisms=[], features="raw"), host)
    assert steps_only.epsilon() == pytest.approx(TARGET, rel=0.01)
    assert steps_only.noise_multiplier < sigma  # the release takes a share of the same budget


def test_the_calibrated_release_carries_noise_of_std_sigma_times_sensitivity(host: PluginHost) -> None:
    graph = node_graph(n=300, f=60)
    session = TrainingSession(config(steps=1), host=host, graph=graph)
    session.prepare()
    residual = (session.released["noisy_features"] - clip_rows(graph.x, 1.0)).double().flatten()
    std = 2.0 * session.noise_multiplier  # σ · sensitivity 2
    # sample variance: relative SE √(2/N) ≈ 0.0082 for N = 18000; 7 SE ⇒ false alarm < 1e-11
    assert abs(float(residual.var()) / std**2 - 1) < 7 * math.sqrt(2 / residual.numel())


def test_an_explicit_noise_multiplier_is_shared_with_calibrated_releases(host: PluginHost) -> None:
    session = run(config(privacy={"noise_multiplier": 3.0}), host)
    assert session.noise_multiplier == 3.0
    assert session.epsilon() == pytest.approx(by_hand_epsilon(session, STEPS, [3.0]), rel=1e-9)


# ----------------------------------------------------------------------------- a plugin method


class TwoReleasesPostProcessed(Method):
    """A fixed-noise and a calibrated feature release, their mean row-normalised (before
    training), and the trained model's weight norm (after training)."""

    seen: list[Any] = []

    def plan(self, config: Any, mechanisms: Any) -> Plan:
        def normalise(released: Any) -> torch.Tensor:
            self.seen.append(released)
            return clip_rows((released["fixed"] + released["shared"]) / 2, 1.0)

        def weight_norm(released: Any) -> float:
            self.seen.append(released)
            return float(sum(p.detach().pow(2).sum() for p in released[MODEL_KEY].parameters()))

        return Plan((Release("fixed", NoisyFeatures(NoisyFeaturesParams(noise_std=6.0))),
                     Release("shared", NoisyFeatures()), PostProcess("normed", normalise), Train(),
                     PostProcess("weight_norm", weight_norm)))


class NoTraining(Method):
    def plan(self, config: Any, mechanisms: Any) -> Plan:
        return Plan((Release("noisy_features", NoisyFeatures()),))


class NotAPlan(Method):
    def plan(self, config: Any, mechanisms: Any) -> Any:
        return [Train()]


class MethodsPlugin:
    @hookimpl
    def graphveil_methods(self) -> dict[str, Any]:
        return {"two_releases": TwoReleasesPostProcessed, "no_training": NoTraining, "not_a_plan": NotAPlan}


@pytest.fixture(scope="module")
def plugin_host() -> PluginHost:
    host = PluginHost()
    host.register(MethodsPlugin(), "test_methods")
    return host


def test_a_plugin_method_releases_post_processes_trains_and_post_processes(plugin_host: PluginHost) -> None:
    TwoReleasesPostProcessed.seen.clear()
    session = run(config(method="two_releases", mechanisms=[], features="released:normed"), plugin_host)
    before, after = TwoReleasesPostProcessed.seen
    # post-processing sees only the released store, read-only; the model only after training
    assert isinstance(before, MappingProxyType) and set(before) == {"fixed", "shared"}
    assert set(after) == {"fixed", "shared", "normed", MODEL_KEY} and after[MODEL_KEY] is session.encoder
    assert session.released["weight_norm"] > 0
    assert session.privacy_report()["releases"] == ["fixed", "shared"]
    epsilon = session.epsilon()
    assert epsilon <= TARGET and epsilon == pytest.approx(TARGET, rel=0.01)
    # the fixed release at its own multiplier 6/2 = 3, the calibrated one at σ
    assert epsilon == pytest.approx(by_hand_epsilon(session, STEPS, [3.0, session.noise_multiplier]), rel=1e-9)
    assert float(session.released["normed"].norm(dim=1).max()) <= 1.0 + 1e-6


def test_a_plan_without_training_calibrates_sigma_for_its_releases_alone(plugin_host: PluginHost) -> None:
    session = run(config(method="no_training", mechanisms=[]), plugin_host)
    assert session.steps_done == 0
    assert session.epsilon() == pytest.approx(TARGET, rel=0.01)
    assert session.epsilon() == pytest.approx(by_hand_epsilon(session, 0, [session.noise_multiplier]), rel=1e-9)
    with pytest.raises(ConfigError, match="'no_training' has no training stage; 3 steps"):
        session.train(3)


def test_a_method_must_return_a_plan(plugin_host: PluginHost) -> None:
    with pytest.raises(PluginError, match="'not_a_plan' returned list, not a graphveil.contract.method.Plan"):
        TrainingSession(config(method="not_a_plan"), host=plugin_host, graph=node_graph()).assemble()


def test_the_task_refuses_features_no_stage_releases_before_training(plugin_host: PluginHost) -> None:
    cfg = config(method="two_releases", mechanisms=[], features="released:weight_norm")
    with pytest.raises(ConfigError, match=r"releases \['fixed', 'shared', 'normed'\] before training"):
        TrainingSession(cfg, host=plugin_host, graph=node_graph()).assemble()


# ----------------------------------------------------------------------------- plan checks


def test_malformed_plans_are_refused() -> None:
    release = Release("a", NoisyFeatures())
    with pytest.raises(ConfigError, match="at most one Train stage, got 2"):
        Plan((Train(), release, Train()))
    with pytest.raises(ConfigError, match="'a' is used twice"):
        Plan((release, PostProcess("a", lambda r: None)))
    with pytest.raises(ConfigError, match="'model' is reserved"):
        Plan((PostProcess(MODEL_KEY, lambda r: None),))
    with pytest.raises(ConfigError, match="stage 0 is str"):
        Plan(("train",))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="int is not a Mechanism"):
        Plan((Release("b", 3),))  # type: ignore[arg-type]
    plan = Plan((release, Train(), PostProcess("p", lambda r: None)))
    assert [type(s) for s in plan.before_training()] == [Release]
    assert [type(s) for s in plan.after_training()] == [PostProcess] and plan.trains


def test_calibration_with_nothing_that_depends_on_sigma_is_refused(host: PluginHost) -> None:
    session = TrainingSession(config(steps=1), host=host, graph=node_graph())
    session.prepare()
    fixed: Mechanism = NoisyFeatures(NoisyFeaturesParams(noise_std=2.0))
    with pytest.raises(PrivacyError, match="nothing in the plan depends on the noise multiplier"):
        session.accountant.calibrate(target_epsilon=1.0, delta=1e-5, num_steps=0,
                                     releases=lambda sigma: [("fixed", fixed.event())])
