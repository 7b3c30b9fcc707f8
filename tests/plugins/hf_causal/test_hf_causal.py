"""The hf_causal_lora encoder: decoder LLMs (Llama, Mistral, Qwen) with LoRA, offline and tiny.

References are independent of the encoder's own code path: the whole LoRA-injected transformers
model run on each text ALONE (no padding, HF's own mask and rotary handling), and per-tuple
gradients from plain autograd on each tuple alone.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.host import PluginHost
from graphveil.contract.sampler import TupleBatch
from graphveil.data.graph import RelationalGraph
from graphveil.engine.dp_step import GaussianNoise, dp_step
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.plugins.edge_dp.clipping import PerTupleEdgeClipper
from graphveil.plugins.hf_causal.encoder import TINY_LLAMA, HfCausalEncoder, HfCausalParams
from graphveil.plugins.relational.losses import LossSpec, tuple_losses

TEXTS = [
    "differential privacy for graphs",
    "a",
    "low rank adapters fine tune transformers on relational data with noise and more words",
    "",
    "citation networks",
    "private learning",
]
WORDS = "graph privacy tuple entity relation noise clip adam lora token text model".split()


def graph(texts=TEXTS) -> RelationalGraph:
    n = len(texts)
    return RelationalGraph("toy", [f"e{i}" for i in range(n)], torch.zeros(0, 2, dtype=torch.long), texts=list(texts))


def tiny(**kw) -> HfCausalEncoder:
    return HfCausalEncoder(HfCausalParams(**{"model": "tiny-llama", **kw}))


def randomise_lora(enc: HfCausalEncoder, seed: int = 0, scale: float = 0.5) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # lora_B starts at 0: randomise so the adapters change the output
        for p in enc.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


def alone(enc: HfCausalEncoder, text: str, pooling: str = "last", normalize: bool = True) -> torch.Tensor:
    """Reference: the whole LoRA-injected model on this one text, unpadded, as transformers runs it."""
    ids = enc.tokenizer(text, truncation=True, max_length=enc.params.max_length, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hidden = enc.peft(input_ids=ids).last_hidden_state[0].float()
    pooled = hidden[-1] if pooling == "last" else hidden.mean(0)
    return F.normalize(pooled, dim=-1) if normalize else pooled


def save_model(path, kind: str, tokenizer, **config) -> None:
    """A tiny random decoder of the given type (with LM head, as published) + tokenizer in ``path``."""
    import transformers

    classes = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
    cfg = getattr(transformers, f"{classes[kind]}Config")(vocab_size=len(tokenizer), **{**TINY_LLAMA, **config})
    torch.manual_seed(11)
    getattr(transformers, f"{classes[kind]}ForCausalLM")(cfg).save_pretrained(path)
    tokenizer.save_pretrained(path)


def minilm_tokenizer():
    from transformers import AutoTokenizer

    from graphveil.plugins.hf_common import minilm_path

    return AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)


def bpe_tokenizer(eos: bool = True):
    """A decoder-style tokenizer: byte-level BPE, no BOS, no pad token (like Qwen's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.train_from_iterator(TEXTS + WORDS, trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "<eos>"]))
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", **({"eos_token": "<eos>"} if eos else {}))


# ---------------------------------------------------------------------------------------------
# embeddings: cache + top layers == the whole model on each text alone
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["last", "mean"])
@pytest.mark.parametrize("lora_layers", [1, 2])
@pytest.mark.parametrize("normalize", [True, False])
def test_cached_lower_layers_plus_top_equal_the_whole_model_on_each_text_alone(pooling, lora_layers, normalize):
    enc = tiny(lora_layers=lora_layers, pooling=pooling, normalize=normalize, max_length=12)
    randomise_lora(enc)
    enc.prepare(graph())
    ids = torch.tensor([2, 0, 5, 1, 3, 2, 4])
    with torch.no_grad():
        got = enc.embed(ids)
    want = torch.stack([alone(enc, TEXTS[i], pooling, normalize) for i in ids])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert got.shape == (7, TINY_LLAMA["hidden_size"]) and got.dtype == torch.float32
    if normalize:
        torch.testing.assert_close(got.norm(dim=1), torch.ones(7))


