"""``frozen_head``: identity at step 0, exact per-tuple gradients, a private run end to end."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data.graph import RelationalGraph
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.plugins.hf_lora.encoder import HfLoraEncoder, HfLoraParams
from graphveil.plugins.hf_lora.frozen_head import FrozenHeadEncoder, FrozenHeadParams
from graphveil.plugins.relational.losses import tuple_losses
from graphveil.run.config import config_from_dict
from graphveil.run.runner import run_training

N = 24
WORDS = "graph privacy tuple entity relation noise clip adam lora token text model".split()


def toy_graph(n: int = N, features: bool = False, edges: int = 0) -> RelationalGraph:
    gen = torch.Generator().manual_seed(5)
    texts = [" ".join(WORDS[j % len(WORDS)] for j in range(i, i + 1 + i % 9)) for i in range(n)]
    e = torch.zeros(0, 2, dtype=torch.long)
    if edges:
        e = torch.randint(0, n, (edges, 2), generator=gen)
        e = torch.unique(torch.stack([e.min(1).values, e.max(1).values], 1)[e[:, 0] != e[:, 1]], dim=0)
    x = None
    if features:  # bag-of-words-like rows, each with at least one word
        x = (torch.rand(n, 10, generator=gen) < 0.3).float()
        x[torch.arange(n), torch.arange(n) % 10] = 1.0
    return RelationalGraph("toy", [f"e{i}" for i in range(n)], e, texts=texts, features=x)


def test_step_zero_is_the_frozen_text_model_hf_lora_starts_from() -> None:
    """Before training the head is the identity: embeddings are hf_lora's (LoRA B = 0), i.e. the
    frozen model's mean pool, for both heads."""
    graph = toy_graph()
    lora = HfLoraEncoder(HfLoraParams(model="tiny-bert", max_length=12, lora_layers=1, seed=3))
    lora.prepare(graph)
    ids = torch.tensor([0, 5, 5, 23, 11])
    want = lora.embed(ids).detach()
    for head in ("linear", "diagonal", "residual"):
        enc = FrozenHeadEncoder(FrozenHeadParams(model="tiny-bert", max_length=12, seed=3, head=head))
        enc.prepare(graph)
        torch.testing.assert_close(enc.embed(ids).detach(), want, rtol=1e-5, atol=1e-6)
    other_seed = FrozenHeadEncoder(FrozenHeadParams(model="tiny-bert", max_length=12, seed=4))
    other_seed.prepare(graph)  # a different random tiny model: the comparison above can fail
    assert not torch.allclose(other_seed.embed(ids), want, atol=1e-3)


def test_step_zero_on_features_is_the_normalised_feature_vector() -> None:
    graph = toy_graph(features=True)
    for head in ("linear", "diagonal", "residual"):
        enc = FrozenHeadEncoder(FrozenHeadParams(model="features", head=head))
        enc.prepare(graph)
        ids = torch.arange(N)
        torch.testing.assert_close(enc.embed(ids).detach(), torch.nn.functional.normalize(graph.features, dim=-1))
    raw = FrozenHeadEncoder(FrozenHeadParams(model="features", normalize=False))
    raw.prepare(graph)
    torch.testing.assert_close(raw.embed(torch.arange(N)).detach(), graph.features)


def _randomise(enc: FrozenHeadEncoder, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in enc.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)


@pytest.mark.parametrize("head", ["linear", "diagonal", "residual"])
@pytest.mark.parametrize("mode", ["ghost", "materialize"])
@pytest.mark.parametrize("model", ["features", "tiny-bert"])
def test_per_tuple_gradients_match_a_one_at_a_time_loop(head: str, mode: str, model: str) -> None:
    params = {"model": model, "head": head, **{"linear": {"bias": True}, "residual": {"rank": 3}}.get(head, {})}
    if model == "tiny-bert":
        params["max_length"] = 12
    enc = FrozenHeadEncoder(FrozenHeadParams(**params))
    enc.prepare(toy_graph(features=True))
    _randomise(enc, 1)
    b, k = 5, 3
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, N, (b, 2 + k), generator=gen)
    anchors = torch.randint(0, 2, (b, k), generator=gen)
    mask = torch.ones(b, k, dtype=torch.bool)

    def losses(rows: list[int]) -> torch.Tensor:
        emb = enc.embed(ids[rows].reshape(-1)).reshape(len(rows), 2 + k, -1)
        return tuple_losses(emb, anchors[rows], mask[rows], kind="infonce", temperature=0.2, margin=0.9)

    trainable = list(enc.trainable_parameters())
    assert trainable and all(p.requires_grad for p in trainable)
    engine = PerTupleGrad(enc, mode=mode)
    with engine.record(num_groups=b):
        batch = losses(list(range(b)))
    norms = engine.compute(batch.sum())
    factors = torch.rand(b, generator=gen)
    engine.accumulate(factors)
    loop = [torch.autograd.grad(losses([i])[0], trainable) for i in range(b)]
    want_norms = torch.stack([torch.sqrt(sum((g.double() ** 2).sum() for g in gs)) for gs in loop]).float()
    torch.testing.assert_close(norms, want_norms, rtol=1e-4, atol=1e-6)
    for j, p in enumerate(trainable):
        want = sum((factors[i] * loop[i][j] for i in range(b)), torch.zeros_like(p))
        torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=1e-6)


