"""A multi-layer perceptron on node features (paper 4's DP-MLP: 3 layers, 64 hidden, SELU)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from graphveil.contract.errors import ConfigError
from graphveil.contract.profiles import ExampleStructure
from graphveil.plugins.node_classification.layers import ACTIVATIONS, LayerStack


class MLPParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(64, gt=0, description="Hidden width (paper 4: 64).")
    layers: int = Field(3, ge=1, description="Linear layers (paper 4's MLP baseline: 3).")
    activation: Literal["selu", "relu", "tanh"] = Field("selu", description="Non-linearity (paper 4: SELU).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout between layers (paper 4: 0 under node DP).")
    seed: int | None = Field(None, description="Seed of the weight initialisation (None: torch's global RNG).")


class MLP(LayerStack):
    """Node features → class logits; each node is its own row, so per-node gradients are exact.

    The layers are sized by :meth:`prepare` from the dataset (features in, classes out); they sit in
    one ``nn.Sequential`` with their own activation (and dropout, when non-zero) modules between
    them, so the trainable state is named ``net.0.weight``, ``net.2.weight``, … as before.
    """

    Params = MLPParams
    name: ClassVar[str] = "mlp"
    structure: ClassVar[ExampleStructure] = ExampleStructure.ROWS

    def __init__(self, params: MLPParams | None = None) -> None:
        super().__init__(params)
        self.net: nn.Sequential | None = None
        self.features: torch.Tensor | None = None

    def make_layer(self, width_in: int, width_out: int) -> nn.Module:
        return nn.Linear(width_in, width_out)

    def prepare(self, data: Any) -> None:
        """Build the layers for ``data.num_features`` inputs and ``data.num_classes`` outputs."""
        p = self.params
        layers: list[nn.Module] = []
        linears = self.build(data)
        for i, linear in enumerate(linears):
            layers.append(linear)
            if i < len(linears) - 1:
                layers.append(ACTIVATIONS[p.activation]())
                if p.dropout:
                    layers.append(nn.Dropout(p.dropout))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.net is None:
            raise ConfigError("model 'mlp' is not prepared (call prepare(data) first)")
        return self.net(x)
