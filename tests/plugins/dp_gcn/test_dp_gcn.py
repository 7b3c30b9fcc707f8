"""Paper 3 (DP-GCN on random graph splits): the splits, the model's locality, clipping, accounting.

* splits: the training graph is cut once into s disjoint splits that cover every training node
  (and no validation/test node); a node's split depends on its own id only; no edge between two
  splits survives, and every edge inside a split does;
* locality: a split's loss reads its own rows alone (other splits' and held-out nodes' data can
  change freely); SubgraphBatch refuses an edge across splits; the GCN refuses a whole graph;
* exactness: per-split gradients from one backward equal each split's gradient computed alone;
* clipping: replacing everything in one split (nodes, features, labels, edges, even the node
  count) moves the released clipped sum by at most 2C, removing its nodes by at most C
  (property test on random graphs), and the unclipped sum does not obey that bound;
* accounting: the RDP curve and ε are dp-accounting's ``SampledWithoutReplacementDpEvent(s, b,
  Gaussian(σ/2))`` under REPLACE_ONE composed T times; s = 1 is the plain Gaussian(σ/2) composed
  T times (q = 1); paper 3's Table 3 numbers are Abadi's conversion of the add/remove Gaussian;
* end to end: a private session's released step is the hand-clipped sum plus N(0, σ²C²); a
  non-private GCN beats the majority class on Cora; the example config runs through the CLI.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import dp_accounting
import numpy as np
import pytest
import torch
import yaml
from _paths import REPO
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch_geometric.data import Data

from graphveil.contract.errors import ConfigError, PrivacyError, ProfileMismatchError
from graphveil.contract.invariant import check_run, check_structure
from graphveil.contract.profiles import (
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind
from graphveil.data.node_graph import NodeGraph
from graphveil.engine.dp_step import GaussianNoise, dp_step
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.evaluation import accuracy, macro_f1
from graphveil.plugins.dp_gcn.accountant import SplitRdpAccountant, split_step_event
from graphveil.plugins.dp_gcn.clipping import PerSplitClipper
from graphveil.plugins.dp_gcn.gcn import GCN, GCNParams
from graphveil.plugins.dp_gcn.sampler import GraphSplitsParams, GraphSplitsSampler
from graphveil.plugins.dp_gcn.splits import SplitBatch, split_assignment, split_key
from graphveil.plugins.dp_gcn.task import SplitNodeClassification, SplitNodeClassificationParams
from graphveil.plugins.dp_gcn.units import SPLIT_REPLACE, split_local_weights_only
from graphveil.plugins.node_classification.mlp import MLP
from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant
from graphveil.plugins.node_dp.clipping import PerNodeClipper
from graphveil.plugins.standard.no_clip import NoClip
from graphveil.privacy import DEFAULT_ORDERS
from graphveil.run.config import SplitConfig, config_from_dict
from graphveil.subgraph_batch import SubgraphBatch

ROOT = REPO
FEATURES, CLASSES = 5, 3
FAST = settings(max_examples=12, deadline=None, derandomize=True)
TOL = {"rtol": 1e-5, "atol": 1e-6}
REPLACE_ONE = dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE


@pytest.fixture
def one_thread():
    """Small models: intra-op threads only add overhead (and the test machines are shared)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# random graphs, tasks, models
# ---------------------------------------------------------------------------------------------


