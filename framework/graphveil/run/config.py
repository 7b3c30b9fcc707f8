"""Run configuration: pydantic models, YAML in, ``--set a.b=value`` overrides.

Component sections (sampler, clipper, accountant, encoder, ...) hold a ``name`` plus that
component's own options, the data section a ``source`` plus that source's options. A config
checks only their shape: the options are validated once, against the component's ``Params``
model, by the run's own plugin host when the run is assembled, still before any data is read
(this module imports no host). Every error names the file, the field and the bad value.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from graphveil.contract.errors import ConfigError
from graphveil.contract.options import format_validation_error


def _positive_finite(v: float) -> float:
    if not (v > 0 and math.isfinite(v)):
        raise ValueError("must be a finite number > 0")
    return v


def _open_unit(v: float) -> float:
    if not 0 < v < 1:
        raise ValueError("must be in (0, 1)")
    return v


#: ε, σ and other privacy numbers: finite and > 0.
PositiveFinite = Annotated[float, AfterValidator(_positive_finite)]
#: δ: strictly between 0 and 1.
Probability = Annotated[float, AfterValidator(_open_unit)]


def merge_config(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``over`` into a copy of ``base`` (sections merge, values replace)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_config(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ComponentConfig(BaseModel):
    """``{name: <component>, <option>: <value>, ...}``"""

    model_config = ConfigDict(extra="allow")
    name: str = Field(description="Registered component name (see `graphveil plugins`).")

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class SplitConfig(_Strict):
    kind: Literal["transfer", "random_node", "planetoid_full", "two_graphs"] = Field("transfer", description=(
        "transfer: entities split into a training side and a held-out side, relations inside each "
        "(zero-shot relation prediction); random_node: nodes split into train / val / test by "
        "val_fraction and test_fraction (node classification, dp-gnn's protocol); planetoid_full: "
        "the public Planetoid split's 500 validation and 1000 test nodes, every other node trains "
        "(PyG's Planetoid(split='full'); source planetoid), or a pyg Data's val_mask and test_mask, "
        "every other labelled node trains (source pyg); unlabelled nodes are on no side; "
        "two_graphs: train on the whole of the data graph (graph A), evaluate zero-shot on the "
        "whole of eval_data (graph B)."))
    train_fraction: float = Field(0.5, gt=0, lt=1, description="transfer: share of entities on the training side.")
    val_fraction: float = Field(0.1, ge=0, lt=1, description="random_node: share of nodes for validation.")
    test_fraction: float = Field(0.15, gt=0, lt=1, description="random_node: share of nodes for test.")
    seed: int = Field(0, description=(
        "Split key: a node's side depends only on HMAC-SHA256(key, its id) / 2^64 (transfer: training "
        "side iff < train_fraction; random_node: test iff < test_fraction, else val iff < test_fraction "
        "+ val_fraction), so removing one node moves no other (independent of the sampling seed; the "
        "field keeps its old name). two_graphs: the seed of the evaluation's candidate batches only."))
    eval_data: DataConfig | None = Field(None, description=(
        "two_graphs: graph B, a data section of its own ({source: ..., <options>, max_entities}, no "
        "split), read through the same data sources as data. Evaluation data only: the privacy "
        "guarantee covers graph A, and graph B is read by whoever evaluates."))

    @model_validator(mode="after")
    def _fractions(self) -> SplitConfig:
        if self.kind == "random_node" and self.val_fraction + self.test_fraction >= 1:
            raise ValueError(f"data.split.val_fraction + data.split.test_fraction must be < 1 to leave "
                             f"training nodes, got {self.val_fraction} + {self.test_fraction}")
        if self.kind == "two_graphs" and self.eval_data is None:
            raise ValueError("data.split.kind two_graphs needs data.split.eval_data: the graph to evaluate "
                             "on, e.g. {source: edge_list, path: b.csv, entities: b_texts.csv}")
        if self.kind != "two_graphs" and self.eval_data is not None:
            raise ValueError(f"data.split.eval_data applies only to data.split.kind two_graphs "
                             f"(kind is {self.kind!r})")
        if self.eval_data is not None and self.eval_data.split != SplitConfig():  # a resolved config's default split is fine
            raise ValueError("data.split.eval_data.split: graph B is evaluated whole; remove its split")
        return self


class DataConfig(BaseModel):
    """``{source: <data source>, <option>: <value>, ..., split: {...}, max_entities: N}``

    The source's own options sit next to ``source`` (like a component section's) and are kept as
    written: the config checks only the section's shape. They are validated once, against the
    source's ``Params`` with the run's own host, when the run is assembled
    (:func:`graphveil.data.loaders.check_data_options`), before any data is read; the typed option
    set, defaults filled in, is the session's ``data_options`` (and ``config.resolved.yaml``
    shows it).
    """

    # A refused option (a database URL holding a password) is never echoed by pydantic's own text.
    model_config = ConfigDict(extra="allow", hide_input_in_errors=True)

    source: str = Field("citeseer", description=(
        "Registered data source (see `graphveil plugins`); built in: citeseer (the CiteSeer text graph "
        "bundled with GraphVeil), citeseer_tape (a TAPE CiteSeer folder), edge_list (edges CSV/TSV + "
        "entity table), parquet (relation + entity Parquet tables), sql (database tables or SELECT queries), pyg (a saved torch_geometric Data), planetoid (Cora bundled, or CiteSeer), twitch (a MUSAE Twitch folder). "
        "Its options go next to it, e.g. data.path."))
    split: SplitConfig = Field(default_factory=SplitConfig)
    max_entities: int | None = Field(None, gt=0, description="Keep only the first N entities (quick runs).")
    classes: list[str] | None = Field(None, min_length=1, description=(
        "Keep only the entities labelled with one of these class names, and the relations among "
        "them (e.g. one topic as a domain for two_graphs); applied before max_entities. An entity "
        "is kept or dropped by its own label alone, so neighbouring datasets stay neighbouring."))

    @property
    def params(self) -> dict[str, Any]:
        """The source's options (every key but source, split, max_entities and classes)."""
        return dict(self.model_extra or {})


