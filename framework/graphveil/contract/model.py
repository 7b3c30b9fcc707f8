"""The model family: the trainable model of a run (an encoder of entities for relational tasks).

Only :meth:`Model.trainable_parameters` are updated and released; a model declares how its
forward keeps examples apart (:class:`~graphveil.contract.profiles.ExampleStructure`), which the
invariant reads before data is read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import BaseModel

from graphveil.contract.options import NoParams
from graphveil.contract.profiles import ExampleStructure


def state_problem(state: Mapping[str, Any], expected: Mapping[str, Any]) -> str | None:
    """What is wrong with the keys, shapes or dtypes of ``state`` against ``expected`` (a
    trainable state), or ``None``: checked before loading, as ``copy_`` would broadcast a smaller
    tensor into a weight silently."""
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        key = (missing or extra)[0]
        return (f"key {key!r} is {'missing' if missing else 'not a trainable parameter of this task'} "
                f"({len(missing)} missing, {len(extra)} unexpected)")
    for key, want in expected.items():
        value = state[key]
        if tuple(value.shape) != tuple(want.shape) or value.dtype != want.dtype:
            return f"key {key!r} is {value.dtype} {list(value.shape)}, expected {want.dtype} {list(want.shape)}"
    return None


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
    def prepare(self, graph: Any) -> None:
        """One-time work per graph (a :class:`graphveil.data.graph.RelationalGraph`) (tokenising texts, caching frozen layers' outputs)."""

    @abstractmethod
    def embed(self, entity_ids: torch.Tensor) -> torch.Tensor:
        """``(N,)`` entity indices → ``(N, d)`` embeddings, differentiable in the trainable weights."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write the trained weights (a LoRA adapter via ``save_pretrained``)."""
