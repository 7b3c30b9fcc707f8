"""Paper 2's evaluation protocols beside zero-shot relation prediction: few-shot relation
prediction (released model fine-tuned without noise on 16 + 16 test-domain relations), few-shot
entity classification (linear head on frozen embeddings, macro/micro-F1), and domains cut from one
graph by class (``data.classes``) for the two-graph transfer setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from _paths import REPO

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.model import Encoder
from graphveil.data import RelationalGraph, load_data
from graphveil.evaluation import few_shot_classification, fit_linear_probe
from graphveil.plugins.relational.few_shot import few_shot_relation_prediction, split_few_shot
from graphveil.plugins.relational.losses import LossSpec
from graphveil.run.config import DataConfig, FewShotConfig, config_from_dict
from graphveil.run.session import TrainingSession


class LinearEncoder(Encoder):
    """A linear map of fixed entity features: the smallest encoder whose few-shot fine-tuning
    can generalise to relations it did not see."""

    def __init__(self, features: torch.Tensor, dim: int = 16, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.features = features
        self.proj = torch.nn.Linear(features.shape[1], dim, bias=False)

    def prepare(self, graph: RelationalGraph) -> None:
        pass

    def embed(self, entity_ids: torch.Tensor) -> torch.Tensor:
        return self.proj(self.features[entity_ids])

    def save(self, directory: Path) -> None:
        raise NotImplementedError


def paired(pairs: int = 120, shared: int = 8, noise: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Entities 2i and 2i+1 are related and share a code; louder private noise hides it until an
    encoder learns to project the noise away (which transfers to every pair)."""
    gen = torch.Generator().manual_seed(seed)
    code = torch.randn(pairs, shared, generator=gen).repeat_interleave(2, dim=0)
    features = torch.cat([code, 2.0 * torch.randn(2 * pairs, noise, generator=gen)], dim=1)
    return features, torch.arange(2 * pairs).reshape(pairs, 2)


# ------------------------------------------------------------------------- few-shot relations


def test_split_few_shot_is_disjoint_seeded_and_sized() -> None:
    edges = paired(60)[1]
    train, val, test = split_few_shot(edges, 16, 16, seed=3)
    assert (train.shape[0], val.shape[0], test.shape[0]) == (16, 16, 28)
    as_set = [{tuple(e) for e in part.tolist()} for part in (train, val, test)]
    assert set.union(*as_set) == {tuple(e) for e in edges.tolist()} and sum(map(len, as_set)) == 60
    again = split_few_shot(edges, 16, 16, seed=3)
    assert all(torch.equal(a, b) for a, b in zip((train, val, test), again, strict=True))
    assert not torch.equal(split_few_shot(edges, 16, 16, seed=4)[0], train)
    with pytest.raises(ConfigError, match="held-out side has 33"):
        split_few_shot(edges[:33], 16, 16, seed=0)


def run_few_shot(lr: float, optimizer: str = "adam", **config) -> tuple[dict, LinearEncoder, torch.Tensor]:
    features, edges = paired()
    model = LinearEncoder(features)
    released = model.proj.weight.detach().clone()
    nodes = torch.arange(features.shape[0])
    with torch.no_grad():
        z = model.embed(nodes)
    out = few_shot_relation_prediction(
        model, edges, nodes, z, FewShotConfig(**config), LossSpec(kind="infonce", temperature=0.1),
        lr=lr, optimizer=optimizer, batch_size=64, max_edges=None, seed=0)
    return out, model, released


def test_few_shot_learns_from_the_test_domain_and_restores_the_released_weights() -> None:
    out, model, released = run_few_shot(0.02, steps=60, eval_every=5, negatives=8)
    # the released weights are what a run saves and a site shares, never the few-shot ones
    assert torch.equal(model.proj.weight.detach(), released)
    assert out["fewshot_relations"] == 120 - 32
    assert out["fewshot_step"] > 0  # validation chose a fine-tuned step
    assert out["fewshot_mrr"] > out["fewshot_released_mrr"] + 0.3  # measured 0.23 → 0.80


def test_few_shot_keeps_the_released_model_when_validation_does_not_improve() -> None:
    out, model, released = run_few_shot(1e-12, "sgd", steps=2, eval_every=1)
    assert out["fewshot_step"] == 0 and torch.equal(model.proj.weight.detach(), released)
    assert (out["fewshot_prec1"], out["fewshot_mrr"]) == (out["fewshot_released_prec1"], out["fewshot_released_mrr"])


# ----------------------------------------------------------------------- entity classification


def clusters(classes: int, per: int, dim: int = 16, spread: float = 0.1, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=gen) * 3
    labels = torch.arange(classes).repeat_interleave(per)
    return centres[labels] + spread * torch.randn(labels.numel(), dim, generator=gen), labels


def test_entity_classification_separates_separable_classes() -> None:
    z, labels = clusters(4, 40)
    out = few_shot_classification(z, labels, per_class=8, draws=3, seed=0)
    assert out["ec_macro_f1"] == 1.0 and out["ec_micro_f1"] == 1.0
    assert out["ec_classes"] == 4 and out["ec_test_entities"] == 4 * (40 - 16)


def test_entity_classification_is_at_chance_on_noise() -> None:
    gen = torch.Generator().manual_seed(1)
    z, labels = torch.randn(1200, 16, generator=gen), torch.arange(4).repeat(300)
    out = few_shot_classification(z, labels, per_class=8, draws=5, seed=0)
    assert 0.15 < out["ec_micro_f1"] < 0.35


