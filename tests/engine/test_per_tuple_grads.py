"""Per-tuple gradients from one backward vs a naive reference (one forward + autograd per tuple).

The naive reference runs each tuple's forward on its own and differentiates its loss with plain
autograd, so it also catches any mixing across tuples. Every path (ghost norm, materialised
per-tuple gradients, auto) must give the same norms and the same weighted sum Σᵢ cᵢ g(Tᵢ).
"""

from __future__ import annotations

import warnings
from unittest.mock import patch

import pytest
import torch
from _toy import tiny_lora_encoder
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers import groups as groups_module
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.plugins.relational.losses import tuple_losses

MODES = ["auto", "ghost", "materialize"]
FAST = settings(max_examples=12, deadline=None, derandomize=True)


def naive(forward, params, num_tuples):
    """(norms (b,), per-tuple grads [b][param]) with one forward + autograd per tuple."""
    grads = []
    for i in range(num_tuples):
        loss = forward(i)
        grads.append(torch.autograd.grad(loss, params, allow_unused=True))
    grads = [[torch.zeros_like(p) if g is None else g for g, p in zip(gs, params, strict=True)] for gs in grads]
    norms = torch.stack([torch.sqrt(sum((g.double() ** 2).sum() for g in gs)) for gs in grads])
    return norms.to(torch.float64 if params[0].dtype == torch.float64 else torch.float32), grads


def check(model, batch_forward, tuple_forward, b, mode, seed=0):
    """Engine vs naive: norms and Σᵢ fᵢ g(Tᵢ) for random factors f, with the engine's backward
    over the recorded outputs only (every step after a run's first) and with ``verify`` (the
    parameters differentiated too: the first step)."""
    params = [p for p in model.parameters() if p.requires_grad]
    factors = torch.rand(b, generator=torch.Generator().manual_seed(seed))
    ref_norms, ref_grads = naive(tuple_forward, params, b)
    for verify in (False, True):
        engine = PerTupleGrad(model, mode=mode, verify=verify)
        with engine.record(num_groups=b):
            losses = batch_forward()
        norms = engine.compute(losses.sum())
        engine.accumulate(factors)
        got = [p.grad.clone() for p in params]
        torch.testing.assert_close(norms, ref_norms, rtol=1e-4, atol=1e-6)
        for j, p in enumerate(params):
            want = sum((factors[i] * ref_grads[i][j] for i in range(b)), torch.zeros_like(p))
            torch.testing.assert_close(got[j], want, rtol=1e-4, atol=1e-6)
    return norms


# ---------------------------------------------------------------------------------------------
# tiny-bert + LoRA (the real encoder)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lora_encoder():
    words = "graph privacy tuple entity relation noise clip adam lora token text model".split()
    texts = [" ".join(words[j % len(words)] for j in range(i, i + 1 + i % 9)) for i in range(24)]
    return tiny_lora_encoder(texts, max_length=12, lora_rank=4, lora_layers=1, seed=3)


@FAST
@given(
    b=st.integers(1, 4),
    k=st.integers(0, 3),
    kind=st.sampled_from(["infonce", "hinge"]),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 10_000),
)
def test_lora_encoder_matches_naive(lora_encoder, b, k, kind, mode, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 24, (b, 2 + k), generator=gen)
    anchors = torch.randint(0, 2, (b, k), generator=gen)
    mask = torch.rand(b, k, generator=gen) > 0.25

    def losses(rows):
        emb = lora_encoder.embed(ids[rows].reshape(-1)).reshape(len(rows), 2 + k, -1)
        return tuple_losses(emb, anchors[rows], mask[rows], kind=kind, temperature=0.2, margin=0.9)

    check(lora_encoder, lambda: losses(list(range(b))), lambda i: losses([i])[0], b, mode, seed)


