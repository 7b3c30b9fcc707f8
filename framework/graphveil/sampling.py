"""Sampling primitives shared by every sampler, all driven by one ``torch.Generator``.

* :func:`poisson_subset` — Poisson(γ) sampling of record indices (paper 1, Alg. 3 line 3;
  paper 2, Alg. 1), in time proportional to the batch, not to the number of records.
* :func:`sample_without_replacement` — a uniformly random ordered k-sample of ``0..n-1``
  without replacement (the node draw of NEG-SAMPLE-WOR, paper 1, Alg. 2), cheap for k ≪ n.
* :func:`random_ends` / :func:`pair_with_random_ends` — pair each sampled node with a random
  end of its tuple's positive edge (paper 1, Alg. 2 line 3; paper 2, Sec. 3.2).
* :class:`PoissonTupleSampler` — the template every relational sampler shares: Poisson
  positives over a record set fixed at :meth:`~PoissonTupleSampler.prepare`, then
  ``k_neg`` negatives per tuple (uniform over V by default; subclasses override, e.g.
  NEG-SAMPLE-WOR), paired with random ends.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import ConfigError, DataError, PrivacyError
from graphveil.contract.profiles import SamplingProfile
from graphveil.contract.sampler import Sampler, TupleBatch

if TYPE_CHECKING:
    from graphveil.data.graph import RelationalGraph

#: Above this fraction k/n a full ``randperm(n)`` is cheaper than draw-and-dedupe.
_RANDPERM_FRACTION = 0.25
#: Draw-and-dedupe draws this multiple of the expected number of draws first (then tops up).
_OVERDRAW = 1.1


def _check_count(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def sample_without_replacement(n: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """A uniformly random ordered sample of ``k`` distinct indices from ``0..n-1``.

    For k ≪ n it draws indices *with* replacement and keeps the first occurrence of each
    value in draw order until ``k`` distinct values are seen. Skipping repeats of a sequence
    of uniform draws is exactly sequential sampling without replacement (each new value is
    uniform over the values not yet seen), and the stopping rule depends only on how many
    distinct values were seen, so the result is a uniform random k-permutation. Expected work
    is ``n·ln(n/(n-k))`` ≤ 1.39k draws for k ≤ n/2. For larger k it uses ``randperm(n)[:k]``.

    :returns: ``(k,)`` int64, distinct, in random order.
    :raises ValueError: if ``k > n`` or either is negative.
    """
    n, k = _check_count("n", n), _check_count("k", k)
    if k > n:
        raise ValueError(f"cannot draw {k} distinct indices from {n}")
    if k == 0:
        return torch.empty(0, dtype=torch.long)
    if k > _RANDPERM_FRACTION * n:
        return torch.randperm(n, generator=generator)[:k]
    # Expected draws to see k distinct values: n·(H(n) - H(n-k)) ≈ -n·ln(1 - k/n); top up if short.
    # The dedupe runs in numpy: single-threaded, so it does not stall when OpenMP threads
    # compete for a busy CPU (torch.unique there was measured 15x slower).
    extra = int(-_OVERDRAW * n * math.log1p(-k / n)) + 16
    draws = np.empty(0, dtype=np.int64)
    while True:
        draws = np.concatenate([draws, torch.randint(0, n, (extra,), generator=generator).numpy()])
        _, first = np.unique(draws, return_index=True)  # index of each value's first occurrence
        if first.size >= k:
            break
        extra = int(1.5 * (k - first.size) * n / (n - first.size)) + 16
    first.sort()
    return torch.from_numpy(draws[first[:k]])


def poisson_subset(m: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Poisson(γ) sampling: each index of ``0..m-1`` included independently with probability γ.

    Drawn as ``l ~ Binomial(m, γ)`` followed by ``l`` distinct indices chosen uniformly
    (:func:`sample_without_replacement`). This is *exactly* Poisson sampling, not an
    approximation: under independent inclusion a subset ``s`` has probability
    ``γ^|s| (1-γ)^(m-|s|)``, which depends on ``s`` only through ``|s|``. Hence the size is
    ``Binomial(m, γ)`` and, given its size, the subset is uniform among subsets of that size —
    the two stages reproduce the joint law. Cost is O(l) per step (plus an O(m) permutation
    only when l > m/4), instead of one Bernoulli draw per record.

    :returns: ``(l,)`` int64 distinct indices in random order (``l`` may be 0).
    :raises ValueError: if γ ∉ [0, 1] or ``m`` is negative.
    """
    m = _check_count("m", m)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"Poisson rate must lie in [0, 1], got {rate!r}")
    if m == 0 or rate == 0.0:
        return torch.empty(0, dtype=torch.long)
    count = torch.binomial(
        torch.tensor(float(m), dtype=torch.float64),
        torch.tensor(float(rate), dtype=torch.float64),
        generator=generator,
    )
    return sample_without_replacement(m, int(count.item()), generator)