def test_only_the_head_trains_and_the_cache_is_reused() -> None:
    graph = toy_graph()
    enc = FrozenHeadEncoder(FrozenHeadParams(model="tiny-bert", max_length=12, head="residual", rank=2))
    enc.prepare(graph)
    names = sorted(n for n, p in enc.named_parameters() if p.requires_grad)
    assert names == ["down.weight", "up.weight"]
    assert sum(p.numel() for p in enc.trainable_parameters()) == 2 * 2 * enc.dim
    again = FrozenHeadEncoder(FrozenHeadParams(model="tiny-bert", max_length=12))
    again.prepare(graph)
    assert again.base_embeddings().data_ptr() == enc.base_embeddings().data_ptr() or torch.equal(
        again.base_embeddings(), enc.base_embeddings())


def test_bad_options_and_inputs_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="encoder.rank"):
        FrozenHeadEncoder(FrozenHeadParams(model="features", rank=4))
    with pytest.raises(ConfigError, match="encoder.bias"):
        FrozenHeadEncoder(FrozenHeadParams(model="features", head="residual", bias=True))
    enc = FrozenHeadEncoder(FrozenHeadParams(model="features"))
    with pytest.raises(DataError, match="no entity features"):
        enc.prepare(toy_graph())
    bad = toy_graph(features=True)
    bad.features[3, 2] = float("nan")
    with pytest.raises(DataError, match="NaN"):
        enc.prepare(bad)
    empty = toy_graph(features=True)
    empty.features[7] = 0.0
    with pytest.raises(DataError, match="1 entities have an all-zero feature vector.*'e7'"):
        enc.prepare(empty)
    with pytest.raises(RuntimeError, match="before prepare"):
        enc.embed(torch.tensor([0]))
    enc.prepare(toy_graph(features=True))
    with pytest.raises(DataError, match="out of range"):
        enc.embed(torch.tensor([N]))
    enc.save(tmp_path / "head")
    assert set(torch.load(tmp_path / "head" / "head.pt")) == {"linear.weight"}
    assert (tmp_path / "head" / "head.json").is_file()


@pytest.mark.parametrize("method", [("entity_poisson_wor", "freq_clip", "coupled_rdp_freq"),
                                    ("edge_poisson_decoupled", "per_tuple_clip", "edge_rdp")])
def test_a_short_private_run_trains_the_head_end_to_end(tmp_path: Path, method: tuple[str, str, str]) -> None:
    sampler, clipper, accountant = method
    graph = toy_graph(n=80, features=True, edges=300)
    raw = {
        "name": "fh", "data": {"source": "citeseer", "split": {"train_fraction": 0.6, "seed": 0}},
        "sampler": {"name": sampler, "batch_size": 16, "k_neg": 2,
                    **({"degree_cap": 4} if sampler.startswith("entity") else {})},
        "clipper": {"name": clipper, "clip_norm": 1.0}, "accountant": {"name": accountant},
        "encoder": {"name": "frozen_head", "model": "features"},
        "training": {"steps": 4, "loss": "infonce", "optimizer": "adam", "lr": 0.01},
        "privacy": {"enabled": True, "target_epsilon": 8.0},
        "evaluation": {"batch_size": 16}, "output": {"progress": False, "dir": str(tmp_path / "run")},
    }
    result = run_training(config_from_dict(raw, "test"), graph=graph)
    row, session = result["row"], result["session"]
    assert 0 < row["epsilon"] <= 8.0 * (1 + 1e-6) and row["noise_multiplier"] > 0 and row["steps"] == 4
    assert 0 < row["mrr"] <= 1 and row["mrr_ci"][0] <= row["mrr"] <= row["mrr_ci"][1]
    weight = session.encoder.linear.weight.detach()
    assert not torch.equal(weight, torch.eye(10))  # noisy steps moved the head
    assert math.isfinite(float(weight.sum()))
    assert (result["run_dir"] / "adapter" / "head.pt").is_file()


def test_the_relational_task_takes_a_feature_graph_from_a_node_source() -> None:
    """``graphveil run`` with data.source planetoid/twitch hands the task a NodeGraph: the
    relational task reads its relations (each once) and frozen_head its features."""
    from _graphs import hub_node_graph

    from graphveil.plugins.relational.task import RelationalTask
    from graphveil.run.config import SplitConfig

    nodes = hub_node_graph()
    task = RelationalTask()
    task.setup(nodes, SplitConfig(train_fraction=0.6, seed=0))
    assert task.dataset.num_edges == nodes.num_undirected_edges
    assert task.train_graph.num_edges + task.test_graph.num_edges <= nodes.num_undirected_edges
    enc = FrozenHeadEncoder(FrozenHeadParams(model="features", head="diagonal"))
    task.prepare_model(enc)
    assert task.evaluate(enc)["num_relations"] == task.test_graph.num_edges
