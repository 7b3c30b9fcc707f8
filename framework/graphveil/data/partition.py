"""Split one graph into per-site graphs, for experiments with federated training.

Three ways to give each of N sites a disjoint share of the nodes (every node goes to one site):

* ``random``: a seeded random, near-equal split of the nodes (sites look alike: IID);
* ``labels``: label skew — for every class, its nodes are split among the sites in proportions
  drawn from a symmetric Dirichlet(α) (Hsu et al. 2019's non-IID benchmark; small α: each site
  holds few classes, large α: close to ``random``); unlabelled nodes are spread uniformly;
* ``communities``: connected communities — seeded asynchronous label propagation (Raghavan et
  al. 2007) over the graph, each community split into its connected components, then the
  components dealt largest first to the site that holds the fewest nodes so far. Every site is
  a union of connected communities, so few edges cross sites (as between real owners). METIS
  would cut fewer edges but needs ``torch_geometric`` built with METIS or ``pymetis``, neither of
  which this installation has; label propagation needs nothing.

Relations whose two ends go to different sites belong to no single owner and are dropped by
the per-site graphs; :class:`Partition` reports how many (``cut_edges``, undirected, each
counted once) and their share of the graph's relations (``cut_fraction``).

Works on a :class:`~graphveil.data.graph.RelationalGraph` (relations stored once, ``u < v``)
and on a :class:`~graphveil.data.node_graph.NodeGraph` (both directions stored); each part is
``graph.subgraph(nodes)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from graphveil.contract.errors import ConfigError, DataError

PartitionKind = Literal["random", "labels", "communities"]
KINDS: tuple[str, ...] = ("random", "labels", "communities")
#: Label propagation rounds at most (it usually settles in 5-10 on citation graphs).
_LP_ROUNDS = 30


@dataclass(frozen=True)
class Partition:
    """Which site every node goes to, and what the split cuts.

    :param kind: how the sites were drawn (``random``, ``labels``, ``communities``).
    :param site: ``(n,)`` int64, the site (0..N-1) of every node.
    :param cut_edges: undirected relations whose ends lie at two sites (dropped by the parts).
    :param num_edges: undirected relations of the whole graph.
    :param communities: ``(n,)`` community of every node (``communities`` only), else ``None``.
    """

    kind: str
    site: torch.Tensor
    cut_edges: int
    num_edges: int
    communities: torch.Tensor | None = None

    @property
    def num_sites(self) -> int:
        return int(self.site.max()) + 1 if self.site.numel() else 0

    @property
    def cut_fraction(self) -> float:
        """Share of the graph's relations that cross two sites (0 for a graph without relations)."""
        return self.cut_edges / self.num_edges if self.num_edges else 0.0

    def nodes(self, index: int) -> torch.Tensor:
        """Node indices (ascending) of site ``index``."""
        return (self.site == index).nonzero().flatten()

    def parts(self, graph: Any) -> list[Any]:
        """The per-site induced subgraphs of ``graph``, named ``<graph>/site-<i>``."""
        return [graph.subgraph(self.nodes(i), name=f"{graph.name}/site-{i + 1}") for i in range(self.num_sites)]

    def summary(self) -> dict[str, Any]:
        """Sizes and the cut, for reports and the partition CLI."""
        sizes = torch.bincount(self.site, minlength=self.num_sites).tolist()
        return {"kind": self.kind, "sites": self.num_sites, "nodes": sizes, "cut_edges": self.cut_edges,
                "edges": self.num_edges, "cut_fraction": round(self.cut_fraction, 6)}


def undirected_pairs(graph: Any) -> torch.Tensor:
    """``(m, 2)`` relations of ``graph``, each undirected relation once (``u < v``)."""
    if hasattr(graph, "edge_index"):  # NodeGraph: both directions stored
        u, v = graph.edge_index
        once = u < v
        return torch.stack([u[once], v[once]], dim=1)
    return graph.edges


def count_cut(pairs: torch.Tensor, site: torch.Tensor) -> int:
    """Relations of ``pairs`` whose two ends ``site`` puts at different sites."""
    if pairs.numel() == 0:
        return 0
    return int((site[pairs[:, 0]] != site[pairs[:, 1]]).sum())


