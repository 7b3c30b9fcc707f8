"""Run directories: written under a ``.partial`` name and renamed only when complete."""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    return value


def dumps(obj: Any) -> str:
    return json.dumps(_jsonable(obj), sort_keys=False)


class RunDirectory:
    """A run's output folder. Files go to ``<dir>.partial``; :meth:`commit` renames it.

    If the run fails, :meth:`discard` removes the partial folder, so a run directory that
    exists under its final name is always complete.

    :param resume: keep the ``.partial`` folder of an earlier attempt (appending to its
        ``metrics.jsonl``) instead of starting afresh; a resumable sweep :meth:`close` s it
        when it stops, rather than discarding it.
    """

    def __init__(self, final: Path, *, resume: bool = False) -> None:
        self.final = Path(final)
        if self.final.exists():
            raise FileExistsError(f"output directory {self.final} already exists; choose another output.dir")
        self.path = self.staging_path(self.final)
        if self.path.exists() and not resume:
            shutil.rmtree(self.path)
        # parent folders this run creates (e.g. runs/): removed again by discard() if left empty
        self._new_parents = [p for p in self.path.parents if not p.exists()]
        self.path.mkdir(parents=True, exist_ok=resume)
        self._metrics = (self.path / "metrics.jsonl").open("a" if resume else "w", encoding="utf-8")

    @staticmethod
    def staging_path(final: Path) -> Path:
        """Where the files of the run directory ``final`` are until :meth:`commit` (a
        ``graphveil_run_end`` hook, called just before, reads them there)."""
        return Path(final).with_name(Path(final).name + ".partial")

    @staticmethod
    def default_for(name: str, root: Path = Path("runs")) -> Path:
        return root / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"

    def write_json(self, name: str, obj: Any) -> None:
        (self.path / name).write_text(json.dumps(_jsonable(obj), indent=2) + "\n", encoding="utf-8")

    def write_yaml(self, name: str, obj: Any) -> None:
        (self.path / name).write_text(yaml.safe_dump(_jsonable(obj), sort_keys=False), encoding="utf-8")

    def log_metrics(self, record: Mapping[str, Any]) -> None:
        self._metrics.write(dumps(record) + "\n")
        self._metrics.flush()

    def commit(self) -> Path:
        self._metrics.close()
        self.path.rename(self.final)
        return self.final

    def discard(self) -> None:
        """Remove the partial folder, and the parent folders it created if nothing else is in them."""
        self._metrics.close()
        shutil.rmtree(self.path, ignore_errors=True)
        for parent in self._new_parents:  # deepest first
            try:
                parent.rmdir()
            except OSError:  # another run wrote there meanwhile, or it is gone
                break

    def close(self) -> None:
        """Stop writing and keep the ``.partial`` folder (a resumable sweep that stopped)."""
        self._metrics.close()


def format_cell(row: Mapping[str, Any], key: str, spec: str) -> str:
    """One table cell: ``-`` if absent (or NaN), ``∞`` for infinity, else ``format(value, spec)``."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return format(value, spec) if spec else str(value)


def format_table(rows: Iterable[Mapping[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """Plain-text table. ``columns`` holds (key, header, format spec)."""
    rows = list(rows)
    body = [[format_cell(r, k, s) for k, _, s in columns] for r in rows]
    headers = [h for _, h, _ in columns]
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    out = [line(headers), "  ".join("-" * w for w in widths)]
    out += [line(b) for b in body]
    return "\n".join(out)
