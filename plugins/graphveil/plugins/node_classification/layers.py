"""The layer stack of the node-classification models: ``layers`` layers along the widths
[features, hidden, …, hidden, classes], an activation and dropout between two layers, weights
initialised under the model's own seed.

``mlp`` (:mod:`.mlp`), ``sage`` (:mod:`.sage`), ``gcn`` (:mod:`graphveil.plugins.dp_gcn.gcn`) and
``sage_full`` (:mod:`graphveil.plugins.gdp.modules`) derive from :class:`LayerStack` and differ in
the layer they stack and in what their forward reads (rows, rooted subgraphs, graph splits, a
whole graph).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from graphveil.contract.errors import ConfigError
from graphveil.contract.model import Model

#: activations a model's ``activation`` option may name
ACTIVATIONS: dict[str, type[nn.Module]] = {"selu": nn.SELU, "relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU}


class LayerStack(Model):
    """A model made of ``params.layers`` layers, sized by :meth:`prepare` from the data.

    Subclasses set ``name`` (the registered name, for messages) and implement :meth:`make_layer`;
    their ``Params`` have ``hidden``, ``layers``, ``dropout``, ``seed`` and, unless
    :meth:`activation_name` is overridden, ``activation``. :meth:`prepare` puts the layers in
    ``convs`` (trainable state ``convs.0.…``); ``act`` and ``drop`` hold no parameters.
    """

    name: ClassVar[str]

    def __init__(self, params: Any = None) -> None:
        super().__init__()
        self.params = params if params is not None else self.Params()
        self.act = ACTIVATIONS[self.activation_name()]()
        self.drop = nn.Dropout(self.params.dropout)
        self.convs: nn.ModuleList | None = None

    def prepare(self, data: Any) -> None:
        """Build the layers for ``data.num_features`` inputs and ``data.num_classes`` outputs."""
        self.convs = nn.ModuleList(self.build(data))

    def activation_name(self) -> str:
        return self.params.activation

    def make_layer(self, width_in: int, width_out: int) -> nn.Module:
        raise NotImplementedError

    def widths(self, data: Any) -> list[int]:
        """[features, hidden × (layers − 1), classes] of ``data``.

        :raises ConfigError: if the data has no node features or labels.
        """
        if not hasattr(data, "num_features") or not hasattr(data, "num_classes"):
            raise ConfigError(f"model {self.name!r} needs node features and labels; the data is {type(data).__name__}")
        p = self.params
        return [int(data.num_features)] + [p.hidden] * (p.layers - 1) + [int(data.num_classes)]

    def build(self, data: Any) -> list[nn.Module]:
        """The layers for ``data``, initialised on a fork of torch's global RNG (seeded with
        ``params.seed`` when set), so building a model never moves the global RNG."""
        widths = self.widths(data)
        with torch.random.fork_rng(devices=[]):
            if self.params.seed is not None:
                torch.manual_seed(self.params.seed)
            return [self.make_layer(w_in, w_out) for w_in, w_out in zip(widths[:-1], widths[1:], strict=True)]

    def apply_layer(self, layer: nn.Module, h: torch.Tensor, *graph: Any) -> torch.Tensor:
        """One layer on ``h`` (``graph``: what a message-passing layer also reads, e.g. edges)."""
        return layer(h, *graph)

    def stack(self, layers: Iterable[nn.Module] | None, h: torch.Tensor, *graph: Any) -> torch.Tensor:
        """The layers in order, activation then dropout between two of them (none after the last).

        :raises ConfigError: if the model is not prepared (``layers`` is None).
        """
        if layers is None:
            raise ConfigError(f"model {self.name!r} is not prepared (call prepare(data) first)")
        layers = list(layers)
        for i, layer in enumerate(layers):
            h = self.apply_layer(layer, h, *graph)
            if i < len(layers) - 1:
                h = self.drop(self.act(h))
        return h
