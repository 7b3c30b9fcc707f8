"""Paper 2's randomized-response baseline (method ``rr_finetune``).

* the release decides every unordered pair of training entities once: true relations survive
  at rate e^ε/(1+e^ε), non-relations appear at 1/(1+e^ε) (binomial bounds), only training-side
  entities are involved, and the released graph keeps their ids and texts;
* a run accounts exactly ε (pure, δ = 0: basic composition of one RR), trains without noise on
  the released relations (the sampler is bound to them after the release) and evaluates;
* the plan refuses a task that does not read the release, a σ, and extra mechanisms.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from _graphs import make_graph

from graphveil.contract.errors import ConfigError
from graphveil.plugins.edge_dp.rr_baseline import RELATIONS, RelationRR
from graphveil.privacy.randomized_response import flip_probability
from graphveil.run.config import config_from_dict


def toy_task(n: int = 120, m: int = 300, seed: int = 0) -> Any:
    gen = torch.Generator().manual_seed(seed)
    graph = make_graph(n, torch.randint(0, n, (m, 2), generator=gen), name="toy")
    graph.texts = [f"entity {i}" for i in range(n)]
    return types.SimpleNamespace(train_graph=graph)


def test_every_pair_is_decided_once_at_the_rates_of_epsilon() -> None:
    task, eps = toy_task(), 0.7
    true = {tuple(e) for e in task.train_graph.edges.tolist()}
    n, p = task.train_graph.num_nodes, flip_probability(eps)
    pairs = n * (n - 1) // 2
    kept = flipped = 0
    draws = 40
    for seed in range(draws):
        released = RelationRR(eps, seed, 10**7).release(task, None)
        assert released.entity_ids == task.train_graph.entity_ids and released.texts == task.train_graph.texts
        edges = released.edges
        assert bool((edges[:, 0] < edges[:, 1]).all()) and int(edges.max()) < n
        assert torch.unique(edges, dim=0).shape[0] == edges.shape[0]  # one decision per pair
        out = {tuple(e) for e in edges.tolist()}
        kept += len(out & true)
        flipped += len(out - true)
    m, n0 = len(true) * draws, (pairs - len(true)) * draws
    assert abs(kept - m * (1 - p)) < 5 * math.sqrt(m * p * (1 - p))
    assert abs(flipped - n0 * p) < 5 * math.sqrt(n0 * p * (1 - p))


def test_a_run_keeps_and_flips_relations_at_the_epsilon_its_report_states(tmp_path: Path) -> None:
    """The release a run accounts, measured: true relations kept and non-relations turned into
    relations at the rates of p = 1/(1 + e^ε), ε the pure ε of the run's privacy report (what the
    accountant composed), each count inside its binomial quantiles at 1e-9 on each side (a correct
    release fails with probability < 4e-9; research noise seed, so the test is deterministic).
    At ε = 3 the 417 training entities give ~4,110 ± 63 flips: a release at 2ε (p ≈ 0.0025: ~220)
    or ε/2 (p ≈ 0.18) is far outside."""
    from scipy import stats

    from graphveil.contract.host import default_host
    from graphveil.run.session import TrainingSession

    session = TrainingSession(run_config(tmp_path, privacy={"target_epsilon": 3.0, "research_noise_seed": 9}),
                              host=default_host())
    session.prepare()
    eps = session.privacy_report()["epsilon"]
    p = 1.0 / (1.0 + math.exp(eps))
    graph = session.task.train_graph
    true = {tuple(e) for e in graph.edges.tolist()}
    released = {tuple(e) for e in session.released[RELATIONS].edges.tolist()}
    non_edges = graph.num_nodes * (graph.num_nodes - 1) // 2 - len(true)
    for count, trials, rate in ((len(released & true), len(true), 1.0 - p), (len(released - true), non_edges, p)):
        low, high = stats.binom.ppf(1e-9, trials, rate), stats.binom.isf(1e-9, trials, rate)
        assert low <= count <= high, (count, trials, rate, low, high)


def test_non_private_release_is_the_training_graph_and_sizes_are_refused_before_drawing() -> None:
    task = toy_task()
    assert RelationRR(None, None, 10).release(task, None) is task.train_graph
    with pytest.raises(ValueError, match="max_output_edges"):
        RelationRR(0.1, 0, 1000).release(task, None)


def run_config(tmp_path: Path, **overrides: Any) -> Any:
    raw = {
        "name": "rr", "seed": 1,
        "method": {"name": "rr_finetune"},
        "data": {"source": "citeseer", "max_entities": 600, "split": {"train_fraction": 0.7, "seed": 0}},
        "task": {"name": "relational", "relations": f"released:{RELATIONS}"},
        "sampler": {"name": "edge_poisson_decoupled", "batch_size": 16, "k_neg": 2},
        "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_rdp"},
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 12, "lora_layers": 1, "seed": 5},
        "training": {"steps": 4, "optimizer": "sgd", "lr": 0.01},
        "privacy": {"target_epsilon": 6.0},
        "evaluation": {"max_edges": 32},
        "output": {"progress": False, "dir": str(tmp_path / "run")},
    }
    for key, value in overrides.items():
        raw[key] = value
    return config_from_dict(raw)


def test_a_run_spends_exactly_epsilon_and_trains_on_the_released_relations(tmp_path: Path) -> None:
    from graphveil.contract.host import default_host
    from graphveil.run.session import TrainingSession

    session = TrainingSession(run_config(tmp_path), host=default_host())
    session.prepare()
    released = session.released[RELATIONS]
    assert session.task.train_view is released and released.num_edges != session.task.train_graph.num_edges
    assert session.sampling_profile.num_records == released.num_edges  # the sampler reads the release
    session.train()
    assert session.noise_multiplier == 0.0 and session.epsilon() == pytest.approx(6.0, abs=1e-12)
    report = session.privacy_report()
    assert report["releases"] == [RELATIONS] and report["training"].startswith("non-private: edge level")
    metrics = session.evaluate()
    assert 0.0 <= metrics["mrr"] <= 1.0


def test_the_written_privacy_report_is_pure_epsilon(tmp_path: Path) -> None:
    from graphveil.contract.host import default_host
    from graphveil.run.runner import run_training

    run_training(run_config(tmp_path), host=default_host())
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert report["epsilon"] == pytest.approx(6.0, abs=1e-12) and report["noise_multiplier"] == 0.0


@pytest.mark.parametrize(("overrides", "message"), [
    ({"task": {"name": "relational"}}, "relations: released:rr_relations"),
    ({"privacy": {"noise_multiplier": 1.0}}, "target_epsilon"),
])
def test_the_plan_refuses_what_it_cannot_account(tmp_path: Path, overrides: dict, message: str) -> None:
    from graphveil.contract.host import default_host
    from graphveil.run.session import TrainingSession

    with pytest.raises(ConfigError, match=message):
        TrainingSession(run_config(tmp_path, **overrides), host=default_host()).assemble()


def test_a_dp_sgd_stage_may_not_train_on_a_release(tmp_path: Path) -> None:
    """The sampler is bound to a release only for training without noise: with DP-SGD its
    profile would change after σ was calibrated for the raw training side."""
    from graphveil.contract.hookspecs import hookimpl
    from graphveil.contract.host import PluginHost
    from graphveil.contract.method import Method, Plan, Release, Train
    from graphveil.run.session import TrainingSession

    class PrivateOnRelease(Method):
        def plan(self, config: Any, mechanisms: Any) -> Plan:
            return Plan((Release(RELATIONS, RelationRR(2.0, 0, 10**7)), Train()))

    class Plugin:
        @hookimpl
        def graphveil_methods(self):
            return {"private_on_release": PrivateOnRelease}

    host = PluginHost()
    host.register(Plugin(), "test-private-on-release")
    cfg = run_config(tmp_path, method={"name": "private_on_release"})
    with pytest.raises(ConfigError, match="must train without noise"):
        TrainingSession(cfg, host=host).prepare()
