"""Node graphs from an owner's tables: features, labels and ids read columnar, then validated.

The ``edge_list``, ``parquet`` and ``sql`` sources give a :class:`~graphveil.data.node_graph.NodeGraph`
(node classification) instead of a text graph when the node features are named
(:class:`NodeColumns`), in one of three layouts:

* ``features_col``: one list column holding each node's vector (Parquet ``list<float>``, a JSONL
  array, PostgreSQL ``real[]``/``float8[]``, a DuckDB list);
* ``feature_cols``: one numeric column per feature, named, or all columns starting with a prefix
  (in table order);
* ``features_table`` (or, in a database, ``features_query``): a sparse long table with the node
  id, a ``feature`` column (integer index ``0..F-1``, or names: one feature per distinct name,
  sorted) and an optional ``value`` column (default 1: a multi-hot table); the width ``F`` is
  ``num_features`` or inferred (largest index + 1); a node without rows has all-zero features.

Labels come from ``label_col`` (strings or integers; null or empty: unlabelled, label -1). Every
table arrives as a :class:`pyarrow.Table` (Parquet, CSV and JSONL are read by pyarrow; database
chunks are turned into Arrow arrays as they are fetched) and becomes numpy arrays without a
Python object per value. What is refused, naming the file or table, the 1-based row and the
node id: a null or duplicate id, a null or non-numeric feature, vectors of different lengths,
NaN or infinite values, an unknown node id or a repeated (node, feature) pair in the sparse
table, a label column with fewer than two classes. Edges follow
:mod:`graphveil.data.validate` (an unknown id is an error; self-loops and duplicates are dropped
and counted).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from graphveil.contract.errors import DataError
from graphveil.data.node_graph import NodeGraph, undirected_edge_index
from graphveil.data.validate import EdgeRecords, index_edges, index_entities

if TYPE_CHECKING:
    import pyarrow as pa

#: Column names of the sparse long table besides the node id (``id_col``).
FEATURE, VALUE = "feature", "value"


@dataclass(frozen=True)
class NodeColumns:
    """Where a node table holds what (``prefix``: how messages name the options, e.g. ``data.``).

    :param feature_cols: column names, or one string: the prefix of the feature columns.
    :param features_table: set when a sparse long table gives the features (its name or path).
    """

    id_col: str = "id"
    label_col: str | None = None
    features_col: str | None = None
    feature_cols: tuple[str, ...] | str | None = None
    features_table: str | None = None
    num_features: int | None = None
    prefix: str = ""

    def entity_columns(self, names: list[str], source: str) -> list[str]:
        """The entity table's columns to read (id, label, features), each checked present."""
        p = self.prefix
        wanted = [_present(names, self.id_col, source, f"{p}id_col")]
        if self.label_col is not None:
            wanted.append(_present(names, self.label_col, source, f"{p}label_col"))
        if self.features_col is not None:
            wanted.append(_present(names, self.features_col, source, f"{p}features_col"))
        wanted += self.feature_columns(names, source)
        return wanted

    def feature_columns(self, names: list[str], source: str) -> list[str]:
        """The one-column-per-feature names: as listed, or every column starting with the prefix."""
        option, cols = f"{self.prefix}feature_cols", self.feature_cols
        if cols is None:
            return []
        if isinstance(cols, str):
            found = [n for n in names if n.startswith(cols) and n not in (self.id_col, self.label_col)]
            if not found:
                raise DataError(f"{source}: no column starts with {cols!r} ({option}; columns: "
                                f"{', '.join(names)})")
            return found
        return [_present(names, c, source, option) for c in cols]


def _present(names: list[str], name: str, source: str, option: str) -> str:
    if name not in names:
        raise DataError(f"{source}: no column {name!r} (columns: {', '.join(names)}); set {option} "
                        f"to the right one")
    return name


def _where(source: str, row: int, ids: list[str] | None) -> str:
    """``source, row r (id 'x')`` for the 0-based row index ``row``."""
    return f"{source}, row {row + 1}" + ("" if ids is None else f" (id {ids[row]!r})")


