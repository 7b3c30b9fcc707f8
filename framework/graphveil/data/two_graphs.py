"""The two-graph transfer setting (``data.split.kind: two_graphs``): train on graph A, evaluate
zero-shot on graph B.

Papers 1-2 fine-tune on the relations of one graph and deploy the model on another domain whose
relations (and entities) it never saw. Graph A is the run's ``data`` section, graph B its
``data.split.eval_data``; both are read by the same data sources (:func:`~graphveil.data.load_data`
reads both through the run's plugin host). Entity ids are per graph: an id in both graphs names
two different entities. ``data.max_entities`` cuts graph A, ``data.split.eval_data.max_entities``
graph B; a node-feature source (planetoid) gives its relational view.

The encoder embeds entities by index into one dataset, so the task gets the disjoint union
(:class:`TwoGraphs`): A's entities first, then B's, no relation between them. The privacy
guarantee covers graph A only (the training data); graph B is evaluation data, read in the
clear by whoever evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph


@dataclass(repr=False, eq=False)  # keep RelationalGraph's repr and equality
class TwoGraphs(RelationalGraph):
    """The disjoint union of ``train`` (graph A, entities ``0..a-1``) and ``held_out`` (graph B,
    entities ``a..a+b-1``). Union ids are ``"A:<id>"`` and ``"B:<id>"`` (ids are per graph);
    labels are not carried (the relational task does not read them)."""

    train: RelationalGraph = field(kw_only=True)
    held_out: RelationalGraph = field(kw_only=True)

    @property
    def train_nodes(self) -> torch.Tensor:
        return torch.arange(self.train.num_nodes)

    @property
    def held_out_nodes(self) -> torch.Tensor:
        return torch.arange(self.train.num_nodes, self.num_nodes)


def join_graphs(a: RelationalGraph, b: RelationalGraph) -> TwoGraphs:
    """Graph A (training) and graph B (evaluation) as one :class:`TwoGraphs`.

    Texts are joined if both graphs have them, features if both have them with the same width;
    at least one of the two must be joinable, so one encoder can embed every entity.

    :raises DataError: naming the graph without relations, or the input the graphs do not share.
    """
    for role, g in (("graph A (data)", a), ("graph B (data.split.eval_data)", b)):
        if g.num_edges == 0:
            raise DataError(f"two_graphs: {role} {g.name!r} has no relations to "
                            f"{'train' if g is a else 'evaluate'} on")
    texts = a.texts + b.texts if a.texts is not None and b.texts is not None else None
    features = None
    if a.features is not None and b.features is not None and a.features.shape[1] == b.features.shape[1]:
        features = torch.cat([a.features, b.features])
    if texts is None and features is None:
        raise DataError(f"two_graphs: graph A {a.name!r} has {_inputs(a)}, graph B {b.name!r} has "
                        f"{_inputs(b)}; one encoder embeds both, so they need texts, or features of "
                        f"the same width, in common")
    return TwoGraphs(
        name=f"{a.name}+{b.name}",
        entity_ids=[f"A:{e}" for e in a.entity_ids] + [f"B:{e}" for e in b.entity_ids],
        edges=torch.cat([a.edges, b.edges + a.num_nodes]),
        texts=texts, features=features, notes=dict(a.notes), train=a, held_out=b,
    )


def _inputs(g: RelationalGraph) -> str:
    parts = (["texts"] if g.texts is not None else []) + (
        [f"{g.features.shape[1]} features"] if g.features is not None else [])
    return " and ".join(parts) or "neither texts nor features"
