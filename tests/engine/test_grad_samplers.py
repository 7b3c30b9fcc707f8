"""Every grad sampler, variable-size groups, the torch.func fallback and micro-batching vs a naive loop.

The naive reference computes each example's loss ALONE (its own forward on its own rows, or its
own graph) and differentiates it with plain autograd, so it also catches mixing across examples.
The engine must give the same per-example norms and the same weighted sum Σᵢ fᵢ gᵢ.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from graphveil.contract.clipper import Clipper
from graphveil.contract.errors import PluginError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind, SamplingProfile, SensitivityKind
from graphveil.contract.sampler import TupleBatch
from graphveil.contract.task import NodeBatch
from graphveil.engine.dp_step import GaussianNoise, dp_step
from graphveil.engine.grad_samplers import (
    Blocks,
    GradSampler,
    Segments,
    make_groups,
    register,
    sampler_for,
)
from graphveil.engine.grad_samplers.linear import LinearSampler
from graphveil.engine.grad_samplers.module_bias import ModuleBiasSampler
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.plugins.relational.losses import LossSpec

MODES = ["auto", "ghost", "materialize"]
FAST = settings(max_examples=10, deadline=None, derandomize=True)
TOL = {torch.float32: {"rtol": 1e-4, "atol": 1e-6}, torch.float64: {"rtol": 1e-9, "atol": 1e-12}}


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def naive(loss_one, params, b):
    """Per-example gradients [b][param], each from example i's loss computed alone."""
    out = []
    for i in range(b):
        loss = loss_one(i)
        grads = torch.autograd.grad(loss, params, allow_unused=True) if loss.requires_grad else [None] * len(params)
        out.append([torch.zeros_like(p) if g is None else g for g, p in zip(grads, params, strict=True)])
    return out


def check(model, losses_all, loss_one, b, *, groups=None, mode="auto", fallback=None, seed=0):
    """Engine (one backward over the batch) vs naive loop: norms and Σᵢ fᵢ gᵢ for random fᵢ."""
    params = [p for p in model.parameters() if p.requires_grad]
    dtype = params[0].dtype
    factors = torch.rand(b, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    ref = naive(loss_one, params, b)
    for verify in (False, True):  # output gradients only (steps after the first) / + parameters
        engine = PerTupleGrad(model, mode=mode, fallback=fallback, verify=verify)
        record = engine.record(num_groups=b) if groups is None else engine.record(num_groups=b, groups=groups)
        with record:
            losses = losses_all()
        norms = engine.compute(losses.sum())
        engine.accumulate(factors)
        want_norms = torch.stack(
            [torch.sqrt(sum((g.double() ** 2).sum() for g in gs)) for gs in ref]
        ).to(norms.dtype) if b else torch.zeros(0, dtype=norms.dtype)
        assert norms.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
        torch.testing.assert_close(norms, want_norms, **TOL[dtype])
        for j, p in enumerate(params):
            want = sum((factors[i] * ref[i][j] for i in range(b)), torch.zeros_like(p))
            assert p.grad.dtype == dtype
            torch.testing.assert_close(p.grad, want, **TOL[dtype])
    return norms


def segment_loss(out: torch.Tensor, groups: torch.Tensor, b: int) -> torch.Tensor:
    """Per-example loss coupling all rows (and tokens) of an example nonlinearly: (b,)."""
    flat = out.flatten(1)
    pooled = flat.new_zeros(b, flat.shape[1]).index_add_(0, groups, flat)
    squares = flat.new_zeros(b).index_add_(0, groups, flat.pow(2).sum(1))
    return pooled.sin().sum(1) + squares


def random_groups(n_rows: int, b: int, gen: torch.Generator) -> torch.Tensor:
    """A row → example map with unequal sizes in shuffled order (example 0 may own nothing)."""
    return torch.randint(0, b, (n_rows,), generator=gen)


def segmented(model_fn, x, groups, b):
    """(losses over the whole batch, loss of example i from its rows alone)."""

    def all_losses():
        return segment_loss(model_fn(x), groups, b)

    def one(i):
        rows = (groups == i).nonzero().flatten()
        return segment_loss(model_fn(x[rows]), torch.zeros(rows.numel(), dtype=torch.long), 1)[0]

    return all_losses, one


# ---------------------------------------------------------------------------------------------
# nn.Linear, nn.Embedding with variable-size groups (equal blocks: test_per_tuple_grads.py)
# ---------------------------------------------------------------------------------------------


@FAST
@given(
    b=st.integers(1, 5),
    rows=st.integers(1, 12),
    tokens=st.integers(0, 3),  # 0: 2-D input (N, d)
    d=st.integers(1, 6),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 10_000),
)
def test_linear_with_variable_groups_matches_naive(b, rows, tokens, d, mode, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(d, 5), nn.Tanh(), nn.Linear(5, 3))
    shape = (rows, d) if tokens == 0 else (rows, tokens, d)
    x = torch.randn(shape, generator=gen)
    groups = random_groups(rows, b, gen)
    all_losses, one = segmented(model, x, groups, b)
    check(model, all_losses, one, b, groups=groups, mode=mode, seed=seed)