def _first_null(column: Any) -> int:
    import pyarrow.compute as pc

    return int(pc.index(column.is_null(), True).as_py())


def _plain(column: Any) -> Any:
    """One contiguous array, dictionary-encoded values (pandas categoricals) decoded."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.dictionary_decode() if pa.types.is_dictionary(column.type) else column


def node_ids(column: Any, name: str, source: str) -> list[str]:
    """Ids as stripped strings (integers in decimal); a null is refused naming its row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = _plain(column)
    if column.null_count:
        raise DataError(f"{_where(source, _first_null(column), None)}: id column {name!r} is null")
    if pa.types.is_integer(column.type):
        return column.cast(pa.string()).to_pylist()
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise DataError(f"{source}: id column {name!r} holds {column.type}, not strings or integers")
    return pc.utf8_trim_whitespace(column).to_pylist()


def integer_ids(column: Any) -> np.ndarray | None:
    """The id column as int64 when it holds integers that fit (signed, or unsigned below 64
    bits), else ``None``: the key of :class:`IntegerIdIndex`. Read after :func:`node_ids`."""
    import pyarrow as pa

    column = _plain(column)
    t = column.type
    if not pa.types.is_integer(t) or t == pa.uint64():
        return None
    return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


class IntegerIdIndex:
    """Positions of distinct integer node ids, looked up without a string per id (issue 28: at
    10⁷ relations the decimal cast and Arrow's hash lookup, whose table of every node id is built
    afresh per call, took half of the load). Ids spanning at most ``DENSE_FACTOR·n + 2¹⁶`` values
    get a dense table (one gather per lookup); others a sorted copy and a binary search."""

    DENSE_FACTOR = 4

    def __init__(self, ids: np.ndarray) -> None:
        n = ids.size
        self.low, self.high = int(ids.min()), int(ids.max())
        position = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)  # int32: half the cache
        self.table: np.ndarray | None = None
        if self.high - self.low < self.DENSE_FACTOR * n + (1 << 16):
            self.table = np.full(self.high - self.low + 1, -1, dtype=position.dtype)
            self.table[ids - self.low] = position
        else:
            order = np.argsort(ids, kind="stable")
            self.sorted, self.order = ids[order], position[order]

    def positions(self, values: np.ndarray) -> np.ndarray:
        """int64 position of every value in ``ids``, -1 where it is not an id."""
        inside = (values >= self.low) & (values <= self.high)
        every = bool(inside.all())
        if self.table is not None:
            if every:  # the common case: one gather, no masked copies
                return self.table[values - self.low].astype(np.int64)
            out = np.full(values.shape, -1, dtype=np.int64)
            out[inside] = self.table[values[inside] - self.low]
            return out
        at = np.searchsorted(self.sorted, values).clip(max=self.sorted.size - 1)
        found = (self.sorted[at] == values) & inside
        return np.where(found, self.order[at], -1).astype(np.int64)


