"""Base classes of the component families: samplers, clippers, accountants, models (encoders).

Each family is an abstract base class. A plugin returns named *factories* (usually the class
itself) from the matching hook in :mod:`graphveil.hookspecs`. A factory has:

* ``Params`` — a pydantic model of its options, so a YAML file is validated field by field;
* a docstring whose first line is the one-line description ``graphveil plugins`` shows;
* class-level profile declarations (``sampling_kind``, ``sensitivity_kind``, ``supports``) that
  the invariant check reads *before* any data is touched.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict

from graphveil.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)

if TYPE_CHECKING:
    from graphveil.data.graph import RelationalGraph


class NoParams(BaseModel):
    """Options model for a component that takes none."""

    model_config = ConfigDict(extra="forbid")


def describe(factory: Any) -> str:
    """First line of a factory's docstring: the one-line description users see."""
    doc = (getattr(factory, "__doc__", None) or "").strip()
    return doc.splitlines()[0].strip() if doc else "(no description)"


# --------------------------------------------------------------------------------------------
# Batches of tuples
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Samplers
# --------------------------------------------------------------------------------------------


class _ClaimsUnit:
    """A component whose analysis is stated for a privacy unit (class attribute ``unit``)."""

    unit: ClassVar[PrivacyUnit]

    @classmethod
    def accepts_unit(cls, unit: PrivacyUnit) -> bool:
        """Whether this component's analysis also holds for ``unit`` when a run states its unit
        (``privacy.unit``); the session then records ``unit`` on the instance. Default: only its
        own unit. Override only with the argument why in the docstring."""
        return unit == cls.unit


class Sampler(_ClaimsUnit, ABC):
    """Draws tuple batches from a graph and declares the distribution it draws from.

    Subclasses set ``sampling_kind`` and ``unit`` and implement :meth:`prepare` (one-time
    preprocessing such as degree capping, which is part of the guarantee) and :meth:`sample`.
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    sampling_kind: ClassVar[SamplingKind]

    @abstractmethod
    def prepare(self, graph: RelationalGraph, generator: torch.Generator) -> SamplingProfile:
        """Preprocess the training graph once; return the numeric sampling profile."""

    @abstractmethod
    def sample(self, generator: torch.Generator) -> TupleBatch:
        """Draw one batch. Its size may be random (Poisson) and may be zero."""

    @property
    @abstractmethod
    def profile(self) -> SamplingProfile:
        """The profile returned by :meth:`prepare` (raises if not prepared)."""

    def public_profile(self) -> SamplingProfile | None:
        """The numbers the accountant will analyse, known before any data is read (e.g. from a
        public size floor), or ``None`` (default) if they depend on the data. A federated site
        reserves its spend from this profile before it reads its graph."""
        return None


# --------------------------------------------------------------------------------------------
# Clippers
# --------------------------------------------------------------------------------------------


class Clipper(_ClaimsUnit, ABC):
    """Turns per-tuple gradient norms into per-tuple scale factors in (0, 1].

    The clipped sum Σᵢ factorᵢ·g(Tᵢ) must have the declared sensitivity with respect to the
    privacy unit, with noise N(0, σ²C²) added on top by the engine.
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    sensitivity_kind: ClassVar[SensitivityKind]
    clip_norm: float

    def bind(self, sampling: SamplingProfile) -> None:  # noqa: B027 - optional hook, no-op by default
        """Attach the sampling profile of this run (default: nothing to do).

        Called once by the session after the sampler has prepared the graph and before the
        accountant is bound, so a clipper whose sensitivity depends on the sampling (e.g. on
        the degree cap K and k_neg) can calibrate itself; raise if the profile is unusable.
        """

    @abstractmethod
    def factors(self, batch: TupleBatch, norms: torch.Tensor) -> torch.Tensor:
        """Per-tuple scale factors (shape ``(b,)``) given per-tuple gradient norms."""

    @property
    def profile(self) -> SensitivityProfile:
        return SensitivityProfile(self.sensitivity_kind, self.unit, float(self.clip_norm))


# --------------------------------------------------------------------------------------------
# Accountants
# --------------------------------------------------------------------------------------------


