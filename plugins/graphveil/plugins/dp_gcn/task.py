"""Node classification on random graph splits (paper 3): per-split loss, held-out evaluation.

Training reads only the *split-masked training graph*: the training nodes of the run's node
split (their features and labels) and the edges between two training nodes of the same graph
split. Validation and test nodes are not in any split, so their features, labels and edges are
never read in training; edges between two splits are dropped.

Evaluation (``eval_graph``):

* ``held_out`` (default): the trained GCN runs on the graph induced by the validation and test
  nodes — their features and the edges among them — and nothing of the training side: the
  predictions are post-processing of the released weights and held-out data, so they are
  covered by the run's guarantee like the weights.
* ``full``: the whole graph, as paper 3's code evaluates (``model(data)`` on every node and
  edge, test predictions read from it). Test nodes' predictions then aggregate training nodes'
  features over training edges: the numbers are comparable to the paper's, but predictions read
  private training data and are **not** covered by the guarantee (only the weights are).

Metrics on the test nodes: accuracy (= paper 3's micro-F1, see
:mod:`graphveil.evaluation`), macro-F1, and the same for the majority class of the
training labels (the paper's "Maj." column; training labels are private, so it is a reference
for the table, not something a site releases).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from graphveil.contract.errors import ConfigError, PrivacyError
from graphveil.contract.model import Model
from graphveil.contract.profiles import ExampleStructure
from graphveil.contract.task import MetricColumn
from graphveil.contract.units import PrivacyUnit
from graphveil.evaluation import accuracy, macro_f1
from graphveil.plugins.dp_gcn.splits import SplitBatch, split_members
from graphveil.plugins.node_classification.task import NodeClassification, NodeClassificationParams


class SplitNodeClassificationParams(NodeClassificationParams):
    eval_graph: Literal["held_out", "full"] = Field("held_out", description=(
        "Graph the trained GCN is evaluated on: 'held_out' (induced by the validation and test nodes; "
        "reads no training data) or 'full' (every node and edge, as paper 3's code; the predictions "
        "then read training data and are not covered by the guarantee)."))


class SplitNodeClassification(NodeClassification):
    """Mean cross-entropy over each graph split's (training) nodes; accuracy and macro-F1 on held-out nodes.

    The sampler draws split ids (:class:`~graphveil.plugins.dp_gcn.splits.SplitBatch`);
    :meth:`lift` builds the splits' induced subgraphs of the training graph as a
    :class:`~graphveil.subgraph_batch.SubgraphBatch` (graph i = split i, refused if an edge
    joined two of them), and :meth:`losses` returns one loss per split: the mean cross-entropy
    over its nodes, every one of which is a training node (checked at every step).
    """

    Params = SplitNodeClassificationParams
    metrics: ClassVar[tuple[MetricColumn, ...]] = (
        MetricColumn("test_accuracy", "test acc (= micro-F1)"), MetricColumn("test_macro_f1", "test macro-F1"),
        MetricColumn("val_accuracy", "val acc"), MetricColumn("majority_accuracy", "majority acc"),
        MetricColumn("majority_macro_f1", "majority macro-F1"),
    )

    def __init__(self, params: SplitNodeClassificationParams | None = None) -> None:
        super().__init__(params if params is not None else SplitNodeClassificationParams())
        self._splits: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._splits_for: torch.Tensor | None = None

    def configure(self, config: Any) -> None:
        """The parent's checks (a ``features`` release must be planned), and no whole-graph edges:
        the GCN reads the edges inside each split only (a ``graph`` option of the parent's
        row-wise/whole-graph models would be silently ignored here, so it is refused)."""
        if getattr(self.params, "graph", None) is not None:
            raise ConfigError("task 'split_node_classification': task.graph does not apply; the GCN reads "
                              "the edges inside each graph split (training) and of the evaluation graph only")
        super().configure(config)

    # ------------------------------------------------------------------ data
    def setup(self, data: Any, split: Any) -> None:
        """The node split (``random_node`` or ``planetoid_full``), then the training graph: the
        graph induced by the training nodes (edges to validation and test nodes dropped)."""
        super().setup(data, split)
        self.train_graph = data.subgraph(self.split.train, name=f"{data.name}[train]")
        self._is_train = torch.zeros(data.num_nodes, dtype=torch.bool)
        self._is_train[self.split.train] = True
        self._splits, self._splits_for = {}, None

    @property
    def train_view(self) -> Any:
        """The training graph (a NodeGraph; row r is dataset node ``split.train[r]``): what the
        sampler cuts into splits."""
        return self.train_graph

    def num_units(self, unit: PrivacyUnit | None) -> int:
        """The number of TRAINING NODES (not of splits), for δ's default rule: the guarantee is
        read at node level (one node changes one split), so δ is set well below 1/n for the
        n training nodes — stricter than below 1/s (Cora, planetoid_full: n = 1208 → δ = 1e-5,
        paper 3's δ)."""
        return int(self.split.train.numel())

    def scope(self) -> dict[str, Any]:
        return {**super().scope(),
                "graph_splits": ("each training node in one split by a keyed hash of its id; edges "
                                 "between splits and every validation/test node dropped from training"),
                "node_level": ("one training node added, removed or changed changes one split: node-level "
                               "DP (add/remove and replacement) w.r.t. the split-masked training graph"),
                "eval_graph": self.params.eval_graph}

    def prepare_model(self, model: Model) -> None:
        """Refuse a model that does not keep splits apart (structure ``components``), then size it."""
        structure = getattr(model, "structure", None)
        if structure is not ExampleStructure.COMPONENTS:
            raise ConfigError(
                f"task 'split_node_classification' trains on disjoint graph splits: the model must "
                f"declare structure components (e.g. model 'gcn'), got {getattr(structure, 'value', structure)!r}")
        super().prepare_model(model)

    # ------------------------------------------------------------------ batches
    def split_rows(self, assignment: torch.Tensor, split_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, edge_index)`` of one split: its nodes as dataset indices (sorted) and the edges of
        the training graph between two of them, relabelled to ``0..len(rows)-1``."""
        from torch_geometric.utils import subgraph

        if self._splits_for is not assignment:  # a new partition (another sampler prepare)
            self._splits, self._splits_for = {}, assignment
            num_splits = int(assignment.max()) + 1 if assignment.numel() else 0
            self._members = split_members(assignment, num_splits)
        if split_id not in self._splits:
            members = self._members[split_id] if split_id < len(self._members) else torch.zeros(0, dtype=torch.long)
            edges, _ = subgraph(members, self.train_graph.edge_index, relabel_nodes=True,
                                num_nodes=self.train_graph.num_nodes)
            self._splits[split_id] = (self.split.train[members], edges)
        return self._splits[split_id]

    def lift(self, batch: SplitBatch) -> Any:
        """The drawn splits' induced subgraphs, graph i = split ``batch.split_ids[i]`` (features: raw or
        the released matrix; labels of the split's training nodes; ``n_id``: dataset node ids)."""
        from torch_geometric.data import Data

        from graphveil.subgraph_batch import SubgraphBatch

        if not isinstance(batch, SplitBatch):
            raise ConfigError(f"task 'split_node_classification' needs a graph-split sampler (graph_splits), "
                              f"got a {type(batch).__name__}")
        x, y = self.features(), self.dataset.y
        graphs = []
        for k in batch.split_ids.tolist():
            rows, edges = self.split_rows(batch.assignment, int(k))
            graphs.append(Data(x=x[rows], y=y[rows], edge_index=edges, n_id=rows, num_nodes=int(rows.numel())))
        if not graphs:
            return _empty_batch(x.shape[1])
        return SubgraphBatch.from_data_list(graphs)

    def losses(self, model: Model, batch: Any) -> torch.Tensor:
        """``(b,)``: split i's loss is the mean cross-entropy over split i's nodes (0 for an empty split).

        :raises PrivacyError: if a row of the batch is not a training node (labels of validation and
            test nodes must never reach a training loss).
        """
        rows = getattr(batch, "node_ids", None)
        if rows is None or not bool(self._is_train[rows.cpu()].all()):
            raise PrivacyError("a training batch holds a node outside the training side (or no node ids): "
                               "validation and test nodes must never reach a training loss")
        device = self._device(model)
        logits = model(batch)
        per_node = F.cross_entropy(logits, batch.labels.to(device), reduction="none")
        groups = batch.groups.to(device)
        b = batch.size
        sums = torch.zeros(b, dtype=per_node.dtype, device=device).index_add(0, groups, per_node)
        counts = torch.bincount(groups, minlength=b).clamp(min=1).to(per_node.dtype)
        return sums / counts

    # ------------------------------------------------------------------ evaluation
    def eval_nodes(self) -> torch.Tensor:
        """Dataset nodes the evaluation graph holds: validation ∪ test (held_out), or all (full)."""
        if self.params.eval_graph == "full":
            return torch.arange(self.dataset.num_nodes)
        return torch.cat([self.split.val, self.split.test]).sort().values

    @torch.no_grad()
    def predict(self, model: Model) -> torch.Tensor:
        """``(n,)`` predicted class of every dataset node in :meth:`eval_nodes` (-1 elsewhere)."""
        from torch_geometric.data import Data
        from torch_geometric.utils import subgraph

        from graphveil.subgraph_batch import SubgraphBatch

        nodes = self.eval_nodes()
        edges, _ = subgraph(nodes, self.dataset.edge_index, relabel_nodes=True, num_nodes=self.dataset.num_nodes)
        graph = SubgraphBatch.from_data_list([Data(x=self.features()[nodes], edge_index=edges, n_id=nodes,
                                                   num_nodes=int(nodes.numel()))])
        model.eval()
        try:
            pred = model(graph).argmax(dim=1).cpu()
        finally:
            model.train()
        out = torch.full((self.dataset.num_nodes,), -1, dtype=torch.long)
        out[nodes] = pred
        return out

    def evaluate(self, model: Model) -> dict[str, float]:
        pred, y = self.predict(model), self.dataset.y
        out: dict[str, float] = {}
        for name, idx in (("test", self.split.test), ("val", self.split.val)):
            out[f"{name}_accuracy"] = accuracy(pred[idx], y[idx])
            out[f"{name}_macro_f1"] = macro_f1(pred[idx], y[idx])
        majority = int(torch.bincount(y[self.split.train]).argmax())
        test_y = y[self.split.test]
        constant = torch.full_like(test_y, majority)
        out["majority_accuracy"] = accuracy(constant, test_y)
        out["majority_macro_f1"] = macro_f1(constant, test_y)
        return out


def _empty_batch(num_features: int) -> Any:
    """A SubgraphBatch of zero graphs (a batch of zero splits)."""
    from torch_geometric.data import Data

    from graphveil.subgraph_batch import SubgraphBatch

    one = SubgraphBatch.from_data_list([Data(x=torch.zeros(0, num_features), y=torch.zeros(0, dtype=torch.long),
                                             edge_index=torch.zeros(2, 0, dtype=torch.long),
                                             n_id=torch.zeros(0, dtype=torch.long), num_nodes=0)])
    return one.select(torch.zeros(0, dtype=torch.long))
