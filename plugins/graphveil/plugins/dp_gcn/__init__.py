"""DP-GCN on random graph splits (paper 3: Igamberdiev & Habernal, LREC 2022).

The training graph is cut once into s disjoint random subgraphs (edges between them dropped);
each split is one DP-SGD example. Per step, b of the s splits are drawn uniformly without
replacement, a 2-layer GCN runs on each drawn split's subgraph alone (a
:class:`~graphveil.subgraph_batch.SubgraphBatch` of components), each split's gradient of its
mean cross-entropy is clipped to C, Gaussian noise σC is added to the sum, and DP-SGD or DP-Adam
steps on it (``training.optimizer``). The accountant is dp-accounting's RDP of the
sampled-without-replacement Gaussian under replace-one: the unit is one split replaced, which
is node-level DP (add/remove or replacement of one node) w.r.t. the split-masked training graph
(:mod:`graphveil.plugins.dp_gcn.units`). s = 1 is the full-training-graph baseline (q = 1).

Components: sampler ``graph_splits``, clipper ``per_split_clip``, accountant ``split_rdp``,
model ``gcn``, task ``split_node_classification``.
"""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_samplers():
    from graphveil.plugins.dp_gcn.sampler import GraphSplitsSampler

    return {"graph_splits": GraphSplitsSampler}


@hookimpl
def graphveil_clippers():
    from graphveil.plugins.dp_gcn.clipping import PerSplitClipper

    return {"per_split_clip": PerSplitClipper}


@hookimpl
def graphveil_accountants():
    from graphveil.plugins.dp_gcn.accountant import SplitRdpAccountant

    return {"split_rdp": SplitRdpAccountant}


@hookimpl
def graphveil_models():
    from graphveil.plugins.dp_gcn.gcn import GCN

    return {"gcn": GCN}


@hookimpl
def graphveil_tasks():
    from graphveil.plugins.dp_gcn.task import SplitNodeClassification

    return {"split_node_classification": SplitNodeClassification}