def _numeric(t: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def check_finite(x: np.ndarray, ids: list[str], source: str, names: list[str] | None = None) -> np.ndarray:
    """Refuse NaN and ±inf (after the cast to float32: a float64 beyond its range is inf)."""
    bad = ~np.isfinite(x)
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        r = int(rows[0])
        c = int(np.flatnonzero(bad[r])[0])
        what = f"column {names[c]!r}" if names else f"feature {c}"
        raise DataError(f"{_where(source, r, ids)}: {what} is {x[r, c]} (features must be finite); "
                        f"{rows.size} row(s) affected")
    return x


def list_features(column: Any, name: str, ids: list[str], source: str, option: str) -> np.ndarray:
    """``(n, F)`` float32 from a list column: every row a list of ``F`` numbers. ``column``: an
    Arrow array, a chunked one, or an iterable of array chunks read one at a time (a Parquet
    file's record batches); filled chunk by chunk into one array, so the column is never whole."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.chunks
    x: np.ndarray | None = None
    row = 0
    for chunk in [column] if isinstance(column, pa.Array) else column:
        if x is None:
            _check_list_type(chunk.type, name, source, option)
        if len(chunk) == 0:
            continue
        block = _list_block(_plain(chunk), name, ids, source, option, row,
                            None if x is None else x.shape[1])
        if x is None:
            x = np.empty((len(ids), block.shape[1]), dtype=np.float32)
        x[row:row + len(block)] = block
        row += len(block)
    if x is None or row != len(ids):
        raise DataError(f"{source}: column {name!r} ({option}) holds {row} rows for {len(ids)} nodes")
    return check_finite(x, ids, source)


def _check_list_type(t: Any, name: str, source: str, option: str) -> None:
    import pyarrow as pa

    t = t.value_type if pa.types.is_dictionary(t) else t
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
            or not _numeric(t.value_type):
        raise DataError(f"{source}: column {name!r} ({option}) holds {t}, not a list of numbers")


def _list_block(chunk: Any, name: str, ids: list[str], source: str, option: str, first: int,
                width: int | None) -> np.ndarray:
    """One chunk of a list column as ``(rows, F)`` (rows numbered from ``first``)."""
    import pyarrow.compute as pc

    if chunk.null_count:
        raise DataError(f"{_where(source, first + _first_null(chunk), ids)}: column {name!r} ({option}) is null")
    lengths = pc.list_value_length(chunk).to_numpy(zero_copy_only=False)
    width = int(lengths[0]) if width is None else width
    ragged = np.flatnonzero(lengths != width)
    if ragged.size:
        r = first + int(ragged[0])
        raise DataError(f"{_where(source, r, ids)}: column {name!r} ({option}) holds {lengths[r - first]} "
                        f"values, row 1 holds {width}: every node needs the same number of features")
    if width == 0:
        raise DataError(f"{source}: column {name!r} ({option}) holds empty lists")
    values = chunk.flatten()  # the rows' values only, whatever the offsets or slicing
    if values.null_count:
        raise DataError(f"{_where(source, first + _first_null(values) // width, ids)}: column {name!r} "
                        f"({option}) holds a null value")
    return values.to_numpy(zero_copy_only=False).reshape(len(chunk), width)


def column_features(table: Any, names: list[str], ids: list[str], source: str, option: str) -> np.ndarray:
    """``(n, F)`` float32 from one numeric column per feature."""
    x = np.empty((len(ids), len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        column = _plain(table.column(name))
        if not _numeric(column.type):
            raise DataError(f"{source}: feature column {name!r} ({option}) holds {column.type}, not numbers")
        if column.null_count:
            raise DataError(f"{_where(source, _first_null(column), ids)}: feature column {name!r} is null")
        x[:, j] = column.to_numpy(zero_copy_only=False)
    return check_finite(x, ids, source, names)


def node_labels(column: Any, name: str, source: str, option: str) -> tuple[np.ndarray, list[str]]:
    """Class index of every node (-1: unlabelled, a null or empty cell) and the class names:
    integers sorted by value, strings sorted. At least two classes are required."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = _plain(column)
    t = column.type
    if pa.types.is_floating(t):  # pandas writes an integer column with gaps as floats
        values = column.drop_null().to_numpy(zero_copy_only=False)
        if not np.all(np.isfinite(values) & (values == np.round(values))):
            raise DataError(f"{source}: label column {name!r} ({option}) holds non-integer numbers")
        column, t = column.cast(pa.int64()), pa.int64()
    if pa.types.is_integer(t):
        classes = pc.unique(column.drop_null()).sort()
        class_names = [str(c) for c in classes.to_pylist()]
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        column = pc.utf8_trim_whitespace(column)
        column = pc.if_else(pc.equal(column, ""), pa.scalar(None, column.type), column)
        classes = pc.unique(column.drop_null()).sort()
        class_names = classes.to_pylist()
    else:
        raise DataError(f"{source}: label column {name!r} ({option}) holds {t}, not strings or integers")
    if len(class_names) < 2:
        found = f"one class ({class_names[0]!r})" if class_names else "no label"
        raise DataError(f"{source}: label column {name!r} ({option}) holds {found}; node classification "
                        f"needs at least two classes")
    y = pc.index_in(column, value_set=classes).fill_null(-1).to_numpy(zero_copy_only=False)
    return y.astype(np.int64), class_names


def sparse_features(table: Any, columns: NodeColumns, ids: list[str], source: str) -> np.ndarray:
    """``(n, F)`` float32 from a long table (node id ``columns.id_col``, ``feature``, optional
    ``value``) of width ``columns.num_features`` (or inferred), for the nodes ``ids``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    id_col, num_features = columns.id_col, columns.num_features
    option = f"{columns.prefix}features_table"
    names = table.column_names
    for col in (id_col, FEATURE):
        _present(names, col, source, option)
    rows = node_ids(table.column(id_col), id_col, source)
    node = pc.index_in(pa.array(rows, pa.string()), value_set=pa.array(ids, pa.string()))
    if node.null_count:
        r = _first_null(node)
        raise DataError(f"{source}, row {r + 1}: unknown node id {rows[r]!r} (not in the entity table)")
    node_index = node.to_numpy(zero_copy_only=False).astype(np.int64)
    feature, width = _feature_index(_plain(table.column(FEATURE)), rows, source, num_features, option)
    if VALUE in names:
        value = _plain(table.column(VALUE))
        if not _numeric(value.type):
            raise DataError(f"{source}: column {VALUE!r} holds {value.type}, not numbers")
        if value.null_count:
            r = _first_null(value)
            raise DataError(f"{source}, row {r + 1} (id {rows[r]!r}): {VALUE!r} is null")
        values = value.to_numpy(zero_copy_only=False).astype(np.float32)
    else:
        values = np.ones(len(rows), dtype=np.float32)
    check_finite(values[:, None], rows, source, [VALUE])
    keys = node_index * width + feature
    order = np.argsort(keys, kind="stable")
    repeated = np.flatnonzero(keys[order][1:] == keys[order][:-1])
    if repeated.size:
        r = int(order[repeated[0] + 1])
        raise DataError(f"{source}, row {r + 1} (id {rows[r]!r}): feature {int(feature[r])} of this node "
                        f"is listed twice (first at row {int(order[repeated[0]]) + 1})")
    x = np.zeros((len(ids), width), dtype=np.float32)
    x[node_index, feature] = values
    return x


def _feature_index(column: Any, rows: list[str], source: str, num_features: int | None,
                   option: str) -> tuple[np.ndarray, int]:
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.null_count:
        r = _first_null(column)
        raise DataError(f"{source}, row {r + 1} (id {rows[r]!r}): {FEATURE!r} is null")
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        names = pc.unique(column).sort()
        if num_features is not None and num_features != len(names):
            raise DataError(f"{source}: {len(names)} distinct feature names, but num_features is {num_features}")
        return pc.index_in(column, value_set=names).to_numpy(zero_copy_only=False).astype(np.int64), len(names)
    if not pa.types.is_integer(column.type):
        raise DataError(f"{source}: column {FEATURE!r} ({option}) holds {column.type}, not integer "
                        f"indices or names")
    index = column.to_numpy(zero_copy_only=False).astype(np.int64)
    width = num_features if num_features is not None else int(index.max()) + 1 if index.size else 0
    bad = np.flatnonzero((index < 0) | (index >= width))
    if bad.size:
        r = int(bad[0])
        raise DataError(f"{source}, row {r + 1} (id {rows[r]!r}): feature index {index[r]} is outside "
                        f"0..{width - 1}" + ("" if num_features is None else " (num_features)"))
    if width == 0:
        raise DataError(f"{source}: no feature rows")
    return index, width


@dataclass
class NodeRows:
    """A node table as read: ids, features, labels (numpy) and where it came from."""

    source: str
    ids: list[str]
    x: np.ndarray | None
    y: np.ndarray
    class_names: list[str]
    #: the ids as int64 when the id column holds integers (:func:`integer_ids`), else ``None``
    int_ids: np.ndarray | None = None


def node_rows(table: pa.Table, columns: NodeColumns, source: str,
              list_chunks: Iterable[Any] | None = None) -> NodeRows:
    """Ids, features (``None`` with a sparse table: see :func:`sparse_features`) and labels of
    the entity table (read with :meth:`NodeColumns.entity_columns`). ``list_chunks``: the
    ``features_col`` column's chunks, when the caller streams it instead of reading it into ``table``."""
    p = columns.prefix
    if table.num_rows == 0:
        raise DataError(f"{source}: no nodes")
    ids = node_ids(table.column(columns.id_col), columns.id_col, source)
    if len(distinct := set(ids)) != len(ids) or "" in distinct:  # a set in C; the loop names the problem
        index_entities(ids, source, range(1, len(ids) + 1), "row")
    if columns.label_col is None:
        raise DataError(f"{source}: a node graph needs labels; set {p}label_col")
    y, class_names = node_labels(table.column(columns.label_col), columns.label_col, source, f"{p}label_col")
    x = None
    if columns.features_col is not None:
        column = table.column(columns.features_col) if list_chunks is None else list_chunks
        x = list_features(column, columns.features_col, ids, source, f"{p}features_col")
    elif columns.feature_cols is not None:
        x = column_features(table, columns.feature_columns(table.column_names, source), ids, source,
                            f"{p}feature_cols")
    return NodeRows(source, ids, x, y, class_names, integer_ids(table.column(columns.id_col)))


def build_node_graph(name: str, nodes: NodeRows,
                     edges: EdgeRecords | Iterable[EdgeRecords] | torch.Tensor) -> NodeGraph:
    """The :class:`NodeGraph` of ``nodes`` (features set) and the id-keyed ``edges`` (or chunks;
    or a ``(k, 2)`` tensor of positions in ``nodes.ids`` a reader looked up itself): an unknown
    id is an error; self-loops and repeated edges are dropped and counted in ``notes``."""
    if nodes.x is None:
        raise DataError(f"{nodes.source}: no node features were read")
    if isinstance(edges, torch.Tensor):
        pairs, notes = edges, {}
    else:
        pairs, notes = index_edges(edges, {nid: i for i, nid in enumerate(nodes.ids)})
    edge_index, edge_notes = undirected_edge_index(pairs.t(), len(nodes.ids))
    return NodeGraph(
        name=name, x=torch.from_numpy(np.require(nodes.x, requirements="W")),  # Arrow's buffers are read-only
        y=torch.from_numpy(np.require(nodes.y, requirements="W")), edge_index=edge_index,
        node_ids=nodes.ids, class_names=nodes.class_names, notes={**notes, **edge_notes},
    )


def arrow_table(chunks: Iterable[list[tuple[Any, ...]]], names: list[str], source: str) -> pa.Table:
    """Rows fetched from a database cursor, chunk by chunk, as one Arrow table (each chunk's
    columns converted by pyarrow as they arrive: an array cell becomes a list value)."""
    import pyarrow as pa

    batches = []
    for part in chunks:
        columns = list(zip(*part, strict=True))
        try:
            batches.append(pa.RecordBatch.from_arrays([pa.array(c) for c in columns], names=names))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(f"{source}: rows {sum(b.num_rows for b in batches) + 1}.. cannot be read as "
                            f"columns ({exc}); cast the columns in a query") from exc
    if not batches:
        return pa.table({n: pa.array([], pa.null()) for n in names})
    try:
        return pa.Table.from_batches(batches).combine_chunks() if len(batches) == 1 else \
            pa.concat_tables([pa.Table.from_batches([b]) for b in batches], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(f"{source}: a column changes type between rows ({exc})") from exc