def test_lora_sum_equals_plain_backward(lora_encoder):
    """Factors of 1 give exactly the gradient of the summed loss (plain autograd)."""
    ids = torch.arange(12).reshape(3, 4)
    anchors, mask = torch.tensor([[0, 1], [1, 1], [0, 0]]), torch.ones(3, 2, dtype=torch.bool)
    params = list(lora_encoder.trainable_parameters())

    def loss():
        emb = lora_encoder.embed(ids.reshape(-1)).reshape(3, 4, -1)
        return tuple_losses(emb, anchors, mask, kind="infonce").sum()

    want = torch.autograd.grad(loss(), params)
    engine = PerTupleGrad(lora_encoder)
    with engine.record(num_groups=3):
        total = loss()
    engine.compute(total)
    engine.accumulate(torch.ones(3))
    for p, w in zip(params, want, strict=True):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-7)


def test_lora_dropout_keeps_the_decomposition():
    """LoRA dropout (train mode) draws per-token masks: compare on the SAME forward graph."""
    texts = [f"text number {i} " + "x " * i for i in range(8)]
    enc = tiny_lora_encoder(texts, weight_seed=1, max_length=8, lora_dropout=0.5, seed=4)
    enc.train()
    torch.manual_seed(0)
    params, b = list(enc.trainable_parameters()), 3
    ids = torch.randint(0, 8, (b, 4))
    with torch.no_grad():  # dropout is really active
        assert not torch.equal(enc.embed(ids[0]), enc.embed(ids[0]))
    engine = PerTupleGrad(enc)
    with engine.record(num_groups=b):
        emb = enc.embed(ids.reshape(-1)).reshape(b, 4, -1)
    losses = tuple_losses(emb, torch.tensor([[0, 1]] * b), torch.ones(b, 2, dtype=torch.bool), kind="infonce")
    ref = [torch.autograd.grad(losses[i], params, retain_graph=True) for i in range(b)]
    norms = engine.compute(losses.sum())
    want = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in gs)) for gs in ref])
    torch.testing.assert_close(norms, want, rtol=1e-4, atol=1e-6)
    engine.accumulate(torch.tensor([1.0, 0.5, 0.0]))
    for j, p in enumerate(params):
        torch.testing.assert_close(p.grad, ref[0][j] + 0.5 * ref[1][j], rtol=1e-4, atol=1e-7)


# ---------------------------------------------------------------------------------------------
# toy models: trainable embedding + linear (shared across two calls), plain linear
# ---------------------------------------------------------------------------------------------


class TokenModel(nn.Module):
    """Embedding (with padding idx) → Linear applied twice (shared) → mean over tokens → head."""

    def __init__(self, vocab: int, dim: int, out: int, padding_idx: int | None = 0) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim, padding_idx=padding_idx)
        self.mix = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, out, bias=False)
        self.frozen = nn.LayerNorm(dim)
        self.frozen.requires_grad_(False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.frozen(self.emb(tokens))
        h = torch.tanh(self.mix(torch.tanh(self.mix(h))))
        return self.head(h.mean(1))


def _tuple_loss(out: torch.Tensor, s: int) -> torch.Tensor:
    """A per-tuple loss coupling the s sequences of each tuple nonlinearly."""
    out = out.reshape(-1, s, out.shape[-1])
    return (out.prod(1).sin().sum(-1) + out.pow(2).sum((1, 2))).reshape(-1)


@FAST
@given(
    b=st.integers(1, 5),
    s=st.integers(1, 4),
    tokens=st.integers(1, 6),
    vocab=st.integers(2, 9),
    dim=st.integers(1, 6),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 10_000),
    block=st.sampled_from([1, 2, 32]),
)
def test_embedding_and_linear_match_naive(b, s, tokens, vocab, dim, mode, seed, block):
    """``block``: tokens per block of the ghost norm's Gram matrices (1, 2: up to four blocks of
    a tuple's s·tokens tokens, the last one shorter where they do not divide; 32: one block)."""
    torch.manual_seed(seed)
    model = TokenModel(vocab, dim, 3)
    ids = torch.randint(0, vocab, (b * s, tokens))  # includes padding index 0 (no gradient)

    def rows(i):
        return ids[i * s : (i + 1) * s]

    with patch.object(groups_module, "BLOCK_TOKENS", block):
        check(model, lambda: _tuple_loss(model(ids), s), lambda i: _tuple_loss(model(rows(i)), s)[0], b, mode, seed)


