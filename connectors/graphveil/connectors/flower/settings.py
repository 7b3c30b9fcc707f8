"""The federation's run config, a site's node config, and each site's effective run config and policy.

The run config (``[tool.flwr.app.config]``) has two parts:

* federation keys (dashed, Flower style): ``num-server-rounds``, ``local-steps``, ``strategy``,
  ``min-sites``, ... (:class:`FederationSettings`);
* ``task.*``: the shared sections of a GraphVeil :class:`~graphveil.run.config.RunConfig` —
  sampler, clipper, accountant, encoder, training, privacy, evaluation — written as dotted
  keys (``task.encoder.model = "tiny-bert"``), so ``flwr run --run-config`` can override any
  of them. ``data`` is never part of the task: each site names its own graph in its node
  config.

A site's node config (``flower-supernode --node-config``, :class:`SiteSettings`) names its
graph, budget, ledger and privacy policy; ``graphveil fed site`` checks it before Flower starts
and the ClientApp reads it with the same model.

A site's run config is the task, then the site's optional ``site-config`` YAML on top, then
its data and δ from the node config (:func:`site_run_config`). Before it reads any data, a site
checks the task against its own privacy policy (:func:`check_site_policy`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import secrets
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from graphveil.contract.errors import ConfigError
from graphveil.contract.options import format_validation_error
from graphveil.run.config import (
    PositiveFinite,
    Probability,
    RunConfig,
    config_from_dict,
    merge_config,
    set_dotted,
)

TASK_PREFIX = "task."
#: Placeholder graph used only to validate the task on the server (no data is read).
_PLACEHOLDER_DATA = {"source": "citeseer"}


class FederationSettings(BaseModel):
    """Federation keys of the app's run config."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_server_rounds: int = Field(2, ge=1, alias="num-server-rounds", description="Rounds of the federation.")
    local_steps: int = Field(5, ge=1, alias="local-steps", description="DP steps each site runs per round.")
    strategy: Literal["fedavg", "fedadam"] = Field("fedavg", description="Server aggregation of the adapters.")
    min_sites: int = Field(2, ge=1, alias="min-sites", description="Wait for this many connected sites before a round.")
    fraction_train: float = Field(1.0, gt=0, le=1, alias="fraction-train", description="Share of connected sites asked per round.")
    round_timeout: float = Field(3600.0, gt=0, alias="round-timeout", description="Seconds to wait for the sites' replies.")
    sites_timeout: float = Field(
        600.0, gt=0, alias="sites-timeout",
        description="Seconds a round waits for min-sites connected sites; then the run fails.")
    server_lr: float = Field(0.01, gt=0, alias="server-lr", description="FedAdam server learning rate η.")
    server_tau: float = Field(1e-3, gt=0, alias="server-tau", description="FedAdam adaptivity τ.")
    output_dir: str = Field("graphveil-fed", alias="output-dir", description="Where the server writes the adapter and round log.")
    ledger_witness: str | None = Field(
        None, alias="ledger-witness", min_length=1,
        description="The server's record of every site's ledger heads (JSON lines, kept across runs: a "
                    "site whose ledger goes backwards or forks is refused); default: "
                    "<output-dir>/ledger-witness.jsonl.")
    seed: int = Field(0, description="Seed of the server's initial adapter.")
    task: dict[str, Any] = Field(default_factory=dict, description="Shared RunConfig sections (no data).")

    @classmethod
    def from_run_config(cls, run_config: Mapping[str, Any], source: str = "run config") -> FederationSettings:
        """Validate a flat Flower run config; errors name the key and the value."""
        flat: dict[str, Any] = {}
        task: dict[str, Any] = {}
        for key, value in run_config.items():
            if key.startswith(TASK_PREFIX):
                _set_dotted(task, key[len(TASK_PREFIX):], value, source)
            else:
                flat[key] = value
        if "data" in task:
            raise ConfigError(f"{source}: task.data: the data is the site's; set data-path in the SuperNode's node config")
        try:
            settings = cls.model_validate({**flat, "task": task})
        except ValidationError as exc:
            known = [*sorted(f.alias or n for n, f in cls.model_fields.items() if n != "task"), "task.*"]
            raise ConfigError(format_validation_error(source, exc, model=cls, known=known, noun="key")) from exc
        settings.check_task(source)
        return settings

    @property
    def ledger_witness_path(self) -> Path:
        """The witness file: ``ledger-witness``, or ``ledger-witness.jsonl`` in the output folder
        (outside the per-run folders, so every run with this output folder shares it)."""
        if self.ledger_witness is not None:
            return Path(self.ledger_witness)
        return Path(self.output_dir) / "ledger-witness.jsonl"

    def check_task(self, source: str = "run config") -> RunConfig:
        """Validate the task as a RunConfig on a placeholder graph (no data is read)."""
        return config_from_dict({**copy.deepcopy(self.task), "data": _PLACEHOLDER_DATA}, f"{source} (task.*)")

    def to_run_config(self) -> dict[str, Any]:
        """The flat ``[tool.flwr.app.config]`` form (inverse of :meth:`from_run_config`)."""
        out = {
            (info.alias or name): getattr(self, name)
            for name, info in type(self).model_fields.items() if name != "task"
        }
        out.update({f"{TASK_PREFIX}{k}": v for k, v in _flatten(self.task).items()})
        return out


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    try:
        set_dotted(tree, dotted.split("."), value)
    except ValueError as exc:
        raise ConfigError(f"{source}: task.{dotted}: {exc}") from exc


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys (``{"a": {"b": 1}}`` → ``{"a.b": 1}``): TOML tables, ``task.*``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# ------------------------------------------------------------------------------ a site's node config