def random_graph(seed: int, n: int = 60, m: int = 180, scale: float = 1.0, ids: list[str] | None = None) -> NodeGraph:
    """n nodes with random features and labels, m random undirected edges (both directions)."""
    gen = torch.Generator().manual_seed(seed)
    e = torch.randint(0, n, (2, m), generator=gen)
    e = e[:, e[0] != e[1]]
    keys = torch.unique(torch.cat([e[0] * n + e[1], e[1] * n + e[0]]))
    edges = torch.stack([keys // n, keys % n])
    x = torch.randn(n, FEATURES, generator=gen) * scale
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    return NodeGraph(f"random{seed}", x, y, edges, ids or [f"v{i}" for i in range(n)],
                     [f"c{i}" for i in range(CLASSES)])


def make_task(graph: NodeGraph, eval_graph: str = "held_out", key: int = 0) -> SplitNodeClassification:
    task = SplitNodeClassification(SplitNodeClassificationParams(eval_graph=eval_graph))
    task.setup(graph, SplitConfig(kind="random_node", val_fraction=0.2, test_fraction=0.2, seed=key))
    return task


def make_sampler(task: SplitNodeClassification, s: int, b: int | None = None, seed: int = 7) -> GraphSplitsSampler:
    sampler = GraphSplitsSampler(GraphSplitsParams(num_splits=s, batch_size=b or s, partition_seed=seed))
    sampler.prepare(task.train_view, torch.Generator().manual_seed(0))
    return sampler


def all_splits(sampler: GraphSplitsSampler) -> SplitBatch:
    """Every split, in id order (a batch with b = s)."""
    return SplitBatch(torch.arange(sampler.profile.num_records), sampler.assignment)


def make_gcn(seed: int = 0, dtype=torch.float64, layers: int = 2) -> GCN:
    """A prepared GCN without dropout; biases randomised so every parameter matters."""
    model = GCN(GCNParams(hidden=4, layers=layers, dropout=0.0, seed=seed))
    model.prepare(SimpleNamespace(num_features=FEATURES, num_classes=CLASSES))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.to(dtype)


def split_of(sampler: GraphSplitsSampler, task: SplitNodeClassification) -> dict[int, int]:
    """Dataset node → its split."""
    return {int(task.split.train[r]): int(k) for r, k in enumerate(sampler.assignment.tolist())}


# ---------------------------------------------------------------------------------------------
# the splits
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("s", [1, 3, 10])
def test_splits_are_disjoint_cover_every_training_node_and_no_held_out_node(s: int) -> None:
    graph = random_graph(1, n=80)
    task = make_task(graph)
    sampler = make_sampler(task, s)
    batch = task.lift(all_splits(sampler))
    assert batch.size == s and sampler.assignment.shape == (task.split.train.numel(),)
    assert int(sampler.assignment.min()) >= 0 and int(sampler.assignment.max()) < s
    rows = batch.node_ids
    assert rows.numel() == task.split.train.numel() == rows.unique().numel()  # disjoint
    assert torch.equal(rows.sort().values, task.split.train)  # covers the training side, nothing else
    assert not set(rows.tolist()) & set(torch.cat([task.split.val, task.split.test]).tolist())
    owner = split_of(sampler, task)
    for i in range(s):  # graph i of the batch is exactly split i
        assert {owner[int(r)] for r in rows[batch.groups == i]} <= {i}
        assert int((batch.groups == i).sum()) == int((sampler.assignment == i).sum())


def test_a_nodes_split_depends_on_its_id_and_the_key_only() -> None:
    ids = [f"paper-{i}" for i in range(500)]
    key = split_key(3)
    full = split_assignment(ids, 10, key)
    # removing nodes (or adding others) moves no remaining node to another split
    keep = [i for i in range(500) if i % 7]
    assert torch.equal(split_assignment([ids[i] for i in keep], 10, key), full[keep])
    assert torch.equal(split_assignment(ids + ["new-1", "new-2"], 10, key)[:500], full)
    assert not torch.equal(split_assignment(ids, 10, split_key(4)), full)  # another key, another partition
    sizes = torch.bincount(full, minlength=10)
    assert int(sizes.sum()) == 500 and int(sizes.min()) > 20  # ~Multinomial(500, 1/10): near-equal
    with pytest.raises(ValueError, match="num_splits"):
        split_assignment(ids, 0, key)


def test_no_edge_between_two_splits_survives_and_every_edge_inside_one_does() -> None:
    graph = random_graph(2, n=70, m=400)
    task = make_task(graph)
    sampler = make_sampler(task, 4)
    batch = task.lift(all_splits(sampler))
    owner = split_of(sampler, task)
    ids = batch.node_ids
    kept = {(int(ids[u]), int(ids[v])) for u, v in batch.graphs.edge_index.t().tolist()}
    u, v = graph.edge_index
    expected = {(a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)
                if a in owner and b in owner and owner[a] == owner[b]}
    crossing = {(a, b) for a, b in zip(u.tolist(), v.tolist(), strict=True)
                if a in owner and b in owner and owner[a] != owner[b]}
    assert kept == expected
    assert len(crossing) > 50 and len(expected) > 20  # the graph has edges of both kinds to drop and keep
    assert all(owner[a] == owner[b] for a, b in kept)


def test_sampler_draws_b_distinct_splits_with_inclusion_rate_b_over_s() -> None:
    graph = random_graph(3, n=60)
    task = make_task(graph)
    s, b, draws = 10, 3, 3000
    sampler = make_sampler(task, s, b)
    profile = sampler.profile
    assert (profile.kind, profile.num_records, profile.batch_size) == (SamplingKind.UNIFORM_WOR, s, b)
    assert profile.rate == pytest.approx(b / s) and profile.num_nodes == task.split.train.numel()
    gen = torch.Generator().manual_seed(1)
    counts = torch.zeros(s)
    for _ in range(draws):
        ids = sampler.sample(gen).split_ids
        assert ids.numel() == b and ids.unique().numel() == b
        counts[ids] += 1
    sd = math.sqrt(draws * (b / s) * (1 - b / s))
    assert bool(((counts - draws * b / s).abs() < 5 * sd).all())
    for bad in ({"num_splits": 3, "batch_size": 4}, {"num_splits": 1000, "batch_size": 1}):
        with pytest.raises(PrivacyError):
            GraphSplitsSampler(GraphSplitsParams(**bad)).prepare(task.train_view, gen)
    # without a partition seed the partition is drawn from the sampling generator (fixed by its seed)
    free = [GraphSplitsSampler(GraphSplitsParams(num_splits=5)) for _ in range(2)]
    for s_ in free:
        s_.prepare(task.train_view, torch.Generator().manual_seed(9))
    assert torch.equal(free[0].assignment, free[1].assignment)


# ---------------------------------------------------------------------------------------------
# locality: a split's loss reads its own rows only; the refusals are in force
# ---------------------------------------------------------------------------------------------


def test_a_splits_loss_reads_only_its_own_rows() -> None:
    graph = random_graph(4, n=60, m=300)
    task = make_task(graph)
    sampler = make_sampler(task, 3)
    model = make_gcn(dtype=torch.float32)
    batch = task.lift(all_splits(sampler))
    before = task.losses(model, batch).detach()
    # other splits' features and labels, and every held-out node's, changed arbitrarily
    owner = split_of(sampler, task)
    others = torch.tensor([v for v in range(graph.num_nodes) if owner.get(v) != 0])
    graph.x[others] = torch.randn(others.numel(), FEATURES) * 100
    graph.y[others] = (graph.y[others] + 1) % CLASSES
    after = task.losses(model, task.lift(all_splits(sampler))).detach()
    assert torch.equal(after[0], before[0])
    assert bool((after[1:] != before[1:]).all())
    # the input gradient of split 0's loss is zero on every row outside split 0
    batch = task.lift(all_splits(sampler))
    batch.graphs.x.requires_grad_(True)
    (grad,) = torch.autograd.grad(task.losses(model, batch)[0], batch.graphs.x)
    assert bool((grad[batch.groups != 0] == 0).all()) and bool((grad[batch.groups == 0] != 0).any())


def test_held_out_labels_never_reach_a_training_loss() -> None:
    graph = random_graph(5, n=60, m=200)
    task = make_task(graph)
    sampler = make_sampler(task, 4)
    model = make_gcn(dtype=torch.float32)
    before = task.losses(model, task.lift(all_splits(sampler))).detach()
    held = torch.cat([task.split.val, task.split.test])
    graph.y[held] = (graph.y[held] + 1) % CLASSES
    graph.x[held] = 0.0
    assert torch.equal(task.losses(model, task.lift(all_splits(sampler))).detach(), before)
    # a batch smuggling a held-out node into a split is refused at the loss
    batch = task.lift(all_splits(sampler))
    batch.graphs.n_id[0] = int(held[0])
    with pytest.raises(PrivacyError, match="outside the training side"):
        task.losses(model, batch)


def test_an_edge_across_splits_is_refused_and_the_gcn_refuses_a_whole_graph() -> None:
    graph = random_graph(6, n=50, m=200)
    task = make_task(graph)
    sampler = make_sampler(task, 3)
    graphs = task.lift(all_splits(sampler)).graphs
    edge_index = graphs.edge_index.clone()
    edge_index[1, 0] = int(graphs.ptr[2])  # an edge of split 0 now ends in split 2: the public code's full graph
    graphs.edge_index = edge_index
    with pytest.raises(ValueError, match=r"joins example 0 to example 2 .* message passing would mix examples"):
        SubgraphBatch(graphs)
    model = make_gcn(dtype=torch.float32)
    with pytest.raises(ConfigError, match="SubgraphBatch of disjoint graph splits"):
        model(Data(x=graph.x, edge_index=graph.edge_index))
    with pytest.raises(ConfigError, match="not prepared"):
        GCN()(task.lift(all_splits(sampler)))
    with pytest.raises(ConfigError, match="graph-split sampler"):
        task.lift(torch.arange(3))


def test_the_task_refuses_a_model_that_does_not_keep_splits_apart() -> None:
    task = make_task(random_graph(7))
    with pytest.raises(ConfigError, match="structure components"):
        task.prepare_model(MLP())
    model = GCN(GCNParams(hidden=4))
    task.prepare_model(model)
    assert [c.in_channels for c in model.convs] == [FEATURES, 4] and model.convs[-1].out_channels == CLASSES
    if "graph" in SplitNodeClassificationParams.model_fields:  # the parent task's whole-graph edges option
        with pytest.raises(ConfigError, match="task.graph does not apply"):
            SplitNodeClassification(SplitNodeClassificationParams(graph="raw")).configure(None)


# ---------------------------------------------------------------------------------------------
# exactness: per-split gradients from one backward = each split alone
# ---------------------------------------------------------------------------------------------


def naive_split_grads(model: GCN, task: SplitNodeClassification, batch: SplitBatch) -> list[list[torch.Tensor]]:
    """Per-split gradients [b][param], each split lifted and differentiated ALONE."""
    params = list(model.trainable_parameters())
    out = []
    for k in batch.split_ids.tolist():
        alone = task.lift(SplitBatch(torch.tensor([k]), batch.assignment))
        out.append(list(torch.autograd.grad(task.losses(model, alone)[0], params)))
    return out


def norms_of(grads: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.stack([torch.sqrt(sum((g.double() ** 2).sum() for g in gs)) for gs in grads])


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("mode", ["auto", "ghost", "materialize"])
def test_per_split_gradients_equal_each_split_computed_alone(mode: str, layers: int) -> None:
    graph = random_graph(8, n=90, m=400)
    task = make_task(graph)
    sampler = make_sampler(task, 5)
    split_ids = torch.tensor([3, 0, 4, 1])  # not in id order
    batch = SplitBatch(split_ids, sampler.assignment)
    model = make_gcn(layers=layers)
    lifted = task.lift(batch)
    assert len(set(lifted.sizes.tolist())) > 1, "splits of different sizes"
    params = list(model.trainable_parameters())
    engine = PerTupleGrad(model, mode=mode)
    ref = naive_split_grads(model, task, batch)

    def run(factors: torch.Tensor):
        with engine.record(num_groups=batch.size, groups=lifted.groups):
            losses = task.losses(model, lifted)
        norms = engine.compute(losses.sum())
        engine.accumulate(factors)
        return norms, [p.grad.clone() for p in params]

    norms, _ = run(torch.ones(batch.size))
    torch.testing.assert_close(norms.double(), norms_of(ref), **TOL)
    for i in range(batch.size):
        _, got = run(torch.eye(batch.size)[i])
        for g, want in zip(got, ref[i], strict=True):
            torch.testing.assert_close(g, want, **TOL)


# ---------------------------------------------------------------------------------------------
# clipping: one split replaced moves the released sum by ≤ 2C, removed by ≤ C
# ---------------------------------------------------------------------------------------------


def ids_in_split(k: int, s: int, seed: int, count: int, prefix: str) -> list[str]:
    """``count`` fresh node ids that the keyed hash puts in split k."""
    key, out, j = split_key(seed), [], 0
    while len(out) < count:
        candidate = f"{prefix}{j}"
        if int(split_assignment([candidate], s, key)) == k:
            out.append(candidate)
        j += 1
    return out


def replaced_graph(graph: NodeGraph, drop: list[int], new_ids: list[str], seed: int, scale: float) -> NodeGraph:
    """``graph`` without nodes ``drop``, plus nodes ``new_ids`` with fresh features, labels and edges
    (among themselves and to old nodes). The other nodes keep their ids, data and edges."""
    keep = [v for v in range(graph.num_nodes) if v not in set(drop)]
    base = graph.subgraph(torch.tensor(keep, dtype=torch.long))
    n_old, n_new = base.num_nodes, len(new_ids)
    gen = torch.Generator().manual_seed(seed)
    n = n_old + n_new
    if n_new:
        a = torch.randint(n_old, n, (3 * n_new,), generator=gen)
        b = torch.randint(0, n, (3 * n_new,), generator=gen)
        mask = a != b
        a, b = a[mask], b[mask]
        keys = torch.unique(torch.cat([base.edge_index[0] * n + base.edge_index[1], a * n + b, b * n + a]))
        edges = torch.stack([keys // n, keys % n])
    else:
        edges = base.edge_index
    x = torch.cat([base.x, torch.randn(n_new, FEATURES, generator=gen) * scale])
    y = torch.cat([base.y, torch.randint(0, CLASSES, (n_new,), generator=gen)])
    return NodeGraph("neighbour", x, y, edges, base.node_ids + new_ids, list(graph.class_names))


def clipped_sum(model: GCN, graph: NodeGraph, s: int, partition_seed: int, clipper) -> tuple[torch.Tensor, torch.Tensor]:
    """(released Σᵢ fᵢ·g(Sᵢ) over ALL s splits in id order at σ = 0, per-split norms)."""
    task = make_task(graph)
    sampler = make_sampler(task, s, seed=partition_seed)
    batch = task.lift(all_splits(sampler))
    seen = []

    class Recording:
        """The clipper's own factors, remembering the norms it was given."""

        clip_norm = clipper.clip_norm if math.isfinite(clipper.clip_norm) else 1.0  # σ = 0: no noise either way

        def factors(self, b, norms):
            seen.append(norms.clone())
            return clipper.factors(b, norms)

    opt = torch.optim.SGD(list(model.trainable_parameters()), lr=0.0)
    dp_step(model, batch, clipper=Recording(), noise_multiplier=0.0, expected_batch_size=1.0, optimizer=opt,
            loss=task.losses, noise=GaussianNoise(research_seed=0))
    return torch.cat([p.grad.reshape(-1) for p in model.trainable_parameters()]).double(), seen[0]


@FAST
@given(seed=st.integers(0, 10_000), s=st.integers(2, 6), clip=st.floats(0.01, 2.0), scale=st.floats(0.5, 20.0),
       new_nodes=st.integers(0, 12))
def test_replacing_one_split_moves_the_clipped_sum_by_at_most_2c(seed, s, clip, scale, new_nodes) -> None:
    """Property over random graphs: every node of split k replaced by other nodes (fresh ids that hash
    into k, fresh features, labels, edges, a different count) moves the released clipped sum by at
    most 2C; dropping split k's nodes altogether (split k empty) by at most C; no other split's
    gradient changes."""
    graph = random_graph(seed, n=50, m=150, scale=scale)
    model = make_gcn(seed=seed)
    clipper = PerSplitClipper(PerSplitClipper.Params(clip_norm=clip))
    k = seed % s
    task = make_task(graph)
    owner = split_of(make_sampler(task, s, seed=seed), task)
    members = [v for v, split in owner.items() if split == k]
    new_ids = ids_in_split(k, s, seed, new_nodes, prefix=f"new{seed}-")
    base, norms = clipped_sum(model, graph, s, seed, clipper)
    replaced, norms_r = clipped_sum(model, replaced_graph(graph, members, new_ids, seed + 1, scale), s, seed, clipper)
    removed, norms_0 = clipped_sum(model, replaced_graph(graph, members, [], seed + 1, scale), s, seed, clipper)
    others = [i for i in range(s) if i != k]
    torch.testing.assert_close(norms_r[others], norms[others], **TOL)  # one split changed, nothing else
    torch.testing.assert_close(norms_0[others], norms[others], **TOL)
    assert float(norms_0[k]) == 0.0
    assert float((base - replaced).norm()) <= 2 * clip * (1 + 1e-5)
    assert float((base - removed).norm()) <= clip * (1 + 1e-5)


def test_without_clipping_the_same_change_exceeds_2c() -> None:
    """Mutation guard: the comparison above fails for an unclipped sum (paper 3's public code clips
    cloned gradients with clip_grad_norm_, which leaves them as they were, so its sum is unclipped)."""
    seed, s, clip = 11, 3, 0.05
    graph = random_graph(seed, n=50, m=150, scale=10.0)
    model = make_gcn(seed=seed)
    task = make_task(graph)
    owner = split_of(make_sampler(task, s, seed=seed), task)
    members = [v for v, split in owner.items() if split == 0]
    neighbour = replaced_graph(graph, members, ids_in_split(0, s, seed, 8, "n"), seed + 1, 10.0)
    unclipped = [clipped_sum(model, g, s, seed, NoClip())[0] for g in (graph, neighbour)]
    assert float((unclipped[0] - unclipped[1]).norm()) > 2 * clip * 10
    clipped = [clipped_sum(model, g, s, seed, PerSplitClipper(PerSplitClipper.Params(clip_norm=clip)))[0]
               for g in (graph, neighbour)]
    assert float((clipped[0] - clipped[1]).norm()) <= 2 * clip * (1 + 1e-5)
    clone = unclipped[0].clone()  # the public code's per_sample_grad
    torch.nn.utils.clip_grad_norm_(clone, max_norm=clip)
    assert torch.equal(clone, unclipped[0])


# ---------------------------------------------------------------------------------------------
# accounting
# ---------------------------------------------------------------------------------------------


def bound(s: int, b: int, clip: float = 1.0, orders=None) -> SplitRdpAccountant:
    acc = SplitRdpAccountant(SplitRdpAccountant.Params(orders=orders))
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, b / s, s, batch_size=b),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, SPLIT_REPLACE, clip))
    return acc


@pytest.mark.parametrize(("s", "b", "sigma", "steps"), [(10, 1, 20.0, 500), (10, 3, 8.0, 200), (40, 2, 3.0, 1000)])
def test_accountant_is_dp_accountings_sampled_wor_gaussian_composed_t_times(s, b, sigma, steps) -> None:
    orders = [float(a) for a in DEFAULT_ORDERS]
    acc = bound(s, b)
    acc.step(noise_multiplier=sigma, num_steps=steps)
    by_hand = dp_accounting.rdp.RdpAccountant(orders=orders, neighboring_relation=REPLACE_ONE)
    by_hand.compose(dp_accounting.SampledWithoutReplacementDpEvent(s, b, dp_accounting.GaussianDpEvent(sigma / 2)),
                    steps)
    np.testing.assert_allclose(acc.total_rdp(), by_hand.rdp, rtol=1e-12)
    assert acc.get_epsilon(1e-5) == pytest.approx(by_hand.get_epsilon(1e-5), rel=1e-9)
    assert acc.report(1e-5)["profile"] == {"sampling": "uniform_wor", "sensitivity": "per_example",
                                          "num_splits": s, "batch_size": b}


@pytest.mark.parametrize(("sigma", "steps"), [(4.0, 1), (112.0, 2000), (30.0, 50)])
def test_one_split_is_the_plain_gaussian_composed_t_times(sigma: float, steps: int) -> None:
    """s = 1: the whole training graph every step (q = 1); replacing it moves the clipped sum by 2C,
    so T steps are Gaussian(σ/2) composed T times: RDP T·α·2²/(2σ²)."""
    acc = bound(1, 1)
    acc.step(noise_multiplier=sigma, num_steps=steps)
    np.testing.assert_allclose(acc.total_rdp(), steps * 2.0 * acc.orders / sigma**2, rtol=1e-12)
    gaussian = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in acc.orders])
    gaussian.compose(dp_accounting.GaussianDpEvent(sigma / 2), steps)
    assert acc.get_epsilon(1e-5) == pytest.approx(gaussian.get_epsilon(1e-5), rel=1e-9)


