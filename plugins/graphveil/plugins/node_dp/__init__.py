"""Node-level DP node classification: paper 4's DP-MLP baseline (GDP, node level, replacement).

Per-node DP-SGD on the node features only: fixed-size batches of nodes drawn uniformly without
replacement, each node's gradient clipped to C, Gaussian noise σC, and the RDP of the
sampled-without-replacement Gaussian under replace-one adjacency (dp-accounting). A node's
prediction reads only the released weights and its own features, so predictions are covered
too (GDP, paper 4 Def. 4.2, with the replaced node r ≠ the predicted node v).

Also the ``sage`` model (GraphSAGE on rooted subgraphs, :mod:`graphveil.subgraph_batch`), which
the GDP plugin's ``dp_sage`` method trains with its own sampler and accountant.
"""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_samplers():
    from graphveil.plugins.node_dp.sampler import UniformNodeSampler

    return {"node_uniform_wor": UniformNodeSampler}


@hookimpl
def graphveil_clippers():
    from graphveil.plugins.node_dp.clipping import PerNodeClipper

    return {"per_node_clip": PerNodeClipper}


@hookimpl
def graphveil_accountants():
    from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant

    return {"node_rdp": NodeReplaceRdpAccountant}


@hookimpl
def graphveil_models():
    from graphveil.plugins.node_classification.mlp import MLP
    from graphveil.plugins.node_classification.sage import SAGE

    return {"mlp": MLP, "sage": SAGE}


@hookimpl
def graphveil_tasks():
    from graphveil.plugins.node_classification.task import NodeClassification

    return {"node_classification": NodeClassification}


@hookimpl
def graphveil_mechanisms():
    from graphveil.plugins.node_dp.mechanisms import NoisyFeatures

    return {"noisy_features": NoisyFeatures}
