"""The transfer split: disjoint entity sets, keyed per entity (stable under removal), relations kept only inside a side."""

from __future__ import annotations

import hashlib
import hmac
import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data import RelationalGraph, load_bundled_citeseer, transfer_split
from graphveil.data.split import split_key, split_position
from graphveil.data.validate import canonical_edges


def make_graph(n: int, pairs: list[tuple[int, int]]) -> RelationalGraph:
    edges, _, _ = canonical_edges(torch.tensor(pairs, dtype=torch.long).reshape(-1, 2))
    return RelationalGraph(
        name="g", entity_ids=[f"e{i}" for i in range(n)], edges=edges,
        texts=[f"text {i}" for i in range(n)], labels=torch.arange(n) % 3, label_names=["a", "b", "c"],
    )


def id_edges(g: RelationalGraph) -> set[frozenset[str]]:
    return {frozenset((g.entity_ids[u], g.entity_ids[v])) for u, v in g.edges.tolist()}


def reference_side(g: RelationalGraph, fraction: float, seed: int) -> set[str]:
    """Naive reference: the entities whose keyed hash falls below the fraction."""
    import hashlib
    import hmac

    key = f"graphveil-transfer-split:{seed}".encode()
    return {e for e in g.entity_ids
            if int.from_bytes(hmac.new(key, e.encode(), hashlib.sha256).digest()[:8], "big") < fraction * 2**64}


def check_split(g: RelationalGraph, train: RelationalGraph, test: RelationalGraph, fraction: float,
                seed: int) -> None:
    a, b = set(train.entity_ids), set(test.entity_ids)
    assert not a & b and a | b == set(g.entity_ids)
    assert a == reference_side(g, fraction, seed)
    # each side = the original relations with both ends on that side (naive reference)
    full = id_edges(g)
    assert id_edges(train) == {e for e in full if e <= a}
    assert id_edges(test) == {e for e in full if e <= b}
    cross = sum(1 for e in full if not e <= a and not e <= b)
    assert train.notes["dropped_cross_edges"] == test.notes["dropped_cross_edges"] == cross
    for side in (train, test):
        assert bool((side.edges[:, 0] < side.edges[:, 1]).all()) and side.edges.dtype == torch.int64
        position = {eid: i for i, eid in enumerate(g.entity_ids)}
        rows = [position[e] for e in side.entity_ids]
        assert rows == sorted(rows)  # the original entity order is kept
        assert side.texts == [g.texts[i] for i in rows]
        assert side.labels.tolist() == [int(g.labels[i]) for i in rows]


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 20), data=st.data())
def test_subgraph_by_indices_or_mask_is_the_induced_subgraph(n: int, data: st.DataObject) -> None:
    """``RelationalGraph.subgraph`` (issue 28: a bool-mask gather) against a naive induced
    subgraph: the same entities in order, rows of every per-entity field, and relations."""
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=60))
    g = make_graph(n, pairs)
    g.features = torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)
    chosen = data.draw(st.lists(st.integers(0, n - 1), max_size=n + 3))  # repeats, any order
    rows = sorted(set(chosen))
    mask = torch.zeros(n, dtype=torch.bool)
    mask[rows] = True
    for sub in (g.subgraph(torch.tensor(chosen, dtype=torch.long)), g.subgraph(mask)):
        assert sub.entity_ids == [g.entity_ids[i] for i in rows]
        assert sub.texts == [g.texts[i] for i in rows]
        assert sub.labels.tolist() == [int(g.labels[i]) for i in rows]
        assert sub.features.tolist() == [g.features[i].tolist() for i in rows]
        assert sub.edges.dtype == torch.int64 and sub.edges.shape[1] == 2
        want = [[rows.index(u), rows.index(v)] for u, v in g.edges.tolist() if u in rows and v in rows]
        assert sub.edges.tolist() == want  # order of g's relations kept
    with pytest.raises(ValueError, match=rf"mask must have shape \({n},\), got \({n + 1},\)"):
        g.subgraph(torch.ones(n + 1, dtype=torch.bool))


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 25),
    data=st.data(),
    fraction=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**31 - 1),
)
def test_split_properties(n: int, data: st.DataObject, fraction: float, seed: int) -> None:
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=80))
    g = make_graph(n, pairs)
    try:
        train, test = transfer_split(g, fraction, seed)
    except DataError as exc:
        # only allowed when a side is empty or has no relation; check with the naive reference
        side = {i for i, e in enumerate(g.entity_ids) if e in reference_side(g, fraction, seed)}
        edges = g.edges.tolist()
        inside_train = sum(u in side and v in side for u, v in edges)
        inside_test = sum(u not in side and v not in side for u, v in edges)
        assert min(inside_train, inside_test) == 0, str(exc)
        assert "split" in str(exc) or "leaves a side empty" in str(exc)
        return
    check_split(g, train, test, fraction, seed)


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 30),
    data=st.data(),
    fraction=st.floats(0.05, 0.95),
    seed=st.integers(0, 2**31 - 1),
)
def test_removing_an_entity_moves_no_other(n: int, data: st.DataObject, fraction: float, seed: int) -> None:
    """Issue 6.2: the side of every other entity is the same with or without any one entity."""
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=80))
    g = make_graph(n, pairs)
    removed = data.draw(st.integers(0, n - 1))
    keep = torch.tensor([i for i in range(n) if i != removed], dtype=torch.long)
    smaller = g.subgraph(keep, name="g-minus-one")
    key = split_key(seed)
    full_side = {e: split_position(key, e) < fraction for e in g.entity_ids}
    small_side = {e: split_position(key, e) < fraction for e in smaller.entity_ids}
    assert all(small_side[e] == full_side[e] for e in smaller.entity_ids)
    # and through transfer_split itself whenever both splits are valid
    try:
        a = transfer_split(g, fraction, seed)
        b = transfer_split(smaller, fraction, seed)
    except DataError:
        return
    gone = g.entity_ids[removed]
    assert set(b[0].entity_ids) == set(a[0].entity_ids) - {gone}
    assert set(b[1].entity_ids) == set(a[1].entity_ids) - {gone}