@pytest.mark.parametrize(
    "kind, config",
    [
        ("llama", {}),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}),  # full + sliding
        ("mistral", {"sliding_window": 3}),
        ("qwen3", {"head_dim": 16}),
    ],
)
def test_local_model_directories_of_each_type_load_offline_and_match_transformers(tmp_path, kind, config):
    save_model(tmp_path, kind, minilm_tokenizer(), **config)
    enc = HfCausalEncoder(HfCausalParams(model=str(tmp_path), max_length=12, lora_layers=1))
    assert enc.base.config.model_type == kind and enc.first_lora_layer == 1
    randomise_lora(enc)
    enc.prepare(graph())
    with torch.no_grad():
        got = enc.embed(torch.arange(len(TEXTS)))
    want = torch.stack([alone(enc, t) for t in TEXTS])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # The saved weights were loaded (not a fresh random model): the base matches the checkpoint.
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True).model
    torch.testing.assert_close(enc.base.embed_tokens.weight, saved.embed_tokens.weight)
    torch.testing.assert_close(enc.base.layers[0].self_attn.q_proj.weight, saved.layers[0].self_attn.q_proj.weight)


def test_sliding_window_changes_embeddings_of_long_texts(tmp_path):
    """The sliding-window mask is really applied (a window of 3 forgets the start of long texts)."""
    tok = minilm_tokenizer()
    save_model(tmp_path / "full", "mistral", tok, sliding_window=None)
    save_model(tmp_path / "window", "mistral", tok, sliding_window=3)
    embs = []
    for name in ("full", "window"):
        enc = HfCausalEncoder(HfCausalParams(model=str(tmp_path / name), max_length=12, lora_layers=1))
        enc.prepare(graph())
        with torch.no_grad():
            embs.append(enc.embed(torch.tensor([1, 2])))
    assert (embs[0][1] - embs[1][1]).abs().max() > 1e-3  # 12 tokens: the window matters
    torch.testing.assert_close(embs[0][0], embs[1][0])  # "a" is 3 tokens: it does not


def test_decoder_tokenizer_without_pad_gets_eos_and_empty_texts_are_one_eos(tmp_path):
    tok = bpe_tokenizer()
    assert tok.pad_token is None and tok("")["input_ids"] == []  # no BOS, nothing for ""
    save_model(tmp_path, "llama", tok)
    enc = HfCausalEncoder(HfCausalParams(model=str(tmp_path), max_length=10, lora_layers=1, pooling="last"))
    assert enc.tokenizer.pad_token == "<eos>"
    randomise_lora(enc)
    enc.prepare(graph())
    inputs, mask = enc._tokenize(["", "graph privacy"])
    eos = enc.tokenizer.eos_token_id
    assert inputs["input_ids"][0, 0] == eos and mask[0].tolist() == [True] + [False] * 9
    with torch.no_grad():
        got = enc.embed(torch.arange(len(TEXTS)))
    assert torch.isfinite(got).all()
    want = [alone(enc, t) for t in TEXTS if t]
    torch.testing.assert_close(got[[i for i, t in enumerate(TEXTS) if t]], torch.stack(want), rtol=1e-5, atol=1e-5)


def test_append_eos_pools_an_eos_token_at_the_end(tmp_path):
    save_model(tmp_path, "llama", bpe_tokenizer())
    plain = HfCausalEncoder(HfCausalParams(model=str(tmp_path), max_length=6, lora_layers=1))
    eos = HfCausalEncoder(HfCausalParams(model=str(tmp_path), max_length=6, lora_layers=1, append_eos=True))
    ids, mask = eos._tokenize(TEXTS)
    lengths = mask.sum(1)
    assert (ids["input_ids"][torch.arange(len(TEXTS)), lengths - 1] == eos.tokenizer.eos_token_id).all()
    assert int(lengths.max()) == 6  # truncated text + EOS still fits the cap
    g = graph()
    plain.prepare(g)
    eos.prepare(g)
    assert eos._hidden is not plain._hidden  # append_eos is part of the cache key
    with torch.no_grad():
        assert (plain.embed(torch.tensor([0])) - eos.embed(torch.tensor([0]))).abs().max() > 1e-3


# ---------------------------------------------------------------------------------------------
# pooling and batch independence
# ---------------------------------------------------------------------------------------------


