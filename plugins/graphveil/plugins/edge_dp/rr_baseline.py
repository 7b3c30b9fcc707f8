"""Paper 2's randomized-response baseline: ε-DP RR on the training relations, then fine-tuning.

Stage 1, ``rr_relations``: every unordered pair of training-side entities is decided once by
randomized response (:func:`graphveil.privacy.randomized_response.randomized_response_edges`,
the mechanism RandEdge uses: exact, sparse, refused above ``max_output_edges`` with the ε that
would fit). A relation is kept with probability e^ε/(1+e^ε); every other pair becomes one with
probability p = 1/(1+e^ε). Adding or removing one relation changes one pair's input bit, so the
release is ε-DP (pure, δ = 0) per relation, accounted by the exact RR curve; ε is the run's
``privacy.target_epsilon``.

Stage 2: the encoder is fine-tuned WITHOUT noise on the released relations (the task reads
``relations: released:rr_relations``): post-processing. Entity texts are public at edge level
(the unit protects relations, not entities), so reading them costs nothing.

The RR coins come from the OS-keyed CSPRNG that draws the Gaussian noise, or, with
``privacy.research_noise_seed`` (reproducible research only; a federated site refuses it), from a
numpy stream seeded by it (see randomized_response's note **Randomness**).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import ConfigError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import Method, Plan, Release, Train
from graphveil.contract.units import PrivacyUnit

RELATIONS = "rr_relations"


class RelationRR(Mechanism):
    """Randomized response on every unordered pair of training entities; releases a relational graph."""

    unit: ClassVar[PrivacyUnit] = PrivacyUnit.EDGE

    def __init__(self, epsilon: float | None, seed: int | None, max_output_edges: int) -> None:
        self.epsilon = epsilon
        self.max_output_edges = max_output_edges
        # no seed: the CSPRNG (randomized_response_edges); a seed: reproducible, and recomputable by its holders
        self.generator = None if seed is None else torch.Generator().manual_seed(seed)

    def sensitivity(self) -> float:
        return 1.0  # one pair's input bit

    def event(self) -> Any:
        from graphveil.privacy.randomized_response import rr_event

        return rr_event(self.epsilon)

    def release(self, task: Any, noise: Any) -> Any:
        from graphveil.privacy.randomized_response import randomized_response_edges

        graph = task.train_graph
        if self.epsilon is None:  # non-private run: the true relations
            return graph
        noisy = randomized_response_edges(graph.edges.T.contiguous(), graph.num_nodes, self.epsilon,
                                          self.generator, max_output_edges=self.max_output_edges)
        return dataclasses.replace(graph, name=f"{graph.name}/rr(eps={self.epsilon:g})", edges=noisy.T.contiguous())


class RrParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_output_edges: int = Field(50_000_000, gt=0, description=(
        "Refuse before drawing when RR would release more relations than this in expectation "
        "(m·e^ε/(1+e^ε) + non-edges·p): at small ε RR densifies the graph (paper 2: ε = 4 was "
        "infeasible at its scale). The message names the smallest ε that fits."))


class RrFinetune(Method):
    """Paper 2's baseline: RR on the training relations (ε-DP), then non-private fine-tuning."""

    Params = RrParams

    def plan(self, config: Any, mechanisms: Sequence[tuple[str, Mechanism]]) -> Plan:
        if mechanisms:
            raise ConfigError("method 'rr_finetune' releases its own randomized relations; remove the run's "
                              "'mechanisms' section")
        relations = config.task.params.get("relations")
        if relations != f"released:{RELATIONS}":
            raise ConfigError(f"method 'rr_finetune' trains on its released relations: set task "
                              f"'relations: released:{RELATIONS}' (got {relations!r})")
        private = config.privacy.enabled
        if private and config.privacy.noise_multiplier is not None:
            raise ConfigError("method 'rr_finetune' is pure ε-DP randomized response: give "
                              "privacy.target_epsilon (its ε), not privacy.noise_multiplier")
        eps = config.privacy.target_epsilon if private else None
        rr = RelationRR(eps, config.privacy.research_noise_seed, self.params.max_output_edges)
        return Plan((Release(RELATIONS, rr), Train(private=False, reason=(
            "edge level: the encoder reads the randomized-response relations (released) and the "
            "public entity texts: post-processing"))))
