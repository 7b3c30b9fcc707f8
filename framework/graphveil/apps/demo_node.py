"""``graphveil demo --task node``: paper 4's GDP methods on the bundled Cora, in minutes.

``--set data.…`` runs the same rows on the owner's node graph (a ``pyg`` Data with ``x`` and
``y``; ``edge_list`` / ``parquet`` / ``sql`` with feature columns and ``data.label_col``): the
rows' ``random_node`` split needs no masks, and the graph is checked once before any row runs
(:func:`check_node_graph`).

Rows are ``bench/gdp.py``'s Table 2 rows (same example configs, same overrides: units, dropout,
DPDGC's ``noise_scale``), each run once as that benchmark's seed-0 cell
(:func:`~graphveil.run.runner.sweep_cell`: seed 0 sets sampling, the split key and initialisation),
so every row trains and tests on the same split. DP noise comes from the OS CSPRNG, so two demo
runs differ in their noise. To fit in ten minutes on 2 CPU cores the node-level rows train fewer
epochs than the benchmark, at a larger learning rate (:func:`faster`); the table's last column
says so, and σ is calibrated to the shorter run (same ε). One row is one line of :data:`ROWS`.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.units import PrivacyUnit, UnitKind
from graphveil.run.config import (
    RunConfig,
    apply_overrides,
    config_from_dict,
    drop_source_options,
    parse_override,
)
from graphveil.run.runner import planned_unit, sweep_cell
from graphveil.run.session import TrainingSession

_SPLIT = {"kind": "random_node", "val_fraction": 0.1, "test_fraction": 0.15, "seed": 0}
_DATA = {"source": "planetoid", "name": "cora", "split": _SPLIT}
_PER_NODE_DP_SGD = {"sampler": {"name": "node_uniform_wor", "batch_size": 64},
                    "clipper": {"name": "per_node_clip", "clip_norm": 1.0},
                    "accountant": {"name": "node_rdp"},
                    "training": {"epochs": 100, "optimizer": "adam", "lr": 0.001}}
_STAGE = {"epochs": 100, "batch_size": 64, "lr": 0.001, "clip_norm": 1.0}

#: examples/dp_mlp_cora.yaml, gap_cora.yaml, dpdgc_cora.yaml and dp_sage_cora.yaml without their sweeps
MLP: dict[str, Any] = {
    "name": "mlp", "data": _DATA, "task": {"name": "node_classification"},
    "model": {"name": "mlp", "hidden": 64, "layers": 3, "activation": "selu", "dropout": 0.0},
    **_PER_NODE_DP_SGD, "privacy": {"target_epsilon": 16}}
GAP: dict[str, Any] = {
    "name": "gap", "data": _DATA,
    "method": {"name": "gap", "hops": 2, "hidden": 64, "encoder_layers": 2, "encoder_training": _STAGE},
    "task": {"name": "node_classification", "features": "released:gap_aggregates"},
    "model": {"name": "mlp", "hidden": 64, "layers": 2, "activation": "selu", "dropout": 0.0},
    **_PER_NODE_DP_SGD, "privacy": {"target_epsilon": 16, "unit": "node/replacement/D=168/predictions"}}
DPDGC: dict[str, Any] = {
    "name": "dpdgc", "data": _DATA,
    "method": {"name": "dpdgc", "hidden": 64, "row_norm": 1.0, "noise_scale": 1000,
               "embedding_training": {**_STAGE, "epochs": 1, "batch_size": 2030}},
    "task": {"name": "node_classification", "features": "released:dpdgc_embedding"},
    "model": {"name": "linkx", "hidden": 64, "layers": 2, "embedding_width": 64, "dropout": 0.0},
    **_PER_NODE_DP_SGD, "privacy": {"target_epsilon": 16, "unit": "node/replacement/D=168/predictions"}}
DP_SAGE: dict[str, Any] = {
    "name": "dp-sage", "data": _DATA,
    "method": {"name": "dp_sage", "output_clip": 1.0, "output_noise_scale": 1.0},
    "task": {"name": "rooted_node_classification", "predictions": "released:dp_sage_outputs"},
    "model": {"name": "sage", "hidden": 64, "layers": 1, "activation": "selu"},
    "sampler": {"name": "root_subgraphs", "batch_size": 64, "num_hops": 1},
    "clipper": {"name": "per_node_clip", "clip_norm": 1.0}, "accountant": {"name": "rooted_rdp"},
    "training": {"epochs": 100, "optimizer": "adam", "lr": 0.001},
    "privacy": {"target_epsilon": 16, "unit": "node/replacement/D=168/predictions"}}

# bench/gdp.py's overrides
EDGE = "privacy.unit=edge/replacement/predictions"
NODE = "privacy.unit=node/replacement/D=168/predictions"
DROPOUT = "model.dropout=0.5"
FULL_BATCH = [DROPOUT, "sampler.batch_size=null"]
GAP_DROPOUT = "method.encoder_dropout=0.5"
NODE_DPEMB = ["method.noise_scale=1000", "method.embedding_training.epochs=1"]
#: DP-Emb without the node-level group (non-private, edge level): 100 epochs at σ
EMB_FULL = ["method.noise_scale=1", "method.embedding_training.epochs=100"]

#: the stages whose DP-SGD the demo shortens, by override prefix: the table names them so
STAGES = {"training": "classifier", "method.encoder_training": "encoder", "method.embedding_training": "DP-Emb"}


def faster(*stages: str, epochs: int = 20, lr: float = 3e-3) -> list[str]:
    """Fewer epochs for each DP-SGD stage (bench: 100), with a larger learning rate (bench: 1e-3)
    so that the shorter run still trains; σ is calibrated to the fewer steps at the same ε."""
    return [f"{stage}.{key}={value}" for stage in stages for key, value in (("epochs", epochs), ("lr", lr))]


@dataclass(frozen=True)
class NodeRow:
    """One demo row: a ``bench/gdp.py`` row (base config, overrides, ε or None for non-private)
    and the demo's own ``changes`` to it (overrides, named in the table)."""

    setting: str
    method: str
    base: dict[str, Any]
    overrides: list[str]
    epsilon: float | None
    changes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.setting} {self.method}"

    @property
    def key(self) -> str:
        return "-".join(self.label.replace("ε=", "eps").replace("-", "").lower().split())


