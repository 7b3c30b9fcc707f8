"""``data.source`` → dataset: the data source a run names, built with its options and loaded
(:func:`load_data`), cut to ``data.classes`` and ``data.max_entities``.

The sources are plugins (hook ``graphveil_data_sources``); the built-in ones live one per module
in ``graphveil.plugins.standard.sources`` (options and reader together): ``citeseer`` and
``citeseer_tape`` (reading :mod:`graphveil.data.citeseer`), ``edge_list``, ``parquet``, ``sql``,
``pyg``, ``planetoid`` and ``twitch``. A relational source returns a validated
:class:`RelationalGraph` (see :mod:`graphveil.data.validate` for what is refused and what is
cleaned); a node source (``planetoid``, ``twitch``, and ``edge_list`` / ``parquet`` / ``sql`` /
``pyg`` given node features and labels) a :class:`~graphveil.data.node_graph.NodeGraph`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from pydantic import BaseModel

from graphveil.contract.data_source import DataSource, check_source_options
from graphveil.contract.errors import ConfigError, DataError
from graphveil.data.citeseer import load_bundled_citeseer, load_citeseer_tape
from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph

if TYPE_CHECKING:
    from graphveil.contract.host import PluginHost

log = logging.getLogger(__name__)

MAX_ENTITIES_DROPPED_EDGES = "max_entities_dropped_edges"
G = TypeVar("G", RelationalGraph, NodeGraph)

__all__ = ["DataOptions", "check_data_options", "create_data_source", "keep_classes", "load_bundled_citeseer",
           "load_citeseer_tape", "load_data", "load_graph", "truncate"]


def truncate(graph: G, max_entities: int) -> G:
    """The first ``max_entities`` entities (nodes) and the relations among them (notes carried
    over, plus the number of relations dropped)."""
    if max_entities >= graph.num_nodes:
        return graph
    sub = graph.subgraph(torch.arange(max_entities), name=f"{graph.name}[:{max_entities}]")
    dropped = graph.num_edges - sub.num_edges
    if isinstance(graph, NodeGraph):
        dropped //= 2  # NodeGraph counts both directions of an edge
    sub.notes = {**graph.notes, MAX_ENTITIES_DROPPED_EDGES: dropped}
    log.info("max_entities=%d: dropped %d of %d relations", max_entities, dropped,
             graph.num_edges // 2 if isinstance(graph, NodeGraph) else graph.num_edges)
    return sub


def keep_classes(graph: G, classes: list[str]) -> G:
    """The entities labelled with one of ``classes`` (names) and the relations among them.

    :raises DataError: if the graph has no labels or names, or a name is not one of its classes.
    """
    labels, names = ((graph.y, graph.class_names) if isinstance(graph, NodeGraph)
                     else (graph.labels, graph.label_names))
    if labels is None or not names:
        raise DataError(f"data.classes: {graph.name} has no class labels with names to select by")
    unknown = [c for c in classes if c not in names]
    if unknown:
        raise DataError(f"data.classes: {graph.name} has no class {unknown[0]!r}; its classes are {names}")
    wanted = torch.tensor([names.index(c) for c in classes])
    keep = torch.isin(labels, wanted).nonzero().flatten()
    sub = graph.subgraph(keep, name=f"{graph.name}[{'+'.join(classes)}]")
    sub.notes = dict(graph.notes)
    log.info("data.classes=%s: kept %d of %d entities", classes, sub.num_nodes, graph.num_nodes)
    return sub


@dataclass(frozen=True)
class DataOptions:
    """A data section's source options, validated against the source's ``Params`` with the run's
    host (:func:`check_data_options`): typed, defaults filled in. The run config keeps the options
    as written; whoever reads an option reads it here (``options.params.id_col``).

    :param source: the data source's name (``data.source``).
    :param params: its ``Params`` instance.
    :param eval_data: graph B's options (``data.split.eval_data`` of a two-graph split), or None.
    """

    source: str
    params: BaseModel
    eval_data: DataOptions | None = None

    def resolved(self) -> dict[str, Any]:
        """The full option set in JSON types, as ``config.resolved.yaml`` shows it."""
        return self.params.model_dump(mode="json", by_alias=True)


def check_data_options(data: Any, host: PluginHost, *, where: str | None = None) -> DataOptions:
    """Validate a run config's ``data`` section (and graph B's of a two-graph split) against its
    sources' ``Params`` with ``host``, the run's plugin host; nothing is read. The session calls
    this once, when the run is assembled (:meth:`graphveil.run.session.TrainingSession.assemble`).

    :param data: a :class:`graphveil.run.config.DataConfig`.
    :param where: the config's origin (its file); messages then read
        ``run.yaml: data: data.id_col: <problem> (got <value>)``.
    :raises ConfigError: on an unknown source or a bad option, naming the ``data.*`` key.
    """
    eval_data = data.split.eval_data
    return DataOptions(
        data.source, _checked(data, host, "data", where),
        None if eval_data is None else DataOptions(
            eval_data.source, _checked(eval_data, host, "data.split.eval_data", where)))


def _checked(part: Any, host: PluginHost, section: str, where: str | None) -> BaseModel:
    try:
        return check_source_options(host, part.source, part.params, section=section)
    except ConfigError as exc:
        if where is None:
            raise
        raise ConfigError(f"{where}: {section}: {exc}") from exc


def create_data_source(data: Any, host: PluginHost | None = None, *, section: str = "data",
                       params: BaseModel | None = None) -> DataSource:
    """Build the data source ``data.source`` names (nothing is read). ``data`` is a run config's
    data section (:class:`graphveil.run.config.DataConfig`).

    :param section: how messages name the config section (``"data.split.eval_data"`` for graph B).
    :param params: the source's options as :func:`check_data_options` validated them; ``None``:
        validated here.
    :raises ConfigError: on an unknown source (listing the available ones) or a bad option
        (naming the ``data.*`` key).
    """
    from graphveil.contract.host import default_host  # the host imports this package

    host = host or default_host()
    if params is None:
        params = check_source_options(host, data.source, data.params, section=section)
    return host.get("data_source", data.source).factory(params)


def _load_source(source: DataSource, data: Any) -> RelationalGraph | NodeGraph:
    graph = source.load()
    if not isinstance(graph, RelationalGraph | NodeGraph):
        raise DataError(f"data source {data.source!r} returned {type(graph).__name__}, "
                        f"not a RelationalGraph or NodeGraph")
    if data.classes is not None:
        graph = keep_classes(graph, data.classes)
    return graph if data.max_entities is None else truncate(graph, data.max_entities)


def _relational(graph: RelationalGraph | NodeGraph) -> RelationalGraph:
    return graph.to_relational() if isinstance(graph, NodeGraph) else graph


def load_data(data: Any, host: PluginHost | None = None, *,
              options: DataOptions | None = None) -> RelationalGraph | NodeGraph:
    """The dataset a run config's ``data`` section names: the source (a plugin, default host:
    every installed plugin) built with its options and loaded, cut to ``data.classes`` and
    ``data.max_entities``.

    With ``data.split.kind: two_graphs`` the section names two graphs: graph B
    (``data.split.eval_data``) is read through the same host and the result is their disjoint
    union, a :class:`~graphveil.data.two_graphs.TwoGraphs` (both options are checked before
    either graph is read).

    :param options: the section's options as the run's assembly validated them
        (:func:`check_data_options`, :attr:`graphveil.run.session.TrainingSession.data_options`);
        ``None``: validated here.
    :raises ConfigError: as :func:`create_data_source`, before anything is read.
    :raises DataError: from the source, naming the file and the problem.
    """
    if options is None:
        from graphveil.contract.host import default_host  # the host imports this package

        options = check_data_options(data, host or default_host())
    source = create_data_source(data, host, params=options.params)
    if data.split.kind != "two_graphs":
        return _load_source(source, data)
    from graphveil.data.two_graphs import join_graphs

    eval_data = data.split.eval_data
    eval_source = create_data_source(eval_data, host, section="data.split.eval_data",
                                     params=options.eval_data.params)
    return join_graphs(_relational(_load_source(source, data)), _relational(_load_source(eval_source, eval_data)))


def load_graph(data: Any, host: PluginHost | None = None, *,
               options: DataOptions | None = None) -> RelationalGraph:
    """:func:`load_data` as a :class:`RelationalGraph` (a :class:`NodeGraph` is converted:
    features, labels, each edge once) for callers of the relational task."""
    return _relational(load_data(data, host, options=options))
