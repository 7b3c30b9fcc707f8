"""A ``bias`` a module owns directly and adds to its output as its last operation.

Covers modules whose forward ends in ``return out + self.bias`` with ``self.bias`` of shape
``(out_channels,)`` broadcast over every row (node) and token: then ``∂ℓ/∂bias = Σ_rows ∂ℓ/∂out``,
so the per-example gradient is the per-example (segment) sum of the output gradient's rows.
Registered for the PyG convolutions where torch_geometric 2.8 does exactly that and whose other
trainable parameters sit in child ``Linear`` modules called through ``__call__`` (so their own
samplers see them):

* ``GCNConv`` (``out = propagate(lin(x)); out = out + bias``, paper 3's model);
* ``ResGatedGraphConv`` (``out = propagate(k, q, v) [+ lin_skip(x)]; out = out + bias``).

Not covered: ``SAGEConv`` / ``GraphConv`` need no entry (their bias lives in a child ``Linear``);
``ChebConv``, ``TAGConv``, ``MixHopConv`` call child linears through ``lin.forward`` (no hook
fires, so the engine's summed-gradient check refuses them); ``GATConv`` owns attention vectors
(refused unless frozen). A plugin whose own layer ends in ``+ self.bias`` registers it with
``register(MyConv)(ModuleBiasSampler)``.

Detection is by registration (an explicit claim about the forward), checked twice: here the
module must own no trainable parameter but ``bias``, a 1-D one matching the output's last dim;
and the engine's ``verify`` compares ``Σᵢ gᵢ(bias)`` with autograd's gradient of the summed
loss, so a bias used any other way is refused at the first step.
"""

from __future__ import annotations

from typing import Any

import torch

from graphveil.contract.errors import PluginError
from graphveil.engine.grad_samplers import GradSampler, LayerRecord, Mode, register
from graphveil.engine.grad_samplers.groups import Groups


@register(
    "torch_geometric.nn.conv.gcn_conv.GCNConv",
    "torch_geometric.nn.conv.res_gated_graph_conv.ResGatedGraphConv",
)
class ModuleBiasSampler(GradSampler):
    """``out = f(inputs) + bias``: per-example gradient = per-example sum of ``∂ℓ/∂out`` rows."""

    handles = frozenset({"bias"})

    def check(self) -> None:
        super().check()
        if self.params["bias"].dim() != 1:
            raise PluginError(
                f"per-tuple gradients: {self.name!r} ({self.kind}) has a bias of shape "
                f"{tuple(self.params['bias'].shape)}; the module-bias sampler needs a 1-D bias "
                "added to the output's last dimension"
            )

    def capture(self, args: tuple, kwargs: dict[str, Any], output: Any) -> None:
        return None  # the bias gradient needs only the output gradient

    def backward(self, rec: LayerRecord, saved: None, grad: torch.Tensor, groups: Groups, mode: Mode) -> None:
        width = self.params["bias"].numel()
        if grad.dim() < 2 or grad.shape[-1] != width:
            raise PluginError(
                f"per-tuple gradients: {self.name!r} ({self.kind}) returned shape "
                f"{tuple(grad.shape)}, but its bias ({width},) must be added to rows of the output"
            )
        rec.add("bias", groups.sum(groups.rows(grad, self.name)))