#: Measured on 2 shared CPU cores: the non-private and edge-level rows at the benchmark's
#: settings take 30-60 s each; the node-level rows (3172 DP-SGD steps per stage at 100 epochs)
#: 140-600 s each, so they train 20 epochs per stage at lr 3e-3.
ROWS: list[NodeRow] = [
    NodeRow("non-private", "MLP", MLP, FULL_BATCH, None),
    NodeRow("non-private", "GAP", GAP, [*FULL_BATCH, GAP_DROPOUT], None),
    NodeRow("non-private", "DPDGC", DPDGC, [*FULL_BATCH, *EMB_FULL], None),
    NodeRow("edge ε=1", "GAP", GAP, [EDGE, DROPOUT, GAP_DROPOUT], 1.0),
    NodeRow("edge ε=1", "DPDGC", DPDGC, [EDGE, *FULL_BATCH, *EMB_FULL], 1.0),
    NodeRow("node ε=16", "DP-MLP", MLP, [], 16.0, faster("training")),
    NodeRow("node ε=16", "GAP", GAP, [NODE], 16.0, faster("method.encoder_training", "training")),
    NodeRow("node ε=16", "DPDGC", DPDGC, [NODE, *NODE_DPEMB], 16.0, faster("training")),
    NodeRow("node ε=16", "DP-SAGE", DP_SAGE, [], 16.0, faster("training", epochs=10)),
]

#: --quick: one epoch for every stage, to check the wiring in seconds
QUICK = ["training.epochs=1", "method.encoder_training.epochs=1", "method.embedding_training.epochs=1"]

SEED = 0

COLUMNS = [("name", "run", ""), ("unit", "unit", ""), ("test_accuracy", "test acc", ".2%"),
           ("majority_accuracy", "majority class", ".2%"), ("epsilon", "ε spent", ".3f"),
           ("noise_multiplier", "σ", ".3g"), ("seconds", "time (s)", ".0f"),
           ("changes", "changed vs bench/gdp.py", "")]