#: The built-in accountants of each privacy unit (a site's default ``accountants``) of a
#: relational site.
BUILTIN_ACCOUNTANTS: dict[str, tuple[str, ...]] = {
    "node": ("coupled_rdp", "coupled_rdp_freq", "coupled_rdp_standard"),
    "edge": ("edge_rdp",),
}
#: The built-in accountants of a node-classification site (every GDP level): per-node DP-SGD on
#: row-wise models (DP-MLP, GAP's classifier) and DP-SAGE's rooted subgraphs.
NODE_TASK_ACCOUNTANTS: tuple[str, ...] = ("node_rdp", "rooted_rdp")
#: The built-in accountants of a node-classification site whose ``release-scope`` is ``weights``:
#: DP-GCN's split accountant, the one analysing a weights-only GDP unit (the accountants above
#: analyse units covering predictions and are refused there by their units).
WEIGHTS_SCOPE_ACCOUNTANTS: tuple[str, ...] = ("split_rdp",)
#: Task kinds a site runs: relational fine-tuning (an ``encoder`` task) or node classification
#: (a ``model`` task: a GNN or MLP on node features), by the task's model family.
TASK_KINDS = {"relational": "encoder", "node_classification": "model"}
#: Paper 4's GDP levels from weakest to strongest: a node-classification site refuses a task at
#: a weaker level than its own (one directed entry < both entries of an undirected edge < one
#: node's features, label and k adjacency entries < the whole node under the degree bound D).
GDP_LEVELS: tuple[str, ...] = ("edge", "undirected_edge", "k_neighbor", "node")
#: σ floor of a site that sets no ``min-noise-multiplier``.
DEFAULT_MIN_NOISE_MULTIPLIER = 0.5
#: Local steps per round of a site that sets no ``max-steps-per-round``.
DEFAULT_MAX_STEPS_PER_ROUND = 100
#: K of a node-level site that sets no ``degree-cap`` (paper 1's default).
DEFAULT_DEGREE_CAP = 5
#: Largest magnitude of a server array value a site accepts by default: far above trained
#: adapters and heads, far below what overflows float32 activations of unit-norm inputs.
DEFAULT_MAX_ABS_WEIGHT = 1e4
#: Clip norms C a site accepts by default (σ·C must stay a sane float).
DEFAULT_CLIP_NORM_RANGE = (1e-4, 1e3)
#: Task keys that change the numerics of the site's forward pass: a task may set them only to
#: their defaults here, or to the value the site's own ``site-config`` pins.
NUMERICS_DEFAULTS = {"encoder.normalize": True}


