"""hf_lora with ``finetune: full``: every weight of a BERT-style encoder trains, with exact
per-tuple gradients (offline, tiny-bert).

References are independent of the encoder's own code path: each text run ALONE (unpadded) through
the transformers model as transformers runs it (its own position / token-type ids), and per-tuple
gradients from plain autograd on each tuple alone.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from graphveil.contract.errors import ConfigError
from graphveil.contract.host import PluginHost
from graphveil.contract.sampler import TupleBatch
from graphveil.data.graph import RelationalGraph
from graphveil.engine.dp_step import GaussianNoise, dp_step
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.plugins.edge_dp.clipping import PerTupleEdgeClipper
from graphveil.plugins.hf_lora.encoder import TINY_BERT, HfLoraEncoder, HfLoraParams
from graphveil.plugins.relational.losses import LossSpec, tuple_losses

WORDS = "graph privacy tuple entity relation noise clip adam lora token text model".split()
TEXTS = [" ".join(WORDS[j % len(WORDS)] for j in range(i, i + 1 + i % 9)) for i in range(23)] + [""]


def graph(texts=TEXTS) -> RelationalGraph:
    n = len(texts)
    return RelationalGraph("toy", [f"e{i}" for i in range(n)], torch.zeros(0, 2, dtype=torch.long), texts=list(texts))


def full(**kw) -> HfLoraEncoder:
    return HfLoraEncoder(HfLoraParams(**{"model": "tiny-bert", "finetune": "full", "max_length": 12, **kw}))


def alone(enc: HfLoraEncoder, text: str) -> torch.Tensor:
    """Reference (differentiable): the transformers model on this one text, unpadded, mean pooled."""
    tokens = enc.tokenizer(text, truncation=True, max_length=enc.params.max_length, return_tensors="pt")
    hidden = enc.transformer(input_ids=tokens["input_ids"]).last_hidden_state[0]
    pooled = hidden.mean(0)
    return F.normalize(pooled, dim=-1) if enc.params.normalize else pooled


@pytest.fixture(scope="module")
def encoder() -> HfLoraEncoder:
    enc = full(seed=3)
    with torch.no_grad():  # token type 0 and position rows stay what they are; perturb everything
        gen = torch.Generator().manual_seed(0)
        for p in enc.trainable_parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    enc.prepare(graph())
    return enc


# ---------------------------------------------------------------------------------------------
# what trains, what the forward computes
# ---------------------------------------------------------------------------------------------


def test_full_makes_every_transformer_weight_trainable_and_lora_stays_the_default():
    enc = full()
    trainable = {n for n, p in enc.named_parameters() if p.requires_grad}
    frozen = {n for n, p in enc.named_parameters() if not p.requires_grad}
    # Unused by mean pooling; key biases shift every score of a query alike (softmax ignores it).
    keys = {f"transformer.encoder.layer.{i}.attention.self.key.bias" for i in range(TINY_BERT["num_hidden_layers"])}
    assert frozen == {"transformer.pooler.dense.weight", "transformer.pooler.dense.bias"} | keys
    assert not any("lora_" in n for n in trainable)
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings"):
        assert f"transformer.embeddings.{name}.weight" in trainable
    assert "transformer.embeddings.LayerNorm.weight" in trainable
    for layer in range(TINY_BERT["num_hidden_layers"]):
        for module in ("attention.self.query", "attention.self.key", "attention.self.value",
                       "attention.output.dense", "attention.output.LayerNorm", "intermediate.dense",
                       "output.dense", "output.LayerNorm"):
            expected = {f"transformer.encoder.layer.{layer}.{module}.{w}" for w in ("weight", "bias")} - keys
            assert expected <= trainable
    assert set(enc.trainable_state()) == trainable and enc.full_finetune
    # The default is LoRA, unchanged: only lora_A / lora_B of the top layers.
    lora = HfLoraEncoder(HfLoraParams(model="tiny-bert"))
    assert lora.params.finetune == "lora" and not lora.full_finetune
    names = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)


def test_full_embed_equals_the_transformers_model_on_each_text_alone(encoder):
    ids = torch.tensor([2, 0, 23, 5, 1, 17, 2])
    with torch.no_grad():
        got = encoder.embed(ids)
        want = torch.stack([alone(encoder, TEXTS[i]) for i in ids])
        single = torch.cat([encoder.embed(torch.tensor([i])) for i in ids])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, single, rtol=1e-5, atol=1e-6)  # other entities in the batch change nothing
    assert encoder.embed(torch.zeros(0, dtype=torch.long)).shape == (0, TINY_BERT["hidden_size"])


def test_every_embedding_sees_one_row_per_sequence(encoder):
    """Position and token-type ids are (N, T), not transformers' broadcast (1, T) buffer rows."""
    shapes: dict[str, tuple[int, ...]] = {}
    emb = encoder.transformer.embeddings
    modules = {"word": emb.word_embeddings, "position": emb.position_embeddings, "type": emb.token_type_embeddings}
    hooks = [m.register_forward_hook(lambda m, a, o, k=k: shapes.__setitem__(k, tuple(a[0].shape)))
             for k, m in modules.items()]
    try:
        encoder.embed(torch.tensor([3, 8, 8, 0, 23]))
    finally:
        for h in hooks:
            h.remove()
    assert len({s for s in shapes.values()}) == 1 and next(iter(shapes.values()))[0] == 5, shapes
    # Why it matters: BertEmbeddings' own (1, T) position ids cannot be attributed to examples.
    engine = PerTupleGrad(emb)
    tokens = encoder._hidden[:4, :, 0]
    with pytest.raises(ValueError, match="cannot be split"):
        with engine.record(num_groups=2):
            out = emb(input_ids=tokens)
        engine.compute(out.sum())


