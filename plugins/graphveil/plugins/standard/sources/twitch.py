"""The ``twitch`` source: MUSAE Twitch social graphs (Rozemberczki, Allen & Sarkar 2021) from their own files, never downloaded.

One graph per language (MUSAE ships DE, ENGB, ES, FR, PTBR, RU): Twitch users are nodes, mutual
follows are undirected edges, a user's features are the ids of the games they played and
liked, and the usual binary target is ``mature`` (explicit content). Three files per language
``L``, in any of the layouts :data:`LAYOUTS` lists (``data.path`` names the folder):

================  ==========================================================================
``L_edges.csv``   header ``from,to``; one undirected edge per row, node ids
``L.json``        ``{"<node id>": [feature ids, ...], ...}``
``L_target.csv``  header ``id,days,mature,views,partner,new_id``: ``new_id`` is the node id
                  the other two files use, ``mature`` (``True``/``False``) the label
================  ==========================================================================

The result is a :class:`~graphveil.data.node_graph.NodeGraph`: nodes in the order of their
integer id (ids ``"0".."n-1"`` on MUSAE's files), multi-hot float32 features over the feature
ids ``0..max id`` (or ``num_features``), label 1 for ``mature`` True, each undirected edge in
both directions, self-loops and repeated edges (in either direction) dropped and counted in
``notes`` (as are feature ids a node lists twice). Every node must have a target row and a
feature entry, and every edge must name known nodes; anything else is a
:class:`~graphveil.contract.errors.DataError` naming the file, the line and the problem.

ENGB (``shared/data/social/musae_twitch_ENGB``): 7126 nodes, 35324 undirected edges (70648
directed), 3170 features (2545 used; 148218 listed ids, 535 of them repeats within a node's
list, so 147683 ones), ``mature`` True 3888 / False 3238; no isolated node, so dp-gnn's
preprocessing changes nothing.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field, field_validator

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import DataError
from graphveil.data.node_graph import DUPLICATES, SELF_LOOPS, NodeGraph, undirected_edge_index
from graphveil.data.preprocess import dp_gnn_preprocess
from graphveil.data.validate import canonical_edges
from graphveil.plugins.standard.sources._options import SourceOptions

log = logging.getLogger(__name__)

#: The languages MUSAE publishes a Twitch graph for.
LANGUAGES = ("DE", "ENGB", "ES", "FR", "PTBR", "RU")
#: (edges, features, target) file paths relative to ``data.path``, ``{L}`` the language code:
#: the files of one language side by side (as MUSAE's ``input/`` files are copied in
#: ``shared/data``), MUSAE's ``input/`` folder itself, and SNAP's ``twitch/<L>/`` folder.
LAYOUTS = (
    ("{L}_edges.csv", "{L}.json", "{L}_target.csv"),
    ("edges/{L}_edges.csv", "features/{L}.json", "target/{L}_target.csv"),
    ("musae_{L}_edges.csv", "musae_{L}_features.json", "musae_{L}_target.csv"),
)
EDGE_HEADER = ("from", "to")
TARGET_HEADER = ("id", "days", "mature", "views", "partner", "new_id")
CLASS_NAMES = ["not_mature", "mature"]
_BOOL = {"true": 1, "false": 0}
#: Key of ``NodeGraph.notes``: feature ids listed more than once for a node (multi-hot: one 1).
REPEATED_FEATURES = "repeated_feature_ids"

Preprocess = Literal["dp_gnn", "none"]


def language_code(name: str) -> str:
    """``name`` as one of :data:`LANGUAGES` (case-insensitive), else a :class:`ValueError`."""
    code = name.strip().upper()
    if code not in LANGUAGES:
        raise ValueError(f"must be a MUSAE Twitch language code ({', '.join(LANGUAGES)}; case-insensitive), "
                         f"or null to detect it from the file names")
    return code


def find_files(folder: str | os.PathLike[str], language: str | None = None) -> tuple[str, Path, Path, Path]:
    """The language and its (edges, features, target) files in ``folder``.

    Without ``language`` it is read from the edge file's name; a folder holding several
    languages' files needs it given. A missing file is an error naming it.
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = "not a folder" if folder.exists() else "no such folder"
        raise DataError(f"{folder}: {what}; data.path must name the folder holding a MUSAE Twitch graph "
                        f"(e.g. ENGB_edges.csv, ENGB.json, ENGB_target.csv)")
    codes = [language_code(language)] if language is not None else list(LANGUAGES)
    found = [(code, layout) for layout in LAYOUTS for code in codes
             if (folder / layout[0].format(L=code)).is_file()]
    if not found:
        code = codes[0] if language is not None else "<L>"
        looked = ", ".join(layout[0].format(L=code) for layout in LAYOUTS)
        which = "" if language is not None else f", L one of {', '.join(LANGUAGES)}"
        raise DataError(f"{folder}: missing MUSAE Twitch edge file {code}_edges.csv{which} (looked for "
                        f"{looked}); a graph needs {', '.join(LAYOUTS[0]).replace('{L}', code)} "
                        f"and GraphVeil never downloads them")
    languages = sorted({code for code, _ in found})
    if len(languages) > 1:
        raise DataError(f"{folder}: holds the Twitch graphs of {', '.join(languages)}; set data.name to one")
    code, layout = found[0]
    paths = tuple(folder / part.format(L=code) for part in layout)
    for path in paths[1:]:
        if not path.is_file():
            raise DataError(f"{path}: missing MUSAE Twitch file; a graph needs "
                            f"{', '.join(p.name for p in paths)} and GraphVeil never downloads them")
    return code, *paths  # type: ignore[return-value]


