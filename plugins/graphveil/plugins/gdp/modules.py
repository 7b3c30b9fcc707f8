"""The trainable modules of GAP and DPDGC (paper 4, Fig. 2; App. K: hidden 64, SELU)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from graphveil.contract.errors import ConfigError
from graphveil.contract.model import Model
from graphveil.contract.profiles import ExampleStructure
from graphveil.plugins.node_classification.layers import LayerStack


class FeatureEncoder(Model):
    """GAP's DP-MLP_X: ``layers`` SELU layers F → h, pretrained through a linear head h → C.

    :meth:`embed` is the encoder without the head (the rows PMA aggregates after row
    normalisation); :meth:`forward` adds the head (pretraining logits). ``dropout`` follows
    every SELU while training (paper 4, App. K: 0.5 for every module in non-private and edge-level
    runs, as GAP's code passes its one dropout rate to the encoder); the release runs in eval mode.
    """

    structure: ClassVar[ExampleStructure] = ExampleStructure.ROWS

    def __init__(self, num_features: int, num_classes: int, hidden: int, layers: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        widths = [num_features] + [hidden] * layers
        self.encoder = nn.Sequential(*[m for w_in, w_out in zip(widths[:-1], widths[1:], strict=True)
                                       for m in (nn.Linear(w_in, w_out), nn.SELU(), nn.Dropout(dropout))])
        self.head = nn.Linear(hidden, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


class AdjacencyEmbedding(Model):
    """DPDGC's DP-Emb: ``Ŷ = SELU(A_i W⁽ᴬ⁾ + b) R`` for node i's adjacency row ``A_i``.

    ``W⁽ᴬ⁾`` (n × h) is the transposed weight of ``linear``; :meth:`project` sets every row of
    ``W⁽ᴬ⁾`` to norm c (paper 4, Alg. 2 line 13 — the constraint the sensitivity of Z rests on).
    ``R`` (h × C) is random and fixed (a buffer, never trained).
    """

    structure: ClassVar[ExampleStructure] = ExampleStructure.ROWS

    def __init__(self, num_nodes: int, num_classes: int, hidden: int, row_norm: float,
                 generator: torch.Generator) -> None:
        super().__init__()
        self.linear = nn.Linear(num_nodes, hidden)
        self.row_norm = float(row_norm)
        self.register_buffer("head", torch.randn(hidden, num_classes, generator=generator) / hidden**0.5)
        self.project()

    @torch.no_grad()
    def project(self) -> None:
        """Rows of W⁽ᴬ⁾ (columns of the weight) to norm c, in place on the parameter itself."""
        weight = self.linear.weight  # (h, n): column j is row j of W⁽ᴬ⁾
        weight.copy_(F.normalize(weight, dim=0) * self.row_norm)

    def max_row_norm(self) -> float:
        return float(self.linear.weight.detach().norm(dim=0).max())

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return F.selu(self.linear(rows)) @ self.head


def _selu_mlp(widths: list[int], dropout: float) -> nn.Sequential:
    """Linear layers along ``widths`` with SELU (and dropout) between them; plain last layer."""
    layers: list[nn.Module] = []
    for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        layers.append(nn.Linear(w_in, w_out))
        if i < len(widths) - 2:
            layers.extend([nn.SELU(), nn.Dropout(dropout)])
    return nn.Sequential(*layers)


class LinkXParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(64, gt=0, description="Width of every layer (paper 4: 64).")
    layers: int = Field(2, ge=1, description="Layers of the classifier after the two branches (paper 4: 2).")
    embedding_width: int = Field(64, gt=0, description=(
        "h: width of the released embedding Z, the last columns of the input (DPDGC's hidden)."))
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout (paper 4: 0.5 non-private / edge, 0 otherwise).")
    seed: int | None = Field(None, description="Seed of the weight initialisation.")


class LinkX(Model):
    """DPDGC's classifier on ``[X ‖ Z]`` (LINKX-style, Lim et al. 2021): one linear layer per
    branch (MLP_X on the features, MLP_A on the released Z), SELU of the concatenation, then
    ``layers`` SELU layers to the classes. Example i reads row i only (structure ``rows``)."""

    Params = LinkXParams
    structure: ClassVar[ExampleStructure] = ExampleStructure.ROWS

    def __init__(self, params: LinkXParams | None = None) -> None:
        super().__init__()
        self.params = params if params is not None else LinkXParams()
        self.branch_x: nn.Linear | None = None

    def prepare(self, data: Any) -> None:
        p = self.params
        width = int(getattr(data, "num_features", 0))
        if width <= p.embedding_width:
            raise ConfigError(f"model 'linkx' reads [X ‖ Z] with Z of width {p.embedding_width}; the input "
                              f"has {width} columns (use task features: released:<DPDGC's release>)")
        with torch.random.fork_rng(devices=[]):
            if p.seed is not None:
                torch.manual_seed(p.seed)
            self.branch_x = nn.Linear(width - p.embedding_width, p.hidden)
            self.branch_z = nn.Linear(p.embedding_width, p.hidden)
            self.classifier = _selu_mlp([2 * p.hidden] + [p.hidden] * (p.layers - 1) + [int(data.num_classes)],
                                        p.dropout)
            self.drop = nn.Dropout(p.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.branch_x is None:
            raise ConfigError("model 'linkx' is not prepared (call prepare(data) first)")
        z_width = self.params.embedding_width
        h = torch.cat([self.branch_x(x[:, :-z_width]), self.branch_z(x[:, -z_width:])], dim=1)
        return self.classifier(self.drop(F.selu(h)))


class HopMLPParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hop_width: int = Field(64, gt=0, description=(
        "Width of each hop's block of the input (GAP's encoder width, method.hidden)."))
    hidden: int = Field(64, gt=0, description="Width of the base and head layers (paper 4: 64).")
    base_layers: int = Field(2, ge=1, description="Layers of each hop's base MLP (paper 4: 2).")
    head_layers: int = Field(1, ge=1, description="Layers of the head after combination (GAP's default: 1).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout (paper 4: 0.5 non-private / edge, 0 otherwise).")
    seed: int | None = Field(None, description="Seed of the weight initialisation.")


class HopMLP(Model):
    """GAP's classification module (Sajadmanesh et al. 2023, Fig. 1: DP-MLP_f): the input is
    ``Z = [H⁽⁰⁾ ‖ … ‖ H⁽ᴸ⁾]``; each hop's block goes through its own base MLP, the outputs are
    concatenated, row-normalised, passed through SELU and a head MLP to the classes. Batch norm,
    which GAP uses only non-privately, is left out: it mixes examples (no per-node gradient).
    Example i reads row i only (structure ``rows``)."""

    Params = HopMLPParams
    structure: ClassVar[ExampleStructure] = ExampleStructure.ROWS

    def __init__(self, params: HopMLPParams | None = None) -> None:
        super().__init__()
        self.params = params if params is not None else HopMLPParams()
        self.bases: nn.ModuleList | None = None

    def prepare(self, data: Any) -> None:
        p = self.params
        width = int(getattr(data, "num_features", 0))
        if width < 2 * p.hop_width or width % p.hop_width:
            raise ConfigError(f"model 'hop_mlp' reads L + 1 ≥ 2 blocks of width hop_width = {p.hop_width}; the "
                              f"input has {width} columns (use task features: released:gap_aggregates and "
                              "set hop_width to the method's hidden)")
        hops = width // p.hop_width
        with torch.random.fork_rng(devices=[]):
            if p.seed is not None:
                torch.manual_seed(p.seed)
            self.bases = nn.ModuleList(_selu_mlp([p.hop_width] + [p.hidden] * p.base_layers, p.dropout)
                                       for _ in range(hops))
            self.head = _selu_mlp([hops * p.hidden] + [p.hidden] * (p.head_layers - 1) + [int(data.num_classes)],
                                  p.dropout)
            self.drop = nn.Dropout(p.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bases is None:
            raise ConfigError("model 'hop_mlp' is not prepared (call prepare(data) first)")
        blocks = x.split(self.params.hop_width, dim=1)
        h = F.normalize(torch.cat([base(b) for base, b in zip(self.bases, blocks, strict=True)], dim=1), dim=1)
        return self.head(self.drop(F.selu(h)))


class FullGraphSAGEParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: int = Field(64, gt=0, description="Hidden width (paper 4: 64).")
    layers: int = Field(2, ge=1, description="SAGEConv layers.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout (paper 4: 0.5 non-private / edge).")
    seed: int | None = Field(None, description="Seed of the weight initialisation.")


def sage_layer(conv: Any, x: torch.Tensor, adj_t: torch.Tensor) -> torch.Tensor:
    """``conv(x, adj_t)`` for PyG's ``SAGEConv`` with its defaults (mean, root weight, no
    projection or normalisation), projecting before aggregating when the layer narrows: the mean
    is linear, so the output is the same, and the sparse product runs at the output width
    (a randomized-response graph at ε = 1 has millions of edges; Twitch has 3170 features)."""
    if conv.aggr != "mean" or not conv.root_weight or conv.normalize or conv.project:
        return conv(x, adj_t)
    lin_l = conv.lin_l
    if lin_l.in_channels > lin_l.out_channels:
        h = F.linear(x, lin_l.weight)
        out = conv.propagate(adj_t, x=(h, h))
        out = out + lin_l.bias if lin_l.bias is not None else out
    else:
        out = lin_l(conv.propagate(adj_t, x=(x, x)))
    return out + conv.lin_r(x)


class FullGraphSAGE(LayerStack):
    """GraphSAGE (mean aggregation) over a whole graph, ``forward(x, edge_index)`` → logits of
    every node, SELU between layers. Structure ``whole_graph``: it has no per-example gradient, so
    it trains only without DP-SGD (non-private runs, or on a released graph at edge level:
    RandEdge+SAGE)."""

    Params = FullGraphSAGEParams
    name: ClassVar[str] = "sage_full"
    structure: ClassVar[ExampleStructure] = ExampleStructure.WHOLE_GRAPH

    def activation_name(self) -> str:
        return "selu"

    def make_layer(self, width_in: int, width_out: int) -> nn.Module:
        from torch_geometric.nn import SAGEConv

        return SAGEConv(width_in, width_out)

    def apply_layer(self, layer: nn.Module, h: torch.Tensor, *graph: Any) -> torch.Tensor:
        return sage_layer(layer, h, *graph)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        if self.convs is None:
            raise ConfigError("model 'sage_full' is not prepared (call prepare(data) first)")
        return self.stack(self.convs, x, self._adjacency(edge_index, x.shape[0]))

    def _adjacency(self, edge_index: torch.Tensor, n: int) -> torch.Tensor:
        """Sparse CSR ``adj_t`` (row = target), cached per edge tensor: a sparse matmul aggregates
        without materialising one message per edge (a randomized-response graph at ε = 1 has
        millions of edges)."""
        from torch_geometric.utils import to_torch_csr_tensor

        key = (edge_index.data_ptr(), tuple(edge_index.shape), n)
        if getattr(self, "_adj_key", None) != key:
            with torch.sparse.check_sparse_tensor_invariants(False):
                self._adj = to_torch_csr_tensor(edge_index.flip(0), size=(n, n))
            self._adj_key = key
        return self._adj
