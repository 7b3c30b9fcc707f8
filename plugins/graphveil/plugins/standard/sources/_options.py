"""What the built-in sources' options share: a strict base model, the node-feature options that
make ``edge_list``, ``parquet`` and ``sql`` give a node graph, and the column options of a
relation table plus an entity table.

Messages of the validators name the keys as a user writes them (``data.<key>``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from graphveil.data.node_table import NodeColumns


class SourceOptions(BaseModel):
    """Base of every built-in source's options: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


#: The options naming node features, in the order messages list them.
FEATURE_KEYS = ("features_col", "feature_cols", "features_table", "features_query")


class NodeFeatureOptions(SourceOptions):
    """Node features and labels: with one of these set the source gives a node graph (node
    classification) read from the entity table, see :mod:`graphveil.data.node_table`."""

    features_col: str | None = Field(None, min_length=1, description=(
        "Node graph: the entity table's list column holding each node's feature vector (Parquet "
        "list<float>, a JSONL array, PostgreSQL real[]/float8[], a DuckDB list); all of one length."))
    feature_cols: list[str] | str | None = Field(None, min_length=1, description=(
        "Node graph: the entity table's numeric columns, one per feature: a list of names, or one "
        "string, the prefix of their names (e.g. f_ for f_0, f_1, ...; in table order)."))
    features_table: Path | None = Field(None, description=(
        "Node graph: a sparse long table of features (same format as the entity table) with the "
        "columns <id_col>, feature (integer index from 0, or names) and value (optional, "
        "default 1); a node without rows has zero features."))
    num_features: int | None = Field(None, gt=0, description=(
        "Width of the features of features_table/features_query (default: largest feature "
        "index + 1, or the number of distinct feature names)."))

    def node_columns(self) -> NodeColumns | None:
        """Where the node table holds what, or ``None``: no features named (a text graph)."""
        sparse = getattr(self, "features_table", None) or getattr(self, "features_query", None)
        if self.features_col is None and self.feature_cols is None and sparse is None:
            return None
        cols = self.feature_cols
        return NodeColumns(
            id_col=getattr(self, "id_col", "id"), label_col=getattr(self, "label_col", None),
            features_col=self.features_col, feature_cols=tuple(cols) if isinstance(cols, list) else cols,
            features_table=None if sparse is None else str(sparse), num_features=self.num_features,
            prefix="data.",
        )

    @model_validator(mode="after")
    def _node_features(self) -> NodeFeatureOptions:
        named = [k for k in FEATURE_KEYS if getattr(self, k, None) is not None]
        keys = [f"data.{k}" for k in FEATURE_KEYS if k in type(self).model_fields]
        if len(named) > 1:
            raise ValueError(f"give one of {', '.join(keys)}, not both data.{named[0]} and data.{named[1]}")
        sparse = bool(set(named) & {"features_table", "features_query"})
        if self.num_features is not None and not sparse:
            raise ValueError("data.num_features applies to a sparse features table (data.features_table"
                             + (" or data.features_query)" if "features_query" in keys else ")"))
        if not named:
            return self
        id_col, label_col = getattr(self, "id_col", "id"), getattr(self, "label_col", None)
        if label_col is None:
            raise ValueError(f"data.{named[0]} makes a node graph (node classification), which needs "
                             f"labels: set data.label_col")
        if label_col == id_col:
            raise ValueError(f"data.id_col and data.label_col name the same column {id_col!r}")
        cols = [self.features_col] if self.features_col else self.feature_cols
        if isinstance(cols, list):
            clash = next((c for c in cols if c in (id_col, label_col)), None)
            if clash is not None:
                raise ValueError(f"data.{named[0]} names {clash!r}, the id or label column")
        return self


class TableOptions(NodeFeatureOptions):
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
    def _columns(self) -> TableOptions:
        return check_columns(self)


_Columns = TypeVar("_Columns", bound=BaseModel)


def check_columns(options: _Columns) -> _Columns:
    """The column options of a relation table plus an entity table, checked together."""
    if (options.source_col is None) != (options.target_col is None):
        raise ValueError("give both data.source_col and data.target_col, or neither")
    if options.source_col is not None and options.source_col == options.target_col:
        raise ValueError(f"data.source_col and data.target_col name the same column {options.source_col!r}")
    if options.id_col == options.text_col:
        raise ValueError(f"data.id_col and data.text_col name the same column {options.id_col!r}")
    return options
