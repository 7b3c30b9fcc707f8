"""DP-MLP's privacy pieces (paper 4 baseline): WOR node sampler, per-node clipping, replace-one RDP.

* accountant: reduces to the plain Gaussian with replace-one sensitivity 2C when b = n (RDP
  2α/σ²), is at most that bound for b < n, is monotone in σ and b, and composes over steps;
* sampler: b distinct training nodes, each node's inclusion frequency b/n, fresh every step;
* clipper: replacing one node of a batch moves the clipped sum of per-node gradients by at most
  2C (property test on random MLPs and features, per-node gradients by a naive loop);
* invariant: DP-MLP's unit (node, replacement, predictions) is refused next to any other unit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphveil.contract.errors import PrivacyError, ProfileMismatchError
from graphveil.contract.invariant import check_run
from graphveil.contract.profiles import (
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.contract.task import NodeBatch
from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind
from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant
from graphveil.plugins.node_dp.clipping import PerNodeClipper
from graphveil.plugins.node_dp.sampler import UniformNodeParams, UniformNodeSampler
from graphveil.plugins.node_dp.units import NODE_GDP


def bound(n: int, b: int, clip: float = 1.0) -> NodeReplaceRdpAccountant:
    acc = NodeReplaceRdpAccountant()
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, b / n, n, batch_size=b),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, NODE_GDP, clip))
    return acc


@pytest.mark.parametrize("sigma", [0.8, 2.0, 7.5])
def test_full_batch_is_the_gaussian_with_replace_one_sensitivity_2c(sigma: float) -> None:
    acc = bound(50, 50)
    expected = 2.0 * acc.orders / sigma**2  # α·Δ²/(2σ²) with Δ = 2 (in units of C)
    np.testing.assert_allclose(acc.per_step_rdp(sigma), expected, rtol=1e-6)


def test_subsampling_only_helps_and_more_noise_only_helps() -> None:
    full = bound(2000, 2000).per_step_rdp(3.0)
    small, large = bound(2000, 64).per_step_rdp(3.0), bound(2000, 256).per_step_rdp(3.0)
    finite = np.isfinite(small) & np.isfinite(large)
    assert finite.sum() > 50
    assert np.all(small[finite] <= large[finite] + 1e-12) and np.all(large[finite] <= full[finite] + 1e-12)
    assert np.all(bound(2000, 64).per_step_rdp(6.0)[finite] <= small[finite] + 1e-12)


def test_steps_compose_additively_and_epsilon_is_calibrated() -> None:
    acc = bound(2031, 64)
    sigma = acc.calibrate(target_epsilon=4.0, delta=1e-5, num_steps=200)
    acc.step(noise_multiplier=sigma, num_steps=200)
    eps = acc.get_epsilon(1e-5)
    assert 3.9 < eps <= 4.0
    np.testing.assert_allclose(acc.total_rdp(), 200 * acc.per_step_rdp(sigma))


def test_sampler_draws_b_distinct_nodes_with_inclusion_rate_b_over_n() -> None:
    n, b, draws = 40, 8, 4000
    sampler = UniformNodeSampler(UniformNodeParams(batch_size=b))
    profile = sampler.prepare(torch.arange(n), torch.Generator().manual_seed(0))
    assert (profile.kind, profile.num_records, profile.batch_size) == (SamplingKind.UNIFORM_WOR, n, b)
    assert profile.rate == pytest.approx(b / n)
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(n)
    first = None
    for _ in range(draws):
        nodes = sampler.sample(gen).nodes
        assert nodes.numel() == b and nodes.unique().numel() == b and int(nodes.max()) < n
        counts[nodes] += 1
        first = nodes if first is None else first
    expected = draws * b / n
    sd = math.sqrt(draws * (b / n) * (1 - b / n))
    assert float((counts - expected).abs().max()) < 5 * sd
    assert not torch.equal(sampler.sample(gen).nodes, first)  # fresh each step


def test_sampler_refuses_a_batch_larger_than_the_training_set() -> None:
    with pytest.raises(PrivacyError, match="exceeds"):
        UniformNodeSampler(UniformNodeParams(batch_size=11)).prepare(torch.arange(10), torch.Generator())


def test_full_batch_sampler_takes_every_training_node_and_is_accounted_as_b_equals_n() -> None:
    n = 37
    sampler = UniformNodeSampler(UniformNodeParams(batch_size=None))
    profile = sampler.prepare(torch.arange(n), torch.Generator().manual_seed(0))
    assert (profile.num_records, profile.batch_size, profile.rate) == (n, n, 1.0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        assert sorted(sampler.sample(gen).nodes.tolist()) == list(range(n))
    acc = NodeReplaceRdpAccountant()
    acc.bind(profile, SensitivityProfile(SensitivityKind.PER_EXAMPLE, NODE_GDP, 1.0))
    np.testing.assert_allclose(acc.per_step_rdp(2.0), 2.0 * acc.orders / 2.0**2, rtol=1e-6)


def per_node_grads(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    grads = []
    for i in range(x.shape[0]):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()]))
    return grads


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 12), clip=st.floats(0.01, 5.0), scale=st.floats(0.1, 50.0))
def test_replacing_one_node_moves_the_clipped_sum_by_at_most_2c(seed: int, b: int, clip: float, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.SELU(), torch.nn.Linear(5, 3))
    x = torch.randn(b + 1, 6, generator=gen) * scale
    y = torch.randint(0, 3, (b + 1,), generator=gen)
    grads = per_node_grads(model, x, y)
    clipper = PerNodeClipper(PerNodeClipper.Params(clip_norm=clip))

    def clipped_sum(rows: list[int]) -> torch.Tensor:
        g = torch.stack([grads[r] for r in rows])
        f = clipper.factors(NodeBatch(torch.tensor(rows)), g.norm(dim=1))
        return (f[:, None] * g).sum(0)

    batch = list(range(b))
    neighbour = batch[:-1] + [b]  # the last node replaced by another one
    assert float((clipped_sum(batch) - clipped_sum(neighbour)).norm()) <= 2 * clip * (1 + 1e-5)


def test_dp_mlp_unit_is_refused_next_to_another_unit() -> None:
    sampler, clipper = UniformNodeSampler(), PerNodeClipper()
    unit = check_run(private=True, sampler=("node_uniform_wor", sampler), clipper=("per_node_clip", clipper),
                     accountant=("node_rdp", NodeReplaceRdpAccountant()))
    assert unit == NODE_GDP and unit.adjacency is Adjacency.REPLACEMENT and unit.protects_predictions
    assert unit != PrivacyUnit(UnitKind.NODE, Adjacency.REPLACEMENT)  # a whole-value comparison
    with pytest.raises(ProfileMismatchError, match="edge_rdp"):
        check_run(private=True, sampler=("node_uniform_wor", sampler), clipper=("per_node_clip", clipper),
                  accountant=("edge_rdp", EdgeRdpAccountant()))

    class AddRemoveClipper(PerNodeClipper):
        unit = PrivacyUnit.NODE

    with pytest.raises(PrivacyError, match="privacy units disagree.*node/replacement/predictions.*node\\b"):
        check_run(private=True, sampler=("node_uniform_wor", sampler), clipper=("mine", AddRemoveClipper()),
                  accountant=("node_rdp", NodeReplaceRdpAccountant()))


def test_unit_labels_round_trip_and_keep_the_relational_labels() -> None:
    assert PrivacyUnit.NODE.value == "node" and PrivacyUnit.EDGE.value == "edge"
    for unit in (NODE_GDP, PrivacyUnit(UnitKind.K_NEIGHBOR, Adjacency.REPLACEMENT, degree_bound=100, k=5),
                 PrivacyUnit.NODE, PrivacyUnit(UnitKind.UNDIRECTED_EDGE)):
        assert PrivacyUnit.parse(unit.value) == unit
    with pytest.raises(ValueError, match="k is set exactly"):
        PrivacyUnit(UnitKind.NODE, k=3)


def test_a_whole_graph_model_is_refused_for_private_training_before_data_is_read() -> None:
    from graphveil.contract.hookspecs import hookimpl
    from graphveil.contract.host import PluginHost
    from graphveil.contract.invariant import check_structure
    from graphveil.contract.profiles import ExampleStructure
    from graphveil.plugins.node_classification.mlp import MLP
    from graphveil.run.config import config_from_dict
    from graphveil.run.session import TrainingSession

    class FullGraphGCN(MLP):
        """Mixes every node in one forward."""

        structure = ExampleStructure.WHOLE_GRAPH

    class Plugin:
        @hookimpl
        def graphveil_models(self):
            return {"full_gcn": FullGraphGCN}

    host = PluginHost()
    host.register(Plugin(), "full_gcn_plugin")
    raw = {
        "data": {"source": "planetoid", "split": {"kind": "random_node"}},
        "task": {"name": "node_classification"}, "model": {"name": "full_gcn"},
        "sampler": {"name": "node_uniform_wor"}, "clipper": {"name": "per_node_clip"},
        "accountant": {"name": "node_rdp"}, "privacy": {"target_epsilon": 4},
    }
    with pytest.raises(PrivacyError, match="'full_gcn' mixes every node"):
        TrainingSession(config_from_dict(raw), host=host).assemble()
    TrainingSession(config_from_dict({**raw, "privacy": {"enabled": False}}), host=host).assemble()
    check_structure("mlp", MLP())  # a rows model passes
    with pytest.raises(PrivacyError, match="declares no per-example structure"):
        check_structure("plain", torch.nn.Linear(2, 2))