class SiteSettings(BaseModel):
    """What a data owner sets for its SuperNode (``--node-config site.toml``).

    Keys use Flower's dashed style. Of these, only ``site-name``, ``epsilon-budget`` and ``delta``
    are ever reported to the server (see deploy/RUNBOOK.md, "What leaves the site").

    The site's privacy *policy* is part of it: ``delta``, ``privacy-unit`` (with ``degree-bound``,
    ``k-neighbors`` and ``release-scope`` for node classification), ``accountants``,
    ``min-noise-multiplier``, ``max-steps-per-round`` (and the rule that a task never pins a
    seed or the noise source). The ClientApp refuses a task that differs before any data is
    read (:func:`check_site_policy`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    site_name: str = Field(alias="site-name", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                           description="Name the site reports to the server.")
    data_source: Literal["edge_list", "parquet", "sql", "citeseer_tape", "pyg", "citeseer"] = Field(
        "edge_list", alias="data-source", description="Loader for the site's graph (see data.source).")
    data_path: Path | None = Field(None, alias="data-path",
                                   description="Edge file (edge_list), relation table (parquet), folder (citeseer_tape) or .pt file (pyg).")
    data_entities: Path | None = Field(None, alias="data-entities", description="Entity table (edge_list, parquet).")
    data_source_col: str | None = Field(None, alias="data-source-col", min_length=1, description=(
        "edge_list: edge-file header column of a relation's first entity id (with data-target-col); "
        "default: a recognised header pair such as source/target (data.source_col)."))
    data_target_col: str | None = Field(None, alias="data-target-col", min_length=1, description=(
        "edge_list: edge-file header column of a relation's second entity id (data.target_col)."))
    data_id_col: str | None = Field(None, alias="data-id-col", min_length=1, description=(
        "edge_list: entity-table column (JSONL: key) of the entity id; default 'id' (data.id_col)."))
    data_text_col: str | None = Field(None, alias="data-text-col", min_length=1, description=(
        "edge_list: entity-table column (JSONL: key) of the entity text; default 'text' (data.text_col)."))
    data_url: str | None = Field(None, alias="data-url", min_length=1, description=(
        "sql: database URL without a password (data.url), e.g. postgresql+psycopg://site@db:5432/graph."))
    data_password_env: str | None = Field(None, alias="data-password-env", min_length=1, description=(
        "sql: environment variable of the SuperNode holding the database password (data.password_env)."))
    data_password_file: Path | None = Field(None, alias="data-password-file", description=(
        "sql: file on the site holding only the database password (data.password_file)."))
    data_entities_table: str | None = Field(None, alias="data-entities-table", min_length=1,
                                            description="sql: entity table (data.entities_table).")
    data_entities_query: str | None = Field(None, alias="data-entities-query", min_length=1,
                                            description="sql: SELECT giving the entities (data.entities_query).")
    data_relations_table: str | None = Field(None, alias="data-relations-table", min_length=1,
                                             description="sql: relation table (data.relations_table).")
    data_relations_query: str | None = Field(None, alias="data-relations-query", min_length=1,
                                             description="sql: SELECT giving the relations (data.relations_query).")
    epsilon_budget: PositiveFinite = Field(alias="epsilon-budget",
                                  description="Total ε this site will ever release, across rounds and runs.")
    delta: Probability = Field(
        description="δ of the budget (required; the site's, whatever the task says): keep it well below "
                    "1/(number of your entities or relations).")
    privacy_unit: Literal["node", "edge", "k_neighbor", "undirected_edge"] = Field(
        alias="privacy-unit", description=(
            "What this site protects. Relational tasks: one entity with its relations (node, add/remove) or "
            "one relation (edge). Node classification: paper 4's graph DP level (replacement, predictions "
            "covered): one node under degree-bound D (node), one node's features, label and k-neighbors "
            "adjacency entries (k_neighbor), one undirected edge (undirected_edge) or one directed entry (edge)."))
    task_kind: Literal["relational", "node_classification"] = Field(
        "relational", alias="task-kind",
        description="The tasks this site runs on its graph: relational fine-tuning, or node classification "
                    "(DP-MLP, GAP, ... on a graph with node features and labels); any other task is refused.")
    release_scope: Literal["predictions", "weights"] = Field(
        "predictions", alias="release-scope",
        description="task-kind node_classification: what the site's guarantee covers. 'predictions' "
                    "(default): the weights and every node's prediction (paper 4's Def. 4.2); 'weights': "
                    "the released weights only (the unit lacks /predictions), which lets the site run "
                    "DP-GCN (paper 3: its predictions read raw neighbours) and refuses the methods "
                    "analysed with predictions. The ledger is bound to the scope; a task cannot set it.")
    degree_bound: int | None = Field(
        None, ge=1, alias="degree-bound",
        description="task-kind node_classification, privacy-unit node (required) or k_neighbor: the "
                    "out-degree bound D of the guarantee (paper 4), public; a task asking another D is refused.")
    k_neighbors: int | None = Field(
        None, ge=1, alias="k-neighbors",
        description="task-kind node_classification, privacy-unit k_neighbor (required): k, the adjacency "
                    "entries of one node the guarantee covers; a task asking a smaller k is refused.")
    accountants: tuple[str, ...] | None = Field(
        None, description="Accountants this site accepts (comma-separated names); default: the built-in "
                          "accountants of its privacy unit.")
    ledger: Path = Field(description="The site's privacy ledger (SQLite), kept across runs.")
    ledger_anchor: Path | None = Field(
        None, alias="ledger-anchor",
        description="File on ANOTHER volume than the ledger where the ledger's head (row count, hash) is "
                    "written after every entry; a ledger restored from a backup or replaced is then refused.")
    prepared_cache: str | None = Field(
        None, alias="prepared-cache", min_length=1,
        description="Folder where the site keeps set-up it would otherwise redo every round (a LoRA "
                    "encoder's frozen-layer states of its entity texts; graphveil.run.prepared_cache): an "
                    "absolute path, or 'off'; default: '<ledger>.prepared' next to the ledger.")
    site_config: Path | None = Field(None, alias="site-config",
                                     description="Optional YAML overriding sections of the run's task (e.g. data.split).")
    min_noise_multiplier: PositiveFinite = Field(
        DEFAULT_MIN_NOISE_MULTIPLIER, alias="min-noise-multiplier", description="Refuse rounds asking for a smaller σ.")
    max_steps_per_round: int = Field(
        DEFAULT_MAX_STEPS_PER_ROUND, ge=1, alias="max-steps-per-round",
        description="Refuse rounds asking for more local DP steps.")
    min_records: int | None = Field(
        None, ge=1, alias="min-records",
        description="privacy-unit edge (required there): a PUBLIC lower bound on your number of training "
                    "relations. The site samples at b/max(m, min-records) and accounts b/min-records, so ε "
                    "and every reply are functions of public numbers only (RUNBOOK §5).")
    degree_cap: int = Field(
        DEFAULT_DEGREE_CAP, ge=1, alias="degree-cap",
        description="privacy-unit node: the degree cap K that defines the capped relation set Ē; a task "
                    "that asks for another K is refused (one Ē per ledger).")
    max_abs_weight: PositiveFinite = Field(
        DEFAULT_MAX_ABS_WEIGHT, alias="max-abs-weight",
        description="Refuse server arrays with any value of magnitude above this (before any data is read).")
    min_clip_norm: PositiveFinite = Field(
        DEFAULT_CLIP_NORM_RANGE[0], alias="min-clip-norm", description="Refuse tasks clipping below this C.")
    max_clip_norm: PositiveFinite = Field(
        DEFAULT_CLIP_NORM_RANGE[1], alias="max-clip-norm", description="Refuse tasks clipping above this C.")
    share_utility_metrics: bool = Field(
        False, alias="share-utility-metrics",
        description="Report held-out MRR and PREC@1 to the server (NOT privatized; off by default).")
    share_epsilon: bool = Field(
        False, alias="share-epsilon",
        description="Report ε spent (and the ε a refused round would reach) to the server; ε depends on "
                    "the sampling rate b/|Ē| (NOT privatized; off by default).")
    seed: int | None = Field(None, description="Reproducible per-round seeds (testing); default: fresh OS randomness.")
    threads: int | None = Field(None, gt=0, description="torch threads for local training.")
    approved_apps: str | None = Field(
        None, alias="approved-apps",
        description="FAB SHA-256 hashes this site runs (comma/space separated, 'bundled' for the app "
                    "shipped with this installation, or an absolute path to a file of them); "
                    "default: bundled. Checked by the site's guard before any app code runs.")

    @field_validator("accountants", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        # Flower node configs hold scalars only: a list is written as one comma-separated string.
        if isinstance(v, str):
            v = [n for n in v.replace(",", " ").split() if n]
            if not v:
                raise ValueError("name at least one accountant")
        return v

    @property
    def accepted_accountants(self) -> tuple[str, ...]:
        """``accountants``, or the built-in accountants of the site's privacy unit."""
        if self.accountants is not None:
            return self.accountants
        if not self.node_task:
            return BUILTIN_ACCOUNTANTS[self.privacy_unit]
        return WEIGHTS_SCOPE_ACCOUNTANTS if self.release_scope == "weights" else NODE_TASK_ACCOUNTANTS

    @property
    def node_task(self) -> bool:
        """The site runs node classification (paper 4's GDP units) rather than relational tasks."""
        return self.task_kind == "node_classification"

    @property
    def gdp_unit(self) -> Any:
        """The site's paper-4 GDP unit (a :class:`~graphveil.contract.units.PrivacyUnit`: replacement
        adjacency; predictions covered unless ``release-scope`` is ``weights``) for node
        classification, else ``None``. Every spend of the site is bound to it in its ledger."""
        if not self.node_task:
            return None
        from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind

        kind = UnitKind(self.privacy_unit)
        return PrivacyUnit(kind, Adjacency.REPLACEMENT, protects_predictions=self.release_scope == "predictions",
                           degree_bound=self.degree_bound if kind in (UnitKind.NODE, UnitKind.K_NEIGHBOR) else None,
                           k=self.k_neighbors if kind is UnitKind.K_NEIGHBOR else None)

    @field_validator("data_path", "data_entities", "data_password_file", "ledger", "ledger_anchor", "site_config")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        # The ClientApp runs in a working directory of Flower's choosing.
        if v is not None and not v.is_absolute():
            raise ValueError("must be an absolute path")
        return v

    @field_validator("prepared_cache")
    @classmethod
    def _cache_folder(cls, v: str | None) -> str | None:
        if v is not None and v != "off" and not Path(v).is_absolute():
            raise ValueError("must be an absolute path or 'off'")
        return v

    @property
    def prepared_cache_dir(self) -> Path | None:
        """The site's prepared-cache folder, or ``None`` if ``prepared-cache = "off"``."""
        if self.prepared_cache == "off":
            return None
        if self.prepared_cache is None:
            return self.ledger.with_name(self.ledger.name + ".prepared")
        return Path(self.prepared_cache)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], source: str = "node config") -> SiteSettings:
        """Validate a (flat) node config; errors name the source, the key and the value."""
        try:
            settings = cls.model_validate(dict(values))
        except ValidationError as exc:
            known = sorted(f.alias or n for n, f in cls.model_fields.items())
            raise ConfigError(format_validation_error(source, exc, model=cls, known=known, noun="key")) from exc
        sql = {k: v for k, v in settings.sql_options.items() if v is not None}
        if settings.data_source == "sql":
            _check_sql_site(settings, source)
        elif sql:
            key = f"data-{next(iter(sql)).replace('_', '-')}"
            raise ConfigError(f"{source}: {key} applies only to data-source 'sql'")
        elif settings.data_source != "citeseer" and settings.data_path is None:
            raise ConfigError(f"{source}: data-path is required for data-source {settings.data_source!r}")
        tables = ("edge_list", "parquet", "sql")  # the sources with named entity and relation columns
        if settings.data_source in ("edge_list", "parquet") and settings.data_entities is None:
            raise ConfigError(f"{source}: data-entities is required for data-source {settings.data_source!r}")
        columns = {k: v for k, v in settings.data_columns.items() if v is not None}
        if columns and settings.data_source not in tables:
            key = f"data-{next(iter(columns)).replace('_', '-')}"
            raise ConfigError(f"{source}: {key} applies only to data-source 'edge_list', 'parquet' or 'sql'")
        if (settings.data_source_col is None) != (settings.data_target_col is None):
            raise ConfigError(f"{source}: give both data-source-col and data-target-col, or neither")
        if settings.node_task:
            _check_node_task_site(settings, source)
        elif settings.privacy_unit not in ("node", "edge"):
            raise ConfigError(f"{source}: privacy-unit {settings.privacy_unit!r} applies to task-kind "
                              "'node_classification' only; a relational site protects a 'node' or an 'edge'")
        else:
            _check_relational_site(settings, source)
        if settings.min_clip_norm > settings.max_clip_norm:
            raise ConfigError(f"{source}: min-clip-norm {settings.min_clip_norm} exceeds max-clip-norm "
                              f"{settings.max_clip_norm}")
        return settings

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> SiteSettings:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: no such node config file")
        try:
            raw = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
        return cls.from_mapping(_flatten(raw), str(path))

    def check_files(self) -> None:
        """Refuse missing data files, an unwritable ledger folder, or a ledger, key or anchor not
        made by ``graphveil budget init`` (before Flower starts)."""
        for key, value in (("data-path", self.data_path), ("data-entities", self.data_entities),
                           ("data-password-file", self.data_password_file), ("site-config", self.site_config)):
            if value is not None and not value.exists():
                raise ConfigError(f"node config: {key}: {value} does not exist")
        folder = self.ledger.parent
        if self.ledger.exists() and not self.ledger.is_file():
            raise ConfigError(f"node config: ledger: {self.ledger} is not a file")
        if folder.exists() and not os.access(folder, os.W_OK):
            raise ConfigError(f"node config: ledger: folder {folder} is not writable")
        self._check_ledger_initialised()

    def _check_ledger_initialised(self) -> None:
        """The ledger, its key and its anchor are made once by ``graphveil budget init``, never
        on first use (a site that made them would re-anchor a restored, de-anchored backup)."""
        from graphveil.ledger.site_key import key_path_for

        init = (f"graphveil budget init --ledger {self.ledger} --site {self.site_name}"
                + (f" --anchor {self.ledger_anchor}" if self.ledger_anchor is not None else ""))
        for key, path in (("ledger", self.ledger), ("ledger (its site key)", key_path_for(self.ledger))):
            if not path.exists():
                raise ConfigError(f"node config: {key}: {path} does not exist; initialise the site's ledger "
                                  f"once with `{init}` (deploy/RUNBOOK.md §4)")
        if self.ledger_anchor is not None and not self.ledger_anchor.exists():
            raise ConfigError(
                f"node config: ledger-anchor: {self.ledger_anchor} does not exist; only `graphveil budget "
                f"init` writes an anchor — if it was lost, `graphveil budget init --ledger {self.ledger} "
                f"--anchor {self.ledger_anchor} --reanchor` (deploy/RUNBOOK.md §8)")

    def data_section(self) -> dict[str, Any]:
        """The ``data`` fields of a run config for this site's graph."""
        out: dict[str, Any] = {"source": self.data_source}
        if self.data_path is not None:
            out["path"] = str(self.data_path)
        if self.data_entities is not None:
            out["entities"] = str(self.data_entities)
        out.update({k: v for k, v in self.data_columns.items() if v is not None})
        out.update({k: str(v) if isinstance(v, Path) else v for k, v in self.sql_options.items() if v is not None})
        return out

    @property
    def sql_options(self) -> dict[str, Any]:
        """``data-url`` … ``data-relations-query`` under their run-config names (``url`` …): the
        names of the site's credentials (variable, file), never a password."""
        return {"url": self.data_url, "password_env": self.data_password_env,
                "password_file": self.data_password_file, "entities_table": self.data_entities_table,
                "entities_query": self.data_entities_query, "relations_table": self.data_relations_table,
                "relations_query": self.data_relations_query}

    @property
    def data_columns(self) -> dict[str, str | None]:
        """``data-source-col`` … ``data-text-col`` under their run-config names (``source_col`` …)."""
        return {"source_col": self.data_source_col, "target_col": self.data_target_col,
                "id_col": self.data_id_col, "text_col": self.data_text_col}


