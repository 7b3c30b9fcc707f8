"""The relational task of papers 1 and 2: tuple losses; zero-shot and few-shot relation prediction,
few-shot entity classification."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from graphveil.contract.errors import ConfigError
from graphveil.contract.model import Encoder
from graphveil.contract.sampler import TupleBatch
from graphveil.contract.task import MetricColumn, Task
from graphveil.contract.units import PrivacyUnit
from graphveil.data import RelationalGraph
from graphveil.data.node_graph import NodeGraph
from graphveil.data.split import transfer_sides
from graphveil.data.two_graphs import TwoGraphs
from graphveil.evaluation import few_shot_classification, rank_metrics, relation_ranks
from graphveil.plugins.relational.few_shot import few_shot_relation_prediction
from graphveil.plugins.relational.losses import LossSpec, batch_losses

RELEASED = "released:"


class RelationalParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    relations: str = Field("raw", description=(
        "The training relations the sampler draws from: 'raw' (the training side's) or "
        "'released:<name>' (a release's relational graph on the training entities, e.g. "
        "'released:rr_relations' of method rr_finetune). A release is read only by a training "
        "stage that trains without noise; before it runs, the raw side sizes the run (δ)."))

    @field_validator("relations")
    @classmethod
    def _relations(cls, v: str) -> str:
        if v != "raw" and not (v.startswith(RELEASED) and re.fullmatch(r"[a-z][a-z0-9_]*", v.removeprefix(RELEASED))):
            raise ValueError("must be 'raw' or 'released:<name>', e.g. 'released:rr_relations'")
        return v

    @property
    def release(self) -> str | None:
        return None if self.relations == "raw" else self.relations.removeprefix(RELEASED)


ZERO_SHOT = (MetricColumn("prec1", "PREC@1"), MetricColumn("mrr", "MRR"))
FEW_SHOT = (MetricColumn("fewshot_prec1", "few-shot PREC@1"), MetricColumn("fewshot_mrr", "few-shot MRR"))
ENTITY_CLASSIFICATION = (MetricColumn("ec_macro_f1", "EC macro-F1"), MetricColumn("ec_micro_f1", "EC micro-F1"))


class RelationalTask(Task):
    """Relational tuples (positive + k negatives) under InfoNCE/hinge; zero-shot PREC@1/MRR on held-out entities.

    Splits the entities by the keyed transfer split (``data.split.train_fraction``), or with
    ``data.split.kind: two_graphs`` trains on the whole of graph A and evaluates on the whole of
    graph B (:mod:`graphveil.data.two_graphs`); the sampler draws tuples from the training side;
    the loss options are ``training.loss``, ``training.temperature`` and ``training.margin``;
    evaluation ranks the held-out side's relations with in-batch negatives
    (``evaluation.batch_size``, ``evaluation.max_edges``) and, when asked, runs few-shot
    relation prediction (``evaluation.few_shot``, :mod:`graphveil.plugins.relational.few_shot`)
    and few-shot entity classification on the held-out side's labels
    (``evaluation.entity_classification``).
    """

    Params = RelationalParams
    model_family: ClassVar[str] = "encoder"
    metrics: tuple[MetricColumn, ...] = ZERO_SHOT
    protocols: ClassVar[frozenset[str]] = frozenset({"few_shot", "entity_classification"})
    #: a tuple's loss reads only its own entities' embeddings: tuples may be sharded across ranks
    data_parallel: ClassVar[bool] = True

    def __init__(self, params: RelationalParams | None = None) -> None:
        self.params = params if params is not None else RelationalParams()
        self.loss = LossSpec()
        self.eval_batch_size, self.eval_max_edges, self.eval_seed = 256, None, 0
        self.few_shot: Any = None  # graphveil.run.config.FewShotConfig
        self.entity_classification: Any = None  # graphveil.run.config.EntityClassificationConfig
        self.training: Any = None
        #: ``(m,)`` ranks of the held-out relations from the last :meth:`evaluate`, in its order.
        self.relation_ranks: torch.Tensor | None = None

    def configure(self, config: Any) -> None:
        """Read the run-level options this task uses (loss, evaluation and its protocols)."""
        self.loss = LossSpec.from_config(config.training)
        self.training = config.training
        evaluation = config.evaluation
        self.eval_batch_size = evaluation.batch_size
        self.eval_max_edges = evaluation.max_edges
        self.eval_seed = config.data.split.seed
        self.few_shot, self.entity_classification = evaluation.few_shot, evaluation.entity_classification
        self.metrics = (ZERO_SHOT + (FEW_SHOT if self.few_shot is not None else ())
                        + (ENTITY_CLASSIFICATION if self.entity_classification is not None else ()))

    def setup(self, data: Any, split: Any) -> None:
        if isinstance(data, NodeGraph):  # a feature graph (planetoid, twitch): its relations, once each
            data = data.to_relational()
        if not isinstance(data, RelationalGraph):
            raise ConfigError(f"task 'relational' needs a relational graph; data source gave {type(data).__name__}")
        if split.kind == "two_graphs":
            if not isinstance(data, TwoGraphs):  # e.g. a graph passed to the session by hand
                raise ConfigError("data.split.kind two_graphs: the dataset holds no graph B; load it with "
                                  "graphveil.data.load_data, which reads data.split.eval_data")
            self._dataset, self._split_scope = data, {
                "rule": "two_graphs: every entity and relation of data (graph A) trains; evaluation "
                        "on data.split.eval_data (graph B), which the guarantee does not cover",
                "eval_graph": data.held_out.name}
            self.train_graph, self.test_graph = data.train, data.held_out
            self.train_nodes, self.test_nodes = data.train_nodes, data.held_out_nodes
            return
        if split.kind != "transfer":
            raise ConfigError(f"task 'relational' uses data.split.kind: transfer or two_graphs, got {split.kind!r}")
        self._dataset, self._split_scope = data, {
            "rule": "HMAC-SHA256(data.split.seed, entity id) / 2^64 < train_fraction",
            "train_fraction": split.train_fraction}
        self.train_graph, self.test_graph, on_train = transfer_sides(data, split.train_fraction, split.seed)
        # each side keeps data's entity order: its i-th entity is the i-th of the mask (no id lookup)
        self.train_nodes, self.test_nodes = on_train.nonzero().flatten(), (~on_train).nonzero().flatten()

    @property
    def train_view(self) -> RelationalGraph:
        """The training side, or (``relations: released:<name>``) that release once it has run."""
        name = self.params.release
        if name is None or name not in self.released:
            return self.train_graph
        graph = self.released[name]
        if not isinstance(graph, RelationalGraph) or graph.entity_ids != self.train_graph.entity_ids:
            raise ConfigError(f"task.relations: release {name!r} is not a relational graph on the training "
                              "entities")
        return graph

    @property
    def reads_release(self) -> bool:
        """Whether training reads a release (the session then binds the sampler to it after it runs)."""
        return self.params.release is not None

    def num_units(self, unit: PrivacyUnit | None) -> int:
        """Training relations before capping (edge-level) or training entities (otherwise)."""
        return self.train_graph.num_edges if unit == PrivacyUnit.EDGE else self.train_graph.num_nodes

    def scope(self) -> dict[str, Any]:
        return {
            "split": dict(self._split_scope),
            "entities": self.train_graph.num_nodes,
            "relations": self.train_graph.num_edges,
        }

    def lift(self, batch: TupleBatch) -> TupleBatch:
        def up(t: torch.Tensor) -> torch.Tensor:
            out = torch.full_like(t, -1)
            ok = t >= 0
            out[ok] = self.train_nodes[t[ok]]
            return out

        return TupleBatch(up(batch.positives), up(batch.negatives), up(batch.anchors))

    def losses(self, model: Encoder, batch: TupleBatch) -> torch.Tensor:
        return batch_losses(model, batch, self.loss)

    def evaluate(self, model: Encoder) -> dict[str, float]:
        """Zero-shot relation prediction, then the protocols the run asks for. Each reads the
        released model; few-shot fine-tuning works on a copy of its weights (restored after)."""
        nodes = self.test_nodes
        with torch.no_grad():
            model.eval()
            z = torch.cat([model.embed(nodes[i : i + 512]) for i in range(0, nodes.numel(), 512)])
            model.train()
        # Kept for paired comparisons (the demo's Δ vs base): same split and seed, same relations.
        self.relation_ranks = relation_ranks(
            self.test_graph.edges, lambda: z, batch_size=self.eval_batch_size,
            max_edges=self.eval_max_edges, seed=self.eval_seed)
        result: dict[str, Any] = rank_metrics(self.relation_ranks, seed=self.eval_seed)
        if self.entity_classification is not None:
            labels = self.test_graph.labels
            if labels is None:
                raise ConfigError(f"evaluation.entity_classification: {self.test_graph.name} has no entity "
                                  "labels (edge_list / parquet: name the label column)")
            ec = self.entity_classification
            try:
                result.update(few_shot_classification(z, labels, per_class=ec.per_class, draws=ec.draws,
                                                       seed=self.eval_seed))
            except ValueError as exc:
                raise ConfigError(f"evaluation.entity_classification: {self.test_graph.name}: {exc}") from exc
        if self.few_shot is not None:
            result.update(few_shot_relation_prediction(
                model, self.test_graph.edges, nodes, z, self.few_shot, self.loss,
                lr=self.few_shot.lr or self.training.lr, optimizer=self.training.optimizer,
                batch_size=self.eval_batch_size, max_edges=self.eval_max_edges, seed=self.eval_seed))
        return result
