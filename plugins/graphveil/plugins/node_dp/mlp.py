"""A multi-layer perceptron on node features (paper 4's DP-MLP: 3 layers, 64 hidden, SELU)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from graphveil.contract.errors import ConfigError
from graphveil.contract.model import Model
from graphveil.contract.profiles import ExampleStructure

_ACTIVATIONS = {"selu": nn.SELU, "relu": nn.ReLU, "tanh": nn.Tanh}


class MLPParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(64, gt=0, description="Hidden width (paper 4: 64).")
    layers: int = Field(3, ge=1, description="Linear layers (paper 4's MLP baseline: 3).")
    activation: Literal["selu", "relu", "tanh"] = Field("selu", description="Non-linearity (paper 4: SELU).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout between layers (paper 4: 0 under node DP).")
    seed: int | None = Field(None, description="Seed of the weight initialisation (None: torch's global RNG).")


class MLP(Model):
    """Node features → class logits; each node is its own row, so per-node gradients are exact.

    The layers are sized by :meth:`prepare` from the dataset (features in, classes out).
    """

    Params = MLPParams
    structure: ClassVar[ExampleStructure] = ExampleStructure.ROWS

    def __init__(self, params: MLPParams | None = None) -> None:
        super().__init__()
        self.params = params if params is not None else MLPParams()
        self.net: nn.Sequential | None = None
        self.features: torch.Tensor | None = None

    def prepare(self, data: Any) -> None:
        """Build the layers for ``data.num_features`` inputs and ``data.num_classes`` outputs."""
        if not hasattr(data, "x") or not hasattr(data, "num_classes"):
            raise ConfigError(f"model 'mlp' needs node features and labels; the data is {type(data).__name__}")
        p = self.params
        widths = [int(data.num_features)] + [p.hidden] * (p.layers - 1) + [int(data.num_classes)]
        with torch.random.fork_rng(devices=[]):
            if p.seed is not None:
                torch.manual_seed(p.seed)
            layers: list[nn.Module] = []
            for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
                layers.append(nn.Linear(w_in, w_out))
                if i < len(widths) - 2:
                    layers.append(_ACTIVATIONS[p.activation]())
                    if p.dropout:
                        layers.append(nn.Dropout(p.dropout))
            self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.net is None:
            raise ConfigError("model 'mlp' is not prepared (call prepare(data) first)")
        return self.net(x)
