"""Datasets: relational graphs and node-feature graphs, their loaders (data sources) and splits."""

from graphveil.data import loaders
from graphveil.data.graph import RelationalGraph
from graphveil.data.loaders import (
    create_data_source,
    load_bundled_citeseer,
    load_citeseer_tape,
    load_data,
    load_edge_list,
    load_graph,
    load_pyg,
)
from graphveil.data.node_graph import NodeGraph
from graphveil.data.node_split import NodeSplit, planetoid_full_split, random_node_split
from graphveil.data.parquet import load_parquet
from graphveil.data.planetoid import load_planetoid
from graphveil.data.split import transfer_split
from graphveil.data.twitch import load_twitch

__all__ = [
    "NodeGraph",
    "NodeSplit",
    "RelationalGraph",
    "create_data_source",
    "load_bundled_citeseer",
    "load_citeseer_tape",
    "load_data",
    "load_edge_list",
    "load_graph",
    "load_parquet",
    "load_planetoid",
    "load_pyg",
    "load_twitch",
    "loaders",
    "planetoid_full_split",
    "random_node_split",
    "transfer_split",
]