def test_paper_table_3_is_abadis_conversion_of_the_add_remove_gaussian() -> None:
    """Paper 3's Table 3 (full graph, δ = 1e-5): σ = 112 for 2000 SGD epochs and σ = 56 for 500 Adam
    epochs give ε = 2.00. That is the moments accountant (log-moments λ(λ+1)/(2σ²) per step, λ ≤ 32,
    ε = min (T·λ(λ+1)/(2σ²) + log 1/δ)/λ) of the Gaussian with sensitivity C, i.e. add/remove of the
    whole graph. Under replacement (the sensitivity is 2C) the same ε needs σ twice as large."""
    def moments(sigma: float, steps: int) -> float:
        return min((steps * lam * (lam + 1) / (2 * sigma**2) + math.log(1e5)) / lam for lam in range(1, 33))

    assert moments(112, 2000) == pytest.approx(2.00, abs=0.005) and moments(56, 500) == pytest.approx(2.00, abs=0.005)
    assert moments(4, 2000) == pytest.approx(136.51, abs=0.01) and moments(26, 2000) == pytest.approx(9.75, abs=0.01)
    add_remove = dp_accounting.rdp.RdpAccountant(orders=[float(a) for a in DEFAULT_ORDERS])
    add_remove.compose(dp_accounting.GaussianDpEvent(112.0), 2000)
    eps_paper_noise = add_remove.get_epsilon(1e-5)  # 1.69: today's RDP conversion of the same event
    assert eps_paper_noise < 2.0
    same_noise, doubled = bound(1, 1), bound(1, 1)
    same_noise.step(noise_multiplier=112.0, num_steps=2000)
    doubled.step(noise_multiplier=224.0, num_steps=2000)
    assert doubled.get_epsilon(1e-5) == pytest.approx(eps_paper_noise, rel=1e-9)
    assert same_noise.get_epsilon(1e-5) > 1.9 * eps_paper_noise


