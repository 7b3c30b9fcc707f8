"""``graphveil demo``: the paper comparisons, on data shipped inside the package, on a CPU.

Two tasks share the run loop, the output folder and the tables of this module:

- ``--task relational`` (default): the comparison on the bundled CiteSeer text graph (below).
- ``--task node``: paper 4's GDP methods on bundled Cora (:mod:`graphveil.apps.demo_node`).

Relational rows: the base encoder without fine-tuning, non-private fine-tuning, entity-level DP
with standard clipping and with FREQ-CLIP, and edge-level DP, all at the same ε target, on the
same keyed transfer split (``data.split.seed`` is the split key), the same encoder and the same
number of steps. The sampling seed is left unset (fresh OS entropy per run) and DP noise comes
from the OS CSPRNG, so two demo runs differ in their batches and noise.

A demo's folder is written under ``<output>.partial`` and renamed when every row has finished
(each row's run directory, ``results.jsonl``, ``table.txt``, ``table.md``); a failed or
interrupted demo leaves nothing behind.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from graphveil.config import RunConfig, config_from_dict, merge_config
from graphveil.outputs import RunDirectory, dumps, format_table
from graphveil.records_store import MemoryRecordsStore
from graphveil.runner import result_columns, run_training

Columns = list[tuple[str, str, str]]

TARGET_EPSILON = 10.0

#: Shared settings. Sizes are planned from the cost of a MiniLM pass on 2 CPU cores: LoRA sits
#: in the top layer only and the frozen layers' outputs are cached once per entity.
BASE: dict[str, Any] = {
    "data": {"source": "citeseer", "split": {"train_fraction": 0.7, "seed": 0}},
    "encoder": {"name": "hf_lora", "model": "minilm", "max_length": 32, "lora_layers": 1, "lora_rank": 8},
    "training": {"steps": 30, "loss": "infonce", "optimizer": "adam", "lr": 2e-3, "temperature": 0.05},
    "evaluation": {"batch_size": 256},
    "output": {"progress": True},
}
ENTITY_SAMPLER = {"name": "entity_poisson_wor", "batch_size": 256, "k_neg": 4, "degree_cap": 5}
EDGE_SAMPLER = {"name": "edge_poisson_decoupled", "batch_size": 256, "k_neg": 4}
PRIVATE = {"enabled": True, "target_epsilon": TARGET_EPSILON}

ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("base", "base encoder (no fine-tuning)", {
        "sampler": ENTITY_SAMPLER, "clipper": {"name": "no_clip"},
        "accountant": {"name": "no_accounting"}, "privacy": {"enabled": False},
        "training": {"steps": 0}}),
    ("nonprivate", "non-private fine-tuning", {
        "sampler": ENTITY_SAMPLER, "clipper": {"name": "no_clip"},
        "accountant": {"name": "no_accounting"}, "privacy": {"enabled": False}}),
    ("entity_standard", f"entity-level ε={TARGET_EPSILON:g}, standard clipping", {
        "sampler": ENTITY_SAMPLER, "clipper": {"name": "standard_clip", "clip_norm": 1.0},
        "accountant": {"name": "coupled_rdp_standard"}, "privacy": PRIVATE}),
    ("entity_freq", f"entity-level ε={TARGET_EPSILON:g}, FREQ-CLIP", {
        "sampler": ENTITY_SAMPLER, "clipper": {"name": "freq_clip", "clip_norm": 1.0},
        "accountant": {"name": "coupled_rdp_freq"}, "privacy": PRIVATE}),
    ("edge", f"edge-level ε={TARGET_EPSILON:g}", {
        "sampler": EDGE_SAMPLER, "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_rdp"}, "privacy": PRIVATE}),
]

#: --quick: a tiny random encoder and a handful of steps, to check the wiring in seconds.
QUICK = {
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 16, "lora_layers": 1},
    "training": {"steps": 3},
    "data": {"max_entities": 600},
    "sampler_batch_size": 32,
}


def demo_configs(quick: bool = False, root: Path | None = None, progress: bool = True,
                 base: dict[str, Any] | None = None, sampler: dict[str, Any] | None = None,
                 target_epsilon: float = TARGET_EPSILON) -> list[tuple[str, RunConfig]]:
    """The relational demo's run configs, in table order (also used by bench/utility.py).

    :param base: shared settings replacing :data:`BASE`.
    :param sampler: options applied to every row's sampler (``degree_cap`` only where it applies).
    :param target_epsilon: ε of the private rows.
    """
    shared = copy.deepcopy(base or BASE)
    if quick:
        shared = merge_config(shared, {k: v for k, v in QUICK.items() if k != "sampler_batch_size"})
        sampler = {"batch_size": QUICK["sampler_batch_size"], **(sampler or {})}
    configs = []
    for key, label, extra in ROWS:
        raw = merge_config(shared, extra)
        if key == "base":
            raw["training"]["steps"] = 0
        for option, value in (sampler or {}).items():
            if option in raw["sampler"]:
                raw["sampler"][option] = value
        if raw["privacy"].get("enabled", True):
            raw["privacy"] = {"enabled": True, "target_epsilon": target_epsilon}
            label = label.replace(f"ε={TARGET_EPSILON:g}", f"ε={target_epsilon:g}")
        raw["name"] = key
        raw["output"] = {"progress": progress, **({"dir": str(root / key)} if root else {})}
        configs.append((label, config_from_dict(raw, f"demo:{key}")))
    return configs


def run_demo(quick: bool = False, output: Path | None = None, progress: bool = True,
             task: str = "relational") -> list[dict[str, Any]]:
    """Run one demo: ``task`` is ``relational`` (this module's rows) or ``node`` (bundled Cora)."""
    if task == "node":
        from graphveil.apps.demo_node import run_node_demo

        return run_node_demo(quick=quick, output=output, progress=progress)
    if task != "relational":
        raise ValueError(f"unknown demo task {task!r}; choose 'relational' or 'node'")
    from graphveil.data import load_graph

    records = MemoryRecordsStore()  # the entity-level rows share one degree-capped Ē, drawn once

    def columns(result: dict[str, Any]) -> Columns:
        return result_columns(result["session"])  # every row runs the same task

    return run_comparison(
        f"GraphVeil demo (relational, ε target {TARGET_EPSILON:g})",
        lambda root: demo_configs(quick, root, progress),
        output=output, default_name="demo-quick" if quick else "demo",
        load=lambda cfg: load_graph(cfg.data), columns=columns, records_store=records,
        caption="zero-shot relation prediction on held-out CiteSeer entities")


# --------------------------------------------------------------- shared by every demo task


def run_comparison(title: str, build: Callable[[Path], Sequence[tuple[str, RunConfig]]], *,
                   output: Path | None, default_name: str, load: Callable[[RunConfig], Any],
                   columns: Callable[[dict[str, Any]], Columns], caption: str,
                   row_extra: Callable[[int, RunConfig], Mapping[str, Any]] | None = None,
                   records_store: Any = None, notes: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run a demo's rows one after the other on one graph, then write its results and tables.

    :param build: the ``(label, config)`` rows, given the folder their run directories go in.
    :param load: loads the graph every row shares (from the first row's config).
    :param columns: the table's columns, given the last row's :func:`run_training` result.
    :param row_extra: fields added to row ``i``'s result (e.g. what was shortened).
    :param notes: lines printed under the table and written below ``table.md``.
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
        print(f"{title}: {graph!r}; {len(configs)} runs", flush=True)
        rows, last = [], None
        for i, (label, cfg) in enumerate(configs):
            print(f"\n== [{i + 1}/{len(configs)}] {label}  ({time.perf_counter() - started:.0f} s so far)",
                  flush=True)
            last = run_training(cfg, graph=graph, records_store=records_store)
            row = {**last["row"], "name": label, **(row_extra(i, cfg) if row_extra else {})}
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


def cell(row: Mapping[str, Any], key: str, spec: str) -> str:
    """One table cell as :func:`~graphveil.outputs.format_table` prints it (``-`` if absent, ∞)."""
    value = row.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and math.isinf(value):
        return "∞"
    return format(value, spec) if spec else str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Columns) -> str:
    """The same table as :func:`~graphveil.outputs.format_table`, as GitHub markdown."""
    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, k, s) for k, _, s in columns) + " |" for r in rows]
    return "\n".join(lines)
