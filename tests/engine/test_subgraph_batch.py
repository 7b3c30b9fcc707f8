"""SubgraphBatch on the DP engine: per-example gradients of GNNs over per-example graphs.

Examples are rooted computation subgraphs (a root-readout loss) or disjoint components (a
mean-pool loss) of a random graph, of DIFFERENT sizes, so only the batch's row → example map
(PyG's ``batch`` vector) can group the rows — equal blocks or "all rows one example" fail the
same comparison (:func:`test_ignoring_the_groups_fails_the_naive_comparison`).

The naive reference batches each example ALONE (``Batch.get_example``) and differentiates its
loss with plain autograd: it sees no other example, so it also catches mixing across examples.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch_geometric.data import Batch as PygBatch
from torch_geometric.data import Data
from torch_geometric.nn import GCNConv, SAGEConv, global_mean_pool
from torch_geometric.utils import subgraph

from graphveil.contract.clipper import ClipNormParams
from graphveil.contract.errors import ConfigError
from graphveil.contract.invariant import check_structure
from graphveil.contract.profiles import ExampleStructure
from graphveil.contract.task import Batch
from graphveil.engine.dp_step import GaussianNoise, dp_step
from graphveil.engine.grad_samplers import sampler_for
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.plugins.node_dp.clipping import PerNodeClipper
from graphveil.subgraph_batch import SubgraphBatch, rooted_subgraphs

MODES = ["auto", "ghost", "materialize"]
CONVS = {"sage": SAGEConv, "gcn": GCNConv}
FAST = settings(max_examples=8, deadline=None, derandomize=True)
TOL = {"rtol": 1e-5, "atol": 1e-5}
D, H, CLASSES = 4, 5, 3


# ---------------------------------------------------------------------------------------------
# random graphs, examples, models, losses
# ---------------------------------------------------------------------------------------------


def random_graph(seed: int, n: int = 30, m: int = 40, dtype=torch.float64):
    """``(x, edge_index, y)``: n nodes, m random undirected edges (both directions), no self-loop."""
    gen = torch.Generator().manual_seed(seed)
    e = torch.randint(0, n, (2, m), generator=gen)
    e = e[:, e[0] != e[1]]
    return (torch.randn(n, D, generator=gen, dtype=dtype), torch.cat([e, e.flip(0)], 1),
            torch.randint(0, CLASSES, (n,), generator=gen))


def rooted(seed: int, b: int = 6, num_hops: int = 2, dtype=torch.float64) -> SubgraphBatch:
    """``b`` rooted subgraphs of a random graph, roots drawn from the seed (one repeated)."""
    x, e, y = random_graph(seed, dtype=dtype)
    roots = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed + 1))[: b - 1]
    return rooted_subgraphs(x, e, torch.cat([roots, roots[:1]]), num_hops, y=y)


def components(seed: int, sizes: list[int]) -> SubgraphBatch:
    """Disjoint induced subgraphs of a random graph with these node counts (a graph split)."""
    x, e, y = random_graph(seed, n=sum(sizes), m=3 * sum(sizes))
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed + 1))
    graphs, start = [], 0
    for i, size in enumerate(sizes):
        nodes = perm[start : start + size].sort().values
        start += size
        edges, _ = subgraph(nodes, e, relabel_nodes=True, num_nodes=x.shape[0])
        graphs.append(Data(x=x[nodes], edge_index=edges, y=y[i : i + 1], n_id=nodes))
    return SubgraphBatch.from_data_list(graphs)


class TwoLayer(nn.Module):
    """Two graph convolutions over every row of the batch: ``(num_nodes, CLASSES)`` outputs."""

    def __init__(self, conv: str, seed: int = 0, dtype=torch.float64) -> None:
        super().__init__()
        self.conv1, self.conv2 = CONVS[conv](D, H), CONVS[conv](H, CLASSES)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # GCNConv's bias starts at 0: randomise so every parameter matters
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        self.to(dtype)

    def forward(self, batch: SubgraphBatch) -> torch.Tensor:
        x, edge_index = batch.graphs.x, batch.graphs.edge_index
        return self.conv2(torch.tanh(self.conv1(x, edge_index)), edge_index)

    def trainable_parameters(self):
        return (p for p in self.parameters() if p.requires_grad)


def root_loss(model: nn.Module, batch: SubgraphBatch) -> torch.Tensor:
    """root_subgraphs: each example's loss reads its root's output only."""
    return F.cross_entropy(model(batch)[batch.roots], batch.labels, reduction="none")


def pool_loss(model: nn.Module, batch: SubgraphBatch) -> torch.Tensor:
    """components: each example's loss reads the mean of its own rows."""
    pooled = global_mean_pool(model(batch), batch.groups, size=batch.size)
    return F.cross_entropy(pooled, batch.labels, reduction="none")