def test_deterministic_and_independent_of_global_rng() -> None:
    g = make_graph(40, [(i, (i * 7 + 3) % 40) for i in range(40)] + [(i, i + 1) for i in range(39)])
    torch.manual_seed(1)
    a = transfer_split(g, 0.5, 3)
    torch.manual_seed(2)
    torch.rand(100)
    b = transfer_split(g, 0.5, 3)
    assert a[0].entity_ids == b[0].entity_ids and torch.equal(a[0].edges, b[0].edges)
    assert a[1].entity_ids == b[1].entity_ids and torch.equal(a[1].edges, b[1].edges)
    c = transfer_split(g, 0.5, 4)
    assert c[0].entity_ids != a[0].entity_ids


def test_bad_fraction_and_empty_side() -> None:
    g = make_graph(6, [(0, 1), (1, 2), (3, 4)])
    for bad in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(ConfigError, match="train_fraction must be in"):
            transfer_split(g, bad, 0)
    with pytest.raises(DataError, match="leaves a side empty"):
        transfer_split(make_graph(3, [(0, 1)]), 0.01, 0)
    star = make_graph(10, [(0, i) for i in range(1, 10)])  # every relation touches entity 0
    with pytest.raises(DataError, match=r"no relations inside this side of the split"):
        transfer_split(star, 0.5, 0)


@pytest.mark.parametrize("fraction", [0.5, 0.7])
def test_citeseer_split_key0(fraction: float, caplog) -> None:
    g = load_bundled_citeseer()
    with caplog.at_level(logging.INFO, logger="graphveil.data"):
        train, test = transfer_split(g, fraction, 0)
    # Binomial(n, fraction) training entities: within 5 standard deviations of the mean
    n = g.num_nodes
    assert abs(train.num_nodes - fraction * n) < 5 * (n * fraction * (1 - fraction)) ** 0.5
    assert train.num_nodes + test.num_nodes == n
    cross = train.notes["dropped_cross_edges"]
    assert train.num_edges + test.num_edges + cross == 4225
    assert f"{cross} cross relations discarded" in caplog.text
    check_split(g, train, test, fraction, 0)


@settings(max_examples=80, deadline=None)
@given(key=st.binary(min_size=0, max_size=150), ids=st.lists(st.text(max_size=30), max_size=20))
def test_split_positions_are_the_hmac_of_every_id(key: bytes, ids: list[str]) -> None:
    """The batch form (issue 28: keyed once, copied per id) against the standard library's
    HMAC-SHA256, keys shorter and longer than SHA-256's block, any Unicode id."""
    from graphveil.data.split import split_positions

    want = [int.from_bytes(hmac.new(key, e.encode("utf-8"), hashlib.sha256).digest()[:8], "big") / 2.0**64
            for e in ids]
    got = split_positions(key, ids)
    assert got.dtype == torch.float64 and got.tolist() == want
    assert [split_position(key, e) for e in ids] == want
