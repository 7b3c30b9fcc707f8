"""Relational graphs: the data model, loaders, validation and the transfer split."""

from graphveil.data import loaders
from graphveil.data.graph import RelationalGraph
from graphveil.data.loaders import (
    load_bundled_citeseer,
    load_citeseer_tape,
    load_edge_list,
    load_graph,
    load_pyg,
)
from graphveil.data.split import transfer_split

__all__ = [
    "RelationalGraph",
    "load_bundled_citeseer",
    "load_citeseer_tape",
    "load_edge_list",
    "load_graph",
    "load_pyg",
    "loaders",
    "transfer_split",
]
