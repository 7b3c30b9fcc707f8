"""What a degree bound D guarantees on the graph the owner has (issue 25, point 4).

* Node level (GAP, DPDGC, DP-SAGE): nothing is capped; a graph whose out-degree exceeds D is
  refused (DataError naming the method, the unit, D and the largest out-degree) before any stage
  runs. The issue's counterexample shows why: the keyed out-degree cap moves over a hundred
  rows ≠ r of A·H when the neighbour adds j → r for 200 sources (D = 2, claimed 2D + 1 = 5);
  the refusal fires on that neighbour. Property: for raw graphs and neighbours that add
  unbounded in- and out-edges to r, either a graph is refused or paper 4's bounds hold.
* k-neighbor level (GAP): the keyed cap on the raw graph moves the rows ≠ r of A·H by at most
  √(4D + k(k + 4)) and changes at most 2D + k of them (random raw graphs, neighbours changing
  k in-entries and k out-entries of r, columns reshuffled, many keys); a construction reaches
  the bound exactly (above 2√D).
* The obvious keyed alternatives for node level — cap in-degrees then out-degrees, the reverse,
  their union — are unstable on small gadgets too (why node level refuses instead).
* The cap's key is fresh per run, not derived from the run's seed.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from _gdp_runs import gdp_config, sage_config
from _graphs import hub_node_graph, node_graph_within
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.data import Data

from graphveil.contract.errors import DataError
from graphveil.contract.host import PluginHost
from graphveil.contract.units import PrivacyUnit
from graphveil.plugins.gdp.common import (
    aggregate,
    aggregation_edges,
    row_normalise,
)
from graphveil.plugins.gdp.levels import GdpLevel
from graphveil.run.session import TrainingSession
from graphveil.transforms import OutDegreeBound

NODE = "node/replacement/D={D}/predictions"
KNB = "k_neighbor/replacement/k={k}/D={D}/predictions"


def level(label: str, method: str = "gap") -> GdpLevel:
    return GdpLevel.of(PrivacyUnit.parse(label), method=method, needs_degree_bound=True)


def task_of(edges: torch.Tensor, n: int) -> Any:
    """What aggregation_edges reads of a task: its graph (features unused here)."""
    return SimpleNamespace(dataset=Data(x=torch.zeros(n, 1), edge_index=edges, num_nodes=n))


def as_edges(pairs: list[tuple[int, int]]) -> torch.Tensor:
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).t().contiguous()


def moved(e1: torch.Tensor, e2: torch.Tensor, h1: torch.Tensor, h2: torch.Tensor, r: int) -> tuple[int, float]:
    """Rows ≠ r of A·H that change between (e1, h1) and (e2, h2), and the ℓ2 norm of the change."""
    delta = aggregate(h1, e1) - aggregate(h2, e2)
    delta[r] = 0
    return int((delta.abs().sum(dim=1) > 1e-9).sum()), float(delta.norm())


def aligned_h(n: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The worst H for counting: every row e₁, and H'_r = −e₁."""
    h = torch.zeros(n, 2, dtype=torch.float64)
    h[:, 0] = 1.0
    h2 = h.clone()
    h2[r, 0] = -1.0
    return h, h2


def issue_pair(m: int = 200) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Issue 25's counterexample: sources j with out-edges to a_j, b_j (out-degree 2 = D); the
    neighbour replaces r = 0 by a node with an in-edge j → r from every j."""
    sources = [1 + 3 * t for t in range(m)]
    pairs = [(j, j + o) for j in sources for o in (1, 2)]
    return as_edges(pairs), as_edges(pairs + [(j, 0) for j in sources]), 0, 1 + 3 * m


def keyed(seed: int) -> bytes:
    return bytes((seed * 31 + i) % 256 for i in range(32))


# ----------------------------------------------------------------------------- node level


@pytest.mark.parametrize("method", ["gap", "dpdgc", "dp_sage"])
def test_the_issue_counterexample_is_refused_at_node_level(method: str) -> None:
    g, g2, _, n = issue_pair()
    lv = level(NODE.format(D=2), method)
    # inside the class: the raw graph as it is, no cap
    assert torch.equal(aggregation_edges(task_of(g, n), lv, caps=method == "gap"), g)
    expected = (f"{method} at node level with D=2 needs a graph whose out-degree is at most 2 "
                r"\(this graph has nodes of out-degree up to 3\)")
    with pytest.raises(DataError, match=expected) as refused:
        aggregation_edges(task_of(g2, n), lv, caps=method == "gap")
    assert "'node/replacement/D=3/predictions'" in str(refused.value)


def test_the_keyed_cap_is_not_stable_under_node_replacement() -> None:
    """Why node level cannot cap: on the counterexample the keyed cap changes ~2/3 of the 200
    sources' other rows, for every key (claimed at node level: 2D + 1 = 5 rows, ‖Δ‖ ≤ 2√2)."""
    g, g2, r, n = issue_pair()
    h, h2 = aligned_h(n, r)
    for seed in range(8):
        cap = OutDegreeBound(2, keyed(seed))
        rows, norm = moved(cap(Data(edge_index=g, num_nodes=n)).edge_index,
                           cap(Data(edge_index=g2, num_nodes=n)).edge_index, h, h2, r)
        assert rows >= 100 and norm >= 10.0, (seed, rows, norm)