# ---------------------------------------------------------------------------------------------
# per-tuple gradients: the privacy-critical check
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("verify", [True, False])  # False: output gradients only (steps after the first)
@pytest.mark.parametrize("mode", ["auto", "ghost", "materialize"])
@pytest.mark.parametrize("b, k, kind, seed", [(1, 1, "infonce", 0), (3, 2, "infonce", 1), (4, 3, "hinge", 2)])
def test_per_tuple_gradients_of_every_weight_equal_a_naive_loop_over_tuples(encoder, mode, b, k, kind, seed, verify):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, len(TEXTS), (b, 2 + k), generator=gen)
    anchors = torch.randint(0, 2, (b, k), generator=gen)
    mask = torch.rand(b, k, generator=gen) > 0.25
    mask[:, 0] = True  # every tuple has a loss (masked negatives still exercised)
    names = [n for n, p in encoder.named_parameters() if p.requires_grad]
    params = list(encoder.trainable_parameters())

    def loss_of(emb, rows):
        return tuple_losses(emb.reshape(len(rows), 2 + k, -1), anchors[rows], mask[rows], kind=kind,
                            temperature=0.2, margin=0.9)

    engine = PerTupleGrad(encoder, mode=mode, verify=verify)
    assert len(engine.parameters) == len(params)  # every trainable weight has a grad sampler
    with engine.record(num_groups=b):
        batch = loss_of(encoder.embed(ids.reshape(-1)), list(range(b)))
    norms = engine.compute(batch.sum())
    factors = torch.rand(b, generator=gen)
    engine.accumulate(factors)
    got = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    # Naive: each tuple ALONE, each of its texts unpadded through transformers, plain autograd.
    ref = []
    for i in range(b):
        emb = torch.stack([alone(encoder, TEXTS[j]) for j in ids[i]])
        ref.append(torch.autograd.grad(loss_of(emb, [i])[0], params, allow_unused=True))
    ref = [[torch.zeros_like(p) if g is None else g for g, p in zip(gs, params, strict=True)] for gs in ref]
    want_norms = torch.stack([torch.sqrt(sum(g.double().pow(2).sum() for g in gs)) for gs in ref]).float()
    assert float(want_norms.min()) > 0
    torch.testing.assert_close(norms, want_norms, rtol=1e-4, atol=1e-6)
    for j, (name, p) in enumerate(zip(names, params, strict=True)):
        want = sum((factors[i] * ref[i][j] for i in range(b)), torch.zeros_like(p))
        torch.testing.assert_close(got[j], want, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")
    # Not vacuous: embeddings, LayerNorms and linears all got gradient from these tuples.
    nonzero = {n for n, g in zip(names, got, strict=True) if float(g.abs().max()) > 0}
    for name in ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
                 "embeddings.LayerNorm.weight", "layer.0.attention.self.query.weight",
                 "layer.1.output.dense.weight", "layer.1.output.LayerNorm.bias"):
        assert any(n.endswith(name) for n in nonzero), name



