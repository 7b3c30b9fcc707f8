"""``torch.nn.LayerNorm``: elementwise weight and bias over the normalised trailing dims.

``y = x̂ ∘ w + b`` with ``x̂ = (x − μ) / √(σ² + ε)`` over ``normalized_shape`` per token, so token
``t`` contributes ``rₜ ∘ x̂ₜ`` to ``∂ℓ/∂w`` and ``rₜ`` to ``∂ℓ/∂b`` (``r`` the output gradient): per
example these are segment sums of ``normalized_shape``-sized vectors, always materialised
(``b × |w|`` numbers). ``x̂`` is recomputed from the input in the forward hook
(``F.layer_norm`` without affine), as autograd's own backward does. Statistics are per token,
so no example mixes with another (unlike batch norm, which the engine refuses).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers import GradSampler, LayerRecord, Mode, register
from graphveil.engine.grad_samplers.groups import Groups


@register(nn.LayerNorm)
class LayerNormSampler(GradSampler):
    """Per-token affine normalisation over ``normalized_shape`` (input ``(N, ..., *shape)``)."""

    handles = frozenset({"weight", "bias"})

    def capture(self, args: tuple, kwargs: dict[str, Any], output: Any) -> torch.Tensor | None:
        x = self.input_tensor(args, kwargs)
        shape = self.module.normalized_shape
        if x.dim() <= len(shape):
            raise PluginError(f"per-tuple gradients: {self.name} got an input without a batch dim")
        if "weight" not in self.params:
            return None  # the bias needs only the output gradient
        return F.layer_norm(x.detach(), shape, None, None, self.module.eps)

    def backward(self, rec: LayerRecord, saved: torch.Tensor | None, grad: torch.Tensor, groups: Groups, mode: Mode) -> None:
        shape = tuple(self.module.normalized_shape)
        width = math.prod(shape)

        def per_example(t: torch.Tensor) -> torch.Tensor:
            flat = t.reshape(*t.shape[: t.dim() - len(shape)], width)
            return groups.sum(groups.rows(flat, self.name)).reshape(-1, *shape)

        if "weight" in self.params:
            assert saved is not None
            rec.add("weight", per_example(grad * saved))
        if "bias" in self.params:
            rec.add("bias", per_example(grad))