def test_sampling_fewer_splits_and_more_noise_only_help_and_calibration_meets_the_target() -> None:
    orders = [1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    full, tenth = bound(1, 1, orders=orders).per_step_rdp(10.0), bound(10, 1, orders=orders).per_step_rdp(10.0)
    assert np.all(tenth <= full + 1e-12) and np.all(tenth < full)
    assert np.all(bound(10, 1, orders=orders).per_step_rdp(20.0) <= tenth + 1e-12)
    acc = bound(10, 1, orders=orders)
    sigma = acc.calibrate(target_epsilon=2.0, delta=1e-5, num_steps=300)
    acc.step(noise_multiplier=sigma, num_steps=300)
    assert 1.95 < acc.get_epsilon(1e-5) <= 2.0


def test_accountant_refuses_other_pairs_units_and_sizes() -> None:
    acc = SplitRdpAccountant()
    with pytest.raises(ProfileMismatchError, match="split_rdp"):
        acc.bind(SamplingProfile(SamplingKind.POISSON, 0.1, 10),
                 SensitivityProfile(SensitivityKind.PER_EXAMPLE, SPLIT_REPLACE, 1.0))
    with pytest.raises(ProfileMismatchError, match="graph/replacement"):
        acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 0.1, 10, batch_size=1),
                 SensitivityProfile(SensitivityKind.PER_EXAMPLE, PerNodeClipper.unit, 1.0))
    with pytest.raises(PrivacyError, match="b=4, s=3"):
        acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 1.0, 3, batch_size=4),
                 SensitivityProfile(SensitivityKind.PER_EXAMPLE, SPLIT_REPLACE, 1.0))
    with pytest.raises(PrivacyError, match="not bound"):
        acc.per_step_rdp(1.0)
    event = split_step_event(10, 2, 3.0)
    assert (event.source_dataset_size, event.sample_size, event.event.noise_multiplier) == (10, 2, 1.5)