def test_micro_batched_dp_step_equals_the_whole_batch_step(encoder):
    """embed() called once per chunk of 2 tuples: same clipped sum as one call (σ = 0)."""
    gen = torch.Generator().manual_seed(8)
    pos = torch.stack([torch.randperm(24, generator=gen)[:2] for _ in range(5)])
    batch = TupleBatch(pos, torch.randint(0, 24, (5, 2), generator=gen),
                       torch.gather(pos, 1, torch.randint(0, 2, (5, 2), generator=gen)))
    start = encoder.trainable_state()
    released, clipped = [], []
    for micro in (None, 2):
        encoder.load_trainable_state(start)
        opt = torch.optim.SGD(list(encoder.trainable_parameters()), lr=0.0)  # keeps p.grad to inspect
        m = dp_step(encoder, batch, clipper=PerTupleEdgeClipper(PerTupleEdgeClipper.Params(clip_norm=0.05)), noise_multiplier=0.0, expected_batch_size=5.0, optimizer=opt,
                    loss=LossSpec("infonce", temperature=0.2), noise=GaussianNoise(), micro_batch_size=micro)
        released.append([p.grad.clone() for p in encoder.trainable_parameters()])
        clipped.append(m.clipped_fraction)
    encoder.load_trainable_state(start)
    for p in encoder.trainable_parameters():
        p.grad = None
    assert clipped[0] == clipped[1] > 0
    for a, b in zip(*released, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# options, saving, a real run
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("option", [{"lora_layers": 2}, {"target_modules": ["query"]}, {"lora_rank": 4},
                                    {"lora_alpha": 8.0}, {"lora_dropout": 0.1}, {"cache_batch_size": 8}])
def test_lora_options_with_full_are_a_config_error_naming_the_field(option):
    (field,) = option
    with pytest.raises(ConfigError, match=rf"encoder\.{field}: only applies to finetune: lora"):
        full(**option)
    host = PluginHost(autoload=False)
    host.register("graphveil.plugins.hf_lora", "hf_lora")
    with pytest.raises(ConfigError, match=rf"encoder\.{field}"):
        host.create("encoder", "hf_lora", {"model": "tiny-bert", "finetune": "full", **option})
    with pytest.raises(ConfigError, match="encoder.finetune"):
        host.create("encoder", "hf_lora", {"model": "tiny-bert", "finetune": "everything"})


def test_save_writes_a_model_directory_that_reloads_with_the_trained_weights(tmp_path, encoder):
    encoder.save(tmp_path)
    again = HfLoraEncoder(HfLoraParams(model=str(tmp_path), finetune="full", max_length=12))
    again.prepare(graph())
    torch.testing.assert_close(again.transformer.embeddings.word_embeddings.weight,
                               encoder.transformer.embeddings.word_embeddings.weight)
    with torch.no_grad():
        torch.testing.assert_close(again.embed(torch.arange(6)), encoder.embed(torch.arange(6)))


def test_a_full_finetune_run_on_citeseer_writes_privacy_json_and_moves_non_lora_weights(tmp_path):
    from graphveil.contract.host import default_host
    from graphveil.run.config import config_from_dict
    from graphveil.run.runner import run_training

    encoder = {"name": "hf_lora", "model": "tiny-bert", "finetune": "full", "max_length": 12, "seed": 5}
    raw = {
        "name": "full-ft", "seed": 1,
        "data": {"source": "citeseer", "max_entities": 2000, "split": {"train_fraction": 0.7, "seed": 0}},
        "sampler": {"name": "edge_poisson_decoupled", "batch_size": 16, "k_neg": 2},
        "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_pld"},
        "encoder": encoder,
        "training": {"steps": 4, "optimizer": "sgd", "lr": 0.05},
        "privacy": {"target_epsilon": 4.0},
        "evaluation": {"max_edges": 32},
        "output": {"progress": False, "dir": str(tmp_path / "run")},
    }
    run_training(config_from_dict(raw), host=default_host())
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert report["epsilon"] <= 4.0 and report["accountant"] == "edge_pld"
    trained = load_file(str(tmp_path / "run" / "adapter" / "model.safetensors"))
    start = HfLoraEncoder(HfLoraParams(**{k: v for k, v in encoder.items() if k != "name"})).transformer.state_dict()
    assert not any("lora" in n for n in trained)
    for name in ("embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
                 "embeddings.LayerNorm.weight", "encoder.layer.0.attention.self.key.weight",
                 "encoder.layer.1.intermediate.dense.bias", "encoder.layer.1.output.LayerNorm.weight"):
        assert not torch.equal(trained[name], start[name]), f"{name} did not move"
    torch.testing.assert_close(trained["pooler.dense.weight"], start["pooler.dense.weight"])  # frozen, unused
