"""The ``parquet`` source: a relation table and an entity table in Parquet files.

The same graph as ``edge_list`` (:func:`~graphveil.plugins.standard.sources.edge_list.load_edge_list`) builds from
the same data, through the same validation (:func:`~graphveil.data.validate.build_graph`):
ids are strings (integer id columns are written out in decimal), stripped of surrounding
whitespace; an empty or null label means unlabelled. Messages name the file and the 1-based
data row (``relations.parquet, row 7: unknown entity id 'x'``).

The relation table is streamed: only its two id columns are read, one record batch of a row
group at a time (:meth:`pyarrow.parquet.ParquetFile.iter_batches`), and each batch's ids are
turned into int64 index pairs before the next is read. A relation table whose rows would not
fit in memory as Python strings therefore still loads, as long as the compact graph (16 bytes
per relation) and the entity table do. pyarrow is imported only here, when a Parquet file is read.

With node features named (``features_col``: a ``list<float>`` column; ``feature_cols``;
``features_table``: a sparse long Parquet table) and ``label_col``, the graph is a node graph for
node classification (:mod:`graphveil.data.node_table`): only the id, label and feature columns
of the entity table are read, as Arrow columns turned into one float32 matrix.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import Field

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph
from graphveil.data.node_table import (
    IntegerIdIndex,
    NodeColumns,
    build_node_graph,
    node_rows,
    sparse_features,
)
from graphveil.data.tables import edge_columns
from graphveil.data.validate import EdgeRecords, EntityRecords, OnUnknown, build_graph
from graphveil.plugins.standard.sources._options import TableOptions

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.parquet as pq

#: Rows per record batch: bounds the relation ids held as Python strings at once.
BATCH_ROWS = 65_536


class ParquetOptions(TableOptions):
    path: Path = Field(description=(
        "Relation table (.parquet): one relation per row; read by row group, only the two id columns."))
    entities: Path = Field(description=(
        "Entity table (.parquet) with an id column (strings or integers) and a text column "
        "(strings), or, for a node graph, the label and feature columns."))
    features_table: Path | None = Field(None, description=(
        "Node graph: a sparse long Parquet table of features with the columns <id_col>, feature "
        "(integer index from 0, or names) and value (optional, default 1); a node without rows "
        "has zero features."))
    source_col: str | None = Field(None, min_length=1, description=(
        "Column of the relation table holding the first entity id of each relation (set with "
        "target_col). Default: the recognised pair of column names edge_list's header detection "
        "uses (source/target, src/dst, from/to, ...), case-insensitive."))
    id_col: str = Field("id", min_length=1, description="Column of the entity table holding the entity id.")
    text_col: str = Field("text", min_length=1, description="Column of the entity table holding the entity text.")
    label_col: str | None = Field(None, min_length=1, description=(
        "Column of the entity table holding a class label (empty or null: unlabelled). Default: no labels."))


class ParquetSource(DataSource):
    """A text-attributed graph from Parquet tables (data.path, data.entities): edge_list's graph, streamed with pyarrow."""

    Params = ParquetOptions

    def load(self) -> RelationalGraph | NodeGraph:
        p = self.params
        columns = p.node_columns()
        if columns is not None:
            return load_parquet_nodes(p.path, p.entities, columns, source_col=p.source_col,
                                      target_col=p.target_col)
        return load_parquet(
            p.path, p.entities, source_col=p.source_col, target_col=p.target_col, id_col=p.id_col,
            text_col=p.text_col, label_col=p.label_col, option_prefix="data.",
        )


# ------------------------------------------------------------------------------------ reader


def _open(path: Path) -> pq.ParquetFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a Parquet file ({exc})") from exc


def _column(pf: pq.ParquetFile, name: str, source: str, option: str, prefix: str) -> pa.DataType:
    """The type of column ``name`` (given as the option ``option``), which must exist."""
    names = pf.schema_arrow.names
    if name not in names:
        raise DataError(f"{source}: no column {name!r} (columns: {', '.join(names)}); "
                        f"set {prefix}{option} to the right one")
    return pf.schema_arrow.field(name).type