def test_last_pooling_reads_the_last_real_token_and_ignores_padding():
    enc = tiny(lora_layers=1, max_length=16)
    randomise_lora(enc)
    enc.prepare(graph())
    i, length = 4, int(enc._mask[4].sum())
    assert length < 16
    with torch.no_grad():
        before = enc.embed(torch.tensor([i, 0]))
        saved = enc._hidden.clone()
        try:
            enc._hidden[i, length:] = torch.randn(16 - length, enc.dim) * 100  # garbage in padding
            torch.testing.assert_close(enc.embed(torch.tensor([i, 0])), before)
            enc._hidden[i, length - 1] += 1.0  # the last real token's state
            assert (enc.embed(torch.tensor([i]))[0] - before[0]).abs().max() > 1e-3
        finally:
            enc._hidden.copy_(saved)
    # Another pad token id or a longer pad changes nothing either.
    longer = tiny(lora_layers=1, max_length=32)
    longer.load_trainable_state(enc.trainable_state())
    longer.tokenizer.pad_token = "[MASK]"
    longer.prepare(graph())
    assert longer._mask.shape[1] == 32
    with torch.no_grad():
        torch.testing.assert_close(longer.embed(torch.tensor([i, 0])), before, rtol=1e-5, atol=1e-6)


def test_last_pooling_sees_the_last_word_and_mean_pooling_differs(tmp_path):
    save_model(tmp_path, "llama", bpe_tokenizer())
    enc = HfCausalEncoder(HfCausalParams(model=str(tmp_path), lora_layers=1))
    mean = HfCausalEncoder(HfCausalParams(model=str(tmp_path), lora_layers=1, pooling="mean"))
    texts = ["graph privacy noise", "graph privacy clip", "model privacy noise"]
    for e in (enc, mean):
        e.load_trainable_state(enc.trainable_state())
        e.prepare(graph(texts))
    with torch.no_grad():
        a, b, c = enc.embed(torch.arange(3))
        m = mean.embed(torch.arange(3))
    assert (a - b).abs().max() > 1e-3  # the last token differs
    assert (a - c).abs().max() > 1e-3  # an earlier token differs: the last token attended to it
    assert (a - m[0]).abs().max() > 1e-3


def test_embeddings_do_not_depend_on_the_other_entities_in_the_batch():
    enc = tiny(lora_layers=1, max_length=16)
    randomise_lora(enc)
    enc.prepare(graph())
    with torch.no_grad():
        single = torch.cat([enc.embed(torch.tensor([i])) for i in range(len(TEXTS))])
        for ids in ([4, 2], [4, 1], [1, 2, 3, 4, 5, 0], [4, 4, 4]):
            torch.testing.assert_close(enc.embed(torch.tensor(ids)), single[ids], rtol=1e-5, atol=1e-6)
    assert enc.embed(torch.zeros(0, dtype=torch.long)).shape == (0, TINY_LLAMA["hidden_size"])


# ---------------------------------------------------------------------------------------------
# per-tuple gradients: the privacy-critical check
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def encoder() -> HfCausalEncoder:
    enc = tiny(max_length=12, lora_rank=4, lora_layers=1, seed=3)
    randomise_lora(enc, scale=0.3)
    texts = [" ".join(WORDS[j % len(WORDS)] for j in range(i, i + 1 + i % 9)) for i in range(24)]
    enc.prepare(graph(texts))
    return enc


