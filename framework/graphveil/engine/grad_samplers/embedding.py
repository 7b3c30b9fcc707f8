"""``torch.nn.Embedding``: its weight, by the ghost identity (paper 2, Sec. 3.3).

Token ``t`` with index ``iₜ`` and output gradient ``rₜ`` adds ``rₜ`` to row ``iₜ``, so
``‖G_E‖² = Σ_{t,t'} [iₜ = iₜ'] (rₜ·rₜ')`` over the example's tokens and the weighted sum is an
``index_add_`` of ``fᵢ·rₜ``; no ``vocab × dim`` tensor per example. Tokens equal to
``padding_idx`` get no gradient (as in autograd).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers import GradSampler, LayerRecord, Mode, register
from graphveil.engine.grad_samplers.groups import Groups


@register(nn.Embedding)
class EmbeddingSampler(GradSampler):
    """Index lookup ``(N, ...) → (N, ..., dim)``; always the ghost norm."""

    handles = frozenset({"weight"})

    def check(self) -> None:
        super().check()
        if self.module.scale_grad_by_freq:
            raise PluginError(
                f"per-tuple gradients: embedding {self.name!r} uses scale_grad_by_freq, which couples "
                "tuples through batch token counts; disable it or freeze the embedding"
            )
        if self.module.sparse:
            raise PluginError(
                f"per-tuple gradients: embedding {self.name!r} has sparse=True; use dense gradients"
            )

    def capture(self, args: tuple, kwargs: dict[str, Any], output: Any) -> torch.Tensor:
        return self.input_tensor(args, kwargs).detach()

    def backward(self, rec: LayerRecord, saved: torch.Tensor, grad: torch.Tensor, groups: Groups, mode: Mode) -> None:
        g = groups.rows(grad, self.name)
        rec.ghost = True
        rec.pairs.append((groups.rows(saved.unsqueeze(-1), self.name)[..., 0], g))

    def ghost_inputs(self, a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.module.padding_idx is not None:
            g = g * (a != self.module.padding_idx).unsqueeze(-1).to(g.dtype)
        return a, g

    def gram(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a.unsqueeze(2) == b.unsqueeze(1)).to(self.params["weight"].dtype)

    def weighted(
        self, rec: LayerRecord, name: str, p: nn.Parameter, factors: torch.Tensor, groups: Groups
    ) -> torch.Tensor | None:
        if not rec.pairs:
            return None
        ((a, g),) = rec.pairs
        gf = (g * groups.row_factors(factors)).reshape(-1, g.shape[-1])
        return torch.zeros_like(p).index_add_(0, a.reshape(-1), gf)