def partition_graph(graph: Any, num_sites: int, *, kind: str = "random", seed: int = 0,
                    alpha: float = 0.5) -> Partition:
    """Split ``graph``'s nodes among ``num_sites`` sites (module docstring); no site is empty.

    :param alpha: Dirichlet concentration of ``labels`` (ignored otherwise).
    :raises ConfigError: on an unknown kind, a site count outside ``1..n`` or α ≤ 0.
    :raises DataError: for ``labels`` on a graph without labels, or when the draw leaves a site
        without nodes (too many sites for a small α: raise α or lower the count).
    """
    n = int(graph.num_nodes)
    if kind not in KINDS:
        raise ConfigError(f"partition kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not 1 <= num_sites <= n:
        raise ConfigError(f"number of sites must be in 1..{n}, got {num_sites}")
    pairs = undirected_pairs(graph)
    communities = None
    if kind == "random":
        site = random_sites(n, num_sites, seed)
    elif kind == "labels":
        labels = getattr(graph, "y", None) if hasattr(graph, "edge_index") else graph.labels
        if labels is None:
            raise DataError(f"graph {graph.name!r} has no labels: a label-skew partition needs them")
        site = label_skew_sites(labels, num_sites, alpha, seed)
    else:
        communities = label_propagation(n, pairs, seed)
        site = community_sites(communities, num_sites)
    sizes = torch.bincount(site, minlength=num_sites)
    if (sizes == 0).any():
        raise DataError(f"the {kind} partition of graph {graph.name!r} leaves site "
                        f"{int((sizes == 0).nonzero()[0]) + 1} without nodes; use fewer sites"
                        + (f" or a larger alpha than {alpha}" if kind == "labels" else ""))
    return Partition(kind, site, count_cut(pairs, site), int(pairs.shape[0]), communities)


def random_sites(n: int, num_sites: int, seed: int) -> torch.Tensor:
    """A seeded random, near-equal split: sizes differ by at most one."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    site = torch.empty(n, dtype=torch.long)
    for i, part in enumerate(torch.tensor_split(perm, num_sites)):
        site[part] = i
    return site


def label_skew_sites(labels: torch.Tensor, num_sites: int, alpha: float, seed: int) -> torch.Tensor:
    """Every class's nodes split among the sites in Dirichlet(α)-drawn proportions (seeded);
    unlabelled nodes (label < 0) uniformly at random."""
    if not alpha > 0:
        raise ConfigError(f"alpha must be > 0, got {alpha}")
    rng = np.random.default_rng(seed)
    y = np.asarray(labels, dtype=np.int64)
    site = np.empty(y.shape[0], dtype=np.int64)
    unlabelled = np.flatnonzero(y < 0)
    site[unlabelled] = rng.integers(0, num_sites, size=unlabelled.size)
    for c in np.unique(y[y >= 0]):
        members = rng.permutation(np.flatnonzero(y == c))
        shares = rng.dirichlet(np.full(num_sites, float(alpha)))
        cuts = np.round(np.cumsum(shares)[:-1] * members.size).astype(np.int64)
        for i, part in enumerate(np.split(members, cuts)):
            site[part] = i
    return torch.from_numpy(site)


def label_propagation(n: int, pairs: torch.Tensor, seed: int) -> torch.Tensor:
    """Communities by seeded asynchronous label propagation, each split into its connected
    components (a label can spread to two separate places): ``(n,)`` community ids ``0..c-1``.

    Each round visits the nodes in a fresh random order; a node takes the label most of its
    neighbours hold (ties broken at random, keeping its own label if it is among them); it stops
    when a round changes nothing or after :data:`_LP_ROUNDS` rounds.
    """
    rng = np.random.default_rng(seed)
    indptr, neighbours = _csr(n, pairs)
    label = np.arange(n)
    for _ in range(_LP_ROUNDS):
        changed = 0
        for v in rng.permutation(n):
            nbrs = neighbours[indptr[v]:indptr[v + 1]]
            if nbrs.size == 0:
                continue
            values, counts = np.unique(label[nbrs], return_counts=True)
            best = values[counts == counts.max()]
            if label[v] in best:
                continue
            label[v] = best[rng.integers(best.size)]
            changed += 1
        if not changed:
            break
    return connected_parts(n, pairs, label)


def connected_parts(n: int, pairs: torch.Tensor, group: np.ndarray | torch.Tensor) -> torch.Tensor:
    """The connected components of each group (relations inside a group only), numbered
    ``0..c-1`` in order of their smallest node."""
    group = np.asarray(group)
    inside = group[pairs[:, 0].numpy()] == group[pairs[:, 1].numpy()] if pairs.numel() else np.zeros(0, bool)
    parent = np.arange(n)

    def find(v: int) -> int:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for u, v in pairs.numpy()[inside]:
        ru, rv = find(int(u)), find(int(v))
        if ru != rv:
            parent[max(ru, rv)] = min(ru, rv)
    roots = np.array([find(v) for v in range(n)])
    _, ids = np.unique(roots, return_inverse=True)
    return torch.from_numpy(ids.astype(np.int64))


def community_sites(communities: torch.Tensor, num_sites: int) -> torch.Tensor:
    """Communities dealt largest first (ties: lowest id) to the site holding fewest nodes so
    far (ties: lowest site), so every site is a union of whole communities."""
    sizes = torch.bincount(communities)
    order = sorted(range(sizes.numel()), key=lambda c: (-int(sizes[c]), c))
    load = [0] * num_sites
    owner = torch.empty(sizes.numel(), dtype=torch.long)
    for c in order:
        i = min(range(num_sites), key=lambda s: (load[s], s))
        owner[c] = i
        load[i] += int(sizes[c])
    return owner[communities]


def _csr(n: int, pairs: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Neighbour lists of an undirected relation list as CSR arrays (indptr, neighbours)."""
    p = pairs.numpy()
    src = np.concatenate([p[:, 0], p[:, 1]])
    dst = np.concatenate([p[:, 1], p[:, 0]])
    order = np.argsort(src, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst[order]
