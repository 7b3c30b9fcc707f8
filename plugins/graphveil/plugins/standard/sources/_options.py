"""What the built-in sources' options share: a strict base model, and the column options of a
relation table plus an entity table (``edge_list``, ``parquet``, ``sql``).

Messages of the validators name the keys as a user writes them (``data.<key>``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SourceOptions(BaseModel):
    """Base of every built-in source's options: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


class TableOptions(SourceOptions):
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