@st.composite
def raw_replacement(draw: st.DrawFn) -> tuple[int, int, torch.Tensor, torch.Tensor, int, bool]:
    """A graph of out-degree ≤ D and a neighbour replacing r: r's out-edges rewired (as many as
    drawn when ``wild``), its in-edges removed, and new in-edges j → r from any sources —
    unbounded when ``wild``, from sources with spare out-degree otherwise."""
    n, d = draw(st.integers(5, 14)), draw(st.integers(1, 3))
    wild = draw(st.booleans())
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    pairs = []
    for j in range(n):
        others = [i for i in range(n) if i != j]
        for p in torch.randperm(n - 1, generator=gen)[: int(torch.randint(0, d + 1, (1,), generator=gen))]:
            pairs.append((j, others[int(p)]))
    r = int(torch.randint(n, (1,), generator=gen))
    kept = [(j, i) for j, i in pairs if j != r and (i != r or bool(torch.rand(1, generator=gen) < 0.5))]
    out_count = int(torch.randint(0, (n - 1 if wild else d) + 1, (1,), generator=gen))
    others = [i for i in range(n) if i != r]
    fresh = [(r, others[int(p)]) for p in torch.randperm(n - 1, generator=gen)[:out_count]]
    degree = torch.bincount(as_edges(kept)[0], minlength=n) if kept else torch.zeros(n, dtype=torch.long)
    new_in = [(j, r) for j in others if bool(torch.rand(1, generator=gen) < 0.7)
              and (wild or int(degree[j]) < d) and (j, r) not in kept]
    return n, d, as_edges(pairs), as_edges(kept + fresh + new_in), r, wild


@given(raw_replacement(), st.integers(0, 2**31))
@settings(max_examples=80, deadline=None)
def test_node_level_refuses_or_keeps_paper_4s_bounds(case: Any, seed: int) -> None:
    """For every raw pair: a graph above D is refused; otherwise (both inside the class) the
    edges read are the raw ones and A·H moves by ≤ 2√D, DP-Emb's A·W by ≤ c√(2D) in ≤ 2D + 1 rows."""
    n, d, g, g2, r, wild = case
    lv = level(NODE.format(D=d))
    assert torch.equal(aggregation_edges(task_of(g, n), lv, caps=True), g)
    largest = int(torch.bincount(g2[0], minlength=n).max())
    if largest > d:
        assert wild
        with pytest.raises(DataError, match=f"out-degree up to {largest}"):
            aggregation_edges(task_of(g2, n), lv, caps=True)
        return
    e2 = aggregation_edges(task_of(g2, n), lv, caps=True)
    assert torch.equal(e2, g2)
    gen = torch.Generator().manual_seed(seed)
    h = row_normalise(torch.randn(n, 4, generator=gen, dtype=torch.float64))
    h2 = h.clone()
    h2[r] = row_normalise(torch.randn(1, 4, generator=gen, dtype=torch.float64))[0]
    assert moved(g, e2, h, h2, r)[1] <= lv.aggregation_sensitivity() + 1e-9
    w = row_normalise(torch.randn(n, 3, generator=gen, dtype=torch.float64)) * 0.5
    rows, norm = moved(g, e2, w, w, r)
    assert norm <= lv.embedding_sensitivity(0.5) + 1e-9 and rows + 1 <= lv.changed_rows()


