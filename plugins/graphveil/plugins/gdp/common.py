"""What GAP's and DPDGC's releases share: the GDP level, the data they read, the generator."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from graphveil.contract.errors import ConfigError, DataError
from graphveil.contract.mechanism import Mechanism
from graphveil.contract.method import Train
from graphveil.contract.units import PrivacyUnit
from graphveil.plugins.gdp.levels import GdpLevel
from graphveil.plugins.node_dp.units import NODE_GDP


class GdpRelease(Mechanism):
    """A release of a GDP method: takes the run's σ when private (noise std σ · sensitivity),
    states the run's unit, and draws its batches from its own generator (seeded from the run's
    ``seed`` plus a per-stage offset for reproducible research, else fresh OS entropy)."""

    unit: ClassVar[PrivacyUnit] = NODE_GDP  # replaced per instance by the run's level

    def __init__(self, level: GdpLevel, *, seed: int | None, stream: int) -> None:
        self.level = level
        if level.unit is not None:
            self.unit = level.unit
        self.generator = torch.Generator().manual_seed(
            secrets.randbits(63) if seed is None else (seed * 1_000_003 + stream) % 2**63)
        self.train_nodes: torch.Tensor | None = None

    def calibrated(self) -> bool:
        return self.level.private

    def bind(self, task: Any) -> None:
        """The training nodes (public under replacement); at node level, refuse a graph above D
        here, once the data is loaded and before any stage runs."""
        check_out_degree_class(task, self.level)
        self.train_nodes = task.split.train

    def sigma(self) -> float:
        """The run's shared σ (0 in a non-private run)."""
        if not self.level.private:
            return 0.0
        if self.noise_multiplier is None:
            raise ConfigError(f"{type(self).__name__} was not calibrated with a run")
        return float(self.noise_multiplier)

    def event(self) -> Any:
        return self.event_at(self.sigma())


def load_checked(model: Any, state: Mapping[str, torch.Tensor], release: str) -> None:
    """``state`` into ``model``'s trainable weights, refusing other keys, shapes or dtypes."""
    from graphveil.contract.model import state_problem

    if (problem := state_problem(state, model.trainable_state())) is not None:
        raise ConfigError(f"release {release!r}: weights to start from: {problem}")
    model.load_trainable_state(state)


def node_data(task: Any) -> Any:
    """The task's NodeGraph (features, labels, both directions of every edge)."""
    data = getattr(task, "dataset", None)
    if data is None or not hasattr(data, "edge_index") or not hasattr(data, "x"):
        raise ConfigError("GDP methods need a node graph with features, labels and edges (data.source: planetoid, ...)")
    return data


def out_degree_class_error(level: GdpLevel, largest: int) -> DataError | None:
    """The refusal of a graph whose largest out-degree is ``largest`` at ``level``'s node level,
    or None if the graph is in the class (or the level has none)."""
    bound = level.out_degree_class
    if bound is None or largest <= bound:
        return None
    wider = PrivacyUnit(level.unit.kind, level.unit.adjacency, degree_bound=largest, k=level.unit.k,
                        protects_predictions=level.unit.protects_predictions)
    return DataError(
        f"{level.method} at node level with D={bound} needs a graph whose out-degree is at most {bound} "
        f"(this graph has nodes of out-degree up to {largest}): paper 4's node-level guarantee holds between "
        f"graphs of out-degree <= D only, and no cap of a larger graph is known to keep it (a replaced node's "
        f"in-edges change other nodes' out-degrees). Raise D to >= {largest} (privacy.unit "
        f"{wider.value!r}), or choose another level (k_neighbor with D caps the graph, edge needs no D)")


def check_out_degree_class(task: Any, level: GdpLevel) -> None:
    """At node level, refuse the task's graph if a node's out-degree exceeds D (no cap is applied).

    Called when the data is loaded, before any stage trains or releases (:meth:`GdpRelease.bind`,
    the rooted task's setup); a planning stand-in holding public sizes only is skipped.

    :raises DataError: naming the method, the unit, D and the largest out-degree found.
    """
    from graphveil.run.planning import PublicTask

    if level.out_degree_class is None or isinstance(task, PublicTask):
        return
    data = node_data(task)
    edges = data.edge_index
    largest = int(torch.bincount(edges[0], minlength=data.num_nodes).max()) if edges.numel() else 0
    if (error := out_degree_class_error(level, largest)) is not None:
        raise error


