"""A comparison of runs on one graph, one after the other, written as one table (every demo).

Shared by the relational demo (:mod:`graphveil.apps.demo`) and the node demo
(:mod:`graphveil.apps.demo_node`): runs the rows, writes ``results.jsonl``, ``table.txt`` and
``table.md`` into one run directory, all or nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from graphveil.run.config import RunConfig
from graphveil.run.outputs import RunDirectory, dumps, format_cell, format_table
from graphveil.run.runner import run_training

#: A table's columns: (result key, header, format).
Columns = list[tuple[str, str, str]]


def run_comparison(title: str | Callable[[], str],
                   build: Callable[[Path], Sequence[tuple[str, RunConfig]]], *,
                   output: Path | None, default_name: str, load: Callable[[RunConfig], Any],
                   columns: Callable[[dict[str, Any]], Columns], caption: str | Callable[[], str],
                   row_extra: Callable[[int, RunConfig], Mapping[str, Any]] | None = None,
                   records_store: Any = None, notes: Sequence[str] = (),
                   row_result: Callable[[int, RunConfig, dict[str, Any]], Mapping[str, Any]] | None = None,
                   ) -> list[dict[str, Any]]:
    """Run a demo's rows one after the other on one graph, then write its results and tables.

    :param title: printed with the graph before the rows run; a callable is asked after ``build``
        and ``load`` (a title naming what they chose).
    :param build: the ``(label, config)`` rows, given the folder their run directories go in.
    :param load: loads the graph every row shares (from the first row's config).
    :param columns: the table's columns, given the last row's :func:`run_training` result.
    :param row_extra: fields added to row ``i``'s result (e.g. what was shortened).
    :param row_result: fields added to row ``i``'s result, given its :func:`run_training` result
        (e.g. the paired comparison with an earlier row).
    :param caption: the table's caption (printed and atop ``table.md``); a callable is asked
        after ``build`` and ``load``, as ``title``.
    :param notes: lines printed under the table and written below ``table.md`` (read once the rows
        have run: ``build`` may add to a list it was given).
    :raises FileExistsError: if ``output`` exists (nothing is run).
    """
    root = Path(output) if output else RunDirectory.default_for(default_name)
    if root.exists():
        raise FileExistsError(f"demo output {root} already exists")
    out = RunDirectory(root)
    started = time.perf_counter()
    try:
        configs = build(out.path)
        graph = load(configs[0][1])
        title, caption = (text() if callable(text) else text for text in (title, caption))
        print(f"{title}: {graph!r}; {len(configs)} runs", flush=True)
        rows, last = [], None
        for i, (label, cfg) in enumerate(configs):
            print(f"\n== [{i + 1}/{len(configs)}] {label}  ({time.perf_counter() - started:.0f} s so far)",
                  flush=True)
            last = run_training(cfg, graph=graph, records_store=records_store)
            row = {**last["row"], "name": label, **(row_extra(i, cfg) if row_extra else {}),
                   **(row_result(i, cfg, last) if row_result else {})}
            rows.append(row)
            out.log_metrics(row)
            print(last["table"].splitlines()[-1], flush=True)
        assert last is not None
        cols = columns(last)
        table = format_table(rows, cols)
        elapsed = time.perf_counter() - started
        (out.path / "results.jsonl").write_text("".join(dumps(r) + "\n" for r in rows), encoding="utf-8")
        (out.path / "table.txt").write_text(table + "\n", encoding="utf-8")
        md = [f"{caption}; {len(rows)} runs, {elapsed:.0f} s in all.", "", markdown_table(rows, cols),
              *(["", *notes] if notes else [])]
        (out.path / "table.md").write_text("\n".join(md) + "\n", encoding="utf-8")
        final = out.commit()
    except BaseException:
        out.discard()
        raise
    print(f"\nResults ({caption}, {elapsed:.0f} s):\n{table}", *notes, f"\nwritten to {final}", sep="\n")
    return json.loads(json.dumps(rows, default=str))


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Columns) -> str:
    """The same table as :func:`~graphveil.run.outputs.format_table`, as GitHub markdown."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(format_cell(r, k, s) for k, _, s in columns) + " |" for r in rows]
    return "\n".join(lines)
