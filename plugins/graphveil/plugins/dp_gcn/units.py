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
"""

from graphveil.contract.units import Adjacency, PrivacyUnit, UnitKind

#: One graph split of the collection replaced by another (s public); see the module docstring.
SPLIT_REPLACE = PrivacyUnit(UnitKind.GRAPH, Adjacency.REPLACEMENT)