def _check_sql_site(settings: SiteSettings, source: str) -> None:
    """A site's ``sql`` source: the options the run config would get, checked by the source
    itself, messages naming the node config keys (``data-url``, not ``data.url``)."""
    from graphveil.contract.data_source import check_source_options
    from graphveil.contract.host import default_host

    if settings.data_url is None:
        raise ConfigError(f"{source}: data-url is required for data-source 'sql'")
    for key, value in (("data-path", settings.data_path), ("data-entities", settings.data_entities)):
        if value is not None:
            raise ConfigError(f"{source}: {key} does not apply to data-source 'sql' (name tables or "
                              f"queries with data-entities-table / data-relations-table)")
    try:
        check_source_options(default_host(), "sql", {k: v for k, v in settings.data_section().items()
                                                      if k != "source"})
    except ConfigError as exc:
        message = re.sub(r"\bdata\.(\w+)", lambda m: "data-" + m.group(1).replace("_", "-"), str(exc))
        raise ConfigError(f"{source}: {message}") from None


def _check_relational_site(settings: SiteSettings, source: str) -> None:
    """A relational site: ``min-records`` at edge level (only there); no node-task keys."""
    for key in ("degree_bound", "k_neighbors", "release_scope"):
        if key in settings.model_fields_set and getattr(settings, key) is not None:
            raise ConfigError(f"{source}: {key.replace('_', '-')} applies to task-kind 'node_classification' only")
    if settings.privacy_unit == "edge" and settings.min_records is None:
        raise ConfigError(
            f"{source}: min-records is required for privacy-unit 'edge': a public lower bound on your "
            "number of training relations, so that ε (and every reply) depends on public numbers only "
            "(deploy/RUNBOOK.md §4); e.g. your count rounded down to a power of ten")
    if settings.privacy_unit == "node" and settings.min_records is not None:
        raise ConfigError(
            f"{source}: min-records applies to privacy-unit 'edge' only: the node-level accountants "
            "(paper 1, Thm 3 / C.1) need the exact |Ē| and entity count (RUNBOOK §5: at node level "
            "these sizes are treated as public)")


