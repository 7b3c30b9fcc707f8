"""The built-in data sources (``data.source``): thin plugins over :mod:`graphveil.data`'s loaders.

Options sit next to ``source`` in the run config's ``data`` section, e.g.
``data: {source: edge_list, path: e.csv, entities: t.csv, source_col: id_1, target_col: id_2}``,
``data: {source: parquet, path: relations.parquet, entities: entities.parquet}``,
``data: {source: sql, url: postgresql+psycopg://alice@db/graph, entities_table: entities, relations_table: relations}``,
``data: {source: planetoid, name: cora}`` or ``data: {source: twitch, path: musae_twitch_ENGB}``.
Messages of the validators below name the keys as a user writes them (``data.<key>``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import ConfigError
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.options import NoParams
from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CiteSeerSource(DataSource):
    """CiteSeer with titles and abstracts, shipped with GraphVeil (3186 papers, 4225 relations, 6 classes)."""

    Params = NoParams

    def load(self) -> RelationalGraph:
        from graphveil.data.loaders import load_bundled_citeseer

        return load_bundled_citeseer()


class FolderOptions(_Options):
    path: Path = Field(description="A TAPE dataset/CiteSeer-Orig folder (citeseer_texts.txt, citeseer.cites).")


class CiteSeerTapeSource(DataSource):
    """CiteSeer with titles and abstracts from a TAPE CiteSeer-Orig folder (data.path)."""

    Params = FolderOptions

    def load(self) -> RelationalGraph:
        from graphveil.data.loaders import load_citeseer_tape

        return load_citeseer_tape(self.params.path)


class _TableOptions(_Options):
    """Options shared by the sources reading a relation table and an entity table."""

    path: Path = Field(description="Relation table: one relation per row, two entity-id columns.")
    entities: Path = Field(description="Entity table with an id and a text column (id_col, text_col).")
    source_col: str | None = Field(None, min_length=1, description=(
        "Column of the relation table holding the first entity id of each relation (set with target_col)."))
    target_col: str | None = Field(None, min_length=1, description=(
        "Column of the relation table holding the second entity id (set with source_col)."))
    id_col: str = Field("id", min_length=1, description="Column (JSONL: key) of the entity table holding the entity id.")
    text_col: str = Field("text", min_length=1, description="Column (JSONL: key) of the entity table holding the entity text.")
    label_col: str | None = Field(None, min_length=1, description=(
        "Column (JSONL: key) of the entity table holding a class label (empty: unlabelled). Default: no labels."))

    @model_validator(mode="after")
    def _columns(self) -> _TableOptions:
        return _check_columns(self)


_Columns = TypeVar("_Columns", bound=BaseModel)


def _check_columns(options: _Columns) -> _Columns:
    """The column options of a relation table plus an entity table, checked together."""
    if (options.source_col is None) != (options.target_col is None):
        raise ValueError("give both data.source_col and data.target_col, or neither")
    if options.source_col is not None and options.source_col == options.target_col:
        raise ValueError(f"data.source_col and data.target_col name the same column {options.source_col!r}")
    if options.id_col == options.text_col:
        raise ValueError(f"data.id_col and data.text_col name the same column {options.id_col!r}")
    return options


class EdgeListOptions(_TableOptions):
    path: Path = Field(description="Edge file: CSV/TSV, or whitespace-separated with # comments.")
    entities: Path = Field(description=(
        "Entity table: CSV/TSV/JSONL with an id and a text column (id_col, text_col)."))
    source_col: str | None = Field(None, min_length=1, description=(
        "Header column of the edge file holding the first entity id of each relation "
        "(set with target_col). Default: the first row is a header if it names a recognised pair "
        "(source/target, src/dst, from/to, ...), data if it holds known entity ids."))
    target_col: str | None = Field(None, min_length=1, description=(
        "Header column of the edge file holding the second entity id (set with source_col)."))


class _TableSource(DataSource):
    """A relation table plus an entity table, read by :meth:`loader` with the column options."""

    @staticmethod
    def loader() -> Callable[..., RelationalGraph]:
        raise NotImplementedError

    def load(self) -> RelationalGraph:
        p = self.params
        return self.loader()(
            p.path, p.entities, source_col=p.source_col, target_col=p.target_col, id_col=p.id_col,
            text_col=p.text_col, label_col=p.label_col, option_prefix="data.",
        )


class EdgeListSource(_TableSource):
    """A text-attributed graph from an edge file and an entity table (data.path, data.entities)."""

    Params = EdgeListOptions

    @staticmethod
    def loader() -> Callable[..., RelationalGraph]:
        from graphveil.data.loaders import load_edge_list

        return load_edge_list


class ParquetOptions(_TableOptions):
    path: Path = Field(description=(
        "Relation table (.parquet): one relation per row; read by row group, only the two id columns."))
    entities: Path = Field(description=(
        "Entity table (.parquet) with an id column (strings or integers) and a text column (strings)."))
    source_col: str | None = Field(None, min_length=1, description=(
        "Column of the relation table holding the first entity id of each relation (set with "
        "target_col). Default: the recognised pair of column names edge_list's header detection "
        "uses (source/target, src/dst, from/to, ...), case-insensitive."))
    id_col: str = Field("id", min_length=1, description="Column of the entity table holding the entity id.")
    text_col: str = Field("text", min_length=1, description="Column of the entity table holding the entity text.")
    label_col: str | None = Field(None, min_length=1, description=(
        "Column of the entity table holding a class label (empty or null: unlabelled). Default: no labels."))


class ParquetSource(_TableSource):
    """A text-attributed graph from Parquet tables (data.path, data.entities): edge_list's graph, streamed with pyarrow."""

    Params = ParquetOptions

    @staticmethod
    def loader() -> Callable[..., RelationalGraph]:
        from graphveil.data.parquet import load_parquet  # pyarrow is imported only when used

        return load_parquet


