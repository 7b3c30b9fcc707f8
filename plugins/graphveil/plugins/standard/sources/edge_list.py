"""The ``edge_list`` source: an edge file (CSV/TSV/whitespace) and an entity table (CSV/TSV/JSONL).

``data: {source: edge_list, path: e.csv, entities: t.csv, source_col: id_1, target_col: id_2}``.

With node features named (``feature_cols``; ``features_col`` for a JSONL entity table;
``features_table``) and ``label_col``, the graph is a node graph for node classification
(:mod:`graphveil.data.node_table`): the entity table, and the features table, are then read
columnar by pyarrow, and no text column is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import Field

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph
from graphveil.data.node_table import NodeColumns, build_node_graph, node_rows, sparse_features
from graphveil.data.tables import (
    EDGE_HEADERS,
    JSONL_SUFFIXES,
    TAB_SUFFIXES,
    advice,
    checked_rows,
    first_line,
    header_column,
    read_text,
)
from graphveil.data.validate import EdgeRecords, EntityRecords, OnUnknown, build_graph
from graphveil.plugins.standard.sources._options import TableOptions


class EdgeListOptions(TableOptions):
    path: Path = Field(description="Edge file: CSV/TSV, or whitespace-separated with # comments.")
    entities: Path = Field(description=(
        "Entity table: CSV/TSV/JSONL with an id and a text column (id_col, text_col)."))
    source_col: str | None = Field(None, min_length=1, description=(
        "Header column of the edge file holding the first entity id of each relation "
        "(set with target_col). Default: the first row is a header if it names a recognised pair "
        "(source/target, src/dst, from/to, ...), data if it holds known entity ids."))
    target_col: str | None = Field(None, min_length=1, description=(
        "Header column of the edge file holding the second entity id (set with source_col)."))


class EdgeListSource(DataSource):
    """A text-attributed graph from an edge file and an entity table (data.path, data.entities),
    or a node graph when node features are named."""

    Params = EdgeListOptions

    def load(self) -> RelationalGraph | NodeGraph:
        p = self.params
        columns = p.node_columns()
        if columns is not None:
            return load_edge_list_nodes(p.path, p.entities, columns, source_col=p.source_col,
                                        target_col=p.target_col)
        return load_edge_list(
            p.path, p.entities, source_col=p.source_col, target_col=p.target_col, id_col=p.id_col,
            text_col=p.text_col, label_col=p.label_col, option_prefix="data.",
        )


# ------------------------------------------------------------------------------------ reader


def _edge_delimiter(path: Path, text: str) -> str | None:
    if path.suffix.lower() == ".csv":
        return ","
    if path.suffix.lower() in TAB_SUFFIXES:
        return "\t"
    first = first_line(text, skip_comments=True)
    return "\t" if "\t" in first else "," if "," in first else None


def read_edge_records(
    path: str | os.PathLike[str],
    known_ids: set[str],
    *,
    source_col: str | None = None,
    target_col: str | None = None,
    header: bool | None = None,
    option_prefix: str = "",
) -> EdgeRecords:
    """Read an edge file: CSV (``.csv``), TSV (``.tsv``/``.tab``/``.cites``), else sniffed from
    the first line (tab, comma, or whitespace with ``#`` comments).

    Header: with ``source_col``/``target_col`` the first row must be a header holding them.
    Otherwise, when ``header`` is ``None``, the first row is data if its first two fields are
    known entity ids (or one is: the unknown one is then reported), and a header if it names a
    recognised pair (:data:`EDGE_HEADERS`, case-insensitive); anything else is refused rather
    than guessed. ``header=True`` with two columns uses them in order.

    ``option_prefix``: how error messages name the column options (``""``: keyword arguments;
    ``"data."``: run-config keys, as the ``edge_list`` source passes).
    """
    path = Path(path)
    source = str(path)
    text = read_text(path)
    delimiter = _edge_delimiter(path, text)
    rows = checked_rows(text, delimiter, source)
    try:
        first_line, first = next(rows)
    except StopIteration:
        raise DataError(f"{source}: no edges") from None
    p = option_prefix
    if (source_col is None) != (target_col is None):
        raise DataError(f"{source}: give both {p}source_col and {p}target_col, or neither")
    if source_col is not None:
        if header is False:
            raise DataError(f"{source}: source_col/target_col name header columns, but header=False")
        header = True
    names = [f.strip().lower() for f in first]
    if header is None:
        if len(first) < 2:
            raise DataError(f"{source}, line {first_line}: expected at least 2 fields, got {len(first)}")
        ends = [f.strip() in known_ids for f in first[:2]]
        if any(ends):
            header = False
        elif any(a in names and b in names for a, b in EDGE_HEADERS):
            header = True
        else:
            raise DataError(
                f"{source}, line {first_line}: cannot tell whether {first!r} is a header or an edge: "
                f"no field is a known entity id and no recognised header pair is present "
                f"({', '.join('/'.join(pair) for pair in EDGE_HEADERS)}); "
                f"if it is a header, {advice(p, 'source_col', 'target_col')} to two of its columns"
                + ("" if p else "; if it is an edge, pass header=False")
            )
    if not header:
        if len(first) < 2:
            raise DataError(f"{source}, line {first_line}: expected at least 2 fields, got {len(first)}")
        cols = (0, 1)
        body: Iterator[tuple[int, list[str]]] = iter([(first_line, first), *rows])
    else:
        if source_col is not None and target_col is not None:
            cols = (header_column(first, source_col, source, first_line, "source_col", p),
                    header_column(first, target_col, source, first_line, "target_col", p))
        else:
            pair = next(((a, b) for a, b in EDGE_HEADERS if a in names and b in names), None)
            if pair is None and len(first) != 2:
                raise DataError(
                    f"{source}, line {first_line}: header {first!r} has no recognised source/target "
                    f"pair; {advice(p, 'source_col', 'target_col')}"
                )
            cols = (names.index(pair[0]), names.index(pair[1])) if pair else (0, 1)
        body = rows
    pairs: list[tuple[str, str]] = []
    lines: list[int] = []
    s, t = cols
    for line, row in body:
        pairs.append((row[s].strip(), row[t].strip()))
        lines.append(line)
    return EdgeRecords(source, pairs, lines)


def _suffix_format(path: Path) -> str | None:
    """``"jsonl"`` or the delimiter a table's extension names; None if it names neither."""
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        return "jsonl"
    if suffix == ".csv":
        return ","
    return "\t" if suffix in TAB_SUFFIXES else None


def _line_format(first: str) -> str:
    """``"jsonl"``, or the delimiter of a CSV/TSV table, from its first line."""
    return "jsonl" if first.lstrip().startswith("{") else "\t" if "\t" in first else ","


def _entity_format(path: Path, text: str) -> str:
    """``"jsonl"``, or the delimiter of a CSV/TSV table: by extension, else from the first line."""
    return _suffix_format(path) or _line_format(first_line(text))


def _jsonl_entities(
    text: str, source: str, id_col: str, text_col: str, label_col: str | None, prefix: str = ""
) -> EntityRecords:
    ids: list[str] = []
    texts: list[Any] = []
    labels: list[str | None] = []
    lines: list[int] = []
    for i, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{source}, line {i}: not valid JSON ({exc.msg})") from exc
        if not isinstance(obj, dict):
            raise DataError(f"{source}, line {i}: expected a JSON object, got {type(obj).__name__}")
        for option, key in (("id_col", id_col), ("text_col", text_col)):
            if key not in obj:
                raise DataError(
                    f"{source}, line {i}: missing key {key!r} (keys: {', '.join(map(str, obj))}); "
                    f"set {prefix}{option} to the right one"
                )
        eid = obj[id_col]
        if isinstance(eid, bool) or not isinstance(eid, str | int):
            raise DataError(f"{source}, line {i}: id {eid!r} must be a string or an integer")
        label = obj.get(label_col) if label_col else None
        ids.append(str(eid).strip())
        texts.append(obj[text_col])
        labels.append(None if label is None else str(label).strip())
        lines.append(i)
    return EntityRecords(source, ids, lines, texts, labels if label_col else None)


def read_entity_table(
    path: str | os.PathLike[str],
    *,
    id_col: str = "id",
    text_col: str = "text",
    label_col: str | None = None,
    option_prefix: str = "",
) -> EntityRecords:
    """Read an entity table: JSONL (``.jsonl``/``.ndjson``: one object per line), CSV or TSV
    (by extension, else sniffed). CSV/TSV need a header row naming ``id_col`` and ``text_col``
    (and ``label_col`` if given). An empty label means unlabelled. ``option_prefix``: as for
    :func:`read_edge_records`.
    """
    path = Path(path)
    source = str(path)
    text = read_text(path)
    fmt = _entity_format(path, text)
    if fmt == "jsonl":
        records = _jsonl_entities(text, source, id_col, text_col, label_col, option_prefix)
        if not records.ids:
            raise DataError(f"{source}: no entities")
        return records
    rows = checked_rows(text, fmt, source)
    try:
        header_line, header = next(rows)
    except StopIteration:
        raise DataError(f"{source}: empty entity table (a header row with {id_col!r} and {text_col!r} is required)") from None
    ci = header_column(header, id_col, source, header_line, "id_col", option_prefix)
    ct = header_column(header, text_col, source, header_line, "text_col", option_prefix)
    cl = header_column(header, label_col, source, header_line, "label_col", option_prefix) if label_col else None
    ids, texts, labels, lines = [], [], [], []
    for line, row in rows:
        ids.append(row[ci].strip())
        texts.append(row[ct])
        labels.append(None if cl is None else row[cl].strip())
        lines.append(line)
    return EntityRecords(source, ids, lines, texts, labels if label_col else None)


def load_edge_list(
    edges_path: str | os.PathLike[str],
    entities_path: str | os.PathLike[str],
    *,
    source_col: str | None = None,
    target_col: str | None = None,
    header: bool | None = None,
    id_col: str = "id",
    text_col: str = "text",
    label_col: str | None = None,
    on_unknown: OnUnknown = "error",
    name: str | None = None,
    option_prefix: str = "",
) -> RelationalGraph:
    """A text-attributed graph from an edge file and an entity table (formats:
    :func:`read_edge_records`, :func:`read_entity_table`). Relations are undirected; an edge
    naming an id missing from the entity table is an error unless ``on_unknown="drop"``.
    ``option_prefix``: as for :func:`read_edge_records`.
    """
    entities = read_entity_table(
        entities_path, id_col=id_col, text_col=text_col, label_col=label_col, option_prefix=option_prefix
    )
    edges = read_edge_records(
        edges_path, set(entities.ids), source_col=source_col, target_col=target_col, header=header,
        option_prefix=option_prefix,
    )
    return build_graph(name or Path(edges_path).stem, entities, edges, on_unknown=on_unknown)


# ---------------------------------------------------------------------------------- node graph


def _arrow_format(path: Path) -> str:
    """As :func:`_entity_format`, reading only the file's head when the extension says nothing."""
    fmt = _suffix_format(path)
    if fmt is None:
        with path.open("rb") as f:
            fmt = _line_format(first_line(f.read(1 << 16).decode("utf-8", "replace")))
    return fmt


def read_arrow_table(path: str | os.PathLike[str], wanted: Any, id_col: str) -> Any:
    """A CSV/TSV (header row) or JSONL table as a :class:`pyarrow.Table` of the columns
    ``wanted(names)`` returns; ``id_col`` is read as text (ids like ``007`` stay themselves)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.json as pajson

    path = Path(path)
    source = str(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    fmt = _arrow_format(path)
    try:
        if fmt == "jsonl":
            table = pajson.read_json(path)
            return table.select(wanted(table.column_names))
        parse = pacsv.ParseOptions(delimiter=fmt)
        with pacsv.open_csv(path, parse_options=parse) as reader:
            names = reader.schema.names
        convert = pacsv.ConvertOptions(include_columns=wanted(names), column_types={id_col: pa.string()})
        return pacsv.read_csv(path, parse_options=parse, convert_options=convert)
    except pa.ArrowException as exc:
        raise DataError(f"{source}: cannot be read as a table ({exc})") from exc


def load_edge_list_nodes(
    edges_path: str | os.PathLike[str],
    entities_path: str | os.PathLike[str],
    columns: NodeColumns,
    *,
    source_col: str | None = None,
    target_col: str | None = None,
    name: str | None = None,
) -> NodeGraph:
    """A node graph from an edge file (as :func:`read_edge_records`) and an entity table
    (CSV/TSV/JSONL) holding the node ids, labels and features (``columns``); with
    ``columns.features_table``, the features come from that long table (CSV/TSV/JSONL)."""
    source = str(entities_path)
    table = read_arrow_table(entities_path, lambda names: columns.entity_columns(names, source),
                             columns.id_col)
    nodes = node_rows(table, columns, source)
    del table  # the features are in nodes.x now: the table's memory is free for the edges
    if columns.features_table is not None:
        sparse = read_arrow_table(columns.features_table, lambda names: names, columns.id_col)
        nodes.x = sparse_features(sparse, columns, nodes.ids, columns.features_table)
    edges = read_edge_records(edges_path, set(nodes.ids), source_col=source_col, target_col=target_col,
                              option_prefix=columns.prefix)
    return build_node_graph(name or Path(edges_path).stem, nodes, edges)