def _check_node_task_site(settings: SiteSettings, source: str) -> None:
    """A node-classification site: D at node level, k at k-neighbor level; no relational keys
    (the sizes of a node graph are public at every GDP level: RUNBOOK §5)."""
    unit = settings.privacy_unit
    for key in ("min_records", "degree_cap"):
        if key in settings.model_fields_set and getattr(settings, key) is not None:
            raise ConfigError(f"{source}: {key.replace('_', '-')} applies to task-kind 'relational' only (the "
                              "relational accountants' sampling); a node-classification site sets degree-bound")
    if unit == "node" and settings.degree_bound is None:
        raise ConfigError(f"{source}: degree-bound is required for privacy-unit 'node' of a node-classification "
                          "site: the out-degree bound D of paper 4's node-level guarantee (your graph's largest "
                          "out-degree or more; a graph above D is refused)")
    if unit == "k_neighbor" and settings.k_neighbors is None:
        raise ConfigError(f"{source}: k-neighbors is required for privacy-unit 'k_neighbor': the adjacency "
                          "entries of one node the guarantee covers")
    if unit != "k_neighbor" and settings.k_neighbors is not None:
        raise ConfigError(f"{source}: k-neighbors applies to privacy-unit 'k_neighbor' only")
    if unit in ("edge", "undirected_edge") and settings.degree_bound is not None:
        raise ConfigError(f"{source}: degree-bound applies to privacy-unit 'node' or 'k_neighbor' only")


