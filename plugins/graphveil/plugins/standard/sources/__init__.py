"""The built-in data sources (``data.source``), one module each: its options and its reader.

Options sit next to ``source`` in the run config's ``data`` section, e.g.
``data: {source: edge_list, path: e.csv, entities: t.csv, source_col: id_1, target_col: id_2}``,
``data: {source: parquet, path: relations.parquet, entities: entities.parquet}``,
``data: {source: sql, url: postgresql+psycopg://alice@db/graph, entities_table: entities, relations_table: relations}``,
``data: {source: planetoid, name: cora}``, ``data: {source: twitch, path: musae_twitch_ENGB}`` or
``data: {source: synthetic, kind: csbm, num_nodes: 100000, num_edges: 1000000}``.
Heavy readers (pyarrow, SQLAlchemy, PyG) are imported only when a source loads.
"""

from __future__ import annotations

from graphveil.contract.data_source import DataSource
from graphveil.contract.hookspecs import hookimpl
from graphveil.plugins.standard.sources.citeseer import CiteSeerSource
from graphveil.plugins.standard.sources.citeseer_tape import CiteSeerTapeSource
from graphveil.plugins.standard.sources.edge_list import EdgeListSource
from graphveil.plugins.standard.sources.parquet import ParquetSource
from graphveil.plugins.standard.sources.planetoid import PlanetoidSource
from graphveil.plugins.standard.sources.pyg import PygSource
from graphveil.plugins.standard.sources.sql import SqlSource
from graphveil.plugins.standard.sources.synthetic import SyntheticSource
from graphveil.plugins.standard.sources.twitch import TwitchSource

SOURCES: dict[str, type[DataSource]] = {
    "citeseer": CiteSeerSource,
    "citeseer_tape": CiteSeerTapeSource,
    "edge_list": EdgeListSource,
    "parquet": ParquetSource,
    "sql": SqlSource,
    "pyg": PygSource,
    "planetoid": PlanetoidSource,
    "twitch": TwitchSource,
    "synthetic": SyntheticSource,
}


@hookimpl
def graphveil_data_sources() -> dict[str, type[DataSource]]:
    return dict(SOURCES)