def test_unit_and_invariant() -> None:
    assert SPLIT_REPLACE.kind is UnitKind.GRAPH and SPLIT_REPLACE.adjacency is Adjacency.REPLACEMENT
    assert SPLIT_REPLACE.value == "graph/replacement" and not SPLIT_REPLACE.protects_predictions
    unit = check_run(private=True, sampler=("graph_splits", GraphSplitsSampler()),
                     clipper=("per_split_clip", PerSplitClipper()), accountant=("split_rdp", SplitRdpAccountant()))
    assert unit == SPLIT_REPLACE
    with pytest.raises(PrivacyError, match="privacy units disagree"):
        check_run(private=True, sampler=("graph_splits", GraphSplitsSampler()),
                  clipper=("per_node_clip", PerNodeClipper()), accountant=("split_rdp", SplitRdpAccountant()))
    with pytest.raises(PrivacyError, match="privacy units disagree"):
        check_run(private=True, sampler=("graph_splits", GraphSplitsSampler()),
                  clipper=("per_split_clip", PerSplitClipper()), accountant=("node_rdp", NodeReplaceRdpAccountant()))
    assert {s.value for s in SplitRdpAccountant.structures} == {"components"}
    check_structure("gcn", GCN(), ("split_rdp", SplitRdpAccountant()))
    with pytest.raises(PrivacyError, match="analyses models of structure components"):
        check_structure("mlp", MLP(), ("split_rdp", SplitRdpAccountant()))  # one node's row per example
    with pytest.raises(PrivacyError, match="analyses models of structure rows"):
        check_structure("gcn", GCN(), ("node_rdp", NodeReplaceRdpAccountant()))  # a split is not one node


