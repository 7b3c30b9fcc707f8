"""``graphveil demo``: the paper comparisons, on data shipped inside the package, on a CPU.

Two tasks share the run loop, the output folder and the tables of this module:

- ``--task relational`` (default): zero-shot relation prediction on held-out entities (below).
- ``--task node``: paper 4's GDP methods on bundled Cora or the owner's node graph
  (:mod:`graphveil.apps.demo_node`).

Relational rows: the base encoder without fine-tuning, non-private fine-tuning, entity-level DP
with standard clipping and with FREQ-CLIP, and edge-level DP, all at the same ε target, on the
same keyed transfer split (``data.split.seed`` is the split key), the same encoder and the same
number of steps. Every row is evaluated on the same held-out relations in the same batches, so
each trained row also gets its paired difference to the base row (ΔPREC@1, ΔMRR) with a 95 %
paired-bootstrap interval over those relations, and the private rows the share of the
non-private MRR gain they keep. The sampling seed is left unset (fresh OS entropy per run) and
DP noise comes from the OS CSPRNG, so two demo runs differ in their batches and noise.

Settings (``--setting``, :data:`SETTINGS`): ``cora-features`` trains a weight per
word (encoder ``frozen_head``, ``head: diagonal``, the identity at step 0) on bundled Cora's
bag-of-words vectors, where relations teach which shared words matter; ``citeseer-minilm-lora`` is the
first demo, MiniLM + LoRA on bundled CiteSeer text, which has no headroom (README). ``--set
KEY=VALUE`` overrides apply to every row (:func:`demo_configs`), so the same table runs on a
user's graph. Without ``--setting`` the graph (loaded once, before any row runs) picks the
setting whose encoder reads what its entities carry (:func:`pick_setting`: features →
``cora-features``, texts only → ``citeseer-minilm-lora``); the choice and why are printed and
written under the table. A ``--setting`` whose encoder reads what the graph lacks is refused
before any row runs, naming what the graph has (:func:`fit_setting`).

A demo's folder is written under ``<output>.partial`` and renamed when every row has finished
(each row's run directory, ``results.jsonl``, ``table.txt``, ``table.md``); a failed or
interrupted demo leaves nothing behind.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from graphveil.apps.comparison import Columns, run_comparison
from graphveil.contract.errors import ConfigError
from graphveil.evaluation import paired_delta
from graphveil.run.config import (
    RunConfig,
    apply_overrides,
    config_from_dict,
    drop_source_options,
    merge_config,
    parse_override,
)
from graphveil.run.records_store import MemoryRecordsStore
from graphveil.run.runner import TAIL_COLUMNS

log = logging.getLogger(__name__)

TARGET_EPSILON = 10.0

#: The first demo: MiniLM + LoRA on CiteSeer text (also bench/utility.py's setting). Sizes are
#: planned from the cost of a MiniLM pass on 2 CPU cores: LoRA sits in the top layer only and
#: the frozen layers' outputs are cached once per entity.
MINILM_LORA: dict[str, Any] = {
    "data": {"source": "citeseer", "split": {"train_fraction": 0.7, "seed": 0}},
    "encoder": {"name": "hf_lora", "model": "minilm", "max_length": 32, "lora_layers": 1, "lora_rank": 8},
    "training": {"steps": 30, "loss": "infonce", "optimizer": "adam", "lr": 2e-3, "temperature": 0.05},
    "evaluation": {"batch_size": 256},
    "output": {"progress": True},
}

#: The default: a weight per word (``head: diagonal``, ones at step 0) on Cora's bag of words.
#: The identity-initialised full linear head (``--set encoder.head=linear --set
#: training.lr=3e-4``) gains a little more without DP, but its 2 M weights drown in DP noise
#: and take ~5x the time (README).
CORA_FEATURES: dict[str, Any] = {
    "data": {"source": "planetoid", "name": "cora", "split": {"train_fraction": 0.7, "seed": 0}},
    "encoder": {"name": "frozen_head", "model": "features", "head": "diagonal"},
    "training": {"steps": 100, "loss": "infonce", "optimizer": "adam", "lr": 1e-2, "temperature": 0.1},
    "evaluation": {"batch_size": 256},
    "output": {"progress": True},
}

#: ``--setting`` name → (shared settings, entity-level sampler, edge-level sampler, caption).
SETTINGS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]] = {
    "cora-features": (
        CORA_FEATURES,
        {"name": "entity_poisson_wor", "batch_size": 256, "k_neg": 4, "degree_cap": 5},
        {"name": "edge_poisson_decoupled", "batch_size": 256, "k_neg": 4},
        "zero-shot relation prediction on held-out Cora entities (a weight per word of the bag of words)"),
    "citeseer-minilm-lora": (
        MINILM_LORA,
        {"name": "entity_poisson_wor", "batch_size": 256, "k_neg": 4, "degree_cap": 5},
        {"name": "edge_poisson_decoupled", "batch_size": 256, "k_neg": 4},
        "zero-shot relation prediction on held-out CiteSeer entities (MiniLM + LoRA)"),
}
DEFAULT_SETTING = "cora-features"

#: bench/utility.py's shared settings (MiniLM + LoRA on CiteSeer).
BASE = MINILM_LORA
PRIVATE = {"enabled": True, "target_epsilon": TARGET_EPSILON}

#: (key, label, row settings); ``{eps}`` in a label is the row's ε target.
ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("base", "base encoder (no fine-tuning)", {
        "sampler": "entity", "clipper": {"name": "no_clip"},
        "accountant": {"name": "no_accounting"}, "privacy": {"enabled": False},
        "training": {"steps": 0}}),
    ("nonprivate", "non-private fine-tuning", {
        "sampler": "entity", "clipper": {"name": "no_clip"},
        "accountant": {"name": "no_accounting"}, "privacy": {"enabled": False}}),
    ("entity_standard", "entity-level ε={eps}, standard clipping", {
        "sampler": "entity", "clipper": {"name": "standard_clip", "clip_norm": 1.0},
        "accountant": {"name": "coupled_rdp_standard"}, "privacy": PRIVATE}),
    ("entity_freq", "entity-level ε={eps}, FREQ-CLIP", {
        "sampler": "entity", "clipper": {"name": "freq_clip", "clip_norm": 1.0},
        "accountant": {"name": "coupled_rdp_freq"}, "privacy": PRIVATE}),
    ("edge", "edge-level ε={eps}", {
        "sampler": "edge", "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_rdp"}, "privacy": PRIVATE}),
]

#: Sections whose options differ by row: a ``--set`` there reaches the rows whose section holds
#: the option (``sampler.degree_cap``: entity-level rows; ``clipper.clip_norm``,
#: ``privacy.target_epsilon``: private rows). Every other ``--set`` reaches every row.
ROW_SECTIONS = ("sampler", "clipper", "accountant", "privacy")

def _holds(raw: Mapping[str, Any], section: str, option: str) -> bool:
    """Whether a ``--set section.option`` reaches this row (see :data:`ROW_SECTIONS`)."""
    if section not in ROW_SECTIONS or not isinstance(raw.get(section), dict):
        return True
    if section == "privacy" and raw["privacy"].get("enabled", True):
        return True  # every privacy option (delta, unit, ...) belongs to the private rows
    return option in raw[section]


#: --quick: a handful of steps on a small graph, to check the wiring in seconds.
QUICK: dict[str, dict[str, Any]] = {
    "cora-features": {"training": {"steps": 3}, "data": {"max_entities": 600}},
    "citeseer-minilm-lora": {
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 16, "lora_layers": 1},
        "training": {"steps": 3}, "data": {"max_entities": 600}},
}
QUICK_BATCH_SIZE = 32


def demo_configs(quick: bool = False, root: Path | None = None, progress: bool = True,
                 base: dict[str, Any] | None = None, sampler: dict[str, Any] | None = None,
                 target_epsilon: float = TARGET_EPSILON, overrides: Sequence[str] = (),
                 setting: str = DEFAULT_SETTING) -> list[tuple[str, RunConfig]]:
    """The relational demo's run configs, in table order (also used by bench/utility.py).

    :param base: shared settings replacing the setting's own.
    :param sampler: options applied to every row's sampler (``degree_cap`` only where it applies).
    :param target_epsilon: ε of the private rows.
    :param overrides: ``--set KEY=VALUE`` texts (the run command's syntax), applied to every row
        after the demo's own settings (see :data:`ROW_SECTIONS`); the base row keeps 0 steps.
    :param setting: a key of :data:`SETTINGS`.
    :raises ConfigError: for an unknown setting, a malformed override, one that reaches no row,
        or a row config the override made invalid (naming the row).
    """
    if setting not in SETTINGS:
        raise ConfigError(f"demo --setting {setting!r}: choose one of {', '.join(SETTINGS)}")
    shared_settings, entity_sampler, edge_sampler, _ = SETTINGS[setting]
    shared = copy.deepcopy(base or shared_settings)
    samplers = {"entity": entity_sampler, "edge": edge_sampler}
    if quick:
        shared = merge_config(shared, QUICK[setting])
        sampler = {"batch_size": QUICK_BATCH_SIZE, **(sampler or {})}
    parsed = [(text, *parse_override(text)) for text in overrides]
    reached = {text: 0 for text in overrides}
    configs = []
    for key, label, extra in ROWS:
        raw = merge_config(shared, {**extra, "sampler": samplers[extra["sampler"]]})
        for option, value in (sampler or {}).items():
            if option in raw["sampler"]:
                raw["sampler"][option] = value
        if raw["privacy"].get("enabled", True):
            raw["privacy"] = {"enabled": True, "target_epsilon": target_epsilon}
        # another data source: drop the bundled source's own options (e.g. planetoid's name)
        raw = drop_source_options(raw, [text for text, _, _ in parsed])
        for text, parts, _value in parsed:
            if len(parts) > 1 and not _holds(raw, parts[0], parts[1]):
                continue  # e.g. sampler.degree_cap on the edge-level row
            apply_overrides(raw, [text])
            reached[text] += 1
        if key == "base":
            raw["training"]["steps"] = 0
        raw["name"] = key
        raw["output"] = {**raw.get("output", {}), "progress": progress,
                         **({"dir": str(root / key)} if root else {})}
        cfg = config_from_dict(raw, f"demo row {key!r}")
        if overrides:  # refuse a bad component option now, not after the rows before it ran
            check_components(cfg, f"demo row {key!r}")
        eps = cfg.privacy.target_epsilon
        configs.append((label.format(eps=f"{eps:g}" if eps is not None else "?"), cfg))
    unused = [text for text, count in reached.items() if count == 0]
    if unused:
        raise ConfigError(f"demo --set {unused[0]!r}: no row has that option (row options: "
                          f"{', '.join(ROW_SECTIONS)} sections as each row sets them)")
    return configs


def check_components(cfg: RunConfig, where: str) -> None:
    """Validate each component section's options, and the data source's, against its plugin
    (nothing is built or read)."""
    from graphveil.contract.host import default_host
    from graphveil.data.loaders import check_data_options

    host = default_host()
    check_data_options(cfg.data, host, where=where)
    sections = [("sampler", cfg.sampler), ("clipper", cfg.clipper), ("accountant", cfg.accountant),
                ("task", cfg.task), ("encoder", cfg.network)]
    for family, section in sections:
        host.validate(family, section.name, section.params, where=f"{where}: {family}")


#: The relational demo's table: metrics with their intervals, the paired gain, ε, σ, steps, time.
RELATIONAL_COLUMNS: Columns = [
    ("name", "run", ""), ("prec1", "PREC@1", ".4f"), ("mrr", "MRR", ".4f"),
    ("mrr_ci_text", "MRR 95% CI", ""), ("mrr_delta_text", "ΔMRR vs base [95% paired CI]", ""),
    ("gain_kept", "gain kept", ".0%"), *TAIL_COLUMNS,
]


def paired_row_fields(key: str, ranks: Any, base_ranks: Any, nonprivate_gain: float | None,
                      seed: int) -> dict[str, Any]:
    """A row's paired comparison with the base row: Δ and intervals, as numbers and as text,
    and (private rows) the share of the non-private MRR gain kept."""
    out: dict[str, Any] = {}
    if key != "base":
        out.update(paired_delta(ranks, base_ranks, seed=seed))
        lo, hi = out["mrr_delta_ci"]
        out["mrr_delta_text"] = f"{out['mrr_delta']:+.4f} [{lo:+.4f}, {hi:+.4f}]"
    if nonprivate_gain is not None and key not in ("base", "nonprivate"):
        # no gain to keep when non-private training did not improve on the base: no share
        out["gain_kept"] = out["mrr_delta"] / nonprivate_gain if nonprivate_gain > 0 else None
    return out


def run_demo(quick: bool = False, output: Path | None = None, progress: bool = True,
             task: str = "relational", overrides: Sequence[str] = (),
             setting: str | None = None) -> list[dict[str, Any]]:
    """Run one demo: ``task`` is ``relational`` (this module's rows) or ``node`` (paper 4's GDP
    rows, :mod:`graphveil.apps.demo_node`), on the bundled graph or the one ``--set data.…`` names.

    :param overrides: ``--set KEY=VALUE`` texts applied to every row.
    :param setting: the relational demo's setting (:data:`SETTINGS`); ``None``: picked for the
        graph (:func:`pick_setting`), which is loaded once, before any row runs.
    :raises ConfigError: for a setting that does not fit the graph (naming what the graph has),
        before any row runs; nothing is written.
    """
    if task == "node":
        if setting is not None:
            raise ConfigError("demo --setting: chooses the relational demo's encoder (--task relational); "
                              "the node demo's rows are fixed")
        from graphveil.apps.demo_node import run_node_demo

        return run_node_demo(quick=quick, output=output, progress=progress, overrides=overrides)
    if task != "relational":
        raise ValueError(f"unknown demo task {task!r}; choose 'relational' or 'node'")
    if setting is not None and setting not in SETTINGS:
        raise ConfigError(f"demo --setting {setting!r}: choose one of {', '.join(SETTINGS)}")
    records = MemoryRecordsStore()  # the entity-level rows share one degree-capped Ē, drawn once
    keys = [key for key, _, _ in ROWS]
    ranks: dict[str, Any] = {}
    gains: dict[str, float] = {}
    chosen: dict[str, Any] = {}
    notes: list[str] = []

    def build(root: Path) -> list[tuple[str, RunConfig]]:
        name, graph, configs, why = fit_setting(setting, quick, root, progress, overrides)
        chosen.update(name=name, graph=graph)
        print(f"demo setting: {name} ({why})", flush=True)
        notes.append(f"Setting {name}: {why}.")
        return configs

    def paired(i: int, cfg: RunConfig, result: dict[str, Any]) -> dict[str, Any]:
        key, task_ = keys[i], result["session"].task
        ranks[key] = task_.relation_ranks
        row = result["row"]
        lo, hi = row["mrr_ci"]
        fields = {"run": key, "sigma": row["noise_multiplier"], "mrr_ci_text": f"{lo:.4f}–{hi:.4f}",
                  **paired_row_fields(key, ranks[key], ranks["base"], gains.get("nonprivate"),
                                      cfg.data.split.seed)}
        if "mrr_delta" in fields:
            gains[key] = fields["mrr_delta"]
        if key == "base":
            fields["epsilon"] = None  # the public model, trained on nothing: no mechanism ran, "-"
        return fields

    name = "demo" if setting in (None, DEFAULT_SETTING) else f"demo-{setting}"
    return run_comparison(
        lambda: f"GraphVeil demo (relational, {chosen['name']})", build,
        output=output, default_name=f"{name}-quick" if quick else name,
        load=lambda _cfg: chosen["graph"], columns=lambda _result: RELATIONAL_COLUMNS,
        records_store=records, caption=lambda: demo_caption(chosen["name"], list(overrides)),
        row_result=paired, notes=notes)


#: What each setting's encoder reads from the entities: ``features`` or ``texts``.
READS = {"cora-features": "features", "citeseer-minilm-lora": "texts"}


def graph_has(graph: Any) -> str:
    """What a relational graph's entities carry, for messages: ``entity texts and features``, …"""
    kinds = [k for k, v in (("texts", graph.texts), ("features", graph.features)) if v is not None]
    if not kinds:
        return "neither entity texts nor entity features"
    return "entity " + " and ".join(kinds) + ("" if len(kinds) == 2 else
                                             f", no {'features' if kinds == ['texts'] else 'texts'}")


def pick_setting(graph: Any) -> tuple[str, str]:
    """The setting whose encoder reads what ``graph`` has: features → ``cora-features`` (a weight
    per feature), texts and no features → ``citeseer-minilm-lora`` (MiniLM + LoRA), and why.

    :raises ConfigError: if the entities carry neither.
    """
    has = graph_has(graph)
    if graph.features is not None:
        return "cora-features", f"picked for graph {graph.name!r}: {has}"
    if graph.texts is not None:
        return "citeseer-minilm-lora", f"picked for graph {graph.name!r}: {has}"
    raise ConfigError(f"demo: graph {graph.name!r} has {has}; the relational demo's encoders read one "
                      f"of them (data.text_col for texts; data.features_col, data.feature_cols or "
                      f"data.features_table for features)")


def encoder_reads(cfg: RunConfig) -> str:
    """``features`` if the row's encoder reads entity features (``encoder.model: features``),
    else ``texts`` (a text model)."""
    return "features" if cfg.network.params.get("model") == "features" else "texts"


def fit_setting(setting: str | None, quick: bool, root: Path | None, progress: bool,
                overrides: Sequence[str]) -> tuple[str, Any, list[tuple[str, RunConfig]], str]:
    """``(setting, graph, rows, why)``: the graph the rows read, loaded once, and the rows of
    ``setting`` or (``None``) of the setting :func:`pick_setting` picks for it.

    :raises ConfigError: if a row's encoder reads what the graph lacks (naming the setting, the
        encoder and what the graph has), before any row runs.
    """
    from graphveil.data import load_graph

    first = setting or DEFAULT_SETTING
    configs = demo_configs(quick, root, progress, overrides=overrides, setting=first)
    data = configs[0][1].data
    graph = load_graph(data)
    name, why = (setting, "chosen with --setting") if setting else pick_setting(graph)
    log.info("demo setting: %s (%s)", name, why)
    if name != first:
        configs = demo_configs(quick, root, progress, overrides=overrides, setting=name)
        if configs[0][1].data != data:  # same under --set data.source; else the setting's own graph
            graph = load_graph(configs[0][1].data)
    for _, cfg in configs:
        reads = encoder_reads(cfg)
        if getattr(graph, reads) is None:
            other = next(s for s, r in READS.items() if r != reads)
            what = f"demo --setting {name}" if setting else f"demo setting {name} ({why})"
            raise ConfigError(
                f"{what}: its encoder ({cfg.network.name}, model {cfg.network.params.get('model')!r}) "
                f"reads entity {reads}, but graph {graph.name!r} has {graph_has(graph)}; use --setting "
                f"{other}, or leave --setting out to pick by the graph")
    return name, graph, configs, why


def demo_caption(setting: str, overrides: list[str] | None) -> str:
    """The setting's caption; with ``--set data.…`` the bundled graph it names is not the one
    used, so the caption names the setting and the overrides instead."""
    if not overrides:
        return SETTINGS[setting][3]
    if any(item.startswith("data.") for item in overrides):
        return (f"zero-shot relation prediction on held-out entities ({setting} settings) — with --set "
                + " ".join(overrides))
    return SETTINGS[setting][3] + " — with --set " + " ".join(overrides)