class SqlOptions(_Options):
    """Options of the ``sql`` source; never a password (see :mod:`graphveil.data.sql`)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # a refused URL is not echoed

    url: str = Field(description=(
        "SQLAlchemy database URL without a password, e.g. postgresql+psycopg://alice@db:5432/graph, "
        "sqlite:///graph.db, duckdb:///graph.duckdb. A URL holding a password is refused."))
    password_env: str | None = Field(None, min_length=1, description=(
        "Name of the environment variable holding the password (default: none; PostgreSQL then "
        "uses libpq's PGPASSWORD / PGPASSFILE / ~/.pgpass)."))
    password_file: Path | None = Field(None, description="File holding only the password (trailing newline ignored).")
    entities_table: str | None = Field(None, min_length=1, description=(
        "Entity table (schema.table allowed), read ORDER BY id_col; or give entities_query."))
    entities_query: str | None = Field(None, min_length=1, description=(
        "One SELECT giving the entity rows, read in its own order (add an ORDER BY); or give entities_table."))
    relations_table: str | None = Field(None, min_length=1, description=(
        "Relation table: one relation per row, two entity-id columns; or give relations_query."))
    relations_query: str | None = Field(None, min_length=1, description=(
        "One SELECT giving the relation rows; or give relations_table."))
    source_col: str | None = Field(None, min_length=1, description=(
        "Column of the relations holding the first entity id of each relation (set with "
        "target_col). Default: the recognised pair of column names edge_list's header detection "
        "uses (source/target, src/dst, from/to, ...), case-insensitive."))
    target_col: str | None = Field(None, min_length=1, description=(
        "Column of the relations holding the second entity id (set with source_col)."))
    id_col: str = Field("id", min_length=1, description="Column of the entities holding the entity id (strings or integers).")
    text_col: str = Field("text", min_length=1, description="Column of the entities holding the entity text.")
    label_col: str | None = Field(None, min_length=1, description=(
        "Column of the entities holding a class label (empty or null: unlabelled). Default: no labels."))
    chunk_rows: int = Field(65_536, ge=1, description=(
        "Rows fetched at a time (a server-side cursor on PostgreSQL): bounds the rows held in memory."))

    @model_validator(mode="after")
    def _sql(self) -> SqlOptions:
        from graphveil.data.sql import check_select, check_url, sql_dialect

        if self.password_env is not None and self.password_file is not None:
            raise ValueError("give one of data.password_env and data.password_file, not both")
        try:
            check_url(self.url)
            for what in ("entities", "relations"):
                table, query = getattr(self, f"{what}_table"), getattr(self, f"{what}_query")
                if (table is None) == (query is None):
                    raise ValueError(f"give one of data.{what}_table and data.{what}_query")
                if query is not None:
                    check_select(query, f"data.{what}_query", sql_dialect(self.url))
        except ConfigError as exc:  # pydantic reports ValueErrors only
            raise ValueError(str(exc)) from None
        return _check_columns(self)


class SqlSource(DataSource):
    """A text-attributed graph from database tables or read-only queries (data.url; SQLAlchemy, streamed)."""

    Params = SqlOptions

    def load(self) -> RelationalGraph:
        from graphveil.data.sql import load_sql  # SQLAlchemy is imported only when used

        p = self.params
        return load_sql(
            p.url, entities_table=p.entities_table, entities_query=p.entities_query,
            relations_table=p.relations_table, relations_query=p.relations_query,
            source_col=p.source_col, target_col=p.target_col, id_col=p.id_col, text_col=p.text_col,
            label_col=p.label_col, password_env=p.password_env, password_file=p.password_file,
            chunk_rows=p.chunk_rows, option_prefix="data.",
        )


class PygOptions(_Options):
    path: Path = Field(description="A torch.save'd torch_geometric Data (loaded with weights_only: no code runs).")


class PygSource(DataSource):
    """A torch.save'd torch_geometric Data as a relational graph (data.path)."""

    Params = PygOptions

    def load(self) -> RelationalGraph:
        from graphveil.data.loaders import load_pyg

        return load_pyg(self.params.path)


