"""Build a :class:`RelationalGraph` from raw records, refusing or cleaning bad input.

Policy (every loader goes through these functions):

* duplicate entity ids, empty or whitespace-only texts, NaN/inf features → :class:`DataError`
  naming the file, line or row and the id (text files count lines, Parquet tables rows);
* an edge naming an unknown entity id → :class:`DataError` naming the file, line and id, unless
  the loader opts into ``on_unknown="drop"``: such edges are dropped, counted, logged and
  recorded in ``graph.notes`` (an edge that is also a self-loop counts as unknown);
* self-loops → dropped, counted, logged;
* duplicate relations, in either direction → kept once, counted, logged;
* edges are stored once each as ``u < v``, sorted, int64.

Counts land in ``graph.notes`` under the keys below, so a report can show what was cleaned.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph

log = logging.getLogger(__name__)

OnUnknown = Literal["error", "drop"]
#: What the record numbers of a file count: lines of a text file, rows of a table (both 1-based).
Numbering = Literal["line", "row"]

UNKNOWN_EDGES = "dropped_unknown_edges"
UNKNOWN_IDS = "unknown_ids"
SELF_LOOPS = "dropped_self_loops"
DUPLICATES = "dropped_duplicate_edges"


@dataclass(frozen=True)
class EntityRecords:
    """Entity rows as read from a file: ids, optional texts and label names, line numbers.

    :param source: file name used in error messages.
    :param lines: 1-based line (or record, or table row) number of each entity, for messages.
    :param labels: class name per entity; ``None`` or ``""`` means unlabelled.
    :param numbering: whether ``lines`` counts lines or table rows (the word messages use).
    """

    source: str
    ids: list[str]
    lines: Sequence[int]
    texts: list[str] | None = None
    labels: list[str | None] | None = None
    numbering: Numbering = "line"


@dataclass(frozen=True)
class EdgeRecords:
    """Relation rows as read from a file (or one chunk of them): endpoint ids and the line (or
    table row, see :class:`EntityRecords`) each came from.

    :param columns: the two id columns; when given, messages also name a relation by its key
        (``row 7 (src 'c', dst 'x')``), for tables whose row order is the database's.
    """

    source: str
    pairs: Sequence[tuple[str, str]]
    lines: Sequence[int]
    numbering: Numbering = "line"
    columns: tuple[str, str] | None = None


def _where(source: str, line: int | None, numbering: Numbering = "line") -> str:
    return source if line is None else f"{source}, {numbering} {line}"


def index_entities(ids: Sequence[str], source: str, lines: Sequence[int] | None = None,
                   numbering: Numbering = "line") -> dict[str, int]:
    """External id → index; refuses an empty table, empty ids and duplicate ids."""
    if not ids:
        raise DataError(f"{source}: no entities")
    position: dict[str, int] = {}
    for i, eid in enumerate(ids):
        line = None if lines is None else lines[i]
        if not eid:
            raise DataError(f"{_where(source, line, numbering)}: empty entity id")
        if eid in position:
            first = position[eid] if lines is None else lines[position[eid]]
            kind = "row" if lines is None else numbering
            raise DataError(f"{_where(source, line, numbering)}: duplicate entity id {eid!r} (first at {kind} {first})")
        position[eid] = i
    return position


def check_texts(ids: Sequence[str], texts: Sequence[str], source: str, lines: Sequence[int] | None = None,
                numbering: Numbering = "line") -> list[str]:
    """Refuses a missing (``None``: no text), non-string, empty or whitespace-only text, naming the entity id."""
    if len(texts) != len(ids):
        raise DataError(f"{source}: {len(texts)} texts for {len(ids)} entities")
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            line = None if lines is None else lines[i]
            what = "no text" if not isinstance(text, str) else "empty text"
            raise DataError(f"{_where(source, line, numbering)}: entity {ids[i]!r} has {what}")
    return list(texts)


def check_features(features: torch.Tensor, num_nodes: int, source: str) -> torch.Tensor:
    """``(n, f)`` floating tensor with finite entries; the error names the first bad row."""
    x = torch.as_tensor(features)
    if x.dim() != 2 or x.shape[0] != num_nodes:
        raise DataError(f"{source}: features must be ({num_nodes}, f), got {tuple(x.shape)}")
    if not x.is_floating_point():
        x = x.to(torch.get_default_dtype())
    bad = ~torch.isfinite(x)
    if bad.any():
        rows = bad.any(dim=1).nonzero().flatten()
        row = int(rows[0])
        col = int(bad[row].nonzero()[0])
        raise DataError(
            f"{source}: features row {row} has a non-finite value ({float(x[row, col])} in column "
            f"{col}); {rows.numel()} row(s) affected"
        )
    return x


def encode_labels(names: Sequence[str | None]) -> tuple[torch.Tensor, list[str]]:
    """Class names → ``(n,)`` int64 indices into the sorted distinct names; missing → ``-1``."""
    label_names = sorted({name for name in names if name})
    index = {name: c for c, name in enumerate(label_names)}
    labels = torch.tensor([index[name] if name else -1 for name in names], dtype=torch.long)
    return labels, label_names


def index_edges(
    records: EdgeRecords | Iterable[EdgeRecords], position: dict[str, int], on_unknown: OnUnknown = "error"
) -> tuple[torch.Tensor, dict[str, int]]:
    """Endpoint ids → ``(k, 2)`` int64 indices, raising on (or dropping) unknown ids.

    ``records``: one :class:`EdgeRecords`, or chunks of them read one after the other (a
    streamed table): only one chunk's ids are held as strings at a time, the indices of the
    earlier ones as int64.

    :returns: the indices and the notes ``{dropped_unknown_edges, unknown_ids}`` (drop mode).
    """
    if on_unknown not in ("error", "drop"):
        raise ValueError(f"on_unknown must be 'error' or 'drop', got {on_unknown!r}")
    chunks = [records] if isinstance(records, EdgeRecords) else records
    parts: list[torch.Tensor] = []
    unknown: set[str] = set()
    dropped = 0
    source = None
    get = position.get
    for chunk in chunks:
        source = chunk.source
        us = [get(a) for a, _ in chunk.pairs]
        vs = [get(b) for _, b in chunk.pairs]
        if None in us or None in vs:  # rare: find the first unknown id, or drop every such edge
            keep = []
            for i, ((a, b), u, v) in enumerate(zip(chunk.pairs, us, vs, strict=True)):
                if u is not None and v is not None:
                    keep.append(i)
                    continue
                missing = [x for x, j in ((a, u), (b, v)) if j is None]
                if on_unknown == "error":
                    where = _where(chunk.source, chunk.lines[i], chunk.numbering)
                    if chunk.columns is not None:
                        where += f" ({chunk.columns[0]} {a!r}, {chunk.columns[1]} {b!r})"
                    raise DataError(f"{where}: unknown entity id {missing[0]!r}")
                unknown.update(missing)
                dropped += 1
            us, vs = [us[i] for i in keep], [vs[i] for i in keep]
        parts.append(torch.stack([torch.tensor(us, dtype=torch.long), torch.tensor(vs, dtype=torch.long)], dim=1))
    edges = torch.cat(parts) if parts else torch.zeros(0, 2, dtype=torch.long)
    notes: dict[str, int] = {}
    if on_unknown == "drop":
        notes = {UNKNOWN_EDGES: dropped, UNKNOWN_IDS: len(unknown)}
        if dropped:  # the caller opted into dropping: an expected outcome, logged at INFO
            log.info(
                "%s: dropped %d edge(s) naming %d entity id(s) absent from the entity table",
                source, dropped, len(unknown),
            )
    return edges, notes


def check_index_range(edge_index: torch.Tensor, num_nodes: int, source: str) -> torch.Tensor:
    """A ``(2, k)`` integer ``edge_index`` → ``(k, 2)`` int64, refusing out-of-range indices."""
    ei = torch.as_tensor(edge_index)
    if ei.dim() != 2 or ei.shape[0] != 2:
        raise DataError(f"{source}: edge_index must be (2, k), got {tuple(ei.shape)}")
    if ei.is_floating_point() or ei.is_complex() or ei.dtype == torch.bool:
        raise DataError(f"{source}: edge_index must hold integers, got {ei.dtype}")
    ei = ei.to(torch.long)
    bad = ((ei < 0) | (ei >= num_nodes)).any(dim=0).nonzero().flatten()
    if bad.numel():
        j = int(bad[0])
        raise DataError(
            f"{source}: edge_index column {j} = ({int(ei[0, j])}, {int(ei[1, j])}) names a node "
            f"outside 0..{num_nodes - 1}; {bad.numel()} column(s) affected"
        )
    return ei.t().contiguous()


def canonical_edges(pairs: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``(k, 2)`` index pairs → unique ``u < v`` rows (sorted), #self-loops, #duplicates."""
    pairs = pairs.reshape(-1, 2).to(torch.long)
    loops = pairs[:, 0] == pairs[:, 1]
    kept = pairs[~loops]
    u, v = kept.min(dim=1).values, kept.max(dim=1).values
    # One int64 key per relation, u·n + v (n ≤ 3·10⁹ keeps it exact): a 1-D unique is much
    # faster than unique(dim=0) and sorts the same way, by u then v.
    n = int(v.max()) + 1 if v.numel() else 1
    keys = torch.unique(u * n + v)
    edges = torch.stack([keys // n, keys % n], dim=1)
    return edges.contiguous(), int(loops.sum()), int(kept.shape[0] - edges.shape[0])


def assemble(
    name: str,
    entity_ids: list[str],
    pairs: torch.Tensor,
    *,
    source: str,
    texts: list[str] | None = None,
    features: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    label_names: list[str] | None = None,
    notes: dict[str, int] | None = None,
) -> RelationalGraph:
    """Canonicalise the edges (drop self-loops and duplicates, log the counts) and build the graph."""
    edges, loops, dups = canonical_edges(pairs)
    notes = {**(notes or {}), SELF_LOOPS: loops, DUPLICATES: dups}
    if loops or dups:
        log.info("%s: dropped %d self-loop(s) and %d duplicate edge(s)", source, loops, dups)
    if edges.shape[0] == 0:
        log.warning("%s: no relations left after cleaning", source)
    graph = RelationalGraph(
        name=name, entity_ids=entity_ids, edges=edges, texts=texts, features=features,
        labels=labels, label_names=label_names, notes=notes,
    )
    log.info("loaded %r", graph)
    return graph


def build_graph(
    name: str,
    entities: EntityRecords,
    edges: EdgeRecords | Iterable[EdgeRecords],
    *,
    features: torch.Tensor | None = None,
    on_unknown: OnUnknown = "error",
    edge_source: str | None = None,
) -> RelationalGraph:
    """The graph of id-keyed records: every rule of the module policy applied in order.

    ``edges``: the relation records, or chunks of them (:func:`index_edges`); the entities are
    checked before the first chunk is read. ``edge_source``: the relation file for log lines
    (default: ``edges.source``).
    """
    position = index_entities(entities.ids, entities.source, entities.lines, entities.numbering)
    texts = None
    if entities.texts is not None:
        texts = check_texts(entities.ids, entities.texts, entities.source, entities.lines, entities.numbering)
    if features is not None:
        features = check_features(features, len(entities.ids), entities.source)
    labels = label_names = None
    if entities.labels is not None:
        labels, label_names = encode_labels(entities.labels)
    pairs, notes = index_edges(edges, position, on_unknown)
    source = edge_source or (edges.source if isinstance(edges, EdgeRecords) else entities.source)
    return assemble(
        name, list(entities.ids), pairs, source=source, texts=texts, features=features,
        labels=labels, label_names=label_names, notes=notes,
    )
