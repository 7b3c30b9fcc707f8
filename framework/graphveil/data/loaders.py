"""Loaders behind the built-in data sources, and :func:`load_data` (``data.source`` → dataset).

The built-in sources are plugins (``graphveil.plugins.standard.data_sources``) calling these:

=================  =======================================================================
``citeseer``       :func:`load_bundled_citeseer`: TAPE's CiteSeer texts shipped in the package
``citeseer_tape``  :func:`load_citeseer_tape`: a TAPE ``CiteSeer-Orig`` folder
``edge_list``      :func:`load_edge_list`: an edge CSV/TSV plus an entity table CSV/TSV/JSONL
``parquet``        :func:`graphveil.data.parquet.load_parquet`: the same from Parquet tables, streamed
``sql``            :func:`graphveil.data.sql.load_sql`: the same from database tables or SELECTs, streamed
``pyg``            :func:`load_pyg`: a ``torch_geometric.data.Data`` (or a ``torch.save`` of one)
``planetoid``      :func:`graphveil.data.planetoid.load_planetoid`: Cora (bundled) or CiteSeer
``twitch``         :func:`graphveil.data.twitch.load_twitch`: a MUSAE Twitch graph (label: mature)
=================  =======================================================================

The relational loaders return a validated :class:`RelationalGraph` (see
:mod:`graphveil.data.validate` for what is refused and what is cleaned); ``planetoid`` and
``twitch`` return a :class:`~graphveil.data.node_graph.NodeGraph`.

CiteSeer STATS (bundled and TAPE folder, identical): 3186 entities with text, 6 classes,
4732 citation lines → 4225 undirected relations after dropping 335 lines naming one of the
141 ids without text, 120 further self-loops and 52 duplicates.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import lzma
import os
import pickle
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from graphveil.contract.data_source import DataSource, check_source_options
from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph
from graphveil.data.validate import (
    EdgeRecords,
    EntityRecords,
    OnUnknown,
    assemble,
    build_graph,
    check_features,
    check_index_range,
    check_texts,
)

if TYPE_CHECKING:
    from graphveil.contract.host import PluginHost

log = logging.getLogger(__name__)

CITESEER_TEXTS = "citeseer_texts.txt"
CITESEER_CITES = "citeseer.cites"
#: sha256 of the upstream files (TAPE commit 331e616, dataset/CiteSeer-Orig); the bundled
#: ``.xz`` copies must decompress to exactly these bytes.
CITESEER_SHA256 = {
    CITESEER_TEXTS: "9070723640766aaa09875ce72397a4325feecac968ed9fb44152820b651f1f17",
    CITESEER_CITES: "cd9730630eaaa745058c2cd2cce6b9afb79ca71278a479aebec55f4cf5eb7f30",
}
MAX_ENTITIES_DROPPED_EDGES = "max_entities_dropped_edges"
G = TypeVar("G", RelationalGraph, NodeGraph)

#: Header names recognised when ``source_col``/``target_col`` are not given (case-insensitive).
EDGE_HEADERS = [
    ("source", "target"), ("src", "dst"), ("from", "to"), ("u", "v"), ("head", "tail"),
    ("node1", "node2"), ("id1", "id2"), ("source_id", "target_id"), ("cited", "citing"),
]
_TAB_SUFFIXES = {".tsv", ".tab", ".cites"}
_JSONL_SUFFIXES = {".jsonl", ".ndjson"}


# ------------------------------------------------------------------------------------------ files


def _decode(data: bytes, source: str) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{source}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    return text.replace("\r\n", "\n")


def _read(path: str | os.PathLike[str]) -> str:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    return _decode(path.read_bytes(), str(path))


def _first_line(text: str, skip_comments: bool = False) -> str:
    for line in text.split("\n", 200)[:200]:
        if line.strip() and not (skip_comments and line.startswith("#")):
            return line
    return ""


def _rows(text: str, delimiter: str | None, source: str) -> Iterator[tuple[int, list[str]]]:
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


def _checked_rows(
    text: str, delimiter: str | None, source: str, width: int | None = None
) -> Iterator[tuple[int, list[str]]]:
    """:func:`_rows`, requiring every row to have ``width`` fields (default: the first row's)."""
    for line, row in _rows(text, delimiter, source):
        if width is None:
            width = len(row)
        elif len(row) != width:
            raise DataError(f"{source}, line {line}: expected {width} fields, got {len(row)}")
        yield line, row


def _advice(prefix: str, *options: str) -> str:
    """How to set column options: keyword arguments (``prefix=""``) or run-config keys (``"data."``)."""
    return ("set " if prefix else "pass ") + " and ".join(f"{prefix}{o}" for o in options)


def _column(header: list[str], name: str, source: str, line: int, option: str, prefix: str = "") -> int:
    """Index of column ``name`` (given as the option ``option``, e.g. ``"source_col"``)."""
    names = [h.strip() for h in header]
    if name not in names:
        raise DataError(
            f"{source}, line {line}: header has no column {name!r} (columns: {', '.join(names)}); "
            f"set {prefix}{option} to the right one"
        )
    return names.index(name)


# ------------------------------------------------------------------------------------ edge lists


def _edge_delimiter(path: Path, text: str) -> str | None:
    if path.suffix.lower() == ".csv":
        return ","
    if path.suffix.lower() in _TAB_SUFFIXES:
        return "\t"
    first = _first_line(text, skip_comments=True)
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
    ``"data."``: run-config keys, as :func:`load_graph` passes).
    """
    path = Path(path)
    source = str(path)
    text = _read(path)
    delimiter = _edge_delimiter(path, text)
    rows = _checked_rows(text, delimiter, source)
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
                f"if it is a header, {_advice(p, 'source_col', 'target_col')} to two of its columns"
                + ("" if p else "; if it is an edge, pass header=False")
            )
    if not header:
        if len(first) < 2:
            raise DataError(f"{source}, line {first_line}: expected at least 2 fields, got {len(first)}")
        cols = (0, 1)
        body: Iterator[tuple[int, list[str]]] = iter([(first_line, first), *rows])
    else:
        if source_col is not None and target_col is not None:
            cols = (_column(first, source_col, source, first_line, "source_col", p),
                    _column(first, target_col, source, first_line, "target_col", p))
        else:
            pair = next(((a, b) for a, b in EDGE_HEADERS if a in names and b in names), None)
            if pair is None and len(first) != 2:
                raise DataError(
                    f"{source}, line {first_line}: header {first!r} has no recognised source/target "
                    f"pair; {_advice(p, 'source_col', 'target_col')}"
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


def _entity_format(path: Path, text: str) -> str | None:
    """``"jsonl"``, or the delimiter of a CSV/TSV table."""
    suffix = path.suffix.lower()
    if suffix in _JSONL_SUFFIXES:
        return "jsonl"
    if suffix == ".csv":
        return ","
    if suffix in _TAB_SUFFIXES:
        return "\t"
    first = _first_line(text)
    return "jsonl" if first.lstrip().startswith("{") else "\t" if "\t" in first else ","


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
    text = _read(path)
    fmt = _entity_format(path, text)
    if fmt == "jsonl":
        records = _jsonl_entities(text, source, id_col, text_col, label_col, option_prefix)
        if not records.ids:
            raise DataError(f"{source}: no entities")
        return records
    rows = _checked_rows(text, fmt, source)
    try:
        header_line, header = next(rows)
    except StopIteration:
        raise DataError(f"{source}: empty entity table (a header row with {id_col!r} and {text_col!r} is required)") from None
    ci = _column(header, id_col, source, header_line, "id_col", option_prefix)
    ct = _column(header, text_col, source, header_line, "text_col", option_prefix)
    cl = _column(header, label_col, source, header_line, "label_col", option_prefix) if label_col else None
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


# -------------------------------------------------------------------------------------- CiteSeer


def _tape_entities(text: str, source: str) -> EntityRecords:
    """TAPE ``citeseer_texts.txt``: records of exactly 3 lines (id, text, label)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":  # upstream has no final newline; tolerate one
        lines.pop()
    if len(lines) % 3:
        start = len(lines) - len(lines) % 3 + 1
        raise DataError(
            f"{source}, line {start}: incomplete record ({len(lines)} lines is not a multiple of 3; "
            f"each record is 3 lines: id, text, label)"
        )
    ids, texts, labels = lines[0::3], lines[1::3], lines[2::3]
    for k, (eid, label) in enumerate(zip(ids, labels, strict=True)):
        for offset, what, value in ((1, "id", eid), (3, "label", label)):
            if value.split() != [value]:
                raise DataError(
                    f"{source}, line {3 * k + offset}: {what} line {value[:60]!r} is not a single "
                    f"token (records must be 3 lines: id, text, label)"
                )
    check_texts(ids, texts, source, [3 * k + 2 for k in range(len(ids))])  # name the text's own line
    return EntityRecords(source, ids, [3 * k + 1 for k in range(len(ids))], texts, list(labels))