class Accountant(_ClaimsUnit, ABC):
    """Tracks privacy loss of repeated noisy steps over a sampled batch.

    ``supports`` lists the (sampling, sensitivity) pairs this accountant can analyse; a run
    with any other pair is refused before data is read. Mirrors opacus' accountant interface:
    keyword-only :meth:`step`, :meth:`get_epsilon`, and a state dict that refuses state from a
    different mechanism.
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    mechanism: ClassVar[str]
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]]
    #: model structures whose per-example gradients this analysis covers (None: any); e.g. a
    #: per-node analysis holds only if a node's example reads its own row alone
    structures: ClassVar[frozenset[ExampleStructure] | None] = None

    @abstractmethod
    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Attach the numeric profiles of this run (raises on a mismatched kind)."""

    def check_pair(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Refuse a (sampling, sensitivity) pair outside :attr:`supports` or of another unit.

        :raises ProfileMismatchError: naming the pair and what this accountant analyses.
        """
        from graphveil.invariant import check_profiles

        check_profiles(self, sampling, sensitivity)

    def compose_event(self, event: Any, name: str) -> None:
        """Compose a one-shot release (a ``dp_accounting`` event); default: cannot.

        :raises PrivacyError: this accountant analyses DP-SGD steps only.
        """
        from graphveil.errors import PrivacyError

        raise PrivacyError(f"accountant {self.mechanism!r} cannot compose one-shot releases "
                           f"(mechanism {name!r}); use an RDP accountant")

    @abstractmethod
    def step(self, *, noise_multiplier: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` steps at noise multiplier σ."""

    @abstractmethod
    def get_epsilon(self, delta: float) -> float:
        """ε spent so far at the given δ."""

    @abstractmethod
    def report(self, delta: float) -> dict[str, Any]:
        """ε, δ and the evidence (e.g. optimal α and the RDP curve) as JSON-able values."""

    @abstractmethod
    def calibrate(self, *, target_epsilon: float, delta: float, num_steps: int,
                  releases: Any = None) -> float:
        """Smallest σ (conservative end of a bisection) reaching ``target_epsilon`` in ``num_steps``.

        ``releases``: ``None``, or ``σ → [(name, dp_accounting event)]``, the plan's one-shot
        releases that count against the same target (the session passes it only when the plan
        has releases; an accountant that cannot compose them raises :class:`PrivacyError`).
        """

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


# --------------------------------------------------------------------------------------------
# Encoders
# --------------------------------------------------------------------------------------------


class ExampleStructure(StrEnum):
    """How a model's forward keeps examples apart, so the engine can pick a per-example gradient.

    Declared at class level (``structure``) and read by the invariant check before data is read.
    """

    #: Each example owns its rows along dim 0 of every activation (MLP on node features, a text
    #: encoder over entity sequences): per-example gradients from one backward pass.
    ROWS = "rows"
    #: Each example is a root node with its own sampled computation subgraph (PyG ``Batch``).
    ROOT_SUBGRAPHS = "root_subgraphs"
    #: Examples are disjoint connected components (paper 3's graph splits, a PyG ``Batch``).
    COMPONENTS = "components"
    #: The forward mixes every node of one graph (full-graph GCN): no per-example gradient exists.
    WHOLE_GRAPH = "whole_graph"


class Model(torch.nn.Module, ABC):
    """A trainable model; only :meth:`trainable_parameters` are updated (and released).

    Subclasses declare ``structure`` (:class:`ExampleStructure`). The DP engine computes
    per-example gradients with hooks on the modules that own trainable parameters, so for
    ``ROWS`` every activation must keep examples apart along dimension 0 (no batch norm).
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    structure: ClassVar[ExampleStructure] = ExampleStructure.ROWS

    def prepare(self, data: Any) -> None:  # noqa: B027 - optional hook, no-op by default
        """One-time work per dataset (tokenising texts, sizing the input layer)."""

    def trainable_parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.parameters() if p.requires_grad)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Named trainable tensors: what a site releases and a server aggregates."""
        return {n: p.detach().clone() for n, p in self.named_parameters() if p.requires_grad}

    def load_trainable_state(self, state: Mapping[str, torch.Tensor]) -> None:
        own = {n: p for n, p in self.named_parameters() if p.requires_grad}
        if set(own) != set(state):
            missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            raise ValueError(f"trainable state mismatch: missing {missing[:3]}, unexpected {extra[:3]}")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(torch.as_tensor(tensor))

    def save(self, directory: Path) -> None:
        """Write the trained weights (default: ``model.pt`` with the trainable state)."""
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(self.trainable_state(), directory / "model.pt")


class Encoder(Model):
    """A model that embeds entities for relational tasks (structure ``ROWS``: one sequence per
    entity occurrence along dimension 0, no mixing across entities)."""

    @abstractmethod
    def prepare(self, graph: RelationalGraph) -> None:
        """One-time work per graph (tokenising texts, caching frozen layers' outputs)."""

    @abstractmethod
    def embed(self, entity_ids: torch.Tensor) -> torch.Tensor:
        """``(N,)`` entity indices → ``(N, d)`` embeddings, differentiable in the trainable weights."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write the trained weights (a LoRA adapter via ``save_pretrained``)."""
