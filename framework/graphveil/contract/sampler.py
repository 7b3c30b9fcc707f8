"""The sampler family: draws batches of examples and declares the distribution it draws from.

A sampler's :attr:`~Sampler.sampling_kind` (and, once prepared, its numeric
:class:`~graphveil.contract.profiles.SamplingProfile`) is what the accountant analyses; the
invariant (:mod:`graphveil.contract.invariant`) refuses a pair it cannot analyse before data is read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from pydantic import BaseModel

from graphveil.contract.options import NoParams
from graphveil.contract.profiles import SamplingKind, SamplingProfile
from graphveil.contract.units import ClaimsUnit


@dataclass
class TupleBatch:
    """A mini-batch of relational tuples Tᵢ = (eᵢ⁺, eᵢ,₁⁻, …, eᵢ,ₖ⁻) (paper 1, Eq. 1).

    :param positives: ``(b, 2)`` entity indices (uᵢ, vᵢ) of the positive edges.
    :param negatives: ``(b, k)`` sampled entity indices vᵢⱼ.
    :param anchors: ``(b, k)`` the end wᵢⱼ ∈ eᵢ⁺ each negative is paired with, so the
        negative edge is (wᵢⱼ, vᵢⱼ).
    """

    positives: torch.Tensor
    negatives: torch.Tensor
    anchors: torch.Tensor

    def __post_init__(self) -> None:
        b = self.positives.shape[0]
        if self.positives.shape != (b, 2):
            raise ValueError(f"positives must be (b, 2), got {tuple(self.positives.shape)}")
        if self.negatives.shape[0] != b or self.anchors.shape != self.negatives.shape:
            raise ValueError("negatives and anchors must both be (b, k) with the positives' b")

    @property
    def size(self) -> int:
        return int(self.positives.shape[0])

    @property
    def k_neg(self) -> int:
        return int(self.negatives.shape[1])

    def entities(self) -> torch.Tensor:
        """``(b, 2 + k)`` entities of each tuple: u, v, then the sampled negatives."""
        return torch.cat([self.positives, self.negatives], dim=1)

    def select(self, index: torch.Tensor) -> TupleBatch:
        """The tuples at positions ``index`` (1-D long), in that order (micro-batching)."""
        return TupleBatch(self.positives[index], self.negatives[index], self.anchors[index])


class Sampler(ClaimsUnit, ABC):
    """Draws tuple batches from a graph and declares the distribution it draws from.

    Subclasses set ``sampling_kind`` and ``unit`` and implement :meth:`prepare` (one-time
    preprocessing such as degree capping, which is part of the guarantee) and :meth:`sample`.
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    sampling_kind: ClassVar[SamplingKind]

    @abstractmethod
    def prepare(self, graph: Any, generator: torch.Generator) -> SamplingProfile:
        """Preprocess the training graph once (a :class:`graphveil.data.graph.RelationalGraph`: the
        contract does not import the data layer); return the numeric sampling profile."""

    @abstractmethod
    def sample(self, generator: torch.Generator) -> TupleBatch:
        """Draw one batch. Its size may be random (Poisson) and may be zero."""

    @property
    @abstractmethod
    def profile(self) -> SamplingProfile:
        """The profile returned by :meth:`prepare` (raises if not prepared)."""

    def preprocessing_params(self) -> dict[str, Any] | None:
        """The options of a randomized one-time preprocessing whose outcome must be kept (degree
        capping's K: the session stores the record set once per graph and options,
        :mod:`graphveil.run.records_store`), or ``None`` (default: the records are a function of
        the graph alone)."""
        return None

    def public_profile(self) -> SamplingProfile | None:
        """The numbers the accountant will analyse, known before any data is read (e.g. from a
        public size floor), or ``None`` (default) if they depend on the data. A federated site
        reserves its spend from this profile before it reads its graph."""
        return None