@FAST
@given(b=st.integers(1, 5), rows=st.integers(1, 10), tokens=st.integers(1, 5), seed=st.integers(0, 10_000))
def test_embedding_with_variable_groups_matches_naive(b, rows, tokens, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(6, 4, padding_idx=0), nn.Linear(4, 2))
    ids = torch.randint(0, 6, (rows, tokens), generator=gen)  # includes the padding index
    groups = random_groups(rows, b, gen)
    all_losses, one = segmented(model, ids, groups, b)
    check(model, all_losses, one, b, groups=groups, seed=seed)


def test_a_module_called_twice_with_variable_groups():
    """Two calls of one linear layer: cross-call terms enter the ghost norm of each example."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    gen = torch.Generator().manual_seed(1)
    x, groups = torch.randn(9, 4, 3, generator=gen), random_groups(9, 4, gen)
    all_losses, one = segmented(lambda t: torch.tanh(lin(torch.tanh(lin(t)))), x, groups, 4)
    for mode in MODES:
        check(lin, all_losses, one, 4, groups=groups, mode=mode)


def test_sorted_equal_groups_are_blocks_and_agree_with_a_shuffled_index():
    """An index that is equal sorted blocks takes the reshape path; a permuted copy the segment
    path; both must give the same per-example norms."""
    assert isinstance(make_groups(3, torch.arange(3).repeat_interleave(2)), Blocks)
    assert isinstance(make_groups(3, torch.tensor([0, 1, 1, 2, 2, 0])), Segments)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(6, 4)
    groups = torch.arange(3).repeat_interleave(2)
    perm = torch.randperm(6)
    norms = []
    for xs, gs in ((x, groups), (x[perm], groups[perm])):
        engine = PerTupleGrad(model, mode="ghost")
        with engine.record(groups=gs):
            losses = segment_loss(model(xs), gs, 3)
        norms.append(engine.compute(losses.sum()))
    torch.testing.assert_close(norms[0], norms[1], rtol=1e-5, atol=1e-7)


def test_groups_are_checked():
    with pytest.raises(ValueError, match="1-D integer tensor"):
        make_groups(None, torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError, match=r"values in \[0, 2\)"):
        make_groups(2, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="num_groups .* or groups"):
        make_groups(None, None)
    assert make_groups(None, torch.tensor([2, 0])).num == 3  # default: max + 1
    lin = nn.Linear(2, 1)
    engine = PerTupleGrad(lin)
    with engine.record(groups=torch.tensor([0, 1, 1])):
        out = lin(torch.randn(4, 2))  # 4 rows, but the groups map 3
    with pytest.raises(ValueError, match="4 rows on dim 0, but the groups map 3 rows"):
        engine.compute(out.sum())


def test_an_example_without_rows_has_zero_gradient():
    lin = nn.Linear(2, 2)
    engine = PerTupleGrad(lin)
    groups = torch.tensor([0, 2, 2])
    with engine.record(num_groups=4, groups=groups):
        losses = segment_loss(lin(torch.randn(3, 2)), groups, 4)
    norms = engine.compute(losses.sum())
    assert norms[1] == 0 and norms[3] == 0 and norms[0] > 0 and norms[2] > 0


# ---------------------------------------------------------------------------------------------
# PyG: Linear, module-owned bias (GCNConv) on disjoint components
# ---------------------------------------------------------------------------------------------


def test_pyg_linear_matches_naive_with_blocks_and_groups():
    from torch_geometric.nn.dense.linear import Linear

    torch.manual_seed(0)
    model = nn.Sequential(Linear(4, 5), nn.Tanh(), Linear(5, 2, bias=False))
    assert sampler_for(model[0]).__name__ == "PygLinearSampler"
    x = torch.randn(8, 3, 4)
    groups = torch.arange(4).repeat_interleave(2)
    all_losses, one = segmented(model, x, groups, 4)
    for mode in MODES:
        check(model, all_losses, one, 4, mode=mode)  # equal blocks
        shuffled = groups[torch.randperm(8)]
        all_losses_s, one_s = segmented(model, x, shuffled, 4)
        check(model, all_losses_s, one_s, 4, groups=shuffled, mode=mode)


def test_uninitialised_lazy_pyg_linear_is_refused_until_its_first_forward():
    from torch_geometric.nn.dense.linear import Linear

    lazy = Linear(-1, 3)
    with pytest.raises(PluginError, match=r"module 'Linear' \(Linear\) has uninitialised lazy parameters \['weight'\]"):
        PerTupleGrad(lazy)
    with torch.no_grad():
        lazy(torch.randn(2, 5))  # fixes in_channels = 5
    x = torch.randn(4, 5)
    check(lazy, lambda: lazy(x).pow(3).sum(1), lambda i: lazy(x[i : i + 1]).pow(3).sum(), 4)


class GNN(nn.Module):
    """Two graph convolutions; every example is one connected component (its own graph)."""

    def __init__(self, conv, d: int, h: int, c: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv(d, h), conv(h, c)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.tanh(self.conv1(x, edge_index)), edge_index)


def _components(gen: torch.Generator, sizes: list[int], d: int):
    """Graphs with these node counts, each with random edges (undirected)."""
    from torch_geometric.data import Data

    graphs = []
    for n in sizes:
        e = torch.randint(0, n, (2, 2 * n), generator=gen)
        e = torch.cat([e, e.flip(0)], 1)
        graphs.append(Data(x=torch.randn(n, d, generator=gen), edge_index=e[:, e[0] != e[1]]))
    return graphs


@pytest.mark.parametrize("conv_name", ["GCNConv", "SAGEConv", "ResGatedGraphConv"])
def test_graph_convolutions_on_disjoint_components_match_naive(conv_name):
    import torch_geometric.nn as pyg_nn
    from torch_geometric.data import Batch

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = GNN(getattr(pyg_nn, conv_name), 3, 4, 2)
    with torch.no_grad():  # GCNConv's bias starts at 0: randomise so it matters
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    if conv_name in ("GCNConv", "ResGatedGraphConv"):
        assert sampler_for(model.conv1) is ModuleBiasSampler
        assert "bias" in dict(model.conv1.named_parameters(recurse=False))
    graphs = _components(gen, [3, 5, 1, 4], 3)
    batch = Batch.from_data_list(graphs)
    # shuffle the nodes so examples' rows are interleaved, not contiguous blocks
    perm = torch.randperm(batch.num_nodes, generator=gen)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    x, edge_index, groups = batch.x[perm], inverse[batch.edge_index], batch.batch[perm]
    b = len(graphs)

    def all_losses():
        return segment_loss(model(x, edge_index), groups, b)

    def one(i):
        g = graphs[i]
        return segment_loss(model(g.x, g.edge_index), torch.zeros(g.num_nodes, dtype=torch.long), 1)[0]

    for mode in MODES:
        check(model, all_losses, one, b, groups=groups, mode=mode)


def test_a_module_bias_not_added_last_is_refused_by_the_summed_gradient_check():
    class BiasThenTanh(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.randn(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x + self.bias)  # NOT "+ bias" last: the registration's claim is false

    register(BiasThenTanh)(ModuleBiasSampler)
    module = BiasThenTanh()
    engine = PerTupleGrad(module)
    with engine.record(num_groups=2):
        out = module(torch.randn(2, 3) * 3)
    with pytest.raises(PluginError, match="bias reaches the loss other than through"):
        engine.compute(out.pow(2).sum())


def test_module_bias_sampler_refuses_other_own_parameters():
    from torch_geometric.nn import GCNConv

    conv = GCNConv(2, 2)
    conv.extra = nn.Parameter(torch.zeros(2))
    with pytest.raises(PluginError, match=r"\['extra'\], but ModuleBiasSampler handles only \['bias'\]"):
        PerTupleGrad(conv)


# ---------------------------------------------------------------------------------------------
# nn.LayerNorm
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4,), (2, 3)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_naive(shape, bias):
    torch.manual_seed(0)
    width = math.prod(shape)
    norm = nn.LayerNorm(shape, bias=bias)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape))
    lin = nn.Linear(5, width)

    def model(t):
        h = norm(lin(t).reshape(*t.shape[:-1], *shape))
        return torch.tanh(h)

    modules = nn.ModuleList([lin, norm])
    x = torch.randn(7, 2, 5)
    gen = torch.Generator().manual_seed(3)
    groups = random_groups(7, 3, gen)
    all_losses, one = segmented(model, x, groups, 3)
    check(modules, all_losses, one, 3, groups=groups)
    x6 = x[:6]
    blocks = torch.arange(3).repeat_interleave(2)
    all_losses, one = segmented(model, x6, blocks, 3)
    check(modules, all_losses, one, 3)


# ---------------------------------------------------------------------------------------------
# torch.func fallback, registry
# ---------------------------------------------------------------------------------------------


class ConvNet(nn.Module):
    """Conv1d + PReLU have no grad sampler: only the torch.func fallback handles them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3)
        self.act = nn.PReLU(3)
        self.head = nn.Linear(3 * 4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.act(self.conv(x)).flatten(1))


