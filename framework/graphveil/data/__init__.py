"""Datasets: relational graphs and node-feature graphs, loading through data sources, and splits.

The built-in sources' readers live with their options in ``graphveil.plugins.standard.sources``.
"""

from graphveil.data import loaders
from graphveil.data.citeseer import load_bundled_citeseer, load_citeseer_tape
from graphveil.data.graph import RelationalGraph
from graphveil.data.loaders import create_data_source, load_data, load_graph
from graphveil.data.node_graph import NodeGraph
from graphveil.data.node_split import NodeSplit, planetoid_full_split, random_node_split
from graphveil.data.split import transfer_split

__all__ = [
    "NodeGraph",
    "NodeSplit",
    "RelationalGraph",
    "create_data_source",
    "load_bundled_citeseer",
    "load_citeseer_tape",
    "load_data",
    "load_graph",
    "loaders",
    "planetoid_full_split",
    "random_node_split",
    "transfer_split",
]