#: Paper 4's GDP levels, weights only (no /predictions): what a site with release-scope 'weights' states.
WEIGHTS_ONLY = ("node/replacement/D=168", "node/replacement", "k_neighbor/replacement/k=3",
                "k_neighbor/replacement/D=10/k=3", "undirected_edge/replacement", "edge/replacement")


@pytest.mark.parametrize("label", WEIGHTS_ONLY)
def test_dp_gcn_analyses_every_weights_only_gdp_unit_and_no_unit_covering_predictions(label: str) -> None:
    """The split argument (dp_gcn.units): one GDP unit changes one split, so DP-GCN's components
    accept the weights-only unit (any D, any k) and the run states it; the same unit covering
    predictions is refused (a GCN's prediction reads raw neighbours), as are the row-wise
    components (DP-MLP's) under the weights-only unit and DP-GCN's under add/remove."""
    parts = {"sampler": ("graph_splits", GraphSplitsSampler()), "clipper": ("per_split_clip", PerSplitClipper()),
             "accountant": ("split_rdp", SplitRdpAccountant())}
    unit = PrivacyUnit.parse(label)
    assert split_local_weights_only(unit) and check_run(private=True, unit=unit, **parts) == unit
    covering = PrivacyUnit.parse(label + "/predictions")
    with pytest.raises(PrivacyError, match="is not analysed by sampler 'graph_splits'"):
        check_run(private=True, unit=covering, **parts)
    with pytest.raises(PrivacyError, match="is not analysed by"):
        check_run(private=True, unit=PrivacyUnit(unit.kind, Adjacency.ADD_REMOVE, unit.degree_bound, unit.k), **parts)
    with pytest.raises(PrivacyError, match="is not analysed by sampler 'node_uniform_wor'"):
        from graphveil.plugins.node_dp.sampler import UniformNodeSampler

        check_run(private=True, unit=unit, sampler=("node_uniform_wor", UniformNodeSampler()),
                  clipper=("per_node_clip", PerNodeClipper()), accountant=("node_rdp", NodeReplaceRdpAccountant()))
    assert not split_local_weights_only(PrivacyUnit.NODE) and not split_local_weights_only(SPLIT_REPLACE)


def _canonical(graph: NodeGraph, pairs: set[tuple[int, int]], x: torch.Tensor, y: torch.Tensor) -> NodeGraph:
    """``graph``'s nodes (same ids) with features ``x``, labels ``y`` and the directed entries ``pairs``
    in sorted order (two graphs differing in one unit then list their common edges alike)."""
    edges = torch.tensor(sorted(pairs), dtype=torch.long).reshape(-1, 2).t()
    return NodeGraph(graph.name, x, y, edges, list(graph.node_ids), list(graph.class_names))


def _training_examples(task: SplitNodeClassification, sampler: GraphSplitsSampler) -> list[tuple[torch.Tensor, ...]]:
    """What training reads of every split: its graph in the lifted batch (node ids, features,
    labels, edges), as the DP-SGD step gets it."""
    batch = task.lift(all_splits(sampler))
    out = []
    for k in range(batch.size):
        g = batch.graphs.get_example(k)
        out.append((g.n_id, g.x, g.y, g.edge_index))
    return out