class OptInConvNet(ConvNet):
    per_example_fallback = "functorch"


def test_unregistered_layer_is_refused_without_the_fallback():
    with pytest.raises(PluginError, match=r"module 'conv' \(Conv1d\) owns trainable parameters \['weight', 'bias'\]"):
        PerTupleGrad(ConvNet())
    with pytest.raises(ValueError, match="fallback must be"):
        PerTupleGrad(ConvNet(), fallback="opacus")


@pytest.mark.parametrize("how", ["caller", "model"])
def test_torch_func_fallback_matches_naive(how):
    torch.manual_seed(0)
    model = ConvNet() if how == "caller" else OptInConvNet()
    fallback = "functorch" if how == "caller" else None
    x = torch.randn(6, 2, 6)
    # equal blocks (2 rows per example, one vmap call per example) ...
    all_losses, one = segmented(model, x, torch.arange(3).repeat_interleave(2), 3)
    check(model, all_losses, one, 3, fallback=fallback)
    # ... and a shuffled index (one vmap call per row, segment sums)
    groups = torch.tensor([2, 0, 2, 1, 2, 0])
    all_losses, one = segmented(model, x, groups, 3)
    check(model, all_losses, one, 3, groups=groups, fallback=fallback)


def test_torch_func_fallback_refuses_random_forwards():
    class NoisyScale(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.dropout(x * self.weight, 0.5, training=True)

    module = NoisyScale()
    engine = PerTupleGrad(module, fallback="functorch")
    with engine.record(num_groups=2):
        out = module(torch.randn(2, 3))
    with pytest.raises(PluginError, match="draws random numbers"):
        engine.compute(out.sum())


class Scale(nn.Module):
    """``y = x ∘ w``: a plugin's own layer type."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class ScaleSampler(GradSampler):
    handles = frozenset({"weight"})

    def capture(self, args, kwargs, output):
        return self.input_tensor(args, kwargs).detach()

    def backward(self, rec, saved, grad, groups, mode):
        rec.add("weight", groups.sum(groups.rows(grad * saved, self.name)))


def test_a_plugin_registers_a_layer_type_and_duplicates_are_refused():
    register(Scale)(ScaleSampler)
    with pytest.raises(PluginError, match=r"Scale \(ScaleSampler\)"):
        register(Scale)(LinearSampler)  # never overwrites
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), Scale(4))
    assert isinstance(PerTupleGrad(model)._layers[1].sampler, ScaleSampler)  # not the fallback
    x = torch.randn(5, 2, 3)
    groups = torch.tensor([1, 0, 1, 1, 2])
    all_losses, one = segmented(model, x, groups, 3)
    check(model, all_losses, one, 3, groups=groups)


def test_subclasses_use_their_base_class_sampler():
    class MyLinear(nn.Linear):
        pass

    assert sampler_for(MyLinear(2, 2)) is LinearSampler
    assert sampler_for(nn.Conv1d(1, 1, 1)) is None


# ---------------------------------------------------------------------------------------------
# batch norm
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("trainable", [True, False])
@pytest.mark.parametrize("train_mode", [True, False])
def test_batch_norm_is_refused_naming_the_module(trainable, train_mode):
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3), nn.Linear(3, 1))
    model[1].requires_grad_(trainable)
    model.train(train_mode)
    with pytest.raises(PluginError, match=r"module '1' \(BatchNorm1d\) is batch norm"):
        PerTupleGrad(model)


# ---------------------------------------------------------------------------------------------
# dp_step: micro-batching, float64
# ---------------------------------------------------------------------------------------------


class TinyEncoder(nn.Module):
    """Embedding → Linear, with the Encoder methods dp_step uses."""

    def __init__(self, n: int = 12, dim: int = 6, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb, self.lin = nn.Embedding(n, dim), nn.Linear(dim, dim)

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.tanh(self.emb(ids)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # node batches: features → logits
        return self.lin(torch.tanh(x))

    def trainable_parameters(self):
        return (p for p in self.parameters() if p.requires_grad)


class StandardClip(Clipper):
    sensitivity_kind = SensitivityKind.PER_TUPLE_EDGE
    unit = PrivacyUnit.EDGE

    def __init__(self, clip_norm: float) -> None:
        self.clip_norm, self.seen = clip_norm, []

    def factors(self, batch, norms):
        self.seen.append((batch.size, norms.clone()))
        return torch.clamp(self.clip_norm / norms.clamp(min=1e-12), max=1.0)


def freq_clipper(clip_norm: float, k_neg: int):
    """The real FREQ-CLIP (paper 1, Alg. 1): thresholds from node frequencies in the WHOLE batch."""
    from graphveil.contract.clipper import ClipNormParams
    from graphveil.plugins.entity_dp.clipping import FreqClipper

    clip = FreqClipper(ClipNormParams(clip_norm=clip_norm))
    clip.bind(SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, rate=0.1, num_records=50, num_nodes=12,
                              degree_cap=3, k_neg=k_neg))
    return clip


def tuple_batch(b: int, k: int, seed: int = 0, n: int = 12) -> TupleBatch:
    gen = torch.Generator().manual_seed(seed)
    ends = torch.stack([torch.randperm(n, generator=gen)[:2] for _ in range(b)])
    negatives = torch.randint(0, n, (b, k), generator=gen)
    anchors = torch.gather(ends, 1, torch.randint(0, 2, (b, k), generator=gen))
    return TupleBatch(ends, negatives, anchors)


class CountingNoise(GaussianNoise):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.calls = 0

    def add_(self, tensors, std):
        tensors = list(tensors)
        self.calls += len(tensors)
        super().add_(tensors, std)


def released(model, batch, clipper, loss, *, micro=None, sigma=0.0, seed=None, dtype=torch.float32):
    """(p.grad after one dp_step with lr 0, metrics, noise calls)."""
    model = model.to(dtype)
    noise = CountingNoise(research_seed=seed) if seed is not None else CountingNoise()
    opt = torch.optim.SGD(list(model.trainable_parameters()), lr=0.0)
    metrics = dp_step(model, batch, clipper=clipper, noise_multiplier=sigma, expected_batch_size=4.0,
                      optimizer=opt, loss=loss, noise=noise, micro_batch_size=micro)
    return [p.grad.clone() for p in model.trainable_parameters()], metrics, noise.calls


@pytest.mark.parametrize("clip_kind", ["standard", "freq"])
@pytest.mark.parametrize("micro", [1, 3, 7])
def test_micro_batched_step_equals_whole_batch_step(clip_kind, micro):
    batch, k = tuple_batch(7, 2, seed=1), 2
    spec = LossSpec("infonce", temperature=0.3)
    probe = StandardClip(1.0)
    released(TinyEncoder(), batch, probe, spec)
    norms = probe.seen[0][1].double()
    # clip norms that clip about half the tuples (FREQ-CLIP's thresholds are C·κ/(2·max-freq))
    c_standard = float(norms.median())
    c_freq = float((norms / freq_clipper(1.0, k).thresholds(batch)).median())

    def make():
        return StandardClip(c_standard) if clip_kind == "standard" else freq_clipper(c_freq, k)

    whole_clip, micro_clip = make(), make()
    want, whole_metrics, _ = released(TinyEncoder(), batch, whole_clip, spec)
    got, micro_metrics, _ = released(TinyEncoder(), batch, micro_clip, spec, micro=micro)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
    assert 0 < whole_metrics.clipped_fraction < 1
    assert micro_metrics.clipped_fraction == whole_metrics.clipped_fraction
    assert micro_metrics.loss == pytest.approx(whole_metrics.loss, rel=1e-6)
    assert micro_metrics.mean_grad_norm == pytest.approx(whole_metrics.mean_grad_norm, rel=1e-5)
    if clip_kind == "standard":  # the clipper saw the whole batch and all norms, once
        assert [s for s, _ in micro_clip.seen] == [7]
        torch.testing.assert_close(micro_clip.seen[0][1], whole_clip.seen[0][1], rtol=1e-5, atol=1e-7)


def test_freq_clip_factors_depend_on_the_whole_batch():
    """Guard for the test above: clipping a micro-batch on its own would give other factors."""
    from graphveil.plugins.entity_dp.clipping import max_frequencies

    batch = tuple_batch(7, 2, seed=1)
    part = batch.select(torch.arange(3))
    assert not torch.equal(max_frequencies(part), max_frequencies(batch)[:3])


def test_micro_batching_draws_noise_once_per_step():
    batch, spec = tuple_batch(6, 2, seed=2), LossSpec("infonce", temperature=0.3)
    n_params = len(list(TinyEncoder().trainable_parameters()))
    whole, _, calls_whole = released(TinyEncoder(), batch, StandardClip(0.1), spec, sigma=2.0, seed=5)
    micro, _, calls_micro = released(TinyEncoder(), batch, StandardClip(0.1), spec, micro=2, sigma=2.0, seed=5)
    assert calls_whole == calls_micro == n_params  # one draw per parameter, not per micro-batch
    for g, w in zip(micro, whole, strict=True):  # same seed, same single draw: same release
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def node_losses(model, batch: NodeBatch) -> torch.Tensor:
    feats = torch.linspace(-2, 2, 10 * 6).reshape(10, 6).to(next(model.parameters()))
    out = model(feats[batch.nodes])
    return (out.sin().sum(1) + out.pow(2).sum(1)) * (1 + batch.nodes.to(out.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_node_batch_micro_batching_and_dtype(dtype):
    """NodeBatch (row → example groups) through dp_step, micro-batched, vs the naive loop."""
    batch = NodeBatch(nodes=torch.tensor([3, 7, 1, 4, 9]))
    clip = StandardClip(0.5)
    got, metrics, _ = released(TinyEncoder(), batch, clip, node_losses, micro=2, dtype=dtype)
    model = TinyEncoder().to(dtype)
    params = list(model.trainable_parameters())
    ref = naive(lambda i: node_losses(model, batch.select(torch.tensor([i])))[0], params, 5)
    norms = torch.stack([torch.sqrt(sum(g.pow(2).sum() for g in gs)) for gs in ref])
    factors = torch.clamp(0.5 / norms, max=1.0)
    assert bool((factors < 1).any())
    assert clip.seen[0][1].dtype == dtype and all(g.dtype == dtype for g in got)
    for j, g in enumerate(got):
        want = sum(factors[i] * ref[i][j] for i in range(5)) / 4.0
        torch.testing.assert_close(g, want, **TOL[dtype])


def test_micro_batching_needs_a_selectable_batch():
    class Opaque:
        size = 3

    with pytest.raises(PluginError, match="needs a batch with select"):
        released(TinyEncoder(), Opaque(), StandardClip(1.0), lambda m, b: torch.zeros(3), micro=2)
    with pytest.raises(ValueError, match="micro_batch_size must be an int >= 1"):
        released(TinyEncoder(), tuple_batch(2, 1), StandardClip(1.0), LossSpec(), micro=0)


def test_float64_engine_keeps_float64():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 2)).double()
    ids = torch.randint(0, 5, (6, 2))
    groups = torch.tensor([0, 1, 1, 2, 0, 2])
    all_losses, one = segmented(model, ids, groups, 3)
    for mode in MODES:
        norms = check(model, all_losses, one, 3, groups=groups, mode=mode)
        assert norms.dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("clip_kind", ["standard", "freq"])
def test_cuda_step_matches_cpu_step(clip_kind):
    batch, spec = tuple_batch(5, 2, seed=3), LossSpec("infonce", temperature=0.3)
    make = (lambda: StandardClip(0.2)) if clip_kind == "standard" else (lambda: freq_clipper(0.2, 2))
    want, _, _ = released(TinyEncoder(), batch, make(), spec, micro=2)
    cuda_batch = TupleBatch(batch.positives.cuda(), batch.negatives.cuda(), batch.anchors.cuda())
    got, _, _ = released(TinyEncoder().cuda(), cuda_batch, make(), spec, micro=2)
    for g, w in zip(got, want, strict=True):
        assert g.is_cuda
        torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-6)