# ------------------------------------------------------------------------------------- readers


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc


def _csv_rows(path: Path, header: tuple[str, ...], required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Rows of a CSV file whose first line is a header holding the ``required`` columns, as
    (line, {column: value}); blank lines skipped, every row as wide as the header."""
    reader = csv.reader(io.StringIO(_text(path), newline=""))
    try:
        first = next(reader, None)
        if first is None:
            raise DataError(f"{path}: empty file (expected the header {','.join(header)})")
        names = [h.strip().lower() for h in first]
        missing = [c for c in required if c not in names]
        if missing:
            raise DataError(f"{path}, line 1: bad header {','.join(first)!r}: no column "
                            f"{', '.join(missing)} (expected {','.join(header)})")
        start = reader.line_num + 1
        for row in reader:
            line, start = start, reader.line_num + 1
            if not any(f.strip() for f in row):
                continue
            if len(row) != len(names):
                raise DataError(f"{path}, line {line}: expected {len(names)} fields, got {len(row)}")
            yield line, {n: f.strip() for n, f in zip(names, row, strict=True)}
    except csv.Error as exc:
        raise DataError(f"{path}, line {reader.line_num}: {exc}") from exc


def _node_id(value: str, path: Path, line: int, what: str) -> int:
    if not re.fullmatch(r"\d+", value):
        raise DataError(f"{path}, line {line}: {what} {value!r} is not a node id (a non-negative integer)")
    return int(value)


def read_targets(path: Path) -> tuple[list[int], list[int], dict[int, int]]:
    """``ENGB_target.csv`` → (node ids, labels, id → line), in file order."""
    ids: list[int] = []
    labels: list[int] = []
    lines: dict[int, int] = {}
    for line, row in _csv_rows(path, TARGET_HEADER, ("new_id", "mature")):
        nid = _node_id(row["new_id"], path, line, "new_id")
        if nid in lines:
            raise DataError(f"{path}, line {line}: node {nid} has a second target row (first on line {lines[nid]})")
        label = _BOOL.get(row["mature"].lower())
        if label is None:
            raise DataError(f"{path}, line {line}: mature is {row['mature']!r}, expected True or False")
        ids.append(nid)
        labels.append(label)
        lines[nid] = line
    if not ids:
        raise DataError(f"{path}: no target rows (no nodes)")
    return ids, labels, lines


def read_features(path: Path, index: dict[int, int], target: Path) -> list[list[int]]:
    """``ENGB.json`` → feature ids of every node (by row of ``index``); a node without a target
    row, or a target node without an entry, is an error."""
    try:
        obj = json.loads(_text(path))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a JSON object {{\"<node id>\": [feature ids]}}, got {type(obj).__name__}")
    feats: list[list[int] | None] = [None] * len(index)
    for key, value in obj.items():
        if not re.fullmatch(r"\d+", key.strip()):
            raise DataError(f"{path}: key {key!r} is not a node id (a non-negative integer)")
        nid = int(key)
        if nid not in index:
            raise DataError(f"{path}: node {nid} has features but no target row in {target}")
        if not isinstance(value, list) or not all(
                isinstance(f, int) and not isinstance(f, bool) and f >= 0 for f in value):
            raise DataError(f"{path}: node {nid}: features must be a list of non-negative integer "
                            f"feature ids, got {str(value)[:80]}")
        feats[index[nid]] = value
    missing = [nid for nid, row in index.items() if feats[row] is None]
    if missing:
        raise DataError(f"{path}: node {missing[0]} (from {target}) has no feature entry; "
                        f"{len(missing)} node(s) without one")
    return feats  # type: ignore[return-value]


def read_edges(path: Path, index: dict[int, int], target: Path) -> torch.Tensor:
    """``ENGB_edges.csv`` → ``(k, 2)`` row-index pairs as listed; an unknown node id is an error."""
    pairs: list[tuple[int, int]] = []
    for line, row in _csv_rows(path, EDGE_HEADER, EDGE_HEADER):
        ends = []
        for col in EDGE_HEADER:
            nid = _node_id(row[col], path, line, col)
            if nid not in index:
                raise DataError(f"{path}, line {line}: unknown node id {nid} (no row in {target})")
            ends.append(index[nid])
        pairs.append((ends[0], ends[1]))
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


# ------------------------------------------------------------------------------------- loader


def load_twitch(
    path: str | os.PathLike[str],
    name: str | None = None,
    *,
    num_features: int | None = None,
    preprocess: Preprocess = "dp_gnn",
) -> NodeGraph:
    """A MUSAE Twitch graph as a :class:`NodeGraph` (see the module docstring).

    :param path: the folder holding the graph's files (any of :data:`LAYOUTS`).
    :param name: language code (:data:`LANGUAGES`); default: read from the file names.
    :param num_features: width of the multi-hot features (default: largest feature id + 1;
        give it to line up graphs of several languages).
    :param preprocess: ``"dp_gnn"`` (:func:`~graphveil.data.preprocess.dp_gnn_preprocess`, as
        the Planetoid source) or ``"none"``.
    """
    if preprocess not in ("dp_gnn", "none"):
        raise DataError(f"unknown preprocessing {preprocess!r} (known: dp_gnn, none)")
    try:
        code, edges_path, features_path, target_path = find_files(path, name)
    except ValueError as exc:  # a bad language code
        raise DataError(f"Twitch language {name!r}: {exc}") from exc
    ids, labels, _ = read_targets(target_path)
    order = sorted(range(len(ids)), key=ids.__getitem__)
    index = {ids[i]: row for row, i in enumerate(order)}
    feats = read_features(features_path, index, target_path)
    width = max((max(f) for f in feats if f), default=-1) + 1
    if num_features is not None:
        if width > num_features:
            raise DataError(f"{features_path}: feature id {width - 1} does not fit num_features={num_features}")
        width = num_features
    if width == 0:
        raise DataError(f"{features_path}: no node has any feature id")
    rows = torch.tensor([r for r, f in enumerate(feats) for _ in f], dtype=torch.long)
    cols = torch.tensor([c for f in feats for c in f], dtype=torch.long)
    x = torch.zeros(len(ids), width, dtype=torch.float32)
    x[rows, cols] = 1.0
    repeated = cols.numel() - int(x.sum())  # a game listed twice for one user is one 1
    pairs = read_edges(edges_path, index, target_path)
    once, loops, dups = canonical_edges(pairs)
    if loops or dups:
        log.info("%s: dropped %d self-loop(s) and %d repeated edge(s)", edges_path, loops, dups)
    edge_index, _ = undirected_edge_index(once.t(), len(ids))
    graph = NodeGraph(
        name=f"twitch-{code}", x=x, y=torch.tensor([labels[i] for i in order], dtype=torch.long),
        edge_index=edge_index, node_ids=[str(ids[i]) for i in order], class_names=list(CLASS_NAMES),
        notes={SELF_LOOPS: loops, DUPLICATES: dups, REPEATED_FEATURES: repeated},
    )
    return dp_gnn_preprocess(graph) if preprocess == "dp_gnn" else graph


class TwitchOptions(SourceOptions):
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
        return None if value is None else language_code(value)


class TwitchSource(DataSource):
    """A MUSAE Twitch social graph (data.path; label: mature) as a node-classification graph."""

    Params = TwitchOptions

    def load(self) -> NodeGraph:
        p = self.params
        return load_twitch(p.path, p.name, num_features=p.num_features, preprocess=p.preprocess)