def _value_type(t: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    return t.value_type if pa.types.is_dictionary(t) else t  # pandas categoricals are dictionaries


def _is_text(t: pa.DataType) -> bool:
    import pyarrow as pa

    t = _value_type(t)
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _check_type(t: pa.DataType, name: str, source: str, option: str, prefix: str, *, text: bool = False) -> None:
    import pyarrow as pa

    if _is_text(t) or (not text and pa.types.is_integer(_value_type(t))):
        return
    wanted = "strings" if text else "strings or integers"
    raise DataError(f"{source}: column {name!r} ({prefix}{option}) holds {t}, not {wanted}")


def _strings(column: Any, name: str, source: str, first_row: int, *, nulls: bool = False) -> list[str | None]:
    """A batch's column as stripped Python strings (integers in decimal); a null is refused
    naming its row, or kept as ``None`` with ``nulls=True``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count and not nulls:
        row = first_row + pc.index(column.is_null(), True).as_py()
        raise DataError(f"{source}, row {row}: column {name!r} is null")
    if pa.types.is_integer(column.type):
        return column.cast(pa.string()).to_pylist()
    return pc.utf8_trim_whitespace(column).to_pylist()  # as edge_list strips its id fields


def _batches(pf: pq.ParquetFile, columns: list[str], source: str) -> Iterator[tuple[int, Any]]:
    """``(first row, record batch)`` of ``columns``, rows counted from 1."""
    import pyarrow as pa

    row = 1
    try:
        for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns):
            yield row, batch
            row += batch.num_rows
    except pa.ArrowException as exc:
        raise DataError(f"{source}: cannot read row {row} onwards ({exc})") from exc


def read_parquet_entities(
    path: str | os.PathLike[str],
    *,
    id_col: str = "id",
    text_col: str = "text",
    label_col: str | None = None,
    option_prefix: str = "",
) -> EntityRecords:
    """The entity table: ids (strings or integers), texts (strings; a null is refused by the
    validation as "no text") and optional labels. Only these columns are read."""
    path = Path(path)
    source, pf, p = str(path), _open(path), option_prefix
    wanted = [(id_col, "id_col", False), (text_col, "text_col", True)]
    if label_col:
        wanted.append((label_col, "label_col", False))
    for name, option, text in wanted:
        _check_type(_column(pf, name, source, option, p), name, source, option, p, text=text)
    ids: list[str] = []
    texts: list[Any] = []
    labels: list[str | None] = []
    for row, batch in _batches(pf, [name for name, _, _ in wanted], source):
        ids.extend(_strings(batch.column(id_col), id_col, source, row))
        texts.extend(batch.column(text_col).to_pylist())
        if label_col:
            labels.extend(s or None for s in _strings(batch.column(label_col), label_col, source, row, nulls=True))
    if not ids:
        raise DataError(f"{source}: no entities")
    return EntityRecords(source, ids, range(1, len(ids) + 1), texts, labels if label_col else None, "row")


def read_parquet_edges(
    path: str | os.PathLike[str],
    *,
    source_col: str | None = None,
    target_col: str | None = None,
    option_prefix: str = "",
) -> Iterator[EdgeRecords]:
    """The relation table as chunks of :class:`EdgeRecords` (one per record batch, rows
    numbered across the file). The file and its columns are checked before the first chunk."""
    path = Path(path)
    source, pf, p = str(path), _open(path), option_prefix
    s, t = edge_columns(pf.schema_arrow.names, source, source_col, target_col, p)
    for name, option in ((s, "source_col"), (t, "target_col")):
        _check_type(_column(pf, name, source, option, p), name, source, option, p)
    if pf.metadata.num_rows == 0:
        raise DataError(f"{source}: no edges")

    def chunks() -> Iterator[EdgeRecords]:
        for row, batch in _batches(pf, [s, t], source):
            a = _strings(batch.column(s), s, source, row)
            b = _strings(batch.column(t), t, source, row)
            yield EdgeRecords(source, list(zip(a, b, strict=True)), range(row, row + batch.num_rows), "row")

    return chunks()


def load_parquet(
    edges_path: str | os.PathLike[str],
    entities_path: str | os.PathLike[str],
    *,
    source_col: str | None = None,
    target_col: str | None = None,
    id_col: str = "id",
    text_col: str = "text",
    label_col: str | None = None,
    on_unknown: OnUnknown = "error",
    name: str | None = None,
    option_prefix: str = "",
) -> RelationalGraph:
    """A text-attributed graph from a Parquet relation table and a Parquet entity table (the
    ``parquet`` source); options and result as
    :func:`~graphveil.plugins.standard.sources.edge_list.load_edge_list`."""
    entities = read_parquet_entities(
        entities_path, id_col=id_col, text_col=text_col, label_col=label_col, option_prefix=option_prefix
    )
    chunks = read_parquet_edges(edges_path, source_col=source_col, target_col=target_col,
                                option_prefix=option_prefix)
    return build_graph(name or Path(edges_path).stem, entities, chunks, on_unknown=on_unknown,
                       edge_source=str(edges_path))


def _read_table(path: str | os.PathLike[str], wanted: Any) -> Any:
    """The columns ``wanted(names)`` of a Parquet file, as one Arrow table."""
    import pyarrow as pa

    path = Path(path)
    pf = _open(path)
    columns = wanted(pf.schema_arrow.names)
    try:
        return pf.read(columns=columns)
    except pa.ArrowException as exc:
        raise DataError(f"{path}: cannot read columns {', '.join(columns)} ({exc})") from exc


def load_parquet_nodes(
    edges_path: str | os.PathLike[str],
    entities_path: str | os.PathLike[str],
    columns: NodeColumns,
    *,
    source_col: str | None = None,
    target_col: str | None = None,
    name: str | None = None,
) -> NodeGraph:
    """A node graph from a Parquet relation table (streamed, as :func:`read_parquet_edges`) and
    a Parquet entity table holding the node ids, labels and features (``columns``); with
    ``columns.features_table``, the features come from that long Parquet table."""
    source = str(entities_path)
    vec = columns.features_col  # a list column is streamed by record batch into the feature matrix
    table = _read_table(entities_path, lambda names: [c for c in columns.entity_columns(names, source) if c != vec])
    chunks = None if vec is None else (batch.column(0) for _, batch in _batches(_open(Path(entities_path)), [vec], source))
    nodes = node_rows(table, columns, source, chunks)
    del table
    if columns.features_table is not None:
        sparse = _read_table(columns.features_table, lambda names: names)
        nodes.x = sparse_features(sparse, columns, nodes.ids, columns.features_table)
    pairs = read_parquet_edge_index(edges_path, nodes.ids, int_ids=nodes.int_ids, source_col=source_col,
                                    target_col=target_col,
                                    option_prefix=columns.prefix)
    return build_node_graph(name or Path(edges_path).stem, nodes, pairs)


#: Rows per record batch of :func:`read_parquet_edge_index`.
INDEX_BATCH_ROWS = 1 << 20
#: String ids: Arrow's lookup builds a hash table of every node id per batch, so a batch holds at
#: least this many rows per node id: the builds then cost O(relations), not O(relations · nodes / batch).
ROWS_PER_ID = 4


def _integer_column(t: pa.DataType) -> bool:
    import pyarrow as pa

    t = _value_type(t)
    return pa.types.is_integer(t) and t != pa.uint64()


def read_parquet_edge_index(
    path: str | os.PathLike[str],
    ids: list[str],
    *,
    int_ids: np.ndarray | None = None,
    source_col: str | None = None,
    target_col: str | None = None,
    option_prefix: str = "",
) -> torch.Tensor:
    """The relation table as ``(k, 2)`` int64 positions in ``ids``, looked up column-wise a
    record batch at a time: no Python string per relation (at 10⁷ relations the per-string path
    of :func:`read_parquet_edges` took most of the load, issue 28). Ids as there: integers in
    decimal, strings stripped. When the node ids are integers (``int_ids``, the same ids as
    int64) and both relation columns hold integers, they are looked up as integers
    (:class:`~graphveil.data.node_table.IntegerIdIndex`: no decimal strings, no hash table per
    batch); otherwise as strings by Arrow (``pyarrow.compute.index_in``). A null or unknown id
    is refused as :func:`~graphveil.data.validate.index_edges` does, naming the file and row."""
    import pyarrow as pa

    path = Path(path)
    source, pf, p = str(path), _open(path), option_prefix
    s, t = edge_columns(pf.schema_arrow.names, source, source_col, target_col, p)
    types = [_column(pf, name, source, option, p) for name, option in ((s, "source_col"), (t, "target_col"))]
    for name, option, typ in ((s, "source_col", types[0]), (t, "target_col", types[1])):
        _check_type(typ, name, source, option, p)
    total = pf.metadata.num_rows
    if total == 0:
        raise DataError(f"{source}: no edges")
    if int_ids is not None and all(_integer_column(typ) for typ in types):
        lookup, batch_rows = _integer_lookup(int_ids), INDEX_BATCH_ROWS
    else:
        lookup, batch_rows = _string_lookup(ids), max(INDEX_BATCH_ROWS, ROWS_PER_ID * len(ids))
    out = torch.empty((total, 2), dtype=torch.long)  # filled in place: no per-batch copies to join
    row = 1
    try:
        for batch in pf.iter_batches(batch_size=batch_rows, columns=[s, t]):
            for end, name in enumerate((s, t)):
                index = lookup(_present_ids(batch.column(name), name, source, row), name, source, row)
                out[row - 1:row - 1 + batch.num_rows, end] = torch.from_numpy(index)
            row += batch.num_rows
    except pa.ArrowException as exc:
        raise DataError(f"{source}: cannot read row {row} onwards ({exc})") from exc
    if row - 1 != total:
        raise DataError(f"{source}: {row - 1} rows read, the file's metadata says {total}")
    return out


def _present_ids(column: Any, name: str, source: str, row: int) -> Any:
    """A batch's id column, dictionary-decoded; a null is refused naming its row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if column.null_count:
        raise DataError(f"{source}, row {row + pc.index(column.is_null(), True).as_py()}: column {name!r} is null")
    return column


def _unknown(index: np.ndarray, shown: Any, source: str, row: int) -> np.ndarray:
    """``index`` (-1: not a node id) as int64; the first unknown id refused naming its row."""
    bad = np.flatnonzero(index < 0)
    if bad.size:
        raise DataError(f"{source}, row {row + int(bad[0])}: unknown entity id {shown(int(bad[0]))!r}")
    return index


def _string_lookup(ids: list[str]) -> Any:
    """Ids (integers in decimal, strings stripped) looked up by Arrow among ``ids``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    value_set = pa.array(ids, pa.string())

    def lookup(column: Any, name: str, source: str, row: int) -> np.ndarray:
        text = column.cast(pa.string()) if pa.types.is_integer(column.type) else pc.utf8_trim_whitespace(column)
        index = pc.index_in(text, value_set=value_set).fill_null(-1).to_numpy(zero_copy_only=False)
        return _unknown(index.astype(np.int64), lambda i: text[i].as_py(), source, row)

    return lookup


def _integer_lookup(int_ids: np.ndarray) -> Any:
    """Integer relation ids looked up among the integer node ids ``int_ids``."""
    index = IntegerIdIndex(int_ids)

    def lookup(column: Any, name: str, source: str, row: int) -> np.ndarray:
        values = column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        return _unknown(index.positions(values), lambda i: str(values[i]), source, row)

    return lookup
