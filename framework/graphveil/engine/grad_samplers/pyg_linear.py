"""PyG's ``torch_geometric.nn.dense.linear.Linear`` (the projection inside GCNConv, SAGEConv, …).

In torch_geometric 2.8 it stores ``weight`` as ``(out_channels, in_channels)`` and an optional
``bias`` ``(out_channels,)``, and its forward is ``F.linear(x, weight, bias)`` — exactly
``nn.Linear``'s layout and math (it is not an ``nn.Linear`` subclass), so the same ghost /
book-keeping sampler applies. With ``in_channels=-1`` its weight is an uninitialised lazy
parameter until the first forward; the engine refuses to be built on it (any lazy parameter),
since neither its shape nor the parameters an optimizer holds are known yet.

Registered by dotted name, so torch_geometric is imported only by models that use it.
"""

from __future__ import annotations

from graphveil.engine.grad_samplers import register
from graphveil.engine.grad_samplers.linear import LinearSampler


@register("torch_geometric.nn.dense.linear.Linear")
class PygLinearSampler(LinearSampler):
    """``F.linear(x, weight, bias)`` with ``weight`` ``(out, in)``: :class:`LinearSampler`."""