def _neighbour(graph: NodeGraph, level: str, gen: torch.Generator) -> tuple[NodeGraph, NodeGraph, set[int]]:
    """``(before, after, touched)``: the graph (canonical), a neighbour differing in one unit of
    ``level`` drawn at random, and the nodes the unit's change touches."""
    n = graph.num_nodes
    pairs = {tuple(e) for e in graph.edge_index.t().tolist()}
    x, y = graph.x.clone(), graph.y.clone()
    draw = lambda hi: int(torch.randint(0, hi, (1,), generator=gen))  # noqa: E731
    r = draw(n)
    if level in ("node", "k_neighbor"):  # r's features and label; every edge of r (node) or k entries of it
        x2, y2 = x.clone(), y.clone()
        x2[r] = torch.randn(FEATURES, generator=gen) * 10
        y2[r] = (y2[r] + 1 + draw(CLASSES - 1)) % CLASSES
        others = [w for w in range(n) if w != r]
        if level == "node":
            new = {(a, b) for a, b in pairs if r not in (a, b)}
            for w in others[:: 1 + draw(4)]:
                new |= {(r, w), (w, r)}
        else:
            new = set(pairs)
            for _ in range(3):
                w = others[draw(len(others))]
                new ^= {(r, w), (w, r)}
        return _canonical(graph, pairs, x, y), _canonical(graph, new, x2, y2), {r}
    w = (r + 1 + draw(n - 1)) % n  # undirected_edge: a node graph stores both directions of each edge
    return _canonical(graph, pairs, x, y), _canonical(graph, pairs ^ {(r, w), (w, r)}, x, y), {r, w}


@FAST
@given(seed=st.integers(0, 2**31 - 1), s=st.integers(1, 6),
       level=st.sampled_from(["node", "k_neighbor", "undirected_edge"]))