def random_ends(positives: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """``(b, k)`` anchors: for each of the ``k`` slots of tuple i, uᵢ or vᵢ with probability ½."""
    k = _check_count("k", k)
    side = torch.randint(0, 2, (positives.shape[0], k), generator=generator)
    return positives.gather(1, side)


def pair_with_random_ends(
    positives: torch.Tensor, negatives: torch.Tensor, generator: torch.Generator
) -> TupleBatch:
    """Build the tuple batch: negative edge (wᵢⱼ, vᵢⱼ) with wᵢⱼ a random end of eᵢ⁺.

    A negative slot holding ``-1`` (padding) gets anchor ``-1`` too; losses must mask it.
    """
    anchors = random_ends(positives, negatives.shape[1], generator)
    anchors[negatives < 0] = -1
    return TupleBatch(positives=positives, negatives=negatives, anchors=anchors)


# --------------------------------------------------------------------------------------------
# Template for Poisson-positive relational samplers
# --------------------------------------------------------------------------------------------


class PoissonTupleParams(BaseModel):
    """Options shared by Poisson-positive tuple samplers."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(gt=0, description="expected number of positive edges b per step; γ = b/m")
    k_neg: int = Field(default=1, ge=0, description="negatives per positive edge")


class PoissonTupleSampler(Sampler):
    """Template: Poisson(γ = b/m) positives over a prepared record set, then negatives per tuple.

    Subclasses declare ``sampling_kind`` and ``unit`` and may override the records
    (:meth:`_records`, e.g. degree-capped edges), the negatives (:meth:`_negatives`) and add
    checks (:meth:`_validate`).
    """

    Params: ClassVar[type[BaseModel]] = PoissonTupleParams

    def __init__(self, params: BaseModel) -> None:
        self.params = params
        self._edges: torch.Tensor | None = None
        self._profile: SamplingProfile | None = None
        self._rate = 0.0  # the inclusion probability sample() uses (≤ the profile's rate)

    # ---------------------------------------------------------------- subclass hooks
    def _records(self, graph: RelationalGraph, generator: torch.Generator) -> torch.Tensor:
        """The positive records sampled from (default: every edge)."""
        return graph.edges

    def _validate(self, num_records: int, num_nodes: int) -> None:
        """Extra checks on the prepared sizes (default: none)."""

    def check_records(self, graph: RelationalGraph, records: torch.Tensor) -> torch.Tensor:
        """Validate stored records against ``graph``: ``(m, 2)`` integer entity indices, each an
        edge of ``graph`` (either orientation), no duplicates.

        :returns: the records as ``(m, 2)`` int64, each row ordered ``u < v``.
        :raises PrivacyError: naming what is wrong (the stored Ē does not belong to this graph).
        """
        where = f"stored records for graph {graph.name!r}"
        if not isinstance(records, torch.Tensor) or records.ndim != 2 or records.shape[1] != 2:
            raise PrivacyError(f"{where}: expected an (m, 2) tensor, got "
                               f"{tuple(records.shape) if isinstance(records, torch.Tensor) else type(records)}")
        if records.dtype.is_floating_point or records.dtype.is_complex or records.dtype == torch.bool:
            raise PrivacyError(f"{where}: entity indices must be integers, got {records.dtype}")
        records = records.to(torch.long)
        n = graph.num_nodes
        if records.numel() and (int(records.min()) < 0 or int(records.max()) >= n):
            raise PrivacyError(f"{where}: entity index outside 0..{n - 1}")
        records = torch.sort(records, dim=1).values
        codes = records[:, 0] * n + records[:, 1]
        edges = torch.sort(graph.edges.to(torch.long), dim=1).values
        known = edges[:, 0] * n + edges[:, 1]
        missing = ~torch.isin(codes, known)
        if bool(missing.any()):
            u, v = records[int(missing.nonzero()[0])].tolist()
            raise PrivacyError(
                f"{where}: ({graph.entity_ids[u]!r}, {graph.entity_ids[v]!r}) is not a relation of "
                "the training graph; the store belongs to other data"
            )
        if codes.unique().numel() != codes.numel():
            raise PrivacyError(f"{where}: a relation is stored more than once")
        return records

    def _degree_cap(self) -> int | None:
        return None

    def _negatives(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """``(count, k_neg)`` negative node indices (``-1`` marks a slot left empty).

        Default: every negative uniform over V, independent of every other draw and of the
        data (with replacement; paper 2, Sec. 3.2).
        """
        return torch.randint(0, self.profile.num_nodes, (count, self.params.k_neg), generator=generator)

    # ---------------------------------------------------------------- Sampler API
    def prepare(self, graph: RelationalGraph, generator: torch.Generator,
                records: torch.Tensor | None = None) -> SamplingProfile:
        """Fix the record set (computed, or ``records`` from a store after :meth:`check_records`)
        and return the sampling profile.
        """
        edges = graph.edges
        if edges.ndim != 2 or edges.shape[1] != 2:
            raise DataError(f"graph {graph.name!r}: edges must be (m, 2), got {tuple(edges.shape)}")
        if records is None:
            records = self._records(graph, generator).to(torch.long)
        else:
            records = self.check_records(graph, records)
        m, n, b = int(records.shape[0]), graph.num_nodes, self.params.batch_size
        floor = self._size_floor()
        if floor is None:
            if m == 0:
                raise DataError(f"graph {graph.name!r} has no edges to sample positives from")
            if b > m:
                raise ConfigError(
                    f"sampler.batch_size={b} exceeds the {m} sampleable edges of graph {graph.name!r} "
                    "(after any degree capping): the Poisson rate b/m would exceed 1"
                )
            accounted_m, self._rate = m, b / m
        else:
            # A public floor m₀ (min_records): sample at b/max(m, m₀) ≤ b/m₀ and state b/m₀, so the
            # profile the accountant analyses holds public numbers only and nothing here can fail
            # on the private size m (an empty record set samples empty batches: noise-only steps).
            accounted_m, self._rate = floor, b / max(m, floor)
        self._validate(m, n)
        self._edges = records
        self._profile = SamplingProfile(
            kind=self.sampling_kind, rate=b / accounted_m, num_records=accounted_m, num_nodes=n,
            degree_cap=self._degree_cap(), k_neg=self.params.k_neg,
        )
        return self._profile

    def _size_floor(self) -> int | None:
        """m₀, a public lower bound on the number of records (default: none, γ = b/m exactly)."""
        return None

    def public_profile(self) -> SamplingProfile | None:
        """What the accountant will analyse, from public numbers alone (no data read): the
        profile :meth:`prepare` returns but for the node count (0 here; only the negatives read
        it). ``None`` if the accounted numbers depend on the data (no size floor)."""
        floor = self._size_floor()
        if floor is None:
            return None
        return SamplingProfile(kind=self.sampling_kind, rate=self.params.batch_size / floor,
                               num_records=floor, degree_cap=self._degree_cap(), k_neg=self.params.k_neg)

    def sample(self, generator: torch.Generator) -> TupleBatch:
        records = self.records  # raises if not prepared
        positives = records.index_select(0, poisson_subset(int(records.shape[0]), self._rate, generator))
        negatives = self._negatives(positives.shape[0], generator)
        return pair_with_random_ends(positives, negatives, generator)

    @property
    def profile(self) -> SamplingProfile:
        if self._profile is None:
            raise RuntimeError(f"{type(self).__name__}.prepare(graph, generator) has not been called")
        return self._profile

    @property
    def records(self) -> torch.Tensor:
        """``(m, 2)`` the prepared positive records (e.g. the degree-capped edge set Ē)."""
        if self._edges is None:
            raise RuntimeError(f"{type(self).__name__}.prepare(graph, generator) has not been called")
        return self._edges
