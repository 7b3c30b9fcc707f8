"""``graphveil demo``: the paper comparison on the bundled CiteSeer text graph, on a CPU.

Rows: the base encoder without fine-tuning, non-private fine-tuning, entity-level DP with
standard clipping and with FREQ-CLIP, and edge-level DP, all at the same ε target, on the
same keyed transfer split (``data.split.seed`` is the split key), the same encoder and the same
number of steps. The sampling seed is left unset (fresh OS entropy per run) and DP noise comes
from the OS CSPRNG, so two demo runs differ in their batches and noise.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

from graphveil.config import RunConfig, config_from_dict, merge_config
from graphveil.outputs import RunDirectory, dumps, format_table
from graphveil.records_store import MemoryRecordsStore
from graphveil.runner import result_columns, run_training

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
    """The demo's run configs, in table order (also used by bench/utility.py).

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


def run_demo(quick: bool = False, output: Path | None = None, progress: bool = True) -> list[dict[str, Any]]:
    from graphveil.data import load_graph

    root = output or RunDirectory.default_for("demo-quick" if quick else "demo")
    if root.exists():
        raise FileExistsError(f"demo output {root} already exists")
    configs = demo_configs(quick, root, progress)
    graph = load_graph(configs[0][1].data)  # every row uses the same graph and split
    # ... and the entity-level rows the same degree-capped Ē, drawn once (as a site's ledger does).
    records = MemoryRecordsStore()
    print(f"GraphVeil demo: {graph!r}; {len(configs)} runs, ε target {TARGET_EPSILON:g}", flush=True)
    rows = []
    started = time.perf_counter()
    for label, cfg in configs:
        print(f"\n== {label}", flush=True)
        result = run_training(cfg, graph=graph, records_store=records)
        rows.append({**result["row"], "name": label})
        print(result["table"].splitlines()[-1], flush=True)
    table = format_table(rows, result_columns(result["session"]))  # every row runs the same task
    (root / "results.jsonl").write_text("".join(dumps(r) + "\n" for r in rows), encoding="utf-8")
    (root / "table.txt").write_text(table + "\n", encoding="utf-8")
    print(f"\nResults (zero-shot relation prediction on held-out CiteSeer entities, "
          f"{time.perf_counter() - started:.0f} s):\n{table}\n\nwritten to {root}")
    return json.loads(json.dumps(rows, default=str))
