"""The privacy unit of DP-GCN on random graph splits (paper 3): one split, replaced.

Paper 3 (Igamberdiev & Habernal, Sec. 4.4) cuts the training graph once into s disjoint random
subgraphs and treats each as one DP-SGD example. The DP-SGD guarantee is therefore about one
split: two training datasets are neighbours if they have the same (public) number s of splits
and differ in the *contents* of one split — any of its nodes, their features and labels, and
the edges between them (:data:`SPLIT_REPLACE`, label ``graph/replacement``).

What this means for a node. Every training node lies in exactly one split, chosen from its own
id by a keyed hash drawn independently of the data (:mod:`graphveil.plugins.dp_gcn.splits`),
and every edge between two splits is dropped before training. Adding, removing or changing one
training node (its features, its label, its edges to nodes of its own split) therefore changes
its own split only, and no other node changes split: the run is also node-level DP, with the
same (ε, δ), with respect to the *split-masked training graph* (the training nodes, and only
the edges inside splits), under add/remove **and** under replacement of one node. Edges across
splits and the validation/test nodes are never read in training, so they need no protection
there. Nothing is claimed about the unmasked graph's cross-split edges beyond "never read".

Why replacement and not add/remove of a split: changing one node is a replacement of its split
(the split stays, its contents change), which moves a sum of per-split clipped gradients by up to
2C; add/remove of a whole split (sensitivity C, what paper 3's moments accountant assumes) would
cover a node only through group privacy.

Weights only, at every GDP level. The same argument holds for each of paper 4's units with
replacement adjacency (:data:`_SPLIT_LOCAL`): one node replaced (features, label, every edge of
it, for any out-degree bound D), one node's features, label and k adjacency entries, one
undirected edge, one directed entry. Each changes data of at most one split (an edge is read
only if both its ends lie in one split; every edge of the unit touches the replaced node), and
changes no node's split (ids are kept under replacement), so a run's DP-SGD output is DP with
the same (ε, δ) under that unit: the accountant's replace-one analysis of a split is unchanged.
What it covers is the *weights* (and any post-processing of them alone): a GCN's prediction
for a node v ≠ r reads r's raw features and edges without noise, so predictions are not
covered (paper 4's Def. 4.2, ``…/predictions``, is refused). A node-classification site runs
DP-GCN only if its policy says ``release-scope = "weights"`` (its unit then lacks
``predictions``, and so does its ledger's binding).
"""

from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind

#: One graph split of the collection replaced by another (s public); see the module docstring.
SPLIT_REPLACE = PrivacyUnit(UnitKind.GRAPH, Adjacency.REPLACEMENT)

#: GDP unit kinds whose one unit changes data of at most one split (module docstring).
_SPLIT_LOCAL = frozenset({UnitKind.NODE, UnitKind.K_NEIGHBOR, UnitKind.UNDIRECTED_EDGE, UnitKind.EDGE})


def split_local_weights_only(unit: PrivacyUnit) -> bool:
    """Whether the split analysis holds for ``unit``: a GDP level of :data:`_SPLIT_LOCAL` with
    replacement adjacency that does NOT cover predictions (weights only; any D, any k)."""
    return (unit.kind in _SPLIT_LOCAL and unit.adjacency is Adjacency.REPLACEMENT
            and not unit.protects_predictions)


class SplitUnits:
    """Mixin for DP-GCN's sampler, clipper and accountant: they analyse one split replaced
    (:data:`SPLIT_REPLACE`) and, through the split argument of the module docstring, every
    weights-only GDP level (:func:`split_local_weights_only`); never a unit covering predictions."""

    @classmethod
    def accepts_unit(cls, unit: PrivacyUnit) -> bool:
        return unit == SPLIT_REPLACE or split_local_weights_only(unit)