def test_one_gdp_unit_changes_the_training_examples_of_at_most_its_own_split(seed: int, s: int, level: str) -> None:
    """The argument DP-GCN's weights-only acceptance rests on, on random graphs: a neighbour that
    differs in one unit at a GDP level (one node replaced — features, label, every edge —, its
    features, label and a few entries, one undirected edge; a directed entry is half of one, and
    a node graph stores both halves) has the same
    training nodes, the same split assignment and the same sampler batches, and the examples
    training reads differ in exactly the split the change lies in (the replaced training node's;
    an edge's if both its ends train in one split) and in no other split."""
    gen = torch.Generator().manual_seed(seed)
    before, after, touched = _neighbour(random_graph(seed % 997, n=36, m=90), level, gen)
    tasks = [make_task(g, key=seed % 5) for g in (before, after)]
    samplers = [make_sampler(t, s, seed=seed % 11) for t in tasks]
    assert torch.equal(tasks[0].split.train, tasks[1].split.train)  # the keyed node split: ids only
    assert torch.equal(samplers[0].assignment, samplers[1].assignment)  # the keyed graph splits: ids only
    for sampler in samplers:  # the batches drawn: b of s, from the sampling generator alone
        sampler.params = GraphSplitsParams(num_splits=s, batch_size=max(1, s // 2), partition_seed=0)
    draws = [[sp.draw(torch.Generator().manual_seed(t)).tolist() for t in range(4)] for sp in samplers]
    assert draws[0] == draws[1]
    owner = split_of(samplers[0], tasks[0])  # training node → its split
    splits = {owner.get(v) for v in touched}
    expected = splits if None not in splits and len(splits) == 1 else set()
    if level in ("node", "k_neighbor"):  # r's features always change: its split, if r trains
        expected = {owner[next(iter(touched))]} if next(iter(touched)) in owner else set()
    old, new = (_training_examples(t, sp) for t, sp in zip(tasks, samplers, strict=True))
    changed = {k for k in range(s) if not all(torch.equal(a, b) for a, b in zip(old[k], new[k], strict=True))}
    assert changed == expected, (level, touched, changed, expected)


# ---------------------------------------------------------------------------------------------
# metrics and evaluation
# ---------------------------------------------------------------------------------------------


def test_macro_f1_and_accuracy_match_scikit_learn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    gen = torch.Generator().manual_seed(0)
    for n, k in ((200, 7), (50, 3), (9, 4)):
        target = torch.randint(0, k, (n,), generator=gen)
        pred = torch.where(torch.rand(n, generator=gen) < 0.6, target, torch.randint(0, k + 1, (n,), generator=gen))
        assert macro_f1(pred, target) == pytest.approx(metrics.f1_score(target, pred, average="macro"))
        micro = metrics.precision_recall_fscore_support(target, pred, average="micro")[2]  # paper 3's "F1"
        assert accuracy(pred, target) == pytest.approx(micro)
    assert math.isnan(macro_f1(torch.zeros(0), torch.zeros(0)))


def test_held_out_evaluation_reads_no_training_data_and_full_does() -> None:
    graph = random_graph(9, n=120, m=500)
    model = make_gcn(dtype=torch.float32)
    results = {}
    for eval_graph in ("held_out", "full"):
        task = make_task(graph, eval_graph=eval_graph)
        before = task.predict(model)
        saved = graph.x[task.split.train].clone()
        graph.x[task.split.train] = torch.randn(saved.shape) * 50
        after = task.predict(model)
        graph.x[task.split.train] = saved
        held = torch.cat([task.split.val, task.split.test])
        results[eval_graph] = torch.equal(before[held], after[held])
        metrics = task.evaluate(model)
        majority = int(torch.bincount(graph.y[task.split.train]).argmax())
        assert metrics["majority_accuracy"] == pytest.approx(float((graph.y[task.split.test] == majority).float().mean()))
        assert set(metrics) == {"test_accuracy", "test_macro_f1", "val_accuracy", "val_macro_f1",
                                "majority_accuracy", "majority_macro_f1"}
    assert results == {"held_out": True, "full": False}


# ---------------------------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------------------------


def private_session(graph: NodeGraph, sigma: float, clip: float, lr: float, s: int, b: int):
    from graphveil.run.session import TrainingSession

    raw = {
        "name": "e2e-dp-gcn", "seed": 1,
        "data": {"source": "planetoid", "split": {"kind": "random_node", "val_fraction": 0.1,
                                                  "test_fraction": 0.2, "seed": 4}},
        "task": {"name": "split_node_classification"},
        "model": {"name": "gcn", "hidden": 16, "layers": 2, "dropout": 0.0, "seed": 2},
        "sampler": {"name": "graph_splits", "num_splits": s, "batch_size": b},
        "clipper": {"name": "per_split_clip", "clip_norm": clip},
        "accountant": {"name": "split_rdp", "orders": [2.0, 4.0, 8.0, 16.0, 32.0]},
        "training": {"steps": 2, "optimizer": "sgd", "lr": lr},
        "privacy": {"noise_multiplier": sigma, "delta": 1e-4},
        "output": {"progress": False},
    }
    session = TrainingSession(config_from_dict(raw), graph=graph)
    session.prepare()
    return session


@pytest.mark.parametrize("run", range(2))
def test_a_private_session_step_is_the_hand_clipped_sum_plus_sigma_c_noise(run: int, one_thread) -> None:
    """Plain SGD at rate η: (θ_before − θ_after)·b/η = Σ clipped per-split gradients + z, where the
    per-split gradients are recomputed split by split at θ_before and clipped by hand. z/(σC) must be
    N(0, 1) over the ~300 weights (χ² and KS with false-alarm rates < 1e-6): fails if clipping is
    skipped, the noise is missing or mis-scaled, or the session runs the non-private step."""
    sigma, clip, lr, s, b = 2.0, 0.05, 0.01, 6, 2
    session = private_session(random_graph(20 + run, n=120, m=400, scale=3.0), sigma, clip, lr, s, b)
    params = list(session.encoder.trainable_parameters())
    drawn = []
    original = session.sampler.sample
    session.sampler.sample = lambda gen: drawn.append(original(gen)) or drawn[-1]  # type: ignore[method-assign]
    before = [p.detach().clone() for p in params]
    session.train(1)
    after = torch.cat([p.detach().reshape(-1) for p in params]).double()
    with torch.no_grad():
        for p, w in zip(params, before, strict=True):
            p.copy_(w)
    grads = naive_split_grads(session.encoder, session.task, drawn[-1])
    norms = norms_of(grads)
    assert bool((norms > 5 * clip).all()), "the clip norm binds for every split"
    total = sum(torch.cat([g.reshape(-1) for g in gs]).double() * min(1.0, clip / float(n))
                for gs, n in zip(grads, norms, strict=True))
    flat_before = torch.cat([w.reshape(-1) for w in before]).double()
    z = (b * (flat_before - after) / lr - total) / (sigma * clip)
    d = z.numel()
    chi2 = float((z**2).sum())
    assert stats.chi2.ppf(1e-9, d) < chi2 < stats.chi2.ppf(1 - 1e-9, d), (chi2, d)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-7
    report = session.privacy_report()
    assert report["unit"] == "graph/replacement" and report["sampling_profile"]["num_records"] == s
    assert report["num_units"] == session.task.split.train.numel()


@pytest.mark.slow
def test_a_non_private_gcn_on_cora_splits_beats_the_majority_class(one_thread) -> None:
    from graphveil.run.session import TrainingSession

    raw = {
        "name": "gcn-cora-nonprivate", "seed": 0,
        "data": {"source": "planetoid", "name": "cora", "split": {"kind": "planetoid_full"}},
        "task": {"name": "split_node_classification"},
        "model": {"name": "gcn", "seed": 0},
        "sampler": {"name": "graph_splits", "num_splits": 10, "batch_size": 1},
        "clipper": {"name": "per_split_clip", "clip_norm": 1.0},
        "accountant": {"name": "split_rdp"},
        "training": {"steps": 120, "optimizer": "adam", "lr": 0.01},
        "privacy": {"enabled": False},
        "output": {"progress": False},
    }
    session = TrainingSession(config_from_dict(raw))
    session.train()
    metrics = session.evaluate()
    assert session.task.split.train.numel() == 1208 and session.task.split.test.numel() == 1000
    assert metrics["majority_accuracy"] == pytest.approx(0.319, abs=0.001)
    assert metrics["test_accuracy"] > metrics["majority_accuracy"] + 0.3, metrics
    assert metrics["test_macro_f1"] > 0.5, metrics


@pytest.mark.slow
def test_the_example_config_runs_through_the_cli(tmp_path: Path, capsys, one_thread) -> None:
    from graphveil.apps.cli import main

    config = ROOT / "examples" / "dp_gcn_cora.yaml"
    out = tmp_path / "run"
    code = main(["run", str(config), "--set", "training.epochs=null", "--set", "training.steps=20",
                 "--set", "accountant.orders=[2, 4, 8, 16, 32, 64]", "--output", str(out), "--no-progress"])
    assert code == 0
    assert "test macro-F1" in capsys.readouterr().out
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["unit"] == "graph/replacement" and privacy["steps"] == 20
    assert privacy["sampler"] == "graph_splits" and privacy["accountant"] == "split_rdp"
    target = yaml.safe_load(config.read_text())["privacy"]["target_epsilon"]
    assert 0 < privacy["epsilon"] <= target + 1e-9
    assert privacy["delta"] == 1e-5
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert 0 <= evaluation["test_accuracy"] <= 1 and 0 <= evaluation["test_macro_f1"] <= 1
