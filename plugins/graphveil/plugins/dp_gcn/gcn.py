"""A GCN (Kipf & Welling) over disjoint components: paper 3's model, one graph split per example."""

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


class GCNParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(32, gt=0, description="Hidden width of every GCNConv but the last (paper 3: 32).")
    layers: int = Field(2, ge=1, description="GCNConv layers (paper 3: 2).")
    activation: Literal["relu", "elu", "tanh"] = Field("relu", description="Non-linearity between layers (paper 3: ReLU).")
    dropout: float = Field(0.5, ge=0, lt=1, description=(
        "Dropout after each hidden activation (paper 3: 0.5; elementwise, so examples stay apart)."))
    seed: int | None = Field(None, description="Seed of the weight initialisation (None: torch's global RNG).")


class GCN(LayerStack):
    """GCNConv layers (Â = D^-½(A+I)D^-½, paper 3 Eq. 4) → class logits of every node of the batch.

    The input is a :class:`~graphveil.subgraph_batch.SubgraphBatch` whose graphs are disjoint
    components (paper 3's graph splits, or one held-out graph at evaluation): PyG's
    block-diagonal batching keeps each component's message passing — and GCN's degree
    normalisation, self-loops included — inside the component, so the output rows of split i
    depend on split i's nodes and edges alone and per-split gradients are exact (the engine
    groups rows by the batch's ``groups``). Anything else (a whole ``Data`` graph, a tensor) is
    refused: a forward over the full graph would let one node reach every split's loss, as in
    paper 3's public code. The layers are sized by :meth:`prepare` (features in, classes out).
    """

    Params = GCNParams
    name: ClassVar[str] = "gcn"
    structure: ClassVar[ExampleStructure] = ExampleStructure.COMPONENTS

    def make_layer(self, width_in: int, width_out: int) -> nn.Module:
        from torch_geometric.nn import GCNConv

        return GCNConv(width_in, width_out)

    def forward(self, batch: SubgraphBatch) -> torch.Tensor:
        """``(batch.num_nodes, classes)`` logits of every node of a component :class:`SubgraphBatch`."""
        from graphveil.subgraph_batch import SubgraphBatch

        if self.convs is None:
            raise ConfigError("model 'gcn' is not prepared (call prepare(data) first)")
        if not isinstance(batch, SubgraphBatch):
            raise ConfigError(
                f"model 'gcn' reads a SubgraphBatch of disjoint graph splits, got {type(batch).__name__}: "
                "a forward over one whole graph lets every node reach every split's loss")
        if batch.roots is not None:
            raise ConfigError("model 'gcn' classifies every node of disjoint components; got a rooted "
                              "SubgraphBatch (use the 'sage' model for rooted subgraphs)")
        weight = next(self.parameters())
        h = batch.graphs.x.to(device=weight.device, dtype=weight.dtype)
        return self.stack(self.convs, h, batch.graphs.edge_index.to(weight.device))
