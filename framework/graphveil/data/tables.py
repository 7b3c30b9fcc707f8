"""Reading tables: what the file and database sources share (text files, header columns, the
recognised relation-column pairs). Validation of what is read lives in :mod:`graphveil.data.validate`."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path

from graphveil.contract.errors import DataError

#: Header names recognised when ``source_col``/``target_col`` are not given (case-insensitive).
EDGE_HEADERS = [
    ("source", "target"), ("src", "dst"), ("from", "to"), ("u", "v"), ("head", "tail"),
    ("node1", "node2"), ("id1", "id2"), ("source_id", "target_id"), ("cited", "citing"),
]
TAB_SUFFIXES = {".tsv", ".tab", ".cites"}
JSONL_SUFFIXES = {".jsonl", ".ndjson"}


def decode(data: bytes, source: str) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{source}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    return text.replace("\r\n", "\n")


def read_text(path: str | os.PathLike[str]) -> str:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return decode(path.read_bytes(), str(path))


def first_line(text: str, skip_comments: bool = False) -> str:
    for line in text.split("\n", 200)[:200]:
        if line.strip() and not (skip_comments and line.startswith("#")):
            return line
    return ""


def text_rows(text: str, delimiter: str | None, source: str) -> Iterator[tuple[int, list[str]]]:
    """Non-blank rows with their 1-based first line. ``None``: whitespace-separated, ``#`` comments."""
    if delimiter is None:
        for i, line in enumerate(text.split("\n"), start=1):
            if line.strip() and not line.startswith("#"):
                yield i, line.split()
        return
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    last = 0
    try:
        for row in reader:
            start, last = last + 1, reader.line_num
            if any(field.strip() for field in row):
                yield start, row
    except csv.Error as exc:
        raise DataError(f"{source}, line {reader.line_num}: {exc}") from exc


def checked_rows(
    text: str, delimiter: str | None, source: str, width: int | None = None
) -> Iterator[tuple[int, list[str]]]:
    """:func:`_rows`, requiring every row to have ``width`` fields (default: the first row's)."""
    for line, row in text_rows(text, delimiter, source):
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise DataError(f"{source}, line {line}: expected {width} fields, got {len(row)}")
        yield line, row


def advice(prefix: str, *options: str) -> str:
    """How to set column options: keyword arguments (``prefix=""``) or run-config keys (``"data."``)."""
    return ("set " if prefix else "pass ") + " and ".join(f"{prefix}{o}" for o in options)


def header_column(header: list[str], name: str, source: str, line: int, option: str, prefix: str = "") -> int:
    """Index of column ``name`` (given as the option ``option``, e.g. ``"source_col"``)."""
    names = [h.strip() for h in header]
    if name not in names:
        raise DataError(
            f"{source}, line {line}: header has no column {name!r} (columns: {', '.join(names)}); "
            f"set {prefix}{option} to the right one"
        )
    return names.index(name)


def edge_columns(names: list[str], source: str, source_col: str | None, target_col: str | None,
                 prefix: str = "") -> tuple[str, str]:
    """The relation table's two id columns: as given, else the first recognised pair of
    :data:`EDGE_HEADERS` (case-insensitive), as ``edge_list`` reads a header."""
    if (source_col is None) != (target_col is None):
        raise DataError(f"{source}: give both {prefix}source_col and {prefix}target_col, or neither")
    if source_col is not None and target_col is not None:
        return source_col, target_col
    lower = [n.strip().lower() for n in names]
    pair = next(((a, b) for a, b in EDGE_HEADERS if a in lower and b in lower), None)
    if pair is None:
        raise DataError(
            f"{source}: no recognised source/target column pair among {', '.join(names)} "
            f"({', '.join('/'.join(p) for p in EDGE_HEADERS)}); set {prefix}source_col and "
            f"{prefix}target_col to two of its columns"
        )
    return names[lower.index(pair[0])], names[lower.index(pair[1])]