@pytest.mark.parametrize("length, block, want", [
    (128, 32, [(0, 32), (32, 64), (64, 96), (96, 128)]), (31, 32, [(0, 31)]), (64, 32, [(0, 32), (32, 64)]),
    (1000, 32, [(0, 250), (250, 500), (500, 750), (750, 1000)]), (7, 2, [(0, 3), (3, 6), (6, 7)]), (1, 1, [(0, 1)]), (0, 32, []),
])
def test_token_blocks_cover_the_tokens_once(length, block, want):
    with patch.object(groups_module, "BLOCK_TOKENS", block):
        assert groups_module.token_blocks(length) == want


@FAST
@given(b=st.integers(1, 6), s=st.integers(1, 3), d=st.integers(1, 7), mode=st.sampled_from(MODES))
def test_plain_linear_2d_inputs_match_naive(b, s, d, mode):
    torch.manual_seed(b * 100 + s * 10 + d)
    model = nn.Sequential(nn.Linear(d, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(b * s, d)
    check(
        model,
        lambda: _tuple_loss(model(x), s),
        lambda i: _tuple_loss(model(x[i * s : (i + 1) * s]), s)[0],
        b,
        mode,
    )


# ---------------------------------------------------------------------------------------------
# ghost clipping / book-keeping: shared input Gram matrices, the folded factors, the choice rule
# ---------------------------------------------------------------------------------------------


class Attention(nn.Module):
    """Query, key and value projections of ONE hidden state (they share its Gram matrix), a
    projection of the same memory read transposed (same data pointer and shape, other strides:
    must not share), padded tokens masked out of the pooling, an output projection to another
    width (p > d and p < d in the folded weighted sum)."""

    def __init__(self, width: int, out: int) -> None:
        super().__init__()
        self.q, self.v = nn.Linear(width, width), nn.Linear(width, width)
        self.k = nn.Linear(width, width, bias=False)  # a key bias's gradient is 0 (softmax shift)
        self.t = nn.Linear(width, width, bias=False)
        self.up = nn.Linear(width, out)
        self.down = nn.Linear(out, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(1, 2) / x.shape[-1] ** 0.5
        scores = scores.masked_fill(~mask[:, None, :], -1e4)
        h = scores.softmax(-1) @ self.v(x) + self.t(x.transpose(1, 2))  # x square: (N, T, T)
        h = self.down(torch.tanh(self.up(h)))
        weights = mask.to(h.dtype).unsqueeze(-1)
        return (h * weights).sum(1) / weights.sum(1)


@pytest.mark.parametrize("block", [32, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("b, s, width, out, seed", [(1, 1, 4, 9, 0), (3, 2, 5, 3, 1), (4, 3, 6, 6, 2)])
def test_shared_input_grams_and_folded_factors_match_naive(b, s, width, out, seed, mode, dtype, block, monkeypatch):
    """``block``: one Gram block per tuple (32 tokens) or blocks of 2 tokens (up to four)."""
    from graphveil.engine.grad_samplers.linear import LinearSampler

    monkeypatch.setattr(groups_module, "BLOCK_TOKENS", block)
    torch.manual_seed(seed)
    model = Attention(width, out).to(dtype)
    x = torch.randn(b * s, width, width, dtype=dtype)  # tokens == width: x and xᵀ have one shape
    lengths = torch.randint(1, width + 1, (b * s,))
    mask = torch.arange(width)[None, :] < lengths[:, None]  # padding masks of varying lengths
    calls = []
    gram = LinearSampler.gram
    monkeypatch.setattr(LinearSampler, "gram", lambda self, a, b: calls.append(self.name) or gram(self, a, b))

    def rows(i):
        return slice(i * s, (i + 1) * s)

    check(model, lambda: _tuple_loss(model(x, mask), s), lambda i: _tuple_loss(model(x[rows(i)], mask[rows(i)]), s)[0],
          b, mode, seed)
    if mode == "ghost":  # per engine (verify off, on): q, k, v share one Gram; t, up, down their own
        blocks = len(groups_module.token_blocks(s * width))  # a tuple's tokens (t's: the same count)
        assert calls == [name for name in ("q", "t", "up", "down") for _ in range(blocks)] * 2


def test_factors_fold_into_either_record_of_a_ghost_linear():
    """Σᵢ cᵢ gᵢ for a ghost linear with p < d and p > d against the per-example loop."""
    torch.manual_seed(0)
    for d, p in ((7, 3), (3, 7)):
        lin = nn.Linear(d, p)
        x = torch.randn(6, 5, d)  # 3 tuples × 2 sequences × 5 tokens
        check(lin, lambda lin=lin, x=x: _tuple_loss(lin(x).sum(1), 2),
              lambda i, lin=lin, x=x: _tuple_loss(lin(x[2 * i : 2 * i + 2]).sum(1), 2)[0], 3, "ghost", seed=d)


def test_auto_picks_the_ghost_norm_for_wide_layers_over_short_sequences_and_materialises_narrow_ones():
    """Mixed ghost clipping (Bu et al.): per layer, ghost norm if L(d + p) < d·p, else the
    per-example gradient — and a ghost layer never materialises a per-example weight gradient."""
    torch.manual_seed(0)
    wide, narrow = nn.Linear(32, 32), nn.Linear(2, 2)
    model = nn.ModuleDict({"wide": wide, "narrow": narrow})
    engine = PerTupleGrad(model, verify=False)
    with engine.record(num_groups=2):
        short = wide(torch.randn(4, 2, 32)).pow(2).sum((1, 2))  # L = 2·2 tokens per tuple: 4·64 < 1024
        long = narrow(torch.randn(4, 16, 2)).pow(2).sum((1, 2))  # L = 32: 32·4 > 4
        losses = (short + long).reshape(2, 2).sum(1)
    engine.compute(losses.sum())
    rec_wide, rec_narrow = engine.pop_records().layers
    assert rec_wide.ghost is True and "weight" not in rec_wide.per_example and rec_wide.pairs
    assert rec_narrow.ghost is False and "weight" in rec_narrow.per_example and not rec_narrow.pairs


def test_one_sequence_per_tuple_matches_opacus_per_sample_norms():
    """With one sequence per tuple, per-tuple = per-sample: cross-check with opacus.

    (No padding index: opacus' embedding sampler gives the padding row a gradient, autograd not.)
    """
    from opacus import GradSampleModule

    torch.manual_seed(0)
    model = TokenModel(7, 5, 3, padding_idx=None)
    ids = torch.randint(0, 7, (6, 4))
    gsm = GradSampleModule(TokenModel(7, 5, 3, padding_idx=None), batch_first=True, loss_reduction="sum")
    gsm._module.load_state_dict(model.state_dict())
    with warnings.catch_warnings():  # opacus' full backward hook on a module without input grads
        warnings.simplefilter("ignore", UserWarning)
        _tuple_loss(gsm(ids), 1).sum().backward()
    ref = torch.sqrt(sum(p.grad_sample.flatten(1).pow(2).sum(1) for p in gsm.parameters() if p.requires_grad))
    engine = PerTupleGrad(model)
    with engine.record(num_groups=6):
        loss = _tuple_loss(model(ids), 1).sum()
    torch.testing.assert_close(engine.compute(loss), ref, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------


def test_unsupported_trainable_module_is_named():
    model = nn.Sequential(nn.Linear(3, 3), nn.PReLU(3))  # PReLU has no grad sampler
    with pytest.raises(PluginError, match=r"'1' \(PReLU\)") as err:
        PerTupleGrad(model)
    # the message lists what is supported (from the registry) and the opt-in fallback
    assert "torch.nn.modules.linear.Linear" in str(err.value)
    assert "fallback='functorch'" in str(err.value)


def test_scale_grad_by_freq_refused():
    with pytest.raises(PluginError, match="scale_grad_by_freq"):
        PerTupleGrad(nn.Embedding(5, 2, scale_grad_by_freq=True))


def test_functional_use_of_a_weight_is_refused():
    lin = nn.Linear(3, 3)
    engine = PerTupleGrad(lin)
    x = torch.randn(2, 3)
    with engine.record(num_groups=2):
        out = torch.nn.functional.linear(x, lin.weight)  # bypasses the module's forward
    with pytest.raises(PluginError, match="other than through its module's forward"):
        engine.compute(out.sum())


def test_tied_weight_is_refused():
    """A recorded embedding whose weight is also used as an output projection (weight tying)."""
    emb = nn.Embedding(6, 3)
    engine = PerTupleGrad(emb)
    with engine.record(num_groups=2):
        logits = emb(torch.tensor([[1, 2], [3, 4]])) @ emb.weight.t()
    with pytest.raises(PluginError, match="weight tying"):
        engine.compute(logits.pow(2).sum())


def test_in_place_change_of_an_output_keeps_gradients_exact():
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3)

    def forward(rows):
        out = lin(x[rows])
        out.mul_(3)  # in place, after the module's forward
        return out.pow(2).sum(1)

    check(lin, lambda: forward(slice(None)), lambda i: forward(slice(i, i + 1))[0], 4, "auto")


@pytest.mark.parametrize("verify", [False, True])
def test_in_place_change_of_a_recorded_input_is_refused(verify):
    """The backward over output gradients never reads a linear's saved input, so autograd would
    not notice it changed in place; the engine must (its records would be stale)."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    engine = PerTupleGrad(lin, verify=verify)
    with engine.record(num_groups=2):
        x = torch.randn(4, 3)
        out = lin(x)
        x.mul_(2)  # after the forward: the recorded input is no longer what the output came from
    with pytest.raises((PluginError, RuntimeError), match="modified"):
        engine.compute(out.pow(2).sum())


def test_groups_must_divide_sequences():
    lin = nn.Linear(3, 1)
    engine = PerTupleGrad(lin)
    with engine.record(num_groups=2):
        out = lin(torch.randn(5, 3))
    with pytest.raises(ValueError, match="5 sequences"):
        engine.compute(out.sum())
    with pytest.raises(RuntimeError, match="call compute\\(\\) before accumulate"):
        engine.accumulate(torch.ones(2))  # the failed compute left nothing half-done


def test_records_of_two_chunks_add_up_to_the_whole_batch():
    """pop_records + accumulate(records, add=True): the micro-batching path of dp_step."""
    torch.manual_seed(0)
    model = TokenModel(7, 4, 2)
    ids = torch.randint(0, 7, (6, 3))
    factors = torch.tensor([0.2, 1.0, 0.5, 0.0, 0.7, 0.9])
    engine = PerTupleGrad(model)
    with engine.record(num_groups=6):
        loss = _tuple_loss(model(ids), 1).sum()
    whole_norms = engine.compute(loss)
    engine.accumulate(factors)
    want = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    kept, norms = [], []
    for rows in (slice(0, 4), slice(4, 6)):
        with engine.record(num_groups=len(range(6)[rows])):
            loss = _tuple_loss(model(ids[rows]), 1).sum()
        norms.append(engine.compute(loss))
        kept.append(engine.pop_records())
    with pytest.raises(RuntimeError, match="before pop_records"):
        engine.pop_records()
    torch.testing.assert_close(torch.cat(norms), whole_norms)
    engine.accumulate(factors[:4], kept[0])
    engine.accumulate(factors[4:], kept[1], add=True)
    got = [p.grad for p in model.parameters() if p.requires_grad]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


def test_empty_batch_gives_zero_gradients():
    lin = nn.Linear(3, 2)
    engine = PerTupleGrad(lin)
    with engine.record(num_groups=0):
        pass
    assert engine.compute(torch.zeros(())).shape == (0,)
    engine.accumulate(torch.zeros(0))
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in lin.parameters())


def test_a_ghost_layer_over_zero_tokens_has_norm_zero():
    """Examples whose records have no tokens: the ghost norm is 0 (no Gram block to form)."""
    from graphveil.engine.grad_samplers.groups import Blocks
    from graphveil.engine.grad_samplers.linear import LinearSampler

    a, g = torch.zeros(3, 0, 4), torch.zeros(3, 0, 5)
    sq = Blocks(3).ghost_sq(a, g, lambda x, y: LinearSampler.gram(None, x, y))
    assert sq.dtype == torch.float64 and torch.equal(sq, torch.zeros(3, dtype=torch.float64))
