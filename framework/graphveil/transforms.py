"""Graph transforms for node-level DP on graphs (paper 4).

PyG conventions throughout: ``edge_index[0]`` is the source, ``edge_index[1]`` the target, and
messages flow source → target. Every transform is a :class:`~torch_geometric.transforms.BaseTransform`
that returns a new :class:`~torch_geometric.data.Data` and leaves its input untouched (tensors
it does not change are shared, as in PyG's own transforms). :class:`OutDegreeBound`'s order is a
keyed function of each edge, never of a seed; :func:`_generator` (a given ``torch.Generator``, or
a fresh one seeded from :mod:`secrets`) serves :mod:`graphveil.data.synthetic`.

* :class:`OutDegreeBound` — out-degree cap D by a secret keyed edge order (GAP's k-neighbor
  level, paper 4 Sec. 5.1; its stability lemma and what it does not give at node level).

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