def alone(batch: SubgraphBatch, i: int) -> SubgraphBatch:
    """Example ``i`` batched on its own (PyG's ``get_example``, not :meth:`SubgraphBatch.select`)."""
    return SubgraphBatch(PygBatch.from_data_list([batch.graphs.get_example(i)]))


def naive(model: nn.Module, batch: SubgraphBatch, loss) -> list[list[torch.Tensor]]:
    """Per-example gradients [b][param], each from example i's loss computed alone."""
    params = list(model.trainable_parameters())
    return [list(torch.autograd.grad(loss(model, alone(batch, i))[0], params)) for i in range(batch.size)]


def norms_of(grads: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([torch.sqrt(sum((g.double() ** 2).sum() for g in gs)) for gs in grads])


def check_against_naive(model, batch, loss, *, mode="auto", groups=None, num_groups=None):
    """Engine (one backward per run, ``groups`` = the batch's unless given) vs the naive loop:
    per-example norms, and every per-example gradient (one-hot factors), to 1e-5."""
    params = list(model.trainable_parameters())
    engine = PerTupleGrad(model, mode=mode)
    b = batch.size
    groups = batch.groups if groups is None else groups

    def run(factors: torch.Tensor):
        record = engine.record(num_groups=b) if num_groups == "blocks" else engine.record(num_groups=b, groups=groups)
        with record:
            losses = loss(model, batch)
        norms = engine.compute(losses.sum())
        engine.accumulate(factors)
        return norms, [p.grad.clone() for p in params]

    norms, _ = run(torch.ones(b))
    ref = naive(model, batch, loss)
    torch.testing.assert_close(norms, norms_of(ref).to(norms.dtype), **TOL)
    for i in range(b):
        _, got = run(torch.eye(b)[i])
        for g, want in zip(got, ref[i], strict=True):
            torch.testing.assert_close(g, want, **TOL)


# ---------------------------------------------------------------------------------------------
# (a) per-example gradients = naive loop; (f) ignoring the groups fails that check
# ---------------------------------------------------------------------------------------------


def test_the_registry_handles_sage_and_gcn_without_new_samplers():
    model = TwoLayer("sage")
    assert {type(m).__name__: sampler_for(m).__name__ for m in model.conv1.children()
            if list(m.parameters(recurse=False))} == {"Linear": "PygLinearSampler"}  # lin_l (bias), lin_r
    gcn = TwoLayer("gcn")
    assert sampler_for(gcn.conv1).__name__ == "ModuleBiasSampler"
    assert sampler_for(gcn.conv1.lin).__name__ == "PygLinearSampler" and gcn.conv1.lin.bias is None
    PerTupleGrad(model), PerTupleGrad(gcn)  # no module refused


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_rooted_subgraphs_per_example_gradients_match_naive(conv, mode):
    batch = rooted(seed=3, b=6)
    assert len(set(batch.sizes.tolist())) > 2, "examples must own different numbers of rows"
    check_against_naive(TwoLayer(conv), batch, root_loss, mode=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_components_per_example_gradients_match_naive(conv, mode):
    batch = components(seed=4, sizes=[2, 6, 3, 5, 4, 1])
    assert batch.roots is None and batch.sizes.tolist() == [2, 6, 3, 5, 4, 1]
    check_against_naive(TwoLayer(conv), batch, pool_loss, mode=mode)


@pytest.mark.parametrize("conv", ["sage", "gcn"])
def test_ignoring_the_groups_fails_the_naive_comparison(conv):
    """Mutation guard for the two tests above: the check must depend on the batch's groups.

    Component sizes [2, 6, 3, 5, 4] sum to 20 = 4·5 rows, so equal blocks of 4 rows are
    well-formed (a reshape-based grouping runs) and still wrong; all rows in one example is
    wrong too; the true groups pass.
    """
    batch = components(seed=5, sizes=[2, 6, 3, 5, 4])
    assert batch.num_nodes % batch.size == 0 and len(set(batch.sizes.tolist())) > 1
    model = TwoLayer(conv)
    check_against_naive(model, batch, pool_loss)
    with pytest.raises(AssertionError):
        check_against_naive(model, batch, pool_loss, groups=torch.zeros(batch.num_nodes, dtype=torch.long))
    with pytest.raises(AssertionError):
        check_against_naive(model, batch, pool_loss, num_groups="blocks")
    rooted_batch = rooted(seed=3, b=6)
    with pytest.raises((AssertionError, ValueError)):  # ValueError: rows not divisible into blocks
        check_against_naive(model, rooted_batch, root_loss, num_groups="blocks")


# ---------------------------------------------------------------------------------------------
# dp_step: (b) every contribution clipped to C, (c) micro-batching
# ---------------------------------------------------------------------------------------------


class RecordingClipper(PerNodeClipper):
    """The real per-node clipper (factors min(1, C/‖g‖)), remembering what it was given."""

    def __init__(self, clip_norm: float) -> None:
        super().__init__(ClipNormParams(clip_norm=clip_norm))
        self.seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def factors(self, batch, norms):
        f = super().factors(batch, norms)
        self.seen.append((batch.size, norms.clone(), f.clone()))
        return f


def released(model, batch, clipper, loss, *, micro=None, sigma=0.0, seed=None, expected=1.0):
    """(p.grad after one dp_step with lr 0, metrics)."""
    noise = GaussianNoise(research_seed=seed) if seed is not None else GaussianNoise()
    opt = torch.optim.SGD(list(model.trainable_parameters()), lr=0.0)
    metrics = dp_step(model, batch, clipper=clipper, noise_multiplier=sigma, expected_batch_size=expected,
                      optimizer=opt, loss=loss, noise=noise, micro_batch_size=micro)
    return [p.grad.clone() for p in model.trainable_parameters()], metrics


@FAST
@given(seed=st.integers(0, 10_000), b=st.integers(5, 8), num_hops=st.integers(1, 2),
       conv=st.sampled_from(["sage", "gcn"]), micro=st.sampled_from([None, 2, 3]))
def test_every_examples_contribution_is_clipped_to_c(seed, b, num_hops, conv, micro):
    """Property over random graphs: with C below every per-example norm, the released clipped
    sum is Σᵢ fᵢ·gᵢ with ‖fᵢ·gᵢ‖ ≤ C for every example (gᵢ from the naive loop)."""
    batch = rooted(seed, b=b, num_hops=num_hops)
    model = TwoLayer(conv, seed=seed)
    ref = naive(model, batch, root_loss)
    ref_norms = norms_of(ref)
    clip = 0.5 * float(ref_norms.min())
    if not clip > 0:  # an example without gradient (cannot happen with random weights): nothing to clip
        return
    clipper = RecordingClipper(clip)
    got, metrics = released(model, batch, clipper, root_loss, micro=micro)
    assert metrics.clipped_fraction == 1.0
    ((size, norms, factors),) = clipper.seen
    assert size == b
    torch.testing.assert_close(norms.double(), ref_norms, **TOL)
    for i in range(b):
        contribution = torch.sqrt(sum(((factors[i] * g).double() ** 2).sum() for g in ref[i]))
        assert contribution <= clip * (1 + 1e-6)
    for j, g in enumerate(got):  # σ = 0, b̄ = 1: the release is the clipped sum itself
        torch.testing.assert_close(g, sum(factors[i] * ref[i][j] for i in range(b)), **TOL)


@pytest.mark.parametrize("micro", [1, 2, 4, 5])
@pytest.mark.parametrize("case", ["rooted-sage", "components-gcn"])
def test_micro_batched_step_equals_whole_batch_step(case, micro):
    def setup():
        if case == "rooted-sage":
            return TwoLayer("sage", seed=1), rooted(seed=7, b=6), root_loss
        return TwoLayer("gcn", seed=1), components(seed=8, sizes=[3, 1, 6, 2, 5, 4]), pool_loss

    model, batch, loss = setup()
    clip = float(norms_of(naive(model, batch, loss)).median())  # clips about half the examples
    whole_clip, micro_clip = RecordingClipper(clip), RecordingClipper(clip)
    want, whole_metrics = released(model, batch, whole_clip, loss, expected=4.0)
    got, micro_metrics = released(setup()[0], batch, micro_clip, loss, micro=micro, expected=4.0)
    for g, w in zip(got, want, strict=True):  # noise off: the same clipped sum
        torch.testing.assert_close(g, w, **TOL)
    assert 0 < whole_metrics.clipped_fraction < 1
    assert micro_metrics.clipped_fraction == whole_metrics.clipped_fraction
    assert [s for s, _, _ in micro_clip.seen] == [batch.size]  # the clipper saw the whole batch, once
    torch.testing.assert_close(micro_clip.seen[0][1], whole_clip.seen[0][1], **TOL)
    # noise on, research seed: one draw per logical step, so the same release
    noisy_whole, _ = released(setup()[0], batch, RecordingClipper(clip), loss, sigma=1.5, seed=11, expected=4.0)
    noisy_micro, _ = released(setup()[0], batch, RecordingClipper(clip), loss, micro=micro, sigma=1.5, seed=11,
                              expected=4.0)
    for g, w in zip(noisy_micro, noisy_whole, strict=True):
        torch.testing.assert_close(g, w, **TOL)
    assert any(not torch.allclose(g, w) for g, w in zip(noisy_whole, want, strict=True))


# ---------------------------------------------------------------------------------------------
# (d) the block structure is checked; (e) select
# ---------------------------------------------------------------------------------------------


def test_a_batch_whose_edges_cross_examples_is_refused():
    graphs = rooted(seed=3, b=5).graphs
    edge_index = graphs.edge_index.clone()
    first = int((graphs.batch[edge_index[0]] == 0).nonzero()[0])  # an edge of example 0 ...
    edge_index[1, first] = graphs.ptr[2]  # ... now ends in example 2
    graphs.edge_index = edge_index
    with pytest.raises(ValueError, match=r"joins example 0 to example 2 \(1 such edges\): message passing"):
        SubgraphBatch(graphs)
    by_hand = PygBatch(x=torch.randn(4, D), edge_index=torch.tensor([[0, 1], [1, 3]]),
                       batch=torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="joins example 0 to example 1"):
        SubgraphBatch(by_hand)


def test_other_malformed_batches_are_refused():
    graphs = rooted(seed=3, b=4).graphs
    roots = graphs.root_index.clone()
    roots[1] = graphs.ptr[3]  # example 1's root placed in example 3's rows
    graphs.root_index = roots
    with pytest.raises(ValueError, match=r"the root of example 1 .* lies in example 3"):
        SubgraphBatch(graphs)
    with pytest.raises(ValueError, match="wraps a torch_geometric.data.Batch"):
        SubgraphBatch(Data(x=torch.randn(2, D), edge_index=torch.zeros(2, 0, dtype=torch.long)))
    with pytest.raises(ValueError, match="edge_index endpoints must be rows"):
        SubgraphBatch(PygBatch(x=torch.randn(2, D), edge_index=torch.tensor([[0], [5]]), batch=torch.tensor([0, 0])))
    ok_by_hand = SubgraphBatch(PygBatch(x=torch.randn(2, D), edge_index=torch.tensor([[0], [1]]),
                                        batch=torch.tensor([0, 0])))
    with pytest.raises(ValueError, match="Batch.from_data_list"):
        ok_by_hand.select(torch.tensor([0]))
    x, e, _ = random_graph(0)
    for bad in ([], [30], [-1]):
        with pytest.raises(ValueError, match="roots must be"):
            rooted_subgraphs(x, e, bad, 2)
    with pytest.raises(ValueError, match="num_hops"):
        rooted_subgraphs(x, e, [0], -1)


def test_select_keeps_example_order_and_groups_consistent():
    batch = rooted(seed=3, b=6)
    assert isinstance(batch, Batch)
    index = torch.tensor([4, 0, 5, 2])
    part = batch.select(index)
    assert isinstance(part, SubgraphBatch) and part.size == 4
    assert part.sizes.tolist() == batch.sizes[index].tolist()
    assert torch.equal(part.groups, torch.arange(4).repeat_interleave(part.sizes))
    assert torch.equal(part.labels, batch.labels[index])
    assert torch.equal(part.node_ids[part.roots], batch.node_ids[batch.roots][index])  # the same root nodes
    for j, i in enumerate(index.tolist()):
        mine, theirs = part.graphs.get_example(j), batch.graphs.get_example(i)
        assert torch.equal(mine.x, theirs.x) and torch.equal(mine.edge_index, theirs.edge_index)
    model = TwoLayer("gcn")
    torch.testing.assert_close(root_loss(model, part), root_loss(model, batch)[index])
    empty = batch.select(torch.zeros(0, dtype=torch.long))
    assert empty.size == 0 and empty.groups.numel() == 0 and empty.roots.numel() == 0
    with pytest.raises(IndexError):
        batch.select(torch.tensor([6]))


def test_rooted_subgraphs_are_in_neighbourhoods_and_reproduce_full_graph_roots():
    # direction: 0 → 1 → 2 and 3 → 2; the 1-hop in-neighbourhood of 2 is {1, 2, 3}, of 0 is {0}
    e = torch.tensor([[0, 1, 3], [1, 2, 2]])
    batch = rooted_subgraphs(torch.eye(4), e, [2, 0], num_hops=1, y=torch.tensor([5, 6, 7, 8]))
    assert batch.sizes.tolist() == [3, 1] and batch.labels.tolist() == [7, 5]
    assert batch.node_ids[batch.roots].tolist() == [2, 0]
    assert batch.node_ids[batch.groups == 0].tolist() == [1, 2, 3]
    # a 2-layer mean-aggregating SAGE on 2-hop subgraphs gives each root its full-graph output
    x, e, y = random_graph(9)
    roots = torch.arange(0, 30, 3)
    model = TwoLayer("sage")
    full = model(SimpleNamespace(graphs=SimpleNamespace(x=x, edge_index=e)))[roots]
    sub = rooted_subgraphs(x, e, roots, num_hops=2, y=y)
    torch.testing.assert_close(model(sub)[sub.roots], full)


# ---------------------------------------------------------------------------------------------
# the `sage` model plugin
# ---------------------------------------------------------------------------------------------


def test_sage_model_loads_through_the_host_and_trains_one_dp_step():
    from graphveil.contract.host import default_host
    from graphveil.plugins.node_classification.sage import SAGE

    host = default_host()
    model = host.create("model", "sage", {"hidden": 8, "layers": 2, "activation": "tanh", "seed": 0})
    assert isinstance(model, SAGE) and model.structure is ExampleStructure.ROOT_SUBGRAPHS
    check_structure("sage", model)
    with pytest.raises(ConfigError):
        host.create("model", "sage", {"hidden": 8, "heads": 2})
    with pytest.raises(ConfigError, match="not prepared"):
        model(rooted(seed=3, dtype=torch.float32))
    model.prepare(SimpleNamespace(num_features=D, num_classes=CLASSES))
    batch = rooted(seed=3, b=6, dtype=torch.float32)
    assert model(batch).shape == (6, CLASSES)

    def loss(m, b):
        return F.cross_entropy(m(b), b.labels, reduction="none")

    check_against_naive(model, batch, loss)  # per-example gradients of the plugin model are exact
    before = model.trainable_state()
    opt = torch.optim.SGD(list(model.trainable_parameters()), lr=0.5)
    metrics = dp_step(model, batch, clipper=PerNodeClipper(ClipNormParams(clip_norm=1.0)), noise_multiplier=1.0,
                      expected_batch_size=6.0, optimizer=opt, loss=loss, noise=GaussianNoise(research_seed=0),
                      micro_batch_size=4)
    assert metrics.batch_size == 6 and math.isfinite(metrics.loss) and math.isfinite(metrics.mean_grad_norm)
    after = model.trainable_state()
    assert set(after) == set(before) and all(not torch.equal(after[k], before[k]) for k in after)
    with pytest.raises(ConfigError, match="needs a rooted SubgraphBatch"):
        model(components(seed=4, sizes=[2, 3]))
