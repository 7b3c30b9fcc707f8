"""RandEdge + GraphSAGE (paper 4's edge-level baseline, after Wu et al. 2022's LinkTeller RR).

Stage 1, ``rand_edge``: ε-DP randomized response on the adjacency, each UNORDERED pair {u, v}
decided exactly once (:func:`graphveil.privacy.randomized_response.randomized_response_edges`:
true edges kept with probability e^ε/(1+e^ε), every non-edge flipped with 1/(1+e^ε), sampled
sparsely). A pair counts as an edge if either direction is stored, so changing one directed
entry (edge unit) or one undirected edge changes the input of one pair: ε-DP for both units,
accounted by the exact RR curve (``RandomizedResponseDpEvent``, pure ε; reported ε(δ) ≤ ε).
Stage 2, ``Train(private=False)``: GraphSAGE on the released graph with public features and
labels (edge level): post-processing. The RR ε is the run's ``privacy.target_epsilon``.

The RR coins come from the OS-keyed CSPRNG that draws the Gaussian noise, or, with
``privacy.research_noise_seed`` (reproducible research only; a federated site refuses it), from a
numpy stream seeded by it (see randomized_response's note **Randomness**).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from graphveil.contract.errors import ConfigError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import Method, Plan, Release
from graphveil.contract.units import PrivacyUnit
from graphveil.plugins.gdp.common import node_data, plan_level, train_stage
from graphveil.plugins.node_dp.units import NODE_GDP

GRAPH = "rand_edge"


class RandEdge(Mechanism):
    """Randomized response on every unordered node pair once; releases ``(2, E')`` both directions."""

    unit: ClassVar[PrivacyUnit] = NODE_GDP  # replaced by the run's edge unit

    def __init__(self, unit: PrivacyUnit | None, epsilon: float | None, seed: int | None) -> None:
        if unit is not None:
            self.unit = unit
        self.epsilon = epsilon
        # no seed: the CSPRNG (randomized_response_edges); a seed: reproducible, and recomputable by its holders
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def sensitivity(self) -> float:
        return 1.0  # one pair's input bit

    def event(self) -> Any:
        from graphveil.privacy.randomized_response import rr_event

        return rr_event(self.epsilon)

    def release(self, task: Any, noise: Any) -> torch.Tensor:
        from graphveil.privacy.randomized_response import randomized_response_edges

        data = node_data(task)
        if self.epsilon is None:  # non-private run: the true graph
            return data.edge_index
        e = data.edge_index
        pairs = torch.unique(torch.stack([e.min(dim=0).values, e.max(dim=0).values]), dim=1)
        noisy = randomized_response_edges(pairs, data.num_nodes, self.epsilon, self.generator)
        return torch.cat([noisy, noisy.flip(0)], dim=1)


class RandEdgeSage(Method):
    """RandEdge (ε-DP on the adjacency) then non-private GraphSAGE on the released graph."""

    def plan(self, config: Any, mechanisms: Sequence[tuple[str, Mechanism]]) -> Plan:
        level = plan_level(config, "rand_edge_sage", mechanisms, needs_degree_bound=False, reads=("graph", GRAPH))
        if level.private and not level.edge_level:
            raise ConfigError("method 'rand_edge_sage' protects edges only: privacy.unit must be "
                              "'edge/replacement/predictions' or 'undirected_edge/replacement/predictions'")
        eps = config.privacy.target_epsilon if level.private else None
        rr = RandEdge(level.unit, eps, config.privacy.research_noise_seed)
        return Plan((Release(GRAPH, rr), train_stage(level, reason=(
            "edge-level GDP: GraphSAGE reads the randomized-response graph (released) and public "
            "features and labels: post-processing"))))