class PlanetoidOptions(_Options):
    name: Literal["cora", "citeseer"] = Field("cora", description="Which Planetoid citation graph.")
    path: Path | None = Field(None, description=(
        "Folder holding the 8 Planetoid raw files ind.<name>.* (or PyG's root above <Name>/raw). "
        "Default: the Cora files shipped with GraphVeil. Nothing is ever downloaded."))
    preprocess: Literal["dp_gnn", "none"] = Field("dp_gnn", description=(
        "dp_gnn: paper 4's protocol (classes with < 50 nodes dropped with their nodes, self-loops "
        "and then isolated nodes removed); none: PyG's graph as read."))
    check_sha256: bool = Field(True, description=(
        "Refuse raw files that differ from upstream kimiyoung/planetoid: they are Python pickles, "
        "which can run code when read. Set false only for files you trust (bundled files are "
        "always checked)."))

    @model_validator(mode="after")
    def _bundled(self) -> PlanetoidOptions:
        from graphveil.data.planetoid import BUNDLED, raw_file_names

        if self.path is None and self.name not in BUNDLED:
            raise ValueError(f"data.path is required for Planetoid {self.name!r}: only "
                             f"{', '.join(BUNDLED)} is bundled (the folder must hold "
                             f"{', '.join(raw_file_names(self.name))})")
        return self


class PlanetoidSource(DataSource):
    """Planetoid Cora (bundled) or CiteSeer as a node-classification graph, dp-gnn preprocessing by default."""

    Params = PlanetoidOptions

    def load(self) -> NodeGraph:
        from graphveil.data.planetoid import load_planetoid

        p = self.params
        return load_planetoid(p.name, p.path, preprocess=p.preprocess, check_sha256=p.check_sha256)


class TwitchOptions(_Options):
    path: Path = Field(description=(
        "Folder of a MUSAE Twitch graph: <L>_edges.csv (from,to), <L>.json (node id -> feature ids), "
        "<L>_target.csv (id,days,mature,views,partner,new_id); also MUSAE's input/ folder (edges/, "
        "features/, target/) or SNAP's musae_<L>_* files. Nothing is ever downloaded."))
    name: str | None = Field(None, description=(
        "Language code L (MUSAE ships DE, ENGB, ES, FR, PTBR, RU; case-insensitive). "
        "Default (null): read from the file names; needed when the folder holds several."))
    num_features: int | None = Field(None, gt=0, description=(
        "Width of the multi-hot game features (default: largest feature id + 1, 3170 on ENGB); "
        "set it to line up graphs of several languages."))
    preprocess: Literal["dp_gnn", "none"] = Field("dp_gnn", description=(
        "dp_gnn: as for planetoid (classes with < 50 nodes and isolated nodes removed; none on "
        "ENGB); none: the graph as read."))

    @field_validator("name")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        from graphveil.data.twitch import language_code

        return None if value is None else language_code(value)


class TwitchSource(DataSource):
    """A MUSAE Twitch social graph (data.path; label: mature) as a node-classification graph."""

    Params = TwitchOptions

    def load(self) -> NodeGraph:
        from graphveil.data.twitch import load_twitch

        p = self.params
        return load_twitch(p.path, p.name, num_features=p.num_features, preprocess=p.preprocess)


SOURCES = {
    "citeseer": CiteSeerSource,
    "citeseer_tape": CiteSeerTapeSource,
    "edge_list": EdgeListSource,
    "parquet": ParquetSource,
    "sql": SqlSource,
    "pyg": PygSource,
    "planetoid": PlanetoidSource,
    "twitch": TwitchSource,
}


@hookimpl
def graphveil_data_sources() -> dict[str, type[DataSource]]:
    return dict(SOURCES)