class TrainingConfig(_Strict):
    steps: int = Field(100, ge=0, description="Optimizer steps (each one accounted).")
    loss: Literal["infonce", "hinge"] = Field("infonce", description="Per-tuple loss.")
    temperature: float = Field(0.05, gt=0, description="InfoNCE temperature on cosine scores.")
    margin: float = Field(0.2, gt=0, description="Hinge margin on cosine scores.")
    optimizer: Literal["adam", "sgd"] = Field("adam", description="DP-Adam or DP-SGD (post-processing of the noisy sum).")
    lr: float = Field(1e-3, gt=0, description="Learning rate.")
    eval_every: int = Field(0, ge=0, description="Evaluate every N steps (0: only at the end).")
    epochs: PositiveFinite | None = Field(None, description=(
        "Train for this many passes over the training examples in expectation: steps = "
        "ceil(epochs · n / b) once the data is read (replaces steps; σ is calibrated to it)."))
    schedule: Literal["constant", "linear", "cosine"] = Field("constant", description=(
        "Learning-rate schedule over the planned steps T (training.steps, or the steps planned from "
        "training.epochs), one position per optimizer step: after the warm-up the rate stays at lr "
        "(constant), or decays from lr linearly (linear) or by a half cosine (cosine) to 0 at the end "
        "of step T (graphveil.engine.schedules has the closed form). A federated site follows one "
        "schedule over the whole federation: round r's local steps take positions (r-1)·local-steps "
        "onwards of T = rounds · local-steps. Post-processing: the accounting is unchanged."))
    warmup: float = Field(0.0, description=(
        "Fraction in [0, 1) of the planned steps with linear warm-up from 0: the first W = "
        "ceil(warmup·T) steps train at lr·(t+1)/W, t = 0..W-1 (paper 2: 0.1). Applies to every "
        "schedule, constant included."))
    weight_decay: float = Field(0.0, description=(
        "Decoupled weight decay λ >= 0, scaled by the scheduled rate η: adam becomes torch AdamW "
        "(θ ← θ·(1 - ηλ) - η·Adam update); sgd uses torch SGD's weight_decay (θ ← θ - η(g̃ + λθ), "
        "which without momentum is the same decoupled decay θ·(1 - ηλ) - ηg̃). Post-processing of "
        "the released noisy gradient: it reads only the parameters. Applies to every trainable "
        "parameter (biases and norms included, unlike transformers' Trainer). 0: plain Adam / SGD."))
    micro_batch_size: int | None = Field(None, description=(
        "Physical batch: run the forward/backward on chunks of this many examples of the logical "
        "batch the sampler drew (gradient accumulation). Per-example norms are computed per chunk; "
        "the clipping factors over the whole logical batch (FREQ-CLIP's node frequencies too), one "
        "noise draw and one optimizer step per logical batch, so the update and the accounting are "
        "those of the unchunked batch. None (default): the whole batch at once."))

    @field_validator("warmup")
    @classmethod
    def _warmup(cls, v: float) -> float:
        if not 0 <= v < 1:
            raise ValueError("must be a fraction of the planned steps in [0, 1), e.g. 0.1 for the first 10 %")
        return v

    @field_validator("weight_decay")
    @classmethod
    def _weight_decay(cls, v: float) -> float:
        if not (v >= 0 and math.isfinite(v)):
            raise ValueError("must be a finite number >= 0")
        return v

    @field_validator("micro_batch_size", mode="before")
    @classmethod
    def _micro_batch_size(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError("must be an integer >= 1 (the examples per forward/backward), or null for the whole batch")
        return v

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingConfig:
        if self.epochs is not None and "steps" in self.model_fields_set:
            raise ValueError("give training.steps or training.epochs, not both")
        return self


class PrivacyConfig(_Strict):
    enabled: bool = Field(True, description="False: non-private baseline (no clipping, no noise, no claim).")
    target_epsilon: PositiveFinite | None = Field(None, description="Calibrate σ so that ε after all steps is at most this.")
    noise_multiplier: PositiveFinite | None = Field(None, description="σ; noise std is σ·C. Mutually exclusive with target_epsilon.")
    delta: Probability | None = Field(None, description=(
        "δ; default 10^-(ceil(log10 n)+1) ≤ 1/(10n), n = privacy units in the training data "
        "(training entities for node-level DP, training relations before capping for edge-level); "
        "see graphveil.privacy.default_delta. An explicit δ ≥ 1/n is allowed but logged as a warning."))
    research_noise_seed: int | None = Field(None, description=(
        "Fixed noise seed for reproducible research only: the noise can then be subtracted by anyone "
        "who knows it. privacy.json records that it was set. Default (None): DP noise from the OS "
        "CSPRNG, never seeded, never written."))
    unit: str | None = Field(None, description=(
        "The privacy unit the run's guarantee is stated for, when the components can analyse more "
        "than one (paper 4's GDP levels): e.g. 'node/replacement/D=100/predictions', "
        "'k_neighbor/replacement/k=5/predictions', 'edge/replacement/predictions'. Every sampler, "
        "clipper, accountant and release of the run must accept it, or the run is refused before "
        "data is read. Default: the unit the components declare."))

    @field_validator("unit")
    @classmethod
    def _unit(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from graphveil.contract.units import PrivacyUnit

        return PrivacyUnit.parse(v).value  # ValueError names the part not understood

    @property
    def privacy_unit(self) -> Any:
        """``unit`` as a :class:`~graphveil.contract.units.PrivacyUnit` (None when not given)."""
        from graphveil.contract.units import PrivacyUnit

        return None if self.unit is None else PrivacyUnit.parse(self.unit)

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "secure_rng" in data:
            raise ValueError(
                "privacy.secure_rng was removed: DP noise is now always drawn from the OS CSPRNG "
                "(os.urandom), separately from sampling. Delete the field; for reproducible research "
                "noise only, set privacy.research_noise_seed (the noise can then be subtracted by "
                "anyone who knows the seed)"
            )
        return data

    @model_validator(mode="after")
    def _one_of(self) -> PrivacyConfig:
        if self.enabled and (self.target_epsilon is None) == (self.noise_multiplier is None):
            raise ValueError("give exactly one of privacy.target_epsilon and privacy.noise_multiplier")
        return self


class FewShotConfig(_Strict):
    """Few-shot relation prediction (paper 2, Table 3): the released model fine-tuned without
    noise on a few held-out-side relations, then ranked on the rest."""

    relations: int = Field(16, gt=0, description="Held-out-side relations to fine-tune on.")
    validation: int = Field(16, gt=1, description="Held-out-side relations that choose the step (best validation MRR).")
    steps: int = Field(30, gt=0, description="Non-private steps, each on all the few-shot relations.")
    lr: PositiveFinite | None = Field(None, description="Learning rate (default: training.lr).")
    negatives: int = Field(8, gt=0, description="Negatives per relation, uniform over the held-out side.")
    eval_every: int = Field(5, gt=0, description="Validation MRR every N steps (and before the first).")


class EntityClassificationConfig(_Strict):
    """Few-shot entity classification (paper 2, Table 4): a linear head on frozen embeddings."""

    per_class: int = Field(8, gt=0, description="Labelled training entities per class, and as many for validation.")
    draws: int = Field(5, gt=0, description="Independent draws of the few-shot examples; metrics are their mean.")


class EvaluationConfig(_Strict):
    batch_size: int = Field(256, gt=1, description="Candidates per ranking batch (in-batch negatives).")
    max_edges: int | None = Field(None, gt=0, description="Evaluate on at most N held-out relations.")
    few_shot: FewShotConfig | None = Field(None, description=(
        "Also few-shot relation prediction ({} for the defaults: 16 + 16 relations). Evaluation "
        "data, fine-tuned without noise: ε is unchanged and the saved model is the released one."))
    entity_classification: EntityClassificationConfig | None = Field(None, description=(
        "Also few-shot entity classification on the held-out side's labelled entities ({} for the "
        "defaults: 8 + 8 per class, macro- and micro-F1)."))

    def protocols(self) -> list[str]:
        """The optional evaluation protocols this section turns on (``evaluation.<name>``)."""
        return [name for name in ("few_shot", "entity_classification") if getattr(self, name) is not None]


class OutputConfig(_Strict):
    dir: Path | None = Field(None, description="Run directory; default runs/<name>-<timestamp>.")
    progress: bool = Field(True, description="Show a progress bar.")


class SweepConfig(_Strict):
    target_epsilon: list[PositiveFinite | None] = Field(description=(
        "Privacy budgets to run; null is the non-private baseline (privacy.enabled: false)."))
    seeds: list[int] = Field(min_length=1, description=(
        "Seeds; each sets the sampling seed, the model initialisation and the split key."))


def check_run_name(name: str) -> str:
    """``name`` if it can name a folder inside ``runs/`` and nothing else: one path component,
    no separator (``/``, ``\\``), no ``..``, no leading ``.`` (hidden or relative), no control
    character, at most :data:`MAX_RUN_NAME` characters; else ``ValueError`` saying which rule.

    >>> check_run_name("cora-eps4")
    'cora-eps4'
    >>> check_run_name("../../../x")
    Traceback (most recent call last):
    ValueError: not a plain folder name: holds '/' or '\\'
    """
    if not name.strip():
        problem = "empty"
    elif "/" in name or "\\" in name:
        problem = "holds '/' or '\\'"
    elif ".." in name or name.startswith("."):
        problem = "holds '..' or starts with '.'"
    elif any(ord(c) < 32 or ord(c) == 127 for c in name):
        problem = "holds a control character (NUL, newline, …)"
    elif len(name) > MAX_RUN_NAME:
        problem = f"longer than {MAX_RUN_NAME} characters"
    else:
        return name
    raise ValueError(f"not a plain folder name: {problem}")


#: Longest run name: the folder ``<name>-<timestamp>.partial`` stays within a 255-byte file name.
MAX_RUN_NAME = 200


class RunConfig(_Strict):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # as DataConfig's: no secret echoed
    name: str = Field("run", description=(
        "Run name, used in the default output directory runs/<name>-<timestamp>: one folder name "
        "(no '/', '\\', '..', leading '.' or control characters)."))
    seed: int | None = Field(None, description=(
        "Seed of the SAMPLING generator only (Poisson batches, negatives; never the DP noise). "
        "None (default): fresh OS entropy, not written anywhere. A fixed seed makes the batches "
        "reproducible, but subsampling amplification assumes the sample stays secret: whoever "
        "knows the seed knows each batch, and the guarantee against them is that of the "
        "unsampled Gaussian mechanism. privacy.json records sampling_seed: fixed|fresh."))
    threads: int | None = Field(None, gt=0, description="torch intra-op threads (default: torch's choice).")
    data: DataConfig = Field(default_factory=DataConfig)
    sampler: ComponentConfig
    clipper: ComponentConfig
    accountant: ComponentConfig
    task: ComponentConfig = Field(default_factory=lambda: ComponentConfig(name="relational"), description=(
        "What is learned and how it is evaluated (relational: papers 1-2; node_classification)."))
    encoder: ComponentConfig | None = Field(None, description="Entity encoder (relational task).")
    model: ComponentConfig | None = Field(None, description="Model called on the batches (node_classification and other tasks).")
    method: ComponentConfig = Field(default_factory=lambda: ComponentConfig(name="dp_sgd"), description=(
        "The staged plan of the run (graphveil.contract.method): dp_sgd (default) runs the mechanisms "
        "section, then trains; a method plugin may release, train and post-process in any order."))
    mechanisms: list[ComponentConfig] = Field(default_factory=list, description=(
        "One-shot releases run before training, in order (e.g. a noisy feature release); each is "
        "accounted by the run's accountant and its output is what the task may read. A mechanism "
        "whose noise is left unset takes the run's calibrated noise multiplier (one budget)."))
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    privacy: PrivacyConfig = Field(default_factory=lambda: PrivacyConfig(target_epsilon=10.0))
    evaluation: EvaluationConfig = Field(default_factory=EvaluationConfig)
    output: OutputConfig = Field(default_factory=OutputConfig)
    sweep: SweepConfig | None = Field(None, description=(
        "Run the config once per (target ε, seed) and print mean ± 95 % CI per ε."))
    # where the config came from (its file): messages of the checks at assemble name it too
    _origin: str = PrivateAttr(default="<config>")

    @property
    def origin(self) -> str:
        """The file (or other origin) the config was read from, as its errors name it."""
        return self._origin

    def from_origin(self, origin: str) -> RunConfig:
        """This config, its errors naming ``origin`` (e.g. the file a sweep cell comes from)."""
        self._origin = origin
        return self

    @field_validator("name")
    @classmethod
    def _plain_name(cls, v: str) -> str:
        return check_run_name(v)

    @model_validator(mode="after")
    def _one_model(self) -> RunConfig:
        if (self.encoder is None) == (self.model is None):
            raise ValueError("give exactly one of encoder (relational task) and model")
        return self

    @property
    def network(self) -> ComponentConfig:
        """The trained component's section: ``encoder`` or ``model``."""
        return self.encoder if self.encoder is not None else self.model  # type: ignore[return-value]


# ------------------------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=value"`` → (["a", "b"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. sampler.batch_size=128")
    key, raw = text.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {text!r}: value is not valid YAML ({exc})") from exc
    return parts, value


def set_dotted(tree: dict[str, Any], parts: list[str], value: Any) -> None:
    """Set ``tree[p0][p1]...[pn] = value``, creating sections on the way.

    :raises ValueError: naming the part that is a value where a section is needed, or the last
        part if it names a section (a value must not silently replace a whole section; ``null``
        may, to drop an optional section such as ``sweep``).
    """
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ValueError(f"{part!r} is a value, not a section")
        node = child
    if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict | None):
        raise ValueError(f"{parts[-1]!r} is a section, not a value")
    node[parts[-1]] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        try:
            set_dotted(raw, parts, value)
        except ValueError as exc:
            raise ConfigError(f"--set {text!r}: {exc}") from exc
    return raw


def config_from_dict(raw: dict[str, Any], source: str = "<config>") -> RunConfig:
    """``raw`` validated (its shape); ``source`` names it in every error, those of the checks at
    assemble included (:attr:`RunConfig.origin`)."""
    try:
        return RunConfig.model_validate(raw).from_origin(source)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from exc


def read_yaml_file(path: str | Path, what: str = "config") -> Any:
    """The YAML document in ``path`` (``None`` for an empty file).

    :raises ConfigError: ``no such <what> file``, not UTF-8 text, or not valid YAML, naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such {what} file")
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({exc})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc})") from exc


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML run config, apply ``--set`` overrides, validate.

    :raises ConfigError: naming the file, the field and the bad value.
    """
    raw = read_yaml_file(path) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    raw = apply_overrides(drop_source_options(raw, overrides or []), overrides or [])
    return config_from_dict(raw, str(path))


def drop_source_options(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """With a ``--set data.source=`` naming another source than the file's, the file's options
    of its own source (e.g. planetoid's ``name``) are dropped: the new source's come from
    ``--set`` (``data.split``, ``max_entities`` and ``classes`` stay)."""
    data = raw.get("data")
    sources = [value for parts, value in map(parse_override, overrides) if parts == ["data", "source"]]
    if not isinstance(data, dict) or not sources or sources[-1] == data.get("source"):
        return raw
    keep = set(DataConfig.model_fields) - {"source"}
    return {**raw, "data": {k: v for k, v in data.items() if k in keep}}