@pytest.mark.parametrize("mode", ["auto", "ghost", "materialize"])
@pytest.mark.parametrize("b, k, kind, seed", [(1, 1, "infonce", 0), (3, 2, "infonce", 1), (4, 3, "hinge", 2)])
def test_per_tuple_gradients_equal_a_naive_loop_over_tuples(encoder, mode, b, k, kind, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 24, (b, 2 + k), generator=gen)
    anchors = torch.randint(0, 2, (b, k), generator=gen)
    mask = torch.rand(b, k, generator=gen) > 0.25
    mask[:, 0] = True  # every tuple has a loss (masked negatives still exercised)
    params = list(encoder.trainable_parameters())

    def losses(rows):
        emb = encoder.embed(ids[rows].reshape(-1)).reshape(len(rows), 2 + k, -1)
        return tuple_losses(emb, anchors[rows], mask[rows], kind=kind, temperature=0.2, margin=0.9)

    engine = PerTupleGrad(encoder, mode=mode)
    with engine.record(num_groups=b):
        batch = losses(list(range(b)))
    norms = engine.compute(batch.sum())
    factors = torch.rand(b, generator=gen)
    engine.accumulate(factors)
    got = [p.grad.clone() for p in params]
    # Naive: each tuple's forward ALONE (its own padding, its own batch), plain autograd.
    ref = [torch.autograd.grad(losses([i])[0], params) for i in range(b)]
    want_norms = torch.stack([torch.sqrt(sum(g.double().pow(2).sum() for g in gs)) for gs in ref]).float()
    assert float(want_norms.min()) > 0
    torch.testing.assert_close(norms, want_norms, rtol=1e-4, atol=1e-6)
    for j, p in enumerate(params):
        want = sum((factors[i] * ref[i][j] for i in range(b)), torch.zeros_like(p))
        torch.testing.assert_close(got[j], want, rtol=1e-4, atol=1e-7)
    for p in params:
        p.grad = None



def test_micro_batched_dp_step_equals_the_whole_batch_step(encoder):
    """embed() called once per chunk of 2 tuples: same clipped sum as one call (σ = 0)."""
    gen = torch.Generator().manual_seed(8)
    pos = torch.stack([torch.randperm(24, generator=gen)[:2] for _ in range(5)])
    batch = TupleBatch(pos, torch.randint(0, 24, (5, 2), generator=gen), torch.gather(pos, 1, torch.randint(0, 2, (5, 2), generator=gen)))
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
    assert clipped[0] == clipped[1] > 0
    for got, want in zip(released[1], released[0], strict=True):
        assert want.abs().max() > 0
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("mode, verify", [("auto", True), ("auto", False), ("ghost", False)])
def test_bfloat16_base_keeps_float32_adapters_and_exact_per_tuple_gradients(mode, verify):
    f32, bf16 = tiny(lora_layers=1, max_length=12), tiny(lora_layers=1, max_length=12, dtype="bfloat16")
    randomise_lora(f32, scale=0.3)
    bf16.load_trainable_state(f32.trainable_state())
    assert bf16.base.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
    assert {p.dtype for p in bf16.trainable_parameters()} == {torch.float32}
    g = graph()
    f32.prepare(g)
    bf16.prepare(g)
    assert bf16._hidden.dtype == torch.bfloat16
    ids = torch.tensor([0, 2, 4, 5, 1, 3])  # two tuples (u, v, negative)
    with torch.no_grad():
        a, b = f32.embed(ids), bf16.embed(ids)
    assert b.dtype == torch.float32
    torch.testing.assert_close(b, a, rtol=0.05, atol=0.05)  # the same weights, rounded
    params = list(bf16.trainable_parameters())
    engine = PerTupleGrad(bf16, mode=mode, verify=verify)  # verify=False: output gradients only
    with engine.record(num_groups=2):
        emb = bf16.embed(ids).reshape(2, 3, -1)
    losses = tuple_losses(emb, torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.bool), kind="infonce")
    ref = [torch.autograd.grad(losses[i], params, retain_graph=True) for i in range(2)]
    norms = engine.compute(losses.sum())
    want = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in gs)) for gs in ref])
    assert float(want.min()) > 0
    torch.testing.assert_close(norms, want, rtol=1e-3, atol=1e-6)
    factors = torch.tensor([0.3, 1.0])
    engine.accumulate(factors)  # the clipped sum, in float32 adapters over a bfloat16 base
    for j, p in enumerate(params):
        torch.testing.assert_close(p.grad, factors[0] * ref[0][j] + factors[1] * ref[1][j], rtol=1e-3, atol=1e-6)
        p.grad = None


# ---------------------------------------------------------------------------------------------
# LoRA placement, seeding, saving
# ---------------------------------------------------------------------------------------------


