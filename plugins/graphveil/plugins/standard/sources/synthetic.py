"""The ``synthetic`` source: a generated node graph with features and labels, nothing read.

``kind: csbm`` is :func:`graphveil.data.synthetic.block_csbm` (a C-class contextual SBM: class
blocks, ``homophily`` of the edges inside a class, class-conditional Gaussian features);
``kind: power_law`` is :func:`graphveil.data.synthetic.power_law_graph` (Chung–Lu with a
power-law degree tail of ``exponent``, labels without homophily). The graph is a function of the
options and ``data.seed`` alone, so two runs with the same options see the same graph (the
seed is the data's, not the run's sampling seed). Node ids are ``"0".."n-1"``, class names
``"0".."C-1"``. To measure a real loader on the same graph, write it with
:func:`~graphveil.data.synthetic.write_parquet` and read it with the ``parquet`` source
(``bench/scale.py`` does).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import DataError
from graphveil.data.node_graph import NodeGraph
from graphveil.plugins.standard.sources._options import SourceOptions


class SyntheticOptions(SourceOptions):
    kind: Literal["csbm", "power_law"] = Field("csbm", description=(
        "csbm: contextual stochastic block model; power_law: Chung–Lu graph with a power-law degree tail."))
    num_nodes: int = Field(gt=1, description="Nodes n.")
    num_edges: int = Field(ge=0, description=(
        "Undirected edges: expected (csbm) or exact (power_law); at most a quarter of the n(n-1)/2 pairs."))
    num_classes: int = Field(5, ge=2, description="Classes, of equal size at random nodes.")
    num_features: int = Field(32, gt=0, description="Gaussian features per node.")
    signal: float = Field(1.0, ge=0, allow_inf_nan=False, description=(
        "Norm of the class means relative to the per-node noise (0: features carry no class)."))
    homophily: float = Field(0.8, ge=0, le=1, description="csbm: share of the edges inside a class.")
    exponent: float = Field(2.5, gt=2, allow_inf_nan=False, description=(
        "power_law: γ of the degree distribution P(k) ∝ k^-γ."))
    seed: int = Field(0, ge=0, description="Seed of the generator (the graph, not the run's sampling).")


class SyntheticSource(DataSource):
    """A generated node graph (contextual SBM or power-law) with features and labels."""

    Params = SyntheticOptions

    def load(self) -> NodeGraph:
        import torch

        from graphveil.data.node_graph import node_graph_from_pyg
        from graphveil.data.synthetic import block_csbm, power_law_graph

        p = self.params
        gen = torch.Generator().manual_seed(p.seed)
        common = {"num_classes": p.num_classes, "num_features": p.num_features, "signal": p.signal,
                  "generator": gen}
        try:
            if p.kind == "csbm":
                data = block_csbm(p.num_nodes, p.num_edges, homophily=p.homophily, **common)
            else:
                data = power_law_graph(p.num_nodes, p.num_edges, exponent=p.exponent, **common)
        except ValueError as exc:
            raise DataError(f"data (source synthetic, kind {p.kind}): {exc}") from exc
        name = f"synthetic-{p.kind}-{p.num_nodes}n-{p.num_edges}e-seed{p.seed}"
        return node_graph_from_pyg(data, name=name, class_names=[str(c) for c in range(p.num_classes)])