def test_the_refusal_fires_before_any_stage_runs() -> None:
    """GAP, DPDGC and DP-SAGE at node level with D = 3 on a graph with degrees up to 7: refused
    when the data is loaded, nothing released, no step taken; with D = 7 GAP reads the raw graph."""
    host, raw = PluginHost(), hub_node_graph()
    largest = int(torch.bincount(raw.edge_index[0]).max())
    assert largest == 7
    for name, cfg in (("gap", gdp_config("gap", NODE.format(D=3))), ("dpdgc", gdp_config("dpdgc", NODE.format(D=3))),
                      ("dp_sage", sage_config())):
        session = TrainingSession(cfg, host=host, graph=raw)
        with pytest.raises(DataError, match=f"{name} at node level with D=3 .* out-degree up to 7"):
            session.prepare()
        assert dict(session.released) == {} and session.steps_done == 0
    session = TrainingSession(gdp_config("gap", NODE.format(D=7), hops=1), host=host, graph=raw)
    session.prepare()
    assert torch.equal(session.plan.releases[1].mechanism.bounded_edges, raw.edge_index)


# ----------------------------------------------------------------------------- k-neighbor level


@st.composite
def k_neighbor_change(draw: st.DrawFn) -> tuple[int, int, int, torch.Tensor, torch.Tensor, int]:
    """A raw graph (out-degrees up to n − 1) and a neighbour changing node r's features, at most
    k of its in-entries j → r and at most k of its out-entries r → i (any direction: added or
    removed; no self-loop), its columns in a fresh order."""
    n, d, k = draw(st.integers(5, 16)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    dense = torch.rand(n, n, generator=gen) < draw(st.sampled_from([0.2, 0.5, 0.8]))
    dense.fill_diagonal_(False)
    r = int(torch.randint(n, (1,), generator=gen))
    changed = dense.clone()
    others = torch.tensor([i for i in range(n) if i != r])
    for _ in range(int(torch.randint(0, k + 1, (1,), generator=gen))):  # distinct in-entries j → r
        j = int(others[torch.randint(n - 1, (1,), generator=gen)])
        changed[j, r] = ~dense[j, r]
    for _ in range(int(torch.randint(0, k + 1, (1,), generator=gen))):  # distinct out-entries r → i
        i = int(others[torch.randint(n - 1, (1,), generator=gen)])
        changed[r, i] = ~dense[r, i]
    g, g2 = dense.nonzero().t().contiguous(), changed.nonzero().t().contiguous()
    g2 = g2[:, torch.randperm(g2.shape[1], generator=gen)]
    return n, d, k, g, g2, r


@given(k_neighbor_change(), st.binary(min_size=32, max_size=32), st.integers(0, 2**31), st.booleans())
@settings(max_examples=150, deadline=None)
def test_the_keyed_cap_moves_at_most_the_stated_k_neighbor_sensitivity(
        case: Any, key: bytes, seed: int, aligned: bool) -> None:
    n, d, k, g, g2, r = case
    lv = level(KNB.format(k=k, D=d))
    e1 = aggregation_edges(task_of(g, n), lv, caps=True, key=key)
    e2 = aggregation_edges(task_of(g2, n), lv, caps=True, key=key)
    assert int(torch.bincount(e1[0], minlength=n).max()) <= d and int(torch.bincount(e2[0], minlength=n).max()) <= d
    if aligned:
        h, h2 = aligned_h(n, r)
    else:
        gen = torch.Generator().manual_seed(seed)
        h = row_normalise(torch.randn(n, 3, generator=gen, dtype=torch.float64))
        h2 = h.clone()
        h2[r] = -h[r]
    rows, norm = moved(e1, e2, h, h2, r)
    assert norm <= lv.aggregation_sensitivity() + 1e-9
    assert rows <= 2 * d + k


def test_the_k_neighbor_bound_is_reached() -> None:
    """K_r = K'_r = {1..D}, H'_r = −H_r, and k sources j lose j → r, so that their column j → z
    (z = 1 ∈ K_r, of rank D behind j → r) enters: row z moves by k + 2, the others by 2."""
    for d, k, seed in ((1, 1, 0), (3, 2, 1), (2, 4, 2)):
        key, r, z, n = keyed(seed), 0, 1, 400
        fillers = list(range(d + 1, d + 40))
        pairs, sources = [(r, t) for t in range(1, d + 1)], []
        for j in range(d + 40, n):
            prio = {w: edge_priority(j, w, key) for w in [r, z, *fillers]}
            below = [w for w in fillers if prio[w] < prio[z]]
            if len(sources) < k and prio[r] < prio[z] and len(below) >= d - 1:
                sources.append(j)
                pairs += [(j, z), *[(j, w) for w in below[: d - 1]]]
        assert len(sources) == k
        g2 = as_edges(pairs)
        g = as_edges(pairs + [(j, r) for j in sources])
        lv = level(KNB.format(k=k, D=d))
        e1 = aggregation_edges(task_of(g, n), lv, caps=True, key=key)
        e2 = aggregation_edges(task_of(g2, n), lv, caps=True, key=key)
        h = -aligned_h(n, r)[0]  # every row −e₁ ...
        h[r, 0] = 1.0            # ... but H_r = e₁, and H'_r = −e₁
        rows, norm = moved(e1, e2, h, -aligned_h(n, r)[0], r)
        assert norm == pytest.approx(lv.aggregation_sensitivity(), rel=1e-12)
        assert norm > 2 * math.sqrt(d) and rows == d


def edge_priority(src: int, dst: int, key: bytes) -> int:
    from graphveil.transforms import edge_priorities

    return int(edge_priorities(torch.tensor([[src], [dst]]), key)[0])


# ----------------------------------------------------------------------------- alternatives


def _cap(edges: torch.Tensor, n: int, d: int, key: bytes, *, incoming: bool = False) -> torch.Tensor:
    """Keyed cap of out-degrees (or of in-degrees: the same rule on the reversed edges)."""
    flip = edges.flip(0) if incoming else edges
    kept = OutDegreeBound(d, key)(Data(edge_index=flip, num_nodes=n)).edge_index
    return kept.flip(0) if incoming else kept


def _union(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.unique(torch.cat([a, b], dim=1), dim=1)


ALTERNATIVES = {
    "in then out": lambda e, n, k: _cap(_cap(e, n, 2, k, incoming=True), n, 2, k),
    "out then in": lambda e, n, k: _cap(_cap(e, n, 2, k), n, 2, k, incoming=True),
    "union": lambda e, n, k: _union(ALTERNATIVES["in then out"](e, n, k), ALTERNATIVES["out then in"](e, n, k)),
}


def out_gadget(m: int = 100) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """r = 0 gains out-edges to m targets x, each with 2 (= the in-cap) in-edges from sources w
    that have 2 more out-edges each."""
    pairs, fresh, nxt = [], [], 1
    for _ in range(m):
        x, nxt = nxt, nxt + 1
        for w in (nxt, nxt + 1):
            pairs += [(w, x), (w, nxt + 2), (w, nxt + 3)]
            nxt += 2
        nxt += 2
        fresh.append((0, x))
    return as_edges(pairs), as_edges(pairs + fresh), 0, nxt


@pytest.mark.parametrize(("name", "gadget"), [("in then out", out_gadget), ("out then in", issue_pair),
                                              ("union", out_gadget)])
def test_the_obvious_keyed_rules_are_unstable_too(name: str, gadget: Any) -> None:
    """Each alternative moves far more than 2D + 1 = 5 rows ≠ r on one gadget (D = in-cap = 2)."""
    g, g2, r, n = gadget(100) if gadget is out_gadget else gadget(150)
    h, h2 = aligned_h(n, r)
    for seed in range(3):
        rule = ALTERNATIVES[name]
        rows, _ = moved(rule(g, n, keyed(seed)), rule(g2, n, keyed(seed)), h, h2, r)
        assert rows >= 20, (name, seed, rows)


# ----------------------------------------------------------------------------- the key


def test_the_cap_key_is_fresh_per_run_not_the_seed() -> None:
    """Two GAP runs at k-neighbor level with the same seed cap the same raw graph differently."""
    host, raw = PluginHost(), hub_node_graph()
    caps = []
    for _ in range(2):
        session = TrainingSession(gdp_config("gap", KNB.format(k=1, D=3), hops=1), host=host, graph=raw)
        session.prepare()
        edges = session.plan.releases[1].mechanism.bounded_edges
        assert int(torch.bincount(edges[0]).max()) <= 3 < int(torch.bincount(raw.edge_index[0]).max())
        caps.append(edges)
    assert not torch.equal(caps[0], caps[1])


def test_node_graph_within_is_inside_the_class() -> None:
    graph = node_graph_within(3)(n=400)
    assert int(torch.bincount(graph.edge_index[0]).max()) == 3
