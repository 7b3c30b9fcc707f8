"""Which rows of a recorded activation belong to which example, and per-example sums over them.

Every activation a grad sampler records has rows on dim 0 (a sequence, a node, an entity
occurrence) and tokens/features after it. Two groupings:

* :class:`Blocks` — example ``i`` owns the consecutive rows ``[i·s, (i+1)·s)`` of every module
  call, ``s = rows / num`` (tuples of ``2 + k`` sequences, one node per example). Per-example
  sums are reshapes + batched matrix products, the fastest path.
* :class:`Segments` — a row → example index ``(rows,)`` with values in ``[0, num)``: examples own
  different numbers of rows in any order (subgraph batches: PyG's ``batch`` vector). Per-example
  sums are segment sums (``index_add_``); every module call must have exactly ``rows`` rows.

Samplers see activations in a canonical 3-D form ``(R, L, f)`` from :meth:`rows`: for
:class:`Blocks` ``R`` is the number of examples and ``L`` an example's tokens; for
:class:`Segments` ``R`` is the number of rows and ``L`` a row's tokens. Several calls of one
module are concatenated along ``L``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

#: ``gram(a, b)`` of a sampler's recorded inputs: ``(R, La, ...), (R, Lb, ...) → (R, La, Lb)``, the
#: similarity of every token of ``a`` with every token of ``b`` in the same row block (``a·bᵀ``
#: for a linear layer, index equality for an embedding), so that
#: ``‖Σₜ gₜ aₜᵀ‖² = Σ_{t,t'} gram(a, a)_{tt'} (gₜ·gₜ')`` (the ghost norm).
Gram = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: Tokens per block of the ghost norm's Gram matrices (at most :data:`GRAM_BLOCKS` blocks).
BLOCK_TOKENS = 32
GRAM_BLOCKS = 4


def token_blocks(length: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` blocks of an example's ``length`` tokens for :meth:`Blocks.ghost_sq`.

    Both Gram matrices of the ghost norm are symmetric, so only their block upper triangle is
    formed (block row ``i`` against blocks ``i … m−1``) and the off-diagonal blocks count twice:
    ``(m + 1)/(2m)`` of the products (62.5 % at m = 4: ~24 % less time for a step's norms at
    128 tokens on CPU, where they are most of the engine's cost). Blocks of at least
    :data:`BLOCK_TOKENS` tokens keep the products large enough to run at full speed.
    """
    if length <= 0:  # no tokens: no terms, the norm is 0
        return []
    m = max(1, min(GRAM_BLOCKS, length // BLOCK_TOKENS))
    size = -(-length // m)
    return [(lo, min(lo + size, length)) for lo in range(0, length, size)]


class Blocks:
    """Equal contiguous blocks: example ``i`` owns rows ``[i·s, (i+1)·s)`` of every call.

    :param num: number of examples ``b``.
    :param rows: if given, every call must have exactly this many rows (set when the grouping
        came from an index tensor that happened to be equal sorted blocks).
    """

    def __init__(self, num: int, rows: int | None = None) -> None:
        self.num, self.n_rows = num, rows
        #: Gram matrices of inputs several layers read (:meth:`ghost_sq` with a ``share`` key)
        self._grams: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rows(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """``(N, ..., f)`` → ``(b, L, f)``: example i owns rows ``[i·s, (i+1)·s)``, ``s = N / b``."""
        n, b = t.shape[0], self.num
        if self.n_rows is not None and n != self.n_rows:
            raise ValueError(f"{name}: {n} rows on dim 0, but the groups map {self.n_rows} rows")
        if b == 0 or n % b:
            raise ValueError(f"{name}: {n} sequences on dim 0 cannot be split into {b} equal tuples")
        return t.reshape(b, -1, t.shape[-1])

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Per-example sums ``(b, f)`` of canonical ``(b, L, f)`` contributions."""
        return x.sum(1)

    def outer(self, g: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Per-example ``Σₜ gₜ aₜᵀ``: ``(b, p, d)`` (paper 2, Sec. 3.3, book-keeping)."""
        return torch.bmm(g.transpose(1, 2), a)

    def ghost_sq(self, a: torch.Tensor, g: torch.Tensor, gram: Gram, share: object = None) -> torch.Tensor:
        """Per-example ``‖Σₜ gₜ aₜᵀ‖²`` (float64, ``(b,)``) without forming ``gₜ aₜᵀ``.

        :param share: if not None, ``gram(a, a)`` depends on ``a`` alone and is computed once per
            step for every call with this key and the same input (the same memory, shape,
            strides and dtype — e.g. the query, key and value projections of one attention
            read one hidden state: one input Gram instead of three).
        """
        out = torch.zeros(a.shape[0], dtype=torch.float64, device=a.device)
        for lo, hi in token_blocks(a.shape[1]):
            # block row [lo, hi) against tokens [lo, L): its diagonal block once, the rest twice
            terms = self._gram(a, gram, share, lo, hi) * torch.bmm(g[:, lo:hi], g[:, lo:].transpose(1, 2))
            out += terms[:, :, : hi - lo].sum((1, 2)).double() + 2 * terms[:, :, hi - lo :].sum((1, 2)).double()
        return out

    def _gram(self, a: torch.Tensor, gram: Gram, share: object, lo: int, hi: int) -> torch.Tensor:
        """``gram(a[:, lo:hi], a[:, lo:])``, computed once per step for a shared input."""
        if share is None:
            return gram(a[:, lo:hi], a[:, lo:])
        key = (share, a.data_ptr(), tuple(a.shape), a.stride(), a.dtype, a.device, lo, hi)
        if key not in self._grams:  # ``a`` is kept with its Gram: its memory cannot be reused meanwhile
            self._grams[key] = (a, gram(a[:, lo:hi], a[:, lo:]))
        return self._grams[key][1]

    def release(self) -> None:
        """Drop the shared Gram matrices (after the step's norms)."""
        self._grams.clear()

    def ghost_cheaper(self, a: torch.Tensor, g: torch.Tensor) -> bool:
        """Ghost norm (``L²(d+p)`` per example) beats materialising (``L·d·p``)?"""
        length, d, p = a.shape[1], a.shape[2], g.shape[2]
        return length * (d + p) < d * p

    def row_factors(self, factors: torch.Tensor) -> torch.Tensor:
        """Factors broadcastable against canonical ``(b, L, f)`` records."""
        return factors.view(-1, 1, 1)


class Segments:
    """A row → example index: example ``index[r]`` owns row ``r`` of every call (any sizes, any order).

    :param index: ``(rows,)`` integer tensor with values in ``[0, num)``.
    :param num: number of examples ``b`` (examples without rows get zero gradients).
    """

    def __init__(self, index: torch.Tensor, num: int) -> None:
        self.index, self.num, self.n_rows = index, num, int(index.numel())
        self._order: dict[torch.device, tuple[torch.Tensor, list[int]]] = {}

    def _index(self, device: torch.device) -> torch.Tensor:
        return self.index.to(device)

    def rows(self, t: torch.Tensor, name: str) -> torch.Tensor:
        """``(N, ..., f)`` → ``(N, L, f)`` after checking ``N`` is the number of mapped rows."""
        if t.shape[0] != self.n_rows:
            raise ValueError(f"{name}: {t.shape[0]} rows on dim 0, but the groups map {self.n_rows} rows")
        return t.reshape(self.n_rows, -1, t.shape[-1])

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Segment sums ``(b, f)`` of canonical ``(N, L, f)`` contributions."""
        out = x.new_zeros(self.num, x.shape[-1])
        return out.index_add_(0, self._index(x.device), x.sum(1))

    def outer(self, g: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Per-example ``Σₜ gₜ aₜᵀ`` ``(b, p, d)``: one matrix product per example over its rows.

        Rows are sorted by example once (:meth:`_sorted`), so example i's rows and tokens form
        one ``(Lᵢ, p)ᵀ · (Lᵢ, d)`` product: no per-row ``p × d`` outer product is materialised
        (on rooted subgraphs with wide features that was most of a DP step).
        """
        p, d = g.shape[-1], a.shape[-1]
        out = g.new_zeros(self.num, p, d)
        order, counts = self._sorted(g.device)
        tokens = g.shape[1]
        g, a = g[order].reshape(-1, p), a[order].reshape(-1, d)
        start = 0
        for i, count in enumerate(counts):
            if count:
                rows = slice(start * tokens, (start + count) * tokens)
                torch.mm(g[rows].t(), a[rows], out=out[i])
            start += count
        return out

    def _sorted(self, device: torch.device) -> tuple[torch.Tensor, list[int]]:
        """Rows sorted by example (stable) and the number of rows of each example."""
        if device not in self._order:
            index = self._index(device)
            order = torch.argsort(index, stable=True)
            counts = torch.bincount(index, minlength=self.num).tolist()
            self._order[device] = (order, counts)
        return self._order[device]

    def ghost_sq(self, a: torch.Tensor, g: torch.Tensor, gram: Gram, share: object = None) -> torch.Tensor:
        """Per-example ``‖Σₜ gₜ aₜᵀ‖²`` (float64, ``(b,)``): one Gram matrix per example's tokens.

        Pairs of tokens of different examples never enter, so the cost is ``Σᵢ Lᵢ²(d+p)``.
        (``share`` is accepted for the signature of :meth:`Blocks.ghost_sq`; nothing is shared:
        each example's rows are gathered anew.)
        """
        order, counts = self._sorted(g.device)
        a, g = a[order], g[order]
        out = torch.zeros(self.num, dtype=torch.float64, device=g.device)
        start = 0
        for i, count in enumerate(counts):
            if count:
                ai = a[start : start + count].reshape(1, -1, *a.shape[2:])
                gi = g[start : start + count].reshape(1, -1, g.shape[-1])
                out[i] = (gram(ai, ai) * torch.bmm(gi, gi.transpose(1, 2))).sum().double()
            start += count
        return out

    def ghost_cheaper(self, a: torch.Tensor, g: torch.Tensor) -> bool:
        """Ghost (``Σᵢ Lᵢ²(d+p)``) beats materialising (``Σᵢ Lᵢ·d·p``)?"""
        _, counts = self._sorted(g.device)
        tokens = a.shape[1]
        d, p = a.shape[2], g.shape[2]
        pairs = sum((c * tokens) ** 2 for c in counts)
        return pairs * (d + p) < self.n_rows * tokens * d * p

    def row_factors(self, factors: torch.Tensor) -> torch.Tensor:
        """Each row's example factor, broadcastable against canonical ``(N, L, f)`` records."""
        return factors[self._index(factors.device)].view(-1, 1, 1)

    def release(self) -> None:
        """Nothing is shared across calls (see :meth:`ghost_sq`)."""


Groups = Blocks | Segments


def make_groups(num_groups: int | None, groups: torch.Tensor | None) -> Groups:
    """The grouping of ``record(num_groups=..., groups=...)`` (checked).

    An index that is already equal sorted blocks (e.g. ``arange(b)``: one row per example)
    becomes :class:`Blocks` with a fixed row count: same meaning, the faster path.
    """
    if groups is None:
        if num_groups is None:
            raise ValueError("record() needs num_groups (equal blocks) or groups (a row → example index)")
        if isinstance(num_groups, bool) or int(num_groups) != num_groups or num_groups < 0:
            raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
        return Blocks(int(num_groups))
    integer = isinstance(groups, torch.Tensor) and not (
        groups.is_floating_point() or groups.is_complex() or groups.dtype == torch.bool
    )
    if not integer or groups.dim() != 1:
        raise ValueError("groups must be a 1-D integer tensor mapping each row on dim 0 to its example")
    groups = groups.long()
    n = groups.numel()
    if num_groups is None:
        num_groups = int(groups.max()) + 1 if n else 0
    if isinstance(num_groups, bool) or int(num_groups) != num_groups or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0, got {num_groups!r}")
    num_groups = int(num_groups)
    if n and (int(groups.min()) < 0 or int(groups.max()) >= num_groups):
        raise ValueError(
            f"groups must take values in [0, {num_groups}), got [{int(groups.min())}, {int(groups.max())}]"
        )
    if n and num_groups and n % num_groups == 0:
        blocks = torch.arange(num_groups, device=groups.device).repeat_interleave(n // num_groups)
        if torch.equal(groups, blocks):
            return Blocks(num_groups, rows=n)
    return Segments(groups, num_groups)
