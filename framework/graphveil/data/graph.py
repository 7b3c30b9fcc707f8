"""The relational-graph data model shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RelationalGraph:
    """Entities (with text and/or features, maybe labels) and undirected relations between them.

    Entities are indexed ``0..n-1``; ``entity_ids[i]`` is the external id of entity ``i``.
    ``edges`` is a ``(m, 2)`` long tensor of undirected relations stored once each with
    ``u < v``: no self-loops, no duplicates (loaders enforce this).

    :param name: human-readable name, used in reports.
    :param entity_ids: external ids, unique.
    :param edges: ``(m, 2)`` int64.
    :param texts: one string per entity, or ``None`` for feature-only graphs.
    :param features: ``(n, f)`` float tensor, or ``None``.
    :param labels: ``(n,)`` int64 class indices (``-1`` for unlabelled), or ``None``.
    :param label_names: class index → name.
    """

    name: str
    entity_ids: list[str]
    edges: torch.Tensor
    texts: list[str] | None = None
    features: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    label_names: list[str] | None = None
    notes: dict[str, int] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return len(self.entity_ids)

    @property
    def num_edges(self) -> int:
        return int(self.edges.shape[0])

    def degrees(self) -> torch.Tensor:
        """``(n,)`` degree of every entity."""
        return torch.bincount(self.edges.reshape(-1), minlength=self.num_nodes)

    def subgraph(self, nodes: torch.Tensor, name: str | None = None) -> RelationalGraph:
        """The graph induced on ``nodes`` (indices or an ``(n,)`` bool mask), entity order kept,
        re-indexed ``0..k-1``."""
        nodes = torch.as_tensor(nodes)
        if nodes.dtype == torch.bool:
            if nodes.shape != (self.num_nodes,):
                raise ValueError(f"{self.name}: a subgraph mask must have shape ({self.num_nodes},), "
                                 f"got {tuple(nodes.shape)}")
            keep = nodes
        else:
            keep = torch.zeros(self.num_nodes, dtype=torch.bool)
            keep[nodes.to(torch.long)] = True
        # a gather from an n-byte mask, not an 8n-byte index table: it stays in cache at 10^6 entities
        inside = keep[self.edges[:, 0]] & keep[self.edges[:, 1]]
        remap = keep.cumsum(0) - 1  # entity i -> its rank among the kept (read only where kept)
        idx = keep.nonzero().flatten()
        positions = idx.tolist()
        return RelationalGraph(
            name=name or f"{self.name}[{idx.numel()}]",
            entity_ids=[self.entity_ids[i] for i in positions],
            edges=remap[self.edges[inside]],
            texts=None if self.texts is None else [self.texts[i] for i in positions],
            features=None if self.features is None else self.features[idx],
            labels=None if self.labels is None else self.labels[idx],
            label_names=self.label_names,
        )

    def __repr__(self) -> str:
        kind = "text" if self.texts is not None else "features" if self.features is not None else "bare"
        return f"RelationalGraph({self.name!r}, nodes={self.num_nodes}, edges={self.num_edges}, {kind})"