def _applies(raw: dict[str, Any], override: str) -> bool:
    """Whether the section an override sets exists in ``raw`` (a GAP stage is not in an MLP)."""
    node: Any = raw
    for part in override.split("=", 1)[0].split(".")[:-1]:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return isinstance(node, dict)


def _value(raw: dict[str, Any], path: str) -> Any:
    node: Any = raw
    for part in path.split("."):
        node = node[part]
    return node


def changes_text(changes: list[str], raw: dict[str, Any]) -> str:
    """``encoder + classifier: epochs 100→20, lr 0.001→0.003``: ``changes`` to the benchmark's
    ``raw`` config, grouped by stage (stages with the same changes share a group)."""
    by_stage: dict[str, list[str]] = {}
    for override in changes:
        path, value = override.split("=", 1)
        stage, _, key = path.rpartition(".")
        old = _value(raw, path)
        by_stage.setdefault(STAGES.get(stage, stage), []).append(f"{key} {old:g}→{float(value):g}")
    groups: dict[str, list[str]] = {}
    for stage, parts in by_stage.items():
        groups.setdefault(", ".join(parts), []).append(stage)
    return "; ".join(f"{' + '.join(stages)}: {text}" for text, stages in groups.items()) or "–"


def with_overrides(raw: dict[str, Any], overrides: Sequence[str], reached: dict[str, int]) -> None:
    """Apply the ``--set`` texts to one row's ``raw`` config where their section exists (a
    ``method.…`` reaches the GAP and DPDGC rows, not the MLP's), counting the rows each reached.
    ``data.source`` drops the bundled source's own options (planetoid's ``name``) first."""
    raw.update(drop_source_options(raw, list(overrides)))
    for text in overrides:
        if _applies(raw, text):
            apply_overrides(raw, [text])
            reached[text] += 1


def node_demo_configs(quick: bool = False, root: Path | None = None, progress: bool = True,
                      host: Any = None, overrides: Sequence[str] = ()) -> list[tuple[str, RunConfig, str]]:
    """``(label, config, changes)`` of every row, in table order.

    The third item names the demo's changes to the benchmark's cell (or ``quick``).

    :param overrides: ``--set KEY=VALUE`` texts, applied to every row whose config has the
        section (:func:`with_overrides`) after the demo's own changes, e.g. ``data.source=pyg``.
    :raises ConfigError: for a malformed override, one that reaches no row, or a row config it
        made invalid (naming the row), before any row runs.
    """
    from graphveil.contract.host import default_host

    host = host or default_host()
    for text in overrides:
        parse_override(text)  # a malformed one is refused before any row is built
    reached = dict.fromkeys(overrides, 0)
    out = []
    for row in ROWS:
        bench = apply_overrides(copy.deepcopy(row.base), list(row.overrides))
        changes = [o for o in QUICK if _applies(bench, o)] if quick else row.changes
        raw = apply_overrides(copy.deepcopy(bench), changes)
        with_overrides(raw, overrides, reached)
        raw["name"] = row.key
        where = f"demo row {row.label!r}"
        cfg = sweep_cell(config_from_dict(raw, where), row.epsilon, SEED, root or Path("."), host)
        cfg.name = row.key
        cfg.output.progress = progress
        cfg.output.dir = root / row.key if root else None
        if overrides:  # a bad component option is refused now, not after the rows before it ran
            try:
                TrainingSession(cfg, host=host).assemble()
            except ConfigError as exc:  # a data option's message names the row already (its origin)
                message = str(exc) if str(exc).startswith(f"{where}: ") else f"{where}: {exc}"
                raise ConfigError(message) from exc
        out.append((row.label, cfg, "quick: 1 epoch per stage" if quick else changes_text(row.changes, bench)))
    unused = [text for text, count in reached.items() if count == 0]
    if unused:
        raise ConfigError(f"demo --task node --set {unused[0]!r}: no row has that section")
    return out


