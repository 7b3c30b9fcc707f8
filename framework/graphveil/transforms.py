"""Graph transforms for node-level DP on graphs (paper 4).

PyG conventions throughout: ``edge_index[0]`` is the source, ``edge_index[1]`` the target, and
messages flow source → target. Every transform is a :class:`~torch_geometric.transforms.BaseTransform`
that returns a new :class:`~torch_geometric.data.Data` and leaves its input untouched (tensors
it does not change are shared, as in PyG's own transforms). Every random choice is drawn from
one ``torch.Generator`` (reproducible for a seed; by default a fresh one seeded from the OS's
entropy via :mod:`secrets`), except :class:`OutDegreeBound`'s order, a keyed function of each edge.

* :class:`OutDegreeBound` — out-degree cap D by a secret keyed edge order (GAP's k-neighbor
  level, paper 4 Sec. 5.1; its stability lemma and what it does not give at node level).
* :class:`DegreeCap` — symmetric undirected degree cap K (greedy random edge dropping; no
  stability under replacing a node, used by no private path).
* :class:`DpGnnPreprocess` — the node-classification preprocessing of paper 4's code.

The contextual SBM graphs of paper 4 live in :mod:`graphveil.data.synthetic`.
"""

from __future__ import annotations

import secrets

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

__all__ = [
    "EDGE_KEY_BYTES",
    "DegreeCap",
    "DpGnnPreprocess",
    "OutDegreeBound",
    "edge_priorities",
]


def _generator(generator: torch.Generator | None) -> torch.Generator:
    if generator is None:
        return torch.Generator().manual_seed(secrets.randbits(63))
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return generator


def _positive_int(name: str, value: int, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _edge_index(data: Data) -> tuple[torch.Tensor, int]:
    """``data.edge_index`` and ``data.num_nodes``, checked (ValueError naming the problem)."""
    edge_index = getattr(data, "edge_index", None)
    if edge_index is None:
        raise ValueError("data has no edge_index (a SparseTensor adj_t is not supported)")
    if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.dtype != torch.long:
        raise ValueError(f"data.edge_index must be an int64 (2, E) tensor, "
                         f"got {tuple(edge_index.shape)} {edge_index.dtype}")
    num_nodes = data.num_nodes
    if num_nodes is None:
        raise ValueError("data.num_nodes is unknown")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"data.edge_index has endpoints outside 0..{num_nodes - 1}")
    return edge_index, num_nodes


class _DegreeTransform(BaseTransform):
    """A transform that keeps a subset of the columns, bounded by ``max_degree``: subclasses
    give :meth:`keep_mask`; ``last_dropped`` counts the columns the last call dropped."""

    def __init__(self, max_degree: int) -> None:
        self.max_degree = _positive_int("max_degree", max_degree)
        self.last_dropped: int | None = None

    def keep_mask(self, edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, data: Data) -> Data:
        edge_index, num_nodes = _edge_index(data)
        keep = self.keep_mask(edge_index, num_nodes)
        self.last_dropped = int((~keep).sum())
        return data.edge_subgraph(keep)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(max_degree={self.max_degree})"


#: bytes of the key of :class:`OutDegreeBound` (AES-256)
EDGE_KEY_BYTES = 32


def edge_priorities(edge_index: torch.Tensor, key: bytes) -> np.ndarray:
    """``(E,)`` uint64 priority of every column: the first 8 bytes of AES-256(key, src ‖ dst).

    A keyed pseudorandom function of the edge's two endpoints alone — not of its position in
    ``edge_index``, of the other edges or of any node attribute — so an edge present in two
    neighbouring graphs has the same priority in both. Distinct (src, dst) pairs are distinct AES
    blocks; their 64-bit prefixes collide with probability ≈ E²/2⁶⁵ (ties are broken by
    ``dst``, then input order, see :class:`OutDegreeBound`). One ECB pass over 16·E bytes
    (vectorised, no Python loop).
    """
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    if not isinstance(key, bytes) or len(key) != EDGE_KEY_BYTES:
        raise ValueError(f"key must be {EDGE_KEY_BYTES} bytes (e.g. secrets.token_bytes({EDGE_KEY_BYTES})), "
                         f"got {type(key).__name__} of length {len(key) if isinstance(key, bytes) else '?'}")
    blocks = np.empty((edge_index.shape[1], 2), dtype="<u8")
    blocks[:, 0] = edge_index[0].cpu().numpy()
    blocks[:, 1] = edge_index[1].cpu().numpy()
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # noqa: S305 - a PRF on distinct blocks
    cipher = encryptor.update(blocks.tobytes()) + encryptor.finalize()
    return np.frombuffer(cipher, dtype="<u8").reshape(-1, 2)[:, 0].copy()