# ------------------------------------------------------------------------------ a site's run config


def round_seed(site: SiteSettings, run_id: int, server_round: int) -> int:
    """Seed of one site round. Never reused across rounds, runs or sites: repeated noise would
    let the server difference two releases. Fresh OS randomness unless the site pins ``seed``."""
    if site.seed is None:
        return secrets.randbits(63)
    digest = hashlib.sha256(f"{site.seed}:{site.site_name}:{run_id}:{server_round}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def site_config_overrides(site: SiteSettings) -> dict[str, Any]:
    """The site's ``site-config`` YAML (``{}`` without one): the task values the site pins."""
    if site.site_config is None:
        return {}
    path = Path(site.site_config)
    try:
        extra = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read site config ({exc})") from exc
    if not isinstance(extra, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(extra).__name__}")
    return extra


def site_run_config(fed: FederationSettings, site: SiteSettings, *, seed: int) -> RunConfig:
    """The run config a site trains with: task, then ``site-config``, then the node config's own
    values (data, δ, and what defines the accounted numbers: ``min-records`` at edge level,
    ``degree-cap`` at node level).

    ``training.steps`` becomes rounds × local steps, so a task that calibrates σ to a target ε
    spreads it over the whole federation run (the ledger still caps the site's total).
    """
    raw = copy.deepcopy(fed.task)
    source = f"site {site.site_name}"
    if site.site_config is not None:
        raw = merge_config(raw, site_config_overrides(site))
        source = f"{site.site_config}"
    data = raw.get("data", {}) if isinstance(raw.get("data"), dict) else {}
    raw["data"] = {**data, **site.data_section()}
    if site.node_task and not isinstance(raw["data"].get("split"), dict):
        raw["data"]["split"] = {"kind": "random_node"}  # the node tasks' split, unless site-config sets one
    raw["name"] = site.site_name
    raw["seed"] = seed
    raw.setdefault("training", {})["steps"] = fed.num_server_rounds * fed.local_steps
    raw.setdefault("output", {})["progress"] = False
    privacy = raw.setdefault("privacy", {})
    privacy["delta"] = site.delta  # the site's δ, whatever the task says (check_site_policy refuses a different one)
    sampler = raw.setdefault("sampler", {})
    if isinstance(sampler, dict):
        # the site's, whatever the task says (check_site_policy refuses a task that sets another)
        sampler.update(site_sampler_keys(site))
    if site.node_task:  # the site's GDP unit, whatever the task says (check_site_policy refuses another)
        privacy["unit"] = site.gdp_unit.value
    if site.threads is not None:
        raw["threads"] = site.threads
    return config_from_dict(raw, source)


#: Sampler options a site's node config fixes, per privacy unit: the public size floor that
#: makes ε public (edge), the degree cap that defines Ē (node).
_SITE_SAMPLER_KEYS = {
    "edge": lambda site: {"min_records": site.min_records},
    "node": lambda site: {"degree_cap": site.degree_cap},
}


def site_sampler_keys(site: SiteSettings) -> dict[str, Any]:
    """The sampler options the site's node config fixes (none for node classification: there
    the site fixes ``privacy.unit``, with D and k)."""
    return {} if site.node_task else _SITE_SAMPLER_KEYS[site.privacy_unit](site)


# ------------------------------------------------------------------------------ a simulated site's node config

#: Environment variable naming ``sites.json`` (partition id → node config TOML) of a simulation
#: (``graphveil fed simulate``, :mod:`.simulation`).
SITES_ENV = "GRAPHVEIL_SIMULATION_SITES"
#: What Flower's simulation runtime puts in a virtual node's node config (and nothing else).
SIMULATED_NODE_KEYS = frozenset({"partition-id", "num-partitions"})


def site_node_config(node_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The node config a site trains with: ``node_config`` itself, unless it is a simulated node's
    (only ``partition-id`` / ``num-partitions``) and :data:`SITES_ENV` names the simulation's
    ``sites.json``: then that partition's site node config. A clear error if it lists none."""
    if set(node_config) != SIMULATED_NODE_KEYS or not os.environ.get(SITES_ENV):
        return node_config
    path = Path(os.environ[SITES_ENV])
    try:
        sites = json.loads(path.read_text(encoding="utf-8"))
        toml_path = Path(sites[str(int(node_config["partition-id"]))])
        return _flatten(tomllib.loads(toml_path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as exc:  # TOMLDecodeError is a ValueError
        raise ConfigError(f"{SITES_ENV}={path}: no node config for simulated partition "
                          f"{node_config.get('partition-id')!r} ({type(exc).__name__}: {exc})") from exc


# ------------------------------------------------------------------------------ the site's policy


class PolicyRefusal(ConfigError):
    """A task that differs from the site's privacy policy; ``key`` names the key at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def _task_value(task: Mapping[str, Any], dotted: str) -> Any:
    node: Any = task
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def check_site_policy(site: SiteSettings, fed: FederationSettings, config: RunConfig, *,
                      local_steps: int, host: Any = None) -> None:
    """Refuse a task the site's policy does not allow; raises :class:`PolicyRefusal` naming the key.

    Runs before any data is read or spend is reserved. ``fed.task`` is what the server asked;
    ``config`` is the site's effective run config (:func:`site_run_config`). Component units are
    read from the plugin classes (nothing is built). The policy, all from the node config:

    * ``delta``: the site's; a task that sets another ``privacy.delta`` is refused;
    * ``task-kind``: the task is relational (an encoder task) or node classification (a model task);
    * ``privacy-unit``: relational: sampler, clipper and accountant must all be of that unit. Node
      classification: the task's ``privacy.unit``, if it states one, is the site's GDP unit
      (:attr:`SiteSettings.gdp_unit`: not another adjacency, not another scope — weights only
      where the site's ``release-scope`` covers predictions, or predictions where it is
      ``weights`` —, not a weaker or stronger level, not another k; ``degree-bound``: not a
      larger D, nor a smaller one, which a node-level run would refuse only after reading the
      graph), and sampler, clipper and accountant must each analyse that unit
      (:func:`site_run_config` puts it in): DP-GCN's analyse only a weights-only unit;
    * ``accountants``: the accountant must be one the site accepts;
    * ``min-noise-multiplier``: σ must be given directly (``privacy.noise_multiplier``; a σ
      calibrated to a target ε depends on b/|Ē|) and be at least the floor;
    * ``max-steps-per-round``: the round's local steps must not exceed it;
    * noise source and sampling: the task sets neither ``seed`` nor
      ``privacy.research_noise_seed``: a site's sampling and noise are fresh and secret; only the site's own ``seed`` key (testing) pins them.
    * ``min-records`` (edge) / ``degree-cap`` (node): the sampler options that define what is
      accounted and the capped relation set Ē are the site's; a task that sets another value
      is refused (:func:`site_run_config` puts the site's in);
    * ``site-config``: the values it sets are pinned; a task that contradicts one is refused,
      and a key of :data:`NUMERICS_DEFAULTS` (``encoder.normalize``) may differ from its default
      only where the site pins it;
    * ``min-clip-norm`` / ``max-clip-norm``: the task's clip norm C must lie in that range.

    The server's arrays are checked against ``max-abs-weight`` by the ClientApp, also before
    any data is read.
    """
    task = fed.task

    def where(dotted: str) -> str:
        return f"task.{dotted}" if _task_value(task, dotted) is not None else f"site-config {dotted}"

    if not config.privacy.enabled:
        raise PolicyRefusal(where("privacy.enabled"), "the task disables privacy; this site releases only DP updates")
    # δ is the site's.
    asked = _task_value(task, "privacy.delta")
    if asked is not None and float(asked) != float(site.delta):
        raise PolicyRefusal("task.privacy.delta", (
            f"the task asks δ={float(asked):.3g}, this site's delta is {site.delta:.3g}; the site's δ "
            "is the site's: drop privacy.delta from the task (or set it to the site's)"))
    # Sampling and noise are fresh and secret.
    if _task_value(task, "seed") is not None:
        raise PolicyRefusal("task.seed", (
            "a task may not pin the sampling seed: subsampling amplification assumes the sample is secret"))
    if _task_value(task, "privacy.research_noise_seed") is not None:
        raise PolicyRefusal("task.privacy.research_noise_seed", (
            "a task may not pin the noise: this site draws DP noise from the OS CSPRNG only"))
    if getattr(config.privacy, "research_noise_seed", None) is not None:
        raise PolicyRefusal(where("privacy.research_noise_seed"), "this site draws DP noise from the OS CSPRNG only")
    # Privacy unit and accountant.
    if host is None:
        from graphveil.contract.host import default_host

        host = default_host()
    _check_task_kind(site, config, host, where)
    if site.node_task:
        _check_gdp_unit(site, task, config, host, where)
    else:
        for family, component in (("sampler", config.sampler), ("clipper", config.clipper),
                                  ("accountant", config.accountant)):
            unit = getattr(host.get(family, component.name).factory, "unit", None)
            unit = getattr(unit, "value", unit)
            if unit != site.privacy_unit:
                raise PolicyRefusal(where(f"{family}.name"), (
                    f"{family} {component.name!r} is {unit or 'no'}-level; this site's privacy-unit is "
                    f"{site.privacy_unit!r}"))
    if config.accountant.name not in site.accepted_accountants:
        raise PolicyRefusal(where("accountant.name"), (
            f"accountant {config.accountant.name!r} is not one this site accepts (node config "
            f"accountants: {', '.join(site.accepted_accountants)})"))
    # Noise and steps.
    sigma = config.privacy.noise_multiplier
    if sigma is None:
        raise PolicyRefusal(where("privacy.target_epsilon"), (
            "this site needs σ given directly (privacy.noise_multiplier): a σ calibrated to a target ε "
            "depends on the site's graph size and could not be checked before reading the data"))
    if sigma < site.min_noise_multiplier:
        raise PolicyRefusal(where("privacy.noise_multiplier"), (
            f"σ={sigma:.4g} is below this site's min-noise-multiplier {site.min_noise_multiplier:.4g}"))
    if not 1 <= local_steps <= site.max_steps_per_round:
        raise PolicyRefusal("local-steps", (
            f"the round asks {local_steps} local steps; this site runs 1 to its max-steps-per-round "
            f"{site.max_steps_per_round}"))
    # What defines the accounted numbers and Ē is the site's.
    for key, value in site_sampler_keys(site).items():
        asked = _task_value(task, f"sampler.{key}")
        if asked is not None and asked != value:
            node_key = key.replace("_", "-")
            raise PolicyRefusal(f"task.sampler.{key}", (
                f"the task asks {key}={asked!r}; this site's {node_key} is {value!r} (node config): "
                "drop it from the task"))
    _check_pins(site, task)
    clip = _clip_norm(config, host)
    if clip is not None and not site.min_clip_norm <= clip <= site.max_clip_norm:
        raise PolicyRefusal(where("clipper.clip_norm"), (
            f"clip norm {clip:.4g} is outside this site's range [{site.min_clip_norm:.4g}, "
            f"{site.max_clip_norm:.4g}] (min-clip-norm / max-clip-norm)"))


def task_family(host: Any, task_name: str) -> Any:
    """The registered task's model family ("encoder": relational, "model": node classification;
    :attr:`graphveil.contract.task.Task.model_family`), None for a factory that declares none."""
    return getattr(host.get("task", task_name).factory, "model_family", None)


def task_kind(family: Any) -> str | None:
    """The site ``task-kind`` of a task of model ``family`` (:data:`TASK_KINDS`), None if none."""
    return next((k for k, f in TASK_KINDS.items() if f == family), None)


def _check_task_kind(site: SiteSettings, config: RunConfig, host: Any, where: Callable[[str], str]) -> None:
    """The task is of the site's ``task-kind`` (by its model family: encoder or model)."""
    family = task_family(host, config.task.name)
    if family != TASK_KINDS[site.task_kind]:
        kind = task_kind(family) or f"a {family!r}-family"
        raise PolicyRefusal(where("task.name"), (
            f"task {config.task.name!r} is a {kind} task; this site's task-kind is {site.task_kind!r}"))


def _check_gdp_unit(site: SiteSettings, task: Mapping[str, Any], config: RunConfig, host: Any,
                    where: Callable[[str], str]) -> None:
    """A node-classification task asks the site's GDP unit: not another unit, not a weaker level,
    not another D; and every component analyses that unit (nothing is built)."""
    from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind

    mine: PrivacyUnit = site.gdp_unit
    asked = _task_value(task, "privacy.unit")
    if asked is not None:
        theirs = PrivacyUnit.parse(str(asked))  # readable: the task validated as a RunConfig
        if theirs.adjacency is not Adjacency.REPLACEMENT or (
                mine.protects_predictions and not theirs.protects_predictions):
            raise PolicyRefusal("task.privacy.unit", (
                f"the task asks {theirs.value!r}; this site protects {mine.value!r} (paper 4's graph DP: "
                "replacement adjacency, predictions covered): another unit (weights only is the site's "
                "choice: release-scope in its node config, never the task's)"))
        if theirs.protects_predictions and not mine.protects_predictions:
            raise PolicyRefusal("task.privacy.unit", (
                f"the task asks {theirs.value!r}; this site's release-scope is 'weights' and it accounts "
                f"every spend under its own unit {mine.value!r} (one unit per ledger): drop privacy.unit "
                "from the task"))
        rank = GDP_LEVELS.index
        if rank(theirs.kind.value) < rank(mine.kind.value) or (
                theirs.kind is UnitKind.K_NEIGHBOR and mine.kind is UnitKind.K_NEIGHBOR and theirs.k < mine.k):
            raise PolicyRefusal("task.privacy.unit", (
                f"the task asks {theirs.value!r}, a weaker level than this site's {mine.value!r} (privacy-unit, "
                "k-neighbors)"))
        if theirs.kind is not mine.kind or theirs.k != mine.k:
            raise PolicyRefusal("task.privacy.unit", (
                f"the task asks {theirs.value!r}; this site accounts every spend under its own unit "
                f"{mine.value!r} (one unit per ledger): drop privacy.unit from the task"))
        if theirs.degree_bound is not None and mine.degree_bound is None:
            raise PolicyRefusal("task.privacy.unit", (
                f"the task asks D={theirs.degree_bound}; this site sets no degree-bound"))
        if theirs.degree_bound is not None and mine.degree_bound is not None:
            if theirs.degree_bound > mine.degree_bound:
                raise PolicyRefusal("task.privacy.unit", (
                    f"the task asks D={theirs.degree_bound}, larger than this site's degree-bound "
                    f"D={mine.degree_bound}"))
            if theirs.degree_bound < mine.degree_bound:
                raise PolicyRefusal("task.privacy.unit", (
                    f"the task asks D={theirs.degree_bound}; this site's degree-bound is D={mine.degree_bound}: "
                    "a node-level run refuses a graph above D after reading it, an answer that would "
                    "depend on the data"))
    for family, component in (("sampler", config.sampler), ("clipper", config.clipper),
                              ("accountant", config.accountant)):
        factory = host.get(family, component.name).factory
        accepts = getattr(factory, "accepts_unit", None)
        if accepts is None or not accepts(mine):
            unit = getattr(getattr(factory, "unit", None), "value", None)
            raise PolicyRefusal(where(f"{family}.name"), (
                f"{family} {component.name!r} ({unit or 'no'}-level) does not analyse this site's unit "
                f"{mine.value!r}"))


def _check_pins(site: SiteSettings, task: Mapping[str, Any]) -> None:
    """A task may not contradict the site's ``site-config`` (the values the site pins), and may set
    a key of :data:`NUMERICS_DEFAULTS` only to its default or to the site's pinned value."""
    pinned = _flatten(site_config_overrides(site))
    for key, value in _flatten(task).items():
        if key in pinned and pinned[key] != value:
            raise PolicyRefusal(f"task.{key}", (
                f"the task asks {value!r}; this site pins {pinned[key]!r} (site-config {site.site_config})"))
    for key, default in NUMERICS_DEFAULTS.items():
        value = _task_value(task, key)
        if value is not None and value != default and pinned.get(key) != value:
            raise PolicyRefusal(f"task.{key}", (
                f"the task asks {value!r}; this site computes with {key}={default!r} unless its "
                "site-config pins another value (it changes the numerics of the site's forward pass)"))


def _clip_norm(config: RunConfig, host: Any) -> float | None:
    """The task's effective clip norm C (its option, else the clipper's default), if it has one."""
    params_model = getattr(host.get("clipper", config.clipper.name).factory, "Params", None)
    try:
        params = params_model.model_validate(dict(config.clipper.params)) if params_model else None
    except ValidationError:
        return None  # the clipper's own validation names the problem when it is built
    value = getattr(params, "clip_norm", None)
    return None if value is None else float(value)
