"""b of the s graph splits, uniformly without replacement, independently at every step."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import ConfigError, PrivacyError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind, SamplingProfile
from graphveil.plugins.dp_gcn.splits import SplitBatch, split_assignment, split_key
from graphveil.plugins.dp_gcn.units import SPLIT_REPLACE, SplitUnits
from graphveil.plugins.node_classification.sampler import WithoutReplacementSampler


class GraphSplitsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    num_splits: int = Field(10, ge=1, description=(
        "s: disjoint random subgraphs the training graph is cut into, once (paper 3: 10 in Table 1; "
        "1 is the whole training graph as a single example)."))
    batch_size: int = Field(1, ge=1, description=(
        "b: splits per step, drawn without replacement (paper 3's lot size: 1)."))
    partition_seed: int | None = Field(None, description=(
        "Key of the split assignment (a node's split is a keyed hash of its id). None: drawn from "
        "the run's sampling generator when the sampler is prepared."))


class GraphSplitsSampler(SplitUnits, WithoutReplacementSampler):
    """Cuts the training graph once into s random splits; draws b of them per step (sampled-WOR Gaussian).

    :meth:`prepare` assigns every training node to one of s splits by a keyed hash of its id
    (:func:`~graphveil.plugins.dp_gcn.splits.split_assignment`); edges between splits are
    dropped when the task builds the splits' subgraphs. Every step draws a uniform b-subset of
    the s splits, fresh and independent of earlier steps and of the data: the fixed-size
    sampling that dp-accounting's ``SampledWithoutReplacementDpEvent`` analyses under
    replace-one adjacency (one split replaced; s and b public).

    Paper 3's code instead shuffles the splits once per epoch and walks through them, and
    accounts each step as Poisson sampling with q = b/s (the moments accountant): neither
    analysis covers shuffling, so GraphVeil draws what its accountant analyses.
    """

    Params = GraphSplitsParams
    name: ClassVar[str] = "graph_splits"
    unit: ClassVar[PrivacyUnit] = SPLIT_REPLACE

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self.assignment: torch.Tensor | None = None

    def prepare(self, view: Any, generator: torch.Generator, records: Any = None) -> SamplingProfile:
        """``view``: the training graph (a :class:`~graphveil.data.node_graph.NodeGraph`); only its
        node ids and count are read (the assignment does not depend on features, labels or edges).

        :raises ConfigError: if the view has no node ids.
        :raises PrivacyError: if b > s, or s exceeds the number of training nodes.
        """
        node_ids = getattr(view, "node_ids", None)
        if node_ids is None:
            raise ConfigError(f"sampler 'graph_splits' needs the training graph of a node task "
                              f"(task: split_node_classification), got {type(view).__name__}")
        n, s, b = len(node_ids), self.params.num_splits, self.params.batch_size
        if b > s:
            raise PrivacyError(f"sampler batch_size {b} exceeds the {s} graph splits (num_splits)")
        if s > n:
            raise PrivacyError(f"num_splits {s} exceeds the {n} training nodes")
        seed = self.params.partition_seed
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator))
        self.assignment = split_assignment(node_ids, s, split_key(seed))
        self._profile = SamplingProfile(SamplingKind.UNIFORM_WOR, rate=b / s, num_records=s, num_nodes=n,
                                        batch_size=b)
        return self._profile

    def sample(self, generator: torch.Generator) -> SplitBatch:
        return SplitBatch(self.draw(generator), self.assignment)
