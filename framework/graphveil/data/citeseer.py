"""CiteSeer with titles and abstracts (TAPE's ``CiteSeer-Orig``): shipped inside the package
(``graphveil/data/bundled``, see its ``SOURCE.md``) and readable from an upstream folder.

Bundled data of the core: the ``citeseer`` and ``citeseer_tape`` sources read it, and so do the
federation's partitioner, the benchmarks and the tests.

STATS (bundled and TAPE folder, identical): 3186 entities with text, 6 classes, 4732 citation
lines → 4225 undirected relations after dropping 335 lines naming one of the 141 ids without
text, 120 further self-loops and 52 duplicates.
"""

from __future__ import annotations

import hashlib
import lzma
import os
from importlib import resources
from pathlib import Path

from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.tables import checked_rows, decode, read_text
from graphveil.data.validate import EdgeRecords, EntityRecords, build_graph, check_texts

CITESEER_TEXTS = "citeseer_texts.txt"
CITESEER_CITES = "citeseer.cites"
#: sha256 of the upstream files (TAPE commit 331e616, dataset/CiteSeer-Orig); the bundled
#: ``.xz`` copies must decompress to exactly these bytes.
CITESEER_SHA256 = {
    CITESEER_TEXTS: "9070723640766aaa09875ce72397a4325feecac968ed9fb44152820b651f1f17",
    CITESEER_CITES: "cd9730630eaaa745058c2cd2cce6b9afb79ca71278a479aebec55f4cf5eb7f30",
}


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
    for line, row in checked_rows(cites, "\t", cites_source, width=2):
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
    return _citeseer(read_text(texts), read_text(cites), str(texts), str(cites))


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
    return decode(data, source)


def load_bundled_citeseer() -> RelationalGraph:
    """The CiteSeer text graph shipped inside the package (``graphveil/data/bundled``, see its
    ``SOURCE.md``); the same graph :func:`load_citeseer_tape` builds from the upstream folder.
    """
    return _citeseer(
        _bundled(CITESEER_TEXTS), _bundled(CITESEER_CITES),
        f"graphveil/data/bundled/{CITESEER_TEXTS}", f"graphveil/data/bundled/{CITESEER_CITES}",
    )