def test_entity_classification_leaves_out_small_classes_and_unlabelled_entities() -> None:
    z, labels = clusters(3, 40)
    labels = labels.clone()
    labels[80:] = torch.where(torch.arange(40) < 16, 2, -1)  # class 2: 16 entities < 2·8 + 1
    out = few_shot_classification(z, labels, per_class=8, draws=1, seed=0)
    assert out["ec_classes"] == 2 and out["ec_test_entities"] == 2 * (40 - 16)
    with pytest.raises(ValueError, match="two classes with at least 17"):
        few_shot_classification(z[:60], labels[:60].clamp(max=0), per_class=8, draws=1, seed=0)


def test_linear_probe_matches_scikit_learn_logistic_regression() -> None:
    from sklearn.linear_model import LogisticRegression

    gen = torch.Generator().manual_seed(2)
    x = torch.nn.functional.normalize(torch.randn(48, 10, generator=gen, dtype=torch.float64), dim=-1)
    y = torch.arange(3).repeat(16)
    penalty = 1e-2
    head = fit_linear_probe(x, y, 3, penalty)
    # ours: mean cross-entropy + λ‖W‖²; scikit-learn: C·Σ cross-entropy + ½‖W‖², so C = 1 / (2nλ)
    ref = LogisticRegression(C=1 / (2 * 48 * penalty), tol=1e-10, max_iter=10_000).fit(x.numpy(), y.numpy())
    with torch.no_grad():
        ours = torch.softmax(head(x), dim=1)
    assert torch.allclose(ours, torch.from_numpy(ref.predict_proba(x.numpy())), atol=1e-4)


# ------------------------------------------------------------------------------- configuration


def test_data_classes_keeps_the_named_classes_and_the_relations_among_them() -> None:
    whole = load_data(DataConfig(source="citeseer"))
    part = load_data(DataConfig(source="citeseer", classes=["DB", "IR"]))
    keep = {whole.label_names.index("DB"), whole.label_names.index("IR")}
    mask = torch.tensor([int(c) in keep for c in whole.labels])
    assert part.num_nodes == int(mask.sum())
    assert set(part.labels.tolist()) == keep
    ids = set(part.entity_ids)
    inside = [e for e in whole.edges.tolist() if whole.entity_ids[e[0]] in ids and whole.entity_ids[e[1]] in ids]
    assert part.num_edges == len(inside)
    with pytest.raises(DataError, match="no class 'Robotics'.*'AI'"):
        load_data(DataConfig(source="citeseer", classes=["Robotics"]))


BASE = {
    "name": "protocols",
    "data": {"source": "citeseer", "max_entities": 800, "split": {"train_fraction": 0.6}},
    "sampler": {"name": "edge_poisson_decoupled", "batch_size": 32, "k_neg": 2},
    "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
    "accountant": {"name": "edge_rdp"},
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 16, "lora_layers": 1},
    "training": {"steps": 2, "lr": 0.01},
    "privacy": {"target_epsilon": 8.0},
    "evaluation": {"batch_size": 64, "few_shot": {"steps": 4, "eval_every": 2},
                   "entity_classification": {"per_class": 4, "draws": 1}},
}


def test_a_task_without_the_protocol_refuses_it() -> None:
    raw = yaml.safe_load(REPO.joinpath("examples", "dp_mlp_cora.yaml").read_text())
    raw["evaluation"] = {"few_shot": {}}
    session = TrainingSession(config_from_dict(raw, "dp_mlp"))
    with pytest.raises(ConfigError, match="evaluation.few_shot: task 'node_classification' does not run"):
        session.assemble()


@pytest.mark.slow
def test_run_reports_both_protocols_and_keeps_the_released_adapter() -> None:
    from graphveil.run.runner import result_columns

    session = TrainingSession(config_from_dict(BASE, "protocols"))
    session.train()
    trained = session.trainable_state()
    evaluation = session.evaluate()
    assert {"prec1", "mrr", "fewshot_prec1", "fewshot_mrr", "fewshot_released_mrr", "ec_macro_f1",
            "ec_micro_f1"} <= set(evaluation)
    assert 0 <= evaluation["ec_micro_f1"] <= 1 and 0 <= evaluation["fewshot_prec1"] <= evaluation["fewshot_mrr"] <= 1
    headers = [h for _, h, _ in result_columns(session)]
    assert {"few-shot MRR", "EC macro-F1", "EC micro-F1"} <= set(headers)
    # few-shot fine-tuning leaves no trace in the model a run saves after evaluation
    after = session.trainable_state()
    assert after.keys() == trained.keys() and all(torch.equal(after[k], trained[k]) for k in trained)
    assert session.privacy_report()["epsilon"] <= 8.0 + 1e-9


@pytest.mark.slow
def test_two_graph_protocols_read_graph_b_and_its_labels() -> None:
    raw = dict(BASE, data={"source": "citeseer", "classes": ["DB", "IR", "HCI"], "max_entities": 400, "split": {
        "kind": "two_graphs", "eval_data": {"source": "citeseer", "classes": ["AI", "ML"], "max_entities": 400}}},
        training={"steps": 1, "lr": 0.01})
    raw["evaluation"] = {"batch_size": 64, "entity_classification": {"per_class": 4, "draws": 1}}
    session = TrainingSession(config_from_dict(raw, "two graphs"))
    session.train()
    evaluation = session.evaluate()
    graph_b = session.task.test_graph
    assert graph_b.num_nodes == 400 and set(graph_b.labels.tolist()) == {
        graph_b.label_names.index("AI"), graph_b.label_names.index("ML")}
    assert evaluation["ec_classes"] == 2 and evaluation["ec_test_entities"] == 400 - 2 * 2 * 4
    assert evaluation["num_relations"] == graph_b.num_edges