class OutDegreeBound(_DegreeTransform):
    """Cap every node's out-degree at ``max_degree`` = D by a secret keyed order of the edges.

    Rule: every column (j → i) gets the priority :func:`edge_priorities` (AES-256 under
    ``key`` of the pair (j, i)); each source j keeps its min(D, outdeg j) columns of lowest
    priority (ties: lower ``dst``, then input order). The key is 32 bytes from :mod:`secrets`,
    fresh for every transform unless given: never derived from a seed, a node id or the data,
    so the order is independent of the graph. For a uniformly random key, each node's kept set
    is (up to the PRF) a uniformly random D-subset of its out-edges, independently across nodes.
    Vectorised, O(E log E); the output is a subset of the input columns in input order, with
    per-edge attributes aligned (PyG's ``Data.edge_subgraph``); ``last_dropped`` counts the
    columns dropped by the last call. A self-loop is an out-edge of its node; multi-edges count
    once per column (copies share a priority, so the number of kept copies depends only on
    the multiset).

    **Stability (what node-level sensitivity can and cannot use).** Fix the key. For graphs G,
    G' on the same nodes, write K_j, K'_j for the kept out-edges of j. Because j's kept set is
    a function of j's own raw out-list alone (the priorities of its edges do not depend on
    anything else):

    (a) if j's raw out-lists in G and G' are equal, K_j = K'_j;
    (b) if they differ by one column e (added or removed), K_j △ K'_j ⊆ {e, f} for one other
        column f of j (the D-th column of lowest priority, pushed out or let in).

    *Proof of (b).* Say G' = G + e. If e ranks ≥ D among j's columns in G', the D lowest are
    those of G: K'_j = K_j. Else e enters, and the column of rank D − 1 in G (if j had ≥ D)
    moves to rank D and leaves: K'_j = K_j + e − f. Removal is the same read backwards. ∎

    Consequence for paper 4's k-neighbor level (Def. 4.1: node r's features and label replaced,
    at most k entries of row r — in-edges j → r — and k of column r — out-edges r → i — changed,
    A_rr excluded), with row i ≠ r of A·H the sum of h_j over the kept in-edges j → i and
    every ‖h_j‖ ≤ 1 (H row-normalised; h_r may change arbitrarily, every other row is equal):

        ‖[Ã·H]_{≠r} − [Ã'·H']_{≠r}‖ ≤ √(4D + k(k + 4)),

    tight. *Proof.* Every changed column touches r. Sources j ≠ r whose out-list holds no
    changed column keep K_j (a). A source j ≠ r with changed in-entries j → r changes, by (b)
    applied once per entry, only columns j → r (row r, excluded) and at most one column j → z
    per entry (row z gains or loses h_j): a ≤ k unit vectors in all. r's own kept sets K_r,
    K'_r have ≤ D columns each; row i ≠ r moves by u_i = [i ∈ K'_r] h'_r − [i ∈ K_r] h_r, with
    ‖u_i‖ ≤ 2 on K_r ∩ K'_r, ≤ 1 on K_r △ K'_r, so Σ‖u_i‖² ≤ 4|∩| + |△| ≤ 4|∩| + 2(D − |∩|)
    ≤ 4D. With v_i the
    sum of the unit vectors landing on row i (Σ‖v_i‖ ≤ a), Σ‖u_i + v_i‖² ≤ Σ‖u_i‖² +
    2·max‖u_i‖·Σ‖v_i‖ + (Σ‖v_i‖)² ≤ 4D + 4k + k². Equality: K_r = K'_r of size D, h'_r = −h_r,
    and k in-neighbours j of r, all with h_j = −h_r and a column j → z to one z ∈ K_r of rank
    D in j's list behind j → r, lose j → r. ∎ At most 2D + k rows other than r change.

    **What it does not give: node level on the raw graph.** Replacing r may add unboundedly
    many in-edges j → r; by (b) each such j may trade one of its other columns, so the change
    is unbounded (issue 25's example: D = 2, 200 sources with two out-edges each gain j → r:
    over a hundred rows change, ``tests/plugins/gdp/test_gdp_degree_class.py``). Capping in-degrees first bounds
    r's in-edges but lets r's raw out-edges displace other in-edges at their targets, whose
    sources then keep other edges; the reverse order fails on r's in-edges, and keeping the
    union of both fails two hops further (same test file, on small gadgets). No stable rule is
    known here, so node-level methods refuse a graph whose out-degree exceeds D and cap nothing
    (``plugins/graphveil/plugins/gdp/common.py``): their guarantee is paper 4's, over graphs of out-degree ≤ D.
    """

    def __init__(self, max_degree: int, key: bytes | None = None) -> None:
        super().__init__(max_degree)
        self.key = secrets.token_bytes(EDGE_KEY_BYTES) if key is None else key
        if not isinstance(self.key, bytes) or len(self.key) != EDGE_KEY_BYTES:
            raise ValueError(f"key must be {EDGE_KEY_BYTES} bytes or None (a fresh secrets.token_bytes), "
                             f"got {type(key).__name__}")

    def keep_mask(self, edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
        """``(E,)`` bool mask of the columns kept (see the class docstring)."""
        src, dst = edge_index[0].cpu().numpy(), edge_index[1].cpu().numpy()
        # lexsort: last key is primary — by source, then priority, then target, then input order
        order = np.lexsort((dst, edge_priorities(edge_index, self.key), src))
        sorted_src = src[order]
        counts = np.bincount(src, minlength=num_nodes)
        first = np.cumsum(counts) - counts  # position of each source's first column in `order`
        rank = np.arange(src.size) - first[sorted_src]
        keep = np.zeros(src.size, dtype=bool)
        keep[order] = rank < self.max_degree
        return torch.from_numpy(keep).to(edge_index.device)


class DegreeCap(_DegreeTransform):
    """Cap every node's degree at ``max_degree`` = K in an undirected graph, keeping it symmetric.

    Input: an undirected graph in PyG's layout, every column (u, v) matched by a column (v, u)
    (multi-edges by multiplicity; ValueError otherwise). Degree = number of columns with the
    node as source (``torch_geometric.utils.degree(edge_index[0])``), so a self-loop counts once.

    Rule (greedy, as paper 1's Alg. 3 / Daigavane et al. Alg. 1): visit the undirected edges in
    a uniformly random order and keep one iff both of its ends still have fewer than K kept
    edges; (u, v) and (v, u) are kept or dropped together. Guarantees: the output is symmetric,
    a subset of the input columns (input order, edge attributes aligned as in
    :class:`OutDegreeBound`), every degree is ≤ K, an edge whose two ends have degree ≤ K is
    always kept, and the result is maximal (every dropped edge has an end with exactly K kept
    edges). It is *not* a uniform draw among maximal capped subgraphs. ``last_dropped`` counts
    the columns (both directions) dropped by the last call. Runs a Python loop over the edges
    that touch a node of degree > K only (lighter nodes can never block an edge).
    """

    def __init__(self, max_degree: int, generator: torch.Generator | None = None) -> None:
        super().__init__(max_degree)
        self.generator = _generator(generator)

    def keep_mask(self, edge_index: torch.Tensor, num_nodes: int) -> torch.Tensor:
        """``(E,)`` bool mask of the columns kept (see the class docstring)."""
        src, dst = edge_index.cpu()
        cols = torch.arange(src.numel())
        fwd, rev, loop = src < dst, src > dst, src == dst
        # Pair each (u, v), u < v, with a (v, u): equal keys u*N+v, matched in sorted order.
        fwd_key, fwd_order = torch.sort(src[fwd] * num_nodes + dst[fwd], stable=True)
        rev_key, rev_order = torch.sort(dst[rev] * num_nodes + src[rev], stable=True)
        if not torch.equal(fwd_key, rev_key):
            raise ValueError("DegreeCap needs an undirected edge_index: every column (u, v) "
                             "must have a matching reverse column (v, u)")
        # One unit per undirected edge: its columns, and its ends (u, v) or (u, u).
        unit_a = torch.cat([cols[fwd][fwd_order], cols[loop]])
        unit_b = torch.cat([cols[rev][rev_order], cols[loop]])
        u, v = src[unit_a], dst[unit_a]
        heavy = torch.bincount(src, minlength=num_nodes) > self.max_degree
        keep_unit = torch.ones(unit_a.numel(), dtype=torch.bool)
        order = torch.randperm(unit_a.numel(), generator=self.generator)
        order = order[(heavy[u] | heavy[v])[order]]
        kept = [0] * num_nodes  # kept edges so far, tracked at heavy nodes only
        us, vs, hv, flags = u.tolist(), v.tolist(), heavy.tolist(), keep_unit.tolist()
        cap = self.max_degree
        for t in order.tolist():
            a, b = us[t], vs[t]
            if (hv[a] and kept[a] >= cap) or (hv[b] and kept[b] >= cap):
                flags[t] = False
                continue
            kept[a] += 1
            if b != a:
                kept[b] += 1
        keep_unit = torch.tensor(flags, dtype=torch.bool)
        keep = torch.zeros(src.numel(), dtype=torch.bool)
        keep[unit_a[keep_unit]] = True
        keep[unit_b[keep_unit]] = True
        return keep.to(edge_index.device)


class DpGnnPreprocess(BaseTransform):
    """Node-classification preprocessing of paper 4's code (github.com/thupchnsky/dp-gnn).

    Checked against that repository (facts, no code copied): ``core/datasets/loader.py`` applies
    ``RandomNodeSplit(num_val=0.1, num_test=0.15)`` and ``FilterClassByCount(min_count=50,
    remove_unlabeled=True)`` (from sisaman/GAP), then ``RemoveSelfLoops`` and
    ``RemoveIsolatedNodes``. (google-research's ``differentially_private_gnns`` — Daigavane et
    al. — does none of these: it reads fixed OGB/GraphSAINT splits, adds reverse edges,
    subsamples adjacency lists and adds self-loops.) Steps, in the reference order:

    1. random node split (``split_first=True``, the reference's order): with
       ``n_val = round(val_fraction * N)``, ``n_test = round(test_fraction * N)`` (Python's
       round, as PyG) and ``perm = torch.randperm(N, generator)``: ``perm[:n_val]`` → val,
       the next ``n_test`` → test, the rest → train. This is PyG's ``RandomNodeSplit`` draw
       for draw, so a generator seeded s gives the reference's split under
       ``torch.manual_seed(s)``. Masks are node attributes, so later removals keep them
       aligned (and the fractions among survivors are then only close to the targets);
    2. classes with fewer than ``min_class_size`` nodes (counted over all nodes) are dropped
       with their nodes (induced subgraph); the remaining classes are re-indexed 0..C'-1 in
       their original order;
    3. self-loops are removed;
    4. nodes in no edge are removed (isolated after steps 2-3);
    5. with ``split_first=False`` the split is drawn here instead, on the surviving nodes, so
       the fractions are exact up to rounding.

    Output: boolean ``train_mask``/``val_mask``/``test_mask`` partitioning the nodes; node and
    edge attributes restricted alongside (PyG's ``Data.subgraph``). Directions are left as they
    are. ``last_stats`` holds the counts removed by the last call.
    """

    def __init__(
        self,
        *,
        min_class_size: int = 50,
        val_fraction: float = 0.1,
        test_fraction: float = 0.15,
        split_first: bool = True,
        generator: torch.Generator | None = None,
    ) -> None:
        self.min_class_size = _positive_int("min_class_size", min_class_size)
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not isinstance(value, float | int) or not 0.0 < value < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {value!r}")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be < 1, got "
                             f"{val_fraction} + {test_fraction}")
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.split_first = split_first
        self.generator = _generator(generator)
        self.last_stats: dict[str, int] = {}

    def _split(self, data: Data) -> Data:
        n = data.num_nodes
        n_val, n_test = round(n * self.val_fraction), round(n * self.test_fraction)
        perm = torch.randperm(n, generator=self.generator).to(data.y.device)
        masks = [torch.zeros(n, dtype=torch.bool, device=data.y.device) for _ in range(3)]
        masks[1][perm[:n_val]] = True
        masks[2][perm[n_val:n_val + n_test]] = True
        masks[0][perm[n_val + n_test:]] = True
        data.train_mask, data.val_mask, data.test_mask = masks
        return data

    def forward(self, data: Data) -> Data:
        _, num_nodes = _edge_index(data)
        y = getattr(data, "y", None)
        if (y is None or y.dim() != 1 or y.numel() != num_nodes
                or y.dtype.is_floating_point or y.dtype == torch.bool):
            raise ValueError("data.y must be an integer (N,) tensor of class ids")
        if y.numel() and int(y.min()) < 0:
            raise ValueError("data.y must hold class ids >= 0 (unlabelled nodes are not supported)")
        if self.split_first:
            data = self._split(data)
        counts = torch.bincount(y)
        keep_class = counts >= self.min_class_size
        if not bool(keep_class.any()):
            raise ValueError(f"no class has min_class_size={self.min_class_size} or more nodes")
        in_kept = keep_class[y]
        data = data.subgraph(in_kept)
        data.y = (torch.cumsum(keep_class.long(), 0) - 1)[data.y]
        self_loop = data.edge_index[0] == data.edge_index[1]
        data = data.edge_subgraph(~self_loop)
        linked = torch.zeros(data.num_nodes, dtype=torch.bool, device=data.edge_index.device)
        linked[data.edge_index.flatten()] = True
        data = data.subgraph(linked)
        if data.num_nodes == 0:
            raise ValueError("no node is left after dp-gnn preprocessing (no edge between kept nodes)")
        if not self.split_first:
            data = self._split(data)
        self.last_stats = {
            "dropped_classes": int((~keep_class).sum()),
            "dropped_class_nodes": int((~in_kept).sum()),
            "dropped_self_loops": int(self_loop.sum()),
            "dropped_isolated_nodes": int((~linked).sum()),
        }
        return data

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(min_class_size={self.min_class_size}, "
                f"val_fraction={self.val_fraction}, test_fraction={self.test_fraction}, "
                f"split_first={self.split_first})")


