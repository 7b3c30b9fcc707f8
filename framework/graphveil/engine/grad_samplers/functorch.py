"""Fallback for modules without a registered sampler: ``torch.func`` per-example gradients.

For a module ``y = M(x; θ)`` whose input ``x`` and output gradient ``r`` were recorded, the
gradient of example ``i`` with respect to ``θ`` is the vector-Jacobian product of ``M`` on
example ``i``'s rows: ``∇_θ ⟨M(xᵢ; θ), rᵢ⟩``. We evaluate it for all examples at once with
``torch.func.vmap(torch.func.grad(...))`` over ``torch.func.functional_call(M, θ, (xᵢ,))``
(Opacus' functorch fallback, ``opacus/grad_sample/functorch.py``, does the same per sample):

* equal blocks: one call per example on its ``s`` rows ``(b, s, ...)`` (rows of one example may
  interact inside ``M``);
* a row → example index: one call per row ``(N, 1, ...)``, then segment sums (``index_add_``)
  into examples — ``M`` must then treat rows independently.

It re-runs the module's forward on every example and materialises ``b × |θ|`` numbers (``N ×
|θ|`` with an index), so it is meant for SMALL models, and only on request: the engine uses it
when built with ``fallback="functorch"`` or when the model class sets
``per_example_fallback = "functorch"``. The module must be called as ``module(x)`` with one
tensor and must not draw random numbers in its forward (the re-run would see other draws than
the recorded pass; ``vmap(randomness="error")`` refuses them). The engine's summed-gradient
check still compares ``Σᵢ gᵢ`` with autograd's gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.func import functional_call, grad, vmap

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers import GradSampler, LayerRecord, Mode
from graphveil.engine.grad_samplers.groups import Blocks, Groups


class FunctorchSampler(GradSampler):
    """Per-example gradients of any module's own parameters by ``vmap(grad(functional_call))``."""

    def check(self) -> None:
        """Any parameters: the vector-Jacobian product does not depend on what they are."""

    def capture(self, args: tuple, kwargs: dict[str, Any], output: Any) -> torch.Tensor:
        if kwargs or len(args) != 1 or not isinstance(args[0], torch.Tensor) or args[0].dim() < 1:
            raise PluginError(
                f"per-tuple gradients: the torch.func fallback re-runs {self.name!r} ({self.kind}) "
                "per example, so it must be called as module(x) with one tensor x (rows on dim 0)"
            )
        return args[0].detach()

    def backward(self, rec: LayerRecord, saved: torch.Tensor, grad: torch.Tensor, groups: Groups, mode: Mode) -> None:
        groups.rows(grad, self.name)  # check the rows now, with the engine's usual message
        rec.pairs.append((saved, grad))  # torch.func runs in finish(), after autograd's backward

    def finish(self, rec: LayerRecord, groups: Groups) -> None:
        pairs, rec.pairs = rec.pairs, []
        for x, g in pairs:
            for name, value in self._per_example(x, g, groups).items():
                rec.add(name, value)
        return None

    def _per_example(self, x: torch.Tensor, r: torch.Tensor, groups: Groups) -> dict[str, torch.Tensor]:
        params = {n: p.detach() for n, p in self.params.items()}
        module = self.module

        def contribution(theta: dict[str, torch.Tensor], xi: torch.Tensor, ri: torch.Tensor) -> torch.Tensor:
            return (functional_call(module, theta, (xi,)) * ri).sum()

        per_call = vmap(grad(contribution), in_dims=(None, 0, 0), randomness="error")
        try:
            if isinstance(groups, Blocks):
                b = groups.num
                return per_call(params, x.reshape(b, -1, *x.shape[1:]), r.reshape(b, -1, *r.shape[1:]))
            per_row = per_call(params, x.unsqueeze(1), r.unsqueeze(1))
        except RuntimeError as exc:
            if "random" not in str(exc):
                raise
            raise PluginError(
                f"per-tuple gradients: {self.name!r} ({self.kind}) draws random numbers in its "
                "forward (dropout in train mode?); the torch.func fallback re-runs the forward and "
                "would differentiate other draws than the recorded pass — call eval() on it or "
                "remove the randomness"
            ) from exc
        index = groups.index.to(x.device)
        return {
            n: t.new_zeros(groups.num, *t.shape[1:]).index_add_(0, index, t) for n, t in per_row.items()
        }

