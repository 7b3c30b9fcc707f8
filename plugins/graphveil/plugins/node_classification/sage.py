"""GraphSAGE on rooted computation subgraphs: each example is a root node and its subgraph.

The building block of a DP-SAGE-style method (issue 8): per-example gradients are exact because
a :class:`~graphveil.subgraph_batch.SubgraphBatch` keeps every example's message passing inside
its own graph. The privacy analysis of rooted subgraphs (one node reaches the subgraphs of many roots) is in
:mod:`graphveil.plugins.gdp.rooted` (sampler ``root_subgraphs``) and
:mod:`graphveil.plugins.gdp.rooted_accountant` (accountant ``rooted_rdp``); method ``dp_sage``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from graphveil.contract.errors import ConfigError
from graphveil.contract.profiles import ExampleStructure
from graphveil.plugins.node_classification.layers import LayerStack

if TYPE_CHECKING:
    from graphveil.subgraph_batch import SubgraphBatch


class SAGEParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(64, gt=0, description="Hidden width of every SAGEConv but the last.")
    layers: int = Field(2, ge=1, description="SAGEConv layers (at most the subgraphs' num_hops, so the "
                                               "root sees its whole sampled neighbourhood).")
    activation: Literal["selu", "relu", "tanh"] = Field("relu", description="Non-linearity between layers.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout between layers (elementwise: examples stay apart).")
    seed: int | None = Field(None, description="Seed of the weight initialisation (None: torch's global RNG).")


class SAGE(LayerStack):
    """GraphSAGE (mean aggregation) over rooted subgraphs → class logits of each example's root.

    Every convolution runs on all rows of the batch and the roots are read out last, so each
    parametrised layer's rows map to examples through the batch's ``groups`` (the engine's
    row → example index); a layer applied after the readout would see one row per example and
    be refused by the engine. The layers are sized by :meth:`prepare` (features in, classes out).
    """

    Params = SAGEParams
    name: ClassVar[str] = "sage"
    structure: ClassVar[ExampleStructure] = ExampleStructure.ROOT_SUBGRAPHS

    def make_layer(self, width_in: int, width_out: int) -> nn.Module:
        from torch_geometric.nn import SAGEConv

        return SAGEConv(width_in, width_out)

    def forward(self, batch: SubgraphBatch) -> torch.Tensor:
        """``(batch.size, classes)`` logits at the roots of a rooted :class:`SubgraphBatch`."""
        if self.convs is None:
            raise ConfigError("model 'sage' is not prepared (call prepare(data) first)")
        roots = getattr(batch, "roots", None)
        if roots is None:
            raise ConfigError(f"model 'sage' reads each example's root: it needs a rooted SubgraphBatch "
                              f"(rooted_subgraphs), got {type(batch).__name__} without roots")
        device = next(self.parameters()).device
        return self.full_graph(batch.graphs.x.to(device), batch.graphs.edge_index.to(device))[roots.to(device)]

    def full_graph(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """``(n, classes)`` logits of every node of one graph (``edge_index``: source → target).

        Equal, node by node, to the root outputs on rooted subgraphs of at least ``layers`` hops.
        Inference only under DP: one node's output reads its whole neighbourhood."""
        return self.stack(self.convs, x, edge_index)
