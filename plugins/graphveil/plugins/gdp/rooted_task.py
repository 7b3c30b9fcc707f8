"""Node classification on rooted computation subgraphs of a graph of out-degree ≤ D (DP-SAGE).

Training: the sampler draws root positions (:class:`~graphveil.plugins.gdp.rooted.RootBatch`);
:meth:`RootedNodeClassification.lift` builds each root's L-hop in-neighbourhood on the graph,
whose out-degree must be at most the unit's D: a larger graph is refused when the task is set
up (:func:`~graphveil.plugins.gdp.common.check_out_degree_class`), never capped — the count G of
changed examples (:mod:`~graphveil.plugins.gdp.rooted`) needs every changed edge to touch the
replaced node, which no cap of a raw graph keeps. :meth:`~RootedNodeClassification.losses` gives one
cross-entropy per root. Every node of the graph may appear in a subgraph (paper 4's
transductive setting: the whole graph is private and covered by node-level GDP).

Predictions: a model on the raw (bounded) graph reads every neighbour, so its predictions are
not covered by the weights' guarantee. In a private run evaluation reads only a release of
noisy outputs (``predictions: released:<name>``, e.g. DP-SAGE's ``dp_sage_outputs``); a
non-private run may read the model directly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator

from graphveil.contract.errors import ConfigError
from graphveil.contract.model import Model
from graphveil.contract.profiles import ExampleStructure
from graphveil.plugins.gdp.levels import GdpLevel
from graphveil.plugins.gdp.rooted import RootBatch
from graphveil.plugins.node_classification.task import (
    _MECHANISM_NAME,
    RELEASED,
    NodeClassification,
    NodeClassificationParams,
)


class RootedNodeClassificationParams(NodeClassificationParams):
    predictions: str | None = Field(None, description=(
        "'released:<name>': evaluation reads the class scores that release holds ((n, classes), e.g. "
        "'released:dp_sage_outputs'), never the model on the graph. Required in a private run; unset: "
        "the model's own predictions on the bounded graph (non-private runs)."))

    @field_validator("predictions")
    @classmethod
    def _predictions(cls, v: str | None) -> str | None:
        if v is not None and not (v.startswith(RELEASED) and _MECHANISM_NAME.match(v.removeprefix(RELEASED))):
            raise ValueError("must be 'released:<name>', e.g. 'released:dp_sage_outputs'")
        return v


class RootedNodeClassification(NodeClassification):
    """One example per training root: its L-hop subgraph of the bounded graph; accuracy from a release."""

    Params = RootedNodeClassificationParams
    metrics: ClassVar = NodeClassification.metrics

    def __init__(self, params: RootedNodeClassificationParams | None = None) -> None:
        super().__init__(params if params is not None else RootedNodeClassificationParams())
        self.level = GdpLevel(None)
        self.bounded_edges: torch.Tensor | None = None

    def configure(self, config: Any) -> None:
        """The run's level (the graph must have out-degree ≤ its D) and the predictions rule, before
        data is read."""
        if self.params.graph is not None:
            raise ConfigError("task 'rooted_node_classification': task.graph does not apply; the model reads "
                              "each root's subgraph of the out-degree-bounded graph")
        super().configure(config)
        unit = config.privacy.privacy_unit if config.privacy.enabled else None
        if config.privacy.enabled and (unit is None or unit.degree_bound is None):
            raise ConfigError("task 'rooted_node_classification' needs the graph's out-degree bound D: "
                              "state privacy.unit 'node/replacement/D=<D>/predictions'")
        self.level = GdpLevel(unit, config.method.name)
        if config.privacy.enabled and self.params.predictions is None:
            raise ConfigError("task 'rooted_node_classification': in a private run the model's predictions on "
                              "the graph read every neighbour and are not covered; evaluate a release of "
                              "noisy outputs instead (predictions: 'released:dp_sage_outputs', method dp_sage)")

    def setup(self, data: Any, split: Any) -> None:
        """The node split, then the graph's edges, refused at node level if an out-degree exceeds D."""
        from graphveil.plugins.gdp.common import aggregation_edges

        super().setup(data, split)
        self.bounded_edges = aggregation_edges(self, self.level, caps=False)

    def prepare_model(self, model: Model) -> None:
        if getattr(model, "structure", None) is not ExampleStructure.ROOT_SUBGRAPHS:
            raise ConfigError("task 'rooted_node_classification' trains on rooted subgraphs: the model must "
                              "declare structure root_subgraphs (e.g. model 'sage')")
        super().prepare_model(model)

    def lift(self, batch: RootBatch) -> Any:
        """The drawn roots' subgraphs (graph i = root i), features raw or released, labels of the roots."""
        from graphveil.subgraph_batch import rooted_subgraphs

        if not isinstance(batch, RootBatch):
            raise ConfigError(f"task 'rooted_node_classification' needs a root sampler (root_subgraphs), "
                              f"got a {type(batch).__name__}")
        roots = self.split.train[batch.nodes]
        return rooted_subgraphs(self.features(), self.bounded_edges, roots, batch.num_hops, y=self.dataset.y)

    def losses(self, model: Model, batch: Any) -> torch.Tensor:
        device = self._device(model)
        return F.cross_entropy(model(batch), batch.labels.to(device), reduction="none")

    @torch.no_grad()
    def scores(self, model: Model) -> torch.Tensor:
        """``(n, classes)`` outputs of the model for every node on the bounded graph (not private)."""
        device = self._device(model)
        model.eval()
        try:
            return model.full_graph(self.features().to(device), self.bounded_edges.to(device))
        finally:
            model.train()

    def predicted(self, model: Model) -> torch.Tensor:
        """``(n,)`` predicted classes: argmax of the release named in ``predictions``, else of :meth:`scores`."""
        name = None if self.params.predictions is None else self.params.predictions.removeprefix(RELEASED)
        if name is None:
            return self.scores(model).argmax(dim=1).cpu()
        out = self.released.get(name)
        n = self.dataset.num_nodes
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != n:
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise ConfigError(f"task.predictions: {name!r} released {got}, not ({n}, classes) scores "
                              "(is it a release after training of this run's method?)")
        return out.argmax(dim=1).cpu()