def check_node_graph(graph: Any, cfg: RunConfig, units: Sequence[tuple[str, str]] = ()) -> None:
    """The node demo's graph: node features and labels, with a split (``cfg.data.split``) whose
    training side holds at least two classes, and (node-level rows, ``units``: (row label, unit))
    no node of out-degree above the row's D; checked once, before any row runs.

    :raises ConfigError: for a graph without node features and labels (naming the options that
        give them).
    :raises DataError: for too few labelled nodes or classes (naming the graph and the counts),
        or a node-level row's D below the graph's largest out-degree (naming the rows).
    """
    from graphveil.data import NodeGraph, planetoid_full_split, random_node_split

    if not isinstance(graph, NodeGraph):
        raise ConfigError(
            f"demo --task node: data.source {cfg.data.source!r} gave a relational graph ({graph!r}), "
            f"not a node graph; node classification needs node features and labels: a pyg Data with "
            f"x and y, or data.features_col / data.feature_cols / data.features_table with data.label_col")
    split = cfg.data.split
    if split.kind == "planetoid_full":
        sides = planetoid_full_split(graph)
    else:
        sides = random_node_split(graph, split.val_fraction, split.test_fraction, split.seed)
    classes = torch.unique(graph.y[sides.train]).numel()
    if classes < 2:
        raise DataError(
            f"demo --task node: graph {graph.name!r} has {int(graph.labelled.sum())} labelled nodes; "
            f"the {split.kind} split trains on {sides.train.numel()} of them, of {classes} class "
            f"(node classification needs at least two); label more nodes")
    # paper 4's node-level guarantee holds between graphs of out-degree <= D; the GDP methods
    # refuse a larger one when their row starts: say so before the first row runs
    largest = int(graph.degrees().max()) if graph.num_nodes else 0
    above = [(label, unit) for label, text in units
             if (unit := PrivacyUnit.parse(text)).kind is UnitKind.NODE
             and unit.degree_bound is not None and unit.degree_bound < largest]
    if above:
        raise DataError(
            f"demo --task node: graph {graph.name!r} has nodes of out-degree up to {largest}, above the "
            f"degree bound of the node-level rows {', '.join(repr(label) for label, _ in above)} "
            f"(D={above[0][1].degree_bound}, bench/gdp.py's bound for Cora); paper 4's node-level "
            f"guarantee holds between graphs of out-degree <= D: cap the degrees in your data, or run "
            f"those methods alone with graphveil run and privacy.unit node/replacement/D=<D>/predictions")


def run_node_demo(quick: bool = False, output: Path | None = None, progress: bool = True,
                  overrides: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Run :data:`ROWS` on the bundled Cora, or the graph ``overrides`` name (``--set data.…``);
    results, ``table.txt`` and ``table.md`` in ``output``."""
    from graphveil.apps.comparison import run_comparison
    from graphveil.contract.host import default_host
    from graphveil.data import load_data

    host = default_host()
    changes: list[str] = []
    units: list[str] = []
    names: list[str] = []

    def build(root: Path) -> list[tuple[str, RunConfig]]:
        configs = node_demo_configs(quick, root, progress, host, overrides)
        changes.extend(text for _, _, text in configs)
        # every row states its guarantee: the unit its privacy.json reports (– without privacy)
        units.extend(planned_unit(cfg, host) or "–" for _, cfg, _ in configs)
        return [(label, cfg) for label, cfg, _ in configs]

    def load(cfg: RunConfig) -> Any:
        graph = load_data(cfg.data, host)
        check_node_graph(graph, cfg, [(row.label, unit) for row, unit in zip(ROWS, units, strict=True)
                                      if unit != "–"])
        names.append(graph.name)
        return graph

    def caption() -> str:
        on = "bundled Cora" if not overrides else f"graph {names[0]!r}"
        sets = " — with --set " + " ".join(overrides) if overrides else ""
        return f"node classification on {on}, test accuracy on one keyed split (seed 0){sets}"

    return run_comparison(
        "GraphVeil demo (node classification, paper 4's GDP methods)", build,
        output=output, default_name="demo-node-quick" if quick else "demo-node",
        load=load, columns=lambda _result: COLUMNS,
        row_extra=lambda i, _cfg: {"unit": units[i], "changes": changes[i]},
        caption=caption,
        notes=["Rows are bench/gdp.py's (paper 4, Table 2) seed-0 cells; σ is calibrated to each "
               "row's own number of steps.",
               "Majority class: share of test nodes in the training set's most frequent class."])
