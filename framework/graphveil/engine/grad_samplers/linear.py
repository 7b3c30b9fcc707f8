"""``torch.nn.Linear`` (including peft LoRA's ``lora_A`` / ``lora_B``): weight and bias.

Paper 2, Sec. 3.3: for ``s = W a`` the gradient of example ``E`` is ``g(E) = Σₜ rₜ aₜᵀ`` over its
tokens ``t`` with ``r = ∂ℓ/∂s``. We record ``a`` (forward hook) and ``r`` (the output's gradient
during the ordinary backward), never per-token outer products, and per layer pick the cheaper of

* **book-keeping** (the paper's ``r aᵀ`` summed per example, materialised): ``G_E = R_Eᵀ A_E`` —
  cost ``L·d·p`` and memory ``d·p`` per example with ``L`` tokens; done inside the backward
  hook, so activations are released as early as in a plain backward. Always the choice for
  LoRA factors, where ``p`` or ``d`` is the rank;
* **ghost norm** (Li et al., 2021): ``‖G_E‖² = Σ_{t,t'} (aₜ·aₜ')(rₜ·rₜ')`` — cost ``L²(d+p)``, no
  ``d·p`` tensor per example; ``A``, ``R`` are kept for the weighted sum ``(c ∘ R)ᵀ A`` (Bu et
  al. 2023's book-keeping: one matrix product, the factors ``c`` folded into the narrower of
  ``R`` and ``A``; it replaces the summed weight gradient, which the engine's backward no longer
  forms). Layers that read the same input (an attention's query, key and value projections)
  share its Gram matrix ``A Aᵀ`` within a step.

The bias gradient of example ``E`` is ``Σₜ rₜ`` (always materialised: ``p`` numbers).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers import GradSampler, LayerRecord, Mode, register, threads_for
from graphveil.engine.grad_samplers.groups import Groups


@register(nn.Linear)
class LinearSampler(GradSampler):
    """``y = x Wᵀ + b`` on the last dim of ``x`` (``(N, ..., d)``, N rows on dim 0)."""

    handles = frozenset({"weight", "bias"})
    shared_gram = True  # a·aᵀ: the query, key and value projections of one attention share it

    def capture(self, args: tuple, kwargs: dict[str, Any], output: Any) -> torch.Tensor:
        x = self.input_tensor(args, kwargs)
        if x.dim() < 2:
            raise PluginError(f"per-tuple gradients: {self.name} got an input without a batch dim")
        return x.detach()

    def backward(self, rec: LayerRecord, saved: torch.Tensor, grad: torch.Tensor, groups: Groups, mode: Mode) -> None:
        g = groups.rows(grad, self.name)
        a = groups.rows(saved, self.name)
        with threads_for(g.numel() * a.shape[-1]):
            if "bias" in self.params:
                rec.add("bias", groups.sum(g))
            if "weight" in self.params:
                if rec.ghost is None:
                    rec.ghost = mode == "ghost" or (mode == "auto" and groups.ghost_cheaper(a, g))
                if rec.ghost:
                    rec.pairs.append((a, g))
                else:
                    rec.add("weight", groups.outer(g, a))

    def gram(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b.transpose(1, 2))

    def weighted(
        self, rec: LayerRecord, name: str, p: nn.Parameter, factors: torch.Tensor, groups: Groups
    ) -> torch.Tensor | None:
        if name != "weight" or not (rec.ghost and rec.pairs):
            return None
        ((a, g),) = rec.pairs
        # Book-keeping: the factors folded into the narrower of the two records, one product.
        f = groups.row_factors(factors)
        if g.shape[-1] <= a.shape[-1]:
            g = g * f
        else:
            a = a * f
        return g.reshape(-1, g.shape[-1]).t() @ a.reshape(-1, a.shape[-1])