def aggregation_edges(task: Any, level: GdpLevel, *, caps: bool, key: bytes | None = None) -> torch.Tensor:
    """``(2, E)`` edges messages flow along (source → target).

    Node level: the raw edges, after :func:`check_out_degree_class` (refused above D). k-neighbor
    level with ``caps`` (a method whose sensitivity assumes the cap, GAP): capped at the unit's D
    by :class:`graphveil.transforms.OutDegreeBound` under ``key`` (default: 32 fresh bytes from
    :mod:`secrets`, never a seed). Otherwise (edge level, DPDGC at k-neighbor level, non-private
    runs): the raw edges.
    """
    from torch_geometric.data import Data

    from graphveil.transforms import OutDegreeBound

    data = node_data(task)
    edges = data.edge_index
    check_out_degree_class(task, level)
    cap = level.out_degree_cap(caps=caps)
    if cap is None:
        return edges
    return OutDegreeBound(cap, key=key)(Data(edge_index=edges, num_nodes=data.num_nodes)).edge_index


#: Gathered message entries held at once by :func:`aggregate` (float32: 64 MB).
AGGREGATE_CHUNK = 1 << 24


def aggregate(h: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """``A·H``: row i is the sum of ``h`` over node i's in-neighbours (edges j → i).

    The messages ``h[j]`` are gathered and added in edge order, a chunk of edges at a time:
    gathering all E rows at once held E × h floats (5 GB for 2·10⁷ directed edges and 64
    columns, issue 28); on CPU each chunk adds in the same order, so the sum is the same."""
    out = torch.zeros_like(h)
    src, dst = edges[0].to(h.device), edges[1].to(h.device)
    step = max(1, AGGREGATE_CHUNK // max(1, h.shape[1]))
    for start in range(0, src.numel(), step):
        out.index_add_(0, dst[start:start + step], h[src[start:start + step]])
    return out


def row_normalise(h: torch.Tensor) -> torch.Tensor:
    """Every row to ℓ2 norm 1 (a zero row stays zero, norm 0 ≤ 1)."""
    return torch.nn.functional.normalize(h, dim=1)


#: why a GDP method's classifier may train without noise at edge level
EDGE_REASON = ("edge-level GDP: node features and labels are public and the classifier reads only "
               "released aggregates and features, row by row (paper 4, App. G)")


def plan_level(config: Any, method: str, mechanisms: Any, *, needs_degree_bound: bool,
               reads: tuple[str, str]) -> GdpLevel:
    """The run's GDP level, after the checks every GDP method's plan makes before data is read:
    a private run states its level in ``privacy.unit``; the task reads the method's release
    (``reads`` = (task option, artifact name)); the run config places no ``mechanisms``."""
    unit = config.privacy.privacy_unit if config.privacy.enabled else None
    if config.privacy.enabled and unit is None:
        raise ConfigError(f"method {method!r}: state the GDP level in privacy.unit, e.g. "
                          "'node/replacement/D=100/predictions' or 'edge/replacement/predictions'")
    level = GdpLevel.of(unit, method=method, needs_degree_bound=needs_degree_bound)
    option, artifact = reads
    value = config.task.params.get(option)
    if value != f"released:{artifact}":
        raise ConfigError(f"method {method!r} trains on its release: set task {option}: "
                          f"'released:{artifact}' (got {value!r})")
    if mechanisms:
        raise ConfigError(f"method {method!r} places its own releases; remove the `mechanisms` section")
    return level


def train_stage(level: GdpLevel, reason: str = EDGE_REASON) -> Train:
    """DP-SGD for the final model, without noise at edge level (it reads nothing protected)."""
    return Train(private=False, reason=reason) if level.edge_level else Train()