def test_only_lora_factors_of_the_top_layers_are_trainable():
    enc = tiny(lora_layers=1, lora_rank=3)
    names = [n for n, p in enc.named_parameters() if p.requires_grad]
    assert len(names) == 1 * 2 * 2  # one layer × (q_proj, v_proj) × (A, B)
    assert all(".layers.1.self_attn." in n and ".lora_" in n for n in names)
    # q_proj: 32 → 32; v_proj: 32 → 16 (one KV head of two)
    assert {tuple(p.shape) for p in enc.trainable_parameters()} == {(3, 32), (32, 3), (16, 3)}
    assert set(enc.trainable_state()) == set(names)
    assert sum(p.numel() for p in enc.parameters() if not p.requires_grad) > 0
    custom = tiny(lora_layers=2, target_modules=["o_proj", "down_proj"])
    modules = {n.split(".lora_")[0].split(".layers.")[1] for n, p in custom.named_parameters() if p.requires_grad}
    assert modules == {"0.self_attn.o_proj", "0.mlp.down_proj", "1.self_attn.o_proj", "1.mlp.down_proj"}


def test_lora_init_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b, c = tiny(seed=5), tiny(seed=5), tiny(seed=6)
    assert torch.equal(torch.random.get_rng_state(), before)
    sa, sb, sc = a.trainable_state(), b.trainable_state(), c.trainable_state()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if "lora_A" in k)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing`:FutureWarning")
def test_save_writes_a_peft_adapter_for_the_decoder(tmp_path):
    save_model(tmp_path / "base", "llama", minilm_tokenizer())
    enc = HfCausalEncoder(HfCausalParams(model=str(tmp_path / "base"), lora_layers=1, lora_rank=4))
    randomise_lora(enc, seed=9)
    enc.save(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and set(config["target_modules"]) == {"q_proj", "v_proj"}
    from peft import PeftModel
    from transformers import AutoModel

    reloaded = PeftModel.from_pretrained(AutoModel.from_pretrained(str(tmp_path / "base")), str(tmp_path / "adapter"))
    theirs = dict(reloaded.named_parameters())
    mine = {n.removeprefix("peft."): p for n, p in enc.trainable_state().items()}
    assert mine and all(torch.equal(v, theirs[n]) for n, v in mine.items())


def test_frozen_states_are_reused_only_for_the_same_model_and_options():
    g = graph()
    a, b = tiny(), tiny()
    a.prepare(g)
    b.prepare(g)
    assert b._hidden is a._hidden
    for other in (tiny(seed=1), tiny(dtype="bfloat16"), tiny(max_length=20), tiny(lora_layers=1)):
        other.prepare(g)
        assert other._hidden is not a._hidden


# ---------------------------------------------------------------------------------------------
# end to end through the runner
# ---------------------------------------------------------------------------------------------


def test_an_edge_level_run_with_tiny_llama_trains_and_writes_privacy_json(tmp_path):
    from graphveil.contract.host import default_host
    from graphveil.run.config import config_from_dict
    from graphveil.run.runner import run_training

    raw = {
        "name": "decoder-run", "seed": 1,
        "data": {"source": "citeseer", "max_entities": 2000, "split": {"train_fraction": 0.7, "seed": 0}},
        "sampler": {"name": "edge_poisson_decoupled", "batch_size": 16, "k_neg": 2},
        "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_rdp"},
        "encoder": {"name": "hf_causal_lora", "model": "tiny-llama", "max_length": 12, "lora_layers": 1, "seed": 5},
        "training": {"steps": 4, "optimizer": "sgd", "lr": 0.5},
        "privacy": {"target_epsilon": 4.0},
        "evaluation": {"max_edges": 32},
        "output": {"progress": False, "dir": str(tmp_path / "run")},
    }
    run_training(config_from_dict(raw), host=default_host())
    run = tmp_path / "run"
    report = json.loads((run / "privacy.json").read_text())
    assert report["accountant"] == "edge_rdp" and 0 < report["epsilon"] <= 4.0
    assert report["steps"] == 4
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "loss" in s and s["loss"] is not None]
    assert steps and all(s["loss"] > 0 for s in steps)
    adapter = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == {"q_proj", "v_proj"}
    assert "name: hf_causal_lora" in (run / "config.resolved.yaml").read_text()
    from safetensors.torch import load_file

    trained = load_file(run / "adapter" / "adapter_model.safetensors")
    lora_b = [v for k, v in trained.items() if "lora_B" in k]
    assert lora_b and all(v.abs().max() > 0 for v in lora_b)  # initialised at 0: the steps moved them


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [{"lora_layers": 0}, {"max_length": 1}, {"pooling": "first"}, {"dtype": "float16"}, {"device": "tpu"},
     {"device": "nonsense:x"}, {"rank": 4}],
)
def test_bad_params_are_refused_by_the_model(bad):
    with pytest.raises(ValidationError):
        HfCausalParams(**bad)


def test_registered_as_a_built_in_through_the_entry_point():
    info = PluginHost().get("encoder", "hf_causal_lora")
    assert info.plugin == "hf_causal" and info.factory is HfCausalEncoder
    assert info.description.startswith("Decoder LLM")


def test_bad_params_through_the_host_name_the_field():
    host = PluginHost(autoload=False)
    host.register("graphveil.plugins.hf_causal", "hf_causal")
    with pytest.raises(ConfigError, match="encoder.pooling"):
        host.create("encoder", "hf_causal_lora", {"pooling": "first"})
    with pytest.raises(ConfigError, match="encoder.device"):
        host.create("encoder", "hf_causal_lora", {"device": "tpu"})
    assert isinstance(host.create("encoder", "hf_causal_lora", {"model": "tiny-llama"}), HfCausalEncoder)


def test_every_param_has_a_description():
    assert all(f.description for f in HfCausalParams.model_fields.values())


def test_too_many_lora_layers():
    with pytest.raises(ConfigError, match="encoder.lora_layers: 3 exceeds the 2 layers of 'tiny-llama'"):
        tiny(lora_layers=3)


def test_missing_or_unloadable_model_directory(tmp_path):
    with pytest.raises(ConfigError, match="neither 'tiny-llama' nor a local model directory"):
        HfCausalEncoder(HfCausalParams(model=str(tmp_path / "nope")))
    with pytest.raises(ConfigError, match="cannot load a Hugging Face model"):
        HfCausalEncoder(HfCausalParams(model=str(tmp_path)))


def test_unsupported_model_type_is_named(tmp_path):
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)).save_pretrained(tmp_path)
    minilm_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match=r"model type 'bert' is not supported by hf_causal_lora \(decoder models"):
        HfCausalEncoder(HfCausalParams(model=str(tmp_path)))


def test_tokenizer_problems_and_options_are_named(tmp_path):
    save_model(tmp_path, "llama", bpe_tokenizer(eos=False))
    with pytest.raises(ConfigError, match="has neither a pad nor an eos token"):
        HfCausalEncoder(HfCausalParams(model=str(tmp_path)))
    with pytest.raises(ConfigError, match="encoder.append_eos: the tokenizer of 'tiny-llama' has no eos token"):
        tiny(append_eos=True)
    with pytest.raises(ConfigError, match="encoder.target_modules"):
        tiny(target_modules=["no_such_projection"])


def test_a_tokenizer_that_does_not_match_the_weights_is_named(tmp_path):
    """transformers gives a qwen2 directory Qwen2Tokenizer, whose default pad token
    <|endoftext|> is not in this tiny vocabulary: refused by name, not an IndexError."""
    save_model(tmp_path, "qwen2", bpe_tokenizer())
    enc = HfCausalEncoder(HfCausalParams(model=str(tmp_path), lora_layers=1))
    with pytest.raises(ConfigError, match="outside the model's vocabulary of 120: tokenizer and weights do not match"):
        enc.prepare(graph())


def test_a_directory_missing_weights_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    save_model(tmp_path, "llama", minilm_tokenizer())
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".layers.1.mlp." not in k}, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match=r"has no weights for \['layers.1.mlp.down_proj.weight'"):
        HfCausalEncoder(HfCausalParams(model=str(tmp_path)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_refused():
    with pytest.raises(ConfigError, match="encoder.device: 'cuda' asked for, but CUDA is not available"):
        tiny(device="cuda")
    assert tiny(device="auto").device == torch.device("cpu")


def test_prepare_and_embed_refuse_bad_input():
    enc = tiny()
    with pytest.raises(RuntimeError, match="before prepare"):
        enc.embed(torch.tensor([0]))
    with pytest.raises(DataError, match="no entity texts; hf_causal_lora encodes text"):
        enc.prepare(RelationalGraph("bare", ["a"], torch.zeros(0, 2, dtype=torch.long), features=torch.ones(1, 2)))
    enc.prepare(graph())
    with pytest.raises(DataError, match="entity index 6 is out of range"):
        enc.embed(torch.tensor([0, 6]))