def _citeseer(texts: str, cites: str, texts_source: str, cites_source: str) -> RelationalGraph:
    entities = _tape_entities(texts, texts_source)
    pairs: list[tuple[str, str]] = []
    lines: list[int] = []
    for line, row in _checked_rows(cites, "\t", cites_source, width=2):
        pairs.append((row[0], row[1]))  # <cited>\t<citing>; relations are undirected
        lines.append(line)
    # 141 cited ids have no text upstream: their citations are dropped and counted.
    return build_graph("citeseer", entities, EdgeRecords(cites_source, pairs, lines), on_unknown="drop")


def load_citeseer_tape(folder: str | os.PathLike[str]) -> RelationalGraph:
    """CiteSeer with titles and abstracts from a TAPE ``dataset/CiteSeer-Orig`` folder
    (``citeseer_texts.txt`` + ``citeseer.cites``). Citations to papers without text are dropped
    (counted in ``graph.notes``), as are self-loops and duplicates. Labels: 6 classes.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder (expected {CITESEER_TEXTS} and {CITESEER_CITES})")
    texts, cites = folder / CITESEER_TEXTS, folder / CITESEER_CITES
    return _citeseer(_read(texts), _read(cites), str(texts), str(cites))


def _bundled(name: str) -> str:
    resource = resources.files("graphveil.data").joinpath("bundled", f"{name}.xz")
    source = f"graphveil/data/bundled/{name}.xz"
    try:
        data = lzma.decompress(resource.read_bytes())
    except FileNotFoundError as exc:
        raise DataError(f"{source}: missing from the installed package") from exc
    except lzma.LZMAError as exc:
        raise DataError(f"{source}: corrupt ({exc})") from exc
    digest = hashlib.sha256(data).hexdigest()
    if digest != CITESEER_SHA256[name]:
        raise DataError(f"{source}: sha256 {digest} differs from upstream {CITESEER_SHA256[name]}")
    return _decode(data, source)


def load_bundled_citeseer() -> RelationalGraph:
    """The CiteSeer text graph shipped inside the package (``graphveil/data/bundled``, see its
    ``SOURCE.md``); the same graph :func:`load_citeseer_tape` builds from the upstream folder.
    """
    return _citeseer(
        _bundled(CITESEER_TEXTS), _bundled(CITESEER_CITES),
        f"graphveil/data/bundled/{CITESEER_TEXTS}", f"graphveil/data/bundled/{CITESEER_CITES}",
    )


# ------------------------------------------------------------------------------------------- PyG


def _load_data_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True``: only PyG's data classes are allowed, no code runs."""
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    if not path.is_file():
        raise DataError(f"{path}: no such file")
    allowed = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found is None:
            raise DataError(f"{path}: not a torch.save file of a torch_geometric Data (unpickling failed)") from exc
        raise DataError(
            f"{path}: refused to unpickle {found.group(1)}: only a plain torch_geometric Data is "
            f"loaded from a file (no code runs); load it yourself and pass the Data object to load_pyg"
        ) from exc
    except (RuntimeError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a torch.save file ({exc})") from exc


def _pyg_labels(y: Any, n: int, names: Any, source: str) -> tuple[torch.Tensor, list[str]]:
    y = torch.as_tensor(y)
    if y.dim() == 2 and y.shape[1] == 1:
        y = y.flatten()
    if y.dim() != 1 or y.shape[0] != n:
        raise DataError(f"{source}: y must hold one class index per node ({n},), got {tuple(y.shape)}")
    if y.is_floating_point():
        if not (torch.isfinite(y).all() and (y == y.round()).all()):
            raise DataError(f"{source}: y must hold integer class indices (found non-integer values)")
    y = y.to(torch.long).clamp(min=-1)
    num_classes = int(y.max()) + 1 if y.numel() else 0
    if names is None:
        names = [str(c) for c in range(num_classes)]
    names = [str(s) for s in names]
    if len(names) < num_classes:
        raise DataError(f"{source}: {len(names)} label_names for class indices up to {num_classes - 1}")
    return y, names


def load_pyg(data_or_path: Any, texts: list[str] | None = None, *, name: str | None = None) -> RelationalGraph:
    """A homogeneous ``torch_geometric.data.Data`` (or the path of a ``torch.save``'d one).

    ``edge_index`` → undirected unique relations (both directions of an edge count as one: the
    reverse copy is reported as a duplicate); ``x`` → features (must be finite); ``y`` → labels
    (negative = unlabelled; names from a ``label_names`` attribute if present); texts from the
    ``texts`` argument, else a ``raw_texts`` attribute. Entity ids are ``"0".."n-1"``.
    """
    from torch_geometric.data import Data

    if isinstance(data_or_path, str | os.PathLike):
        path = Path(data_or_path)
        source, data = str(path), _load_data_file(path)
        default_name = path.stem
    else:
        source, data, default_name = "<torch_geometric Data>", data_or_path, "pyg"
    if not isinstance(data, Data):
        raise DataError(f"{source}: expected a torch_geometric.data.Data, got {type(data).__name__}")
    if data.edge_index is None:
        raise DataError(f"{source}: the Data object has no edge_index")
    n = data.num_nodes
    if not n:
        raise DataError(f"{source}: the Data object has no nodes")
    ids = [str(i) for i in range(n)]
    pairs = check_index_range(data.edge_index, n, source)
    raw_texts = texts if texts is not None else getattr(data, "raw_texts", None)
    graph_texts = None if raw_texts is None else check_texts(ids, list(raw_texts), source)
    features = None if data.x is None else check_features(data.x, n, source)
    labels = label_names = None
    if data.y is not None:
        labels, label_names = _pyg_labels(data.y, n, getattr(data, "label_names", None), source)
    return assemble(
        name or default_name, ids, pairs, source=source, texts=graph_texts, features=features,
        labels=labels, label_names=label_names,
    )


# -------------------------------------------------------------------------------------- dispatch


def truncate(graph: G, max_entities: int) -> G:
    """The first ``max_entities`` entities (nodes) and the relations among them (notes carried
    over, plus the number of relations dropped)."""
    if max_entities >= graph.num_nodes:
        return graph
    sub = graph.subgraph(torch.arange(max_entities), name=f"{graph.name}[:{max_entities}]")
    dropped = graph.num_edges - sub.num_edges
    if isinstance(graph, NodeGraph):
        dropped //= 2  # NodeGraph counts both directions of an edge
    sub.notes = {**graph.notes, MAX_ENTITIES_DROPPED_EDGES: dropped}
    log.info("max_entities=%d: dropped %d of %d relations", max_entities, dropped,
             graph.num_edges // 2 if isinstance(graph, NodeGraph) else graph.num_edges)
    return sub


def keep_classes(graph: G, classes: list[str]) -> G:
    """The entities labelled with one of ``classes`` (names) and the relations among them.

    :raises DataError: if the graph has no labels or names, or a name is not one of its classes.
    """
    labels, names = ((graph.y, graph.class_names) if isinstance(graph, NodeGraph)
                     else (graph.labels, graph.label_names))
    if labels is None or not names:
        raise DataError(f"data.classes: {graph.name} has no class labels with names to select by")
    unknown = [c for c in classes if c not in names]
    if unknown:
        raise DataError(f"data.classes: {graph.name} has no class {unknown[0]!r}; its classes are {names}")
    wanted = torch.tensor([names.index(c) for c in classes])
    keep = torch.isin(labels, wanted).nonzero().flatten()
    sub = graph.subgraph(keep, name=f"{graph.name}[{'+'.join(classes)}]")
    sub.notes = dict(graph.notes)
    log.info("data.classes=%s: kept %d of %d entities", classes, sub.num_nodes, graph.num_nodes)
    return sub


def create_data_source(data: Any, host: PluginHost | None = None, *, section: str = "data") -> DataSource:
    """Build the data source ``data.source`` names, its options validated (nothing is read).
    ``data`` is a run config's data section (:class:`graphveil.run.config.DataConfig`).

    :param section: how messages name the config section (``"data.split.eval_data"`` for graph B).
    :raises ConfigError: on an unknown source (listing the available ones) or a bad option
        (naming the ``data.*`` key).
    """
    from graphveil.contract.host import default_host  # the host imports this package

    host = host or default_host()
    params = check_source_options(host, data.source, data.params, section=section)
    return host.get("data_source", data.source).factory(params)


def resolve_data_options(data: Any, host: PluginHost) -> None:
    """Validate the ``data`` section's source options (and graph B's of a two-graph split) with the
    run's host, and keep the full, typed option set in the section (nothing is read).

    :raises ConfigError: naming the ``data.*`` key, as :func:`create_data_source`.
    """
    resolve_source_options(data, host)
    if data.split.eval_data is not None:
        resolve_source_options(data.split.eval_data, host, section="data.split.eval_data")


def resolve_source_options(part: Any, host: PluginHost, *, section: str = "data") -> None:
    """One data section's source options, checked and kept typed (see :func:`resolve_data_options`)."""
    options = check_source_options(host, part.source, part.params, section=section)
    object.__setattr__(part, "__pydantic_extra__", options.model_dump(by_alias=True))


def _load_source(source: DataSource, data: Any) -> RelationalGraph | NodeGraph:
    graph = source.load()
    if not isinstance(graph, RelationalGraph | NodeGraph):
        raise DataError(f"data source {data.source!r} returned {type(graph).__name__}, "
                        f"not a RelationalGraph or NodeGraph")
    if data.classes is not None:
        graph = keep_classes(graph, data.classes)
    return graph if data.max_entities is None else truncate(graph, data.max_entities)


def _relational(graph: RelationalGraph | NodeGraph) -> RelationalGraph:
    return graph.to_relational() if isinstance(graph, NodeGraph) else graph


def load_data(data: Any, host: PluginHost | None = None) -> RelationalGraph | NodeGraph:
    """The dataset a run config's ``data`` section names: the source (a plugin, default host:
    every installed plugin) built with its options and loaded, cut to ``data.classes`` and
    ``data.max_entities``.

    With ``data.split.kind: two_graphs`` the section names two graphs: graph B
    (``data.split.eval_data``) is read through the same host and the result is their disjoint
    union, a :class:`~graphveil.data.two_graphs.TwoGraphs` (both options are checked before
    either graph is read).

    :raises ConfigError: as :func:`create_data_source`, before anything is read.
    :raises DataError: from the source, naming the file and the problem.
    """
    source = create_data_source(data, host)
    if data.split.kind != "two_graphs":
        return _load_source(source, data)
    from graphveil.data.two_graphs import join_graphs

    eval_data = data.split.eval_data
    eval_source = create_data_source(eval_data, host, section="data.split.eval_data")
    return join_graphs(_relational(_load_source(source, data)), _relational(_load_source(eval_source, eval_data)))


def load_graph(data: Any, host: PluginHost | None = None) -> RelationalGraph:
    """:func:`load_data` as a :class:`RelationalGraph` (a :class:`NodeGraph` is converted:
    features, labels, each edge once) for callers of the relational task."""
    return _relational(load_data(data, host))
