"""Paper 4's graph DP (GDP) methods: GAP, DPDGC and RandEdge+SAGE at edge, node and k-neighbor
level, and DP-SAGE at node level (its own root sampler, accountant and task).

A run states its GDP level in ``privacy.unit`` (see :mod:`graphveil.plugins.gdp.levels`);
the methods' releases take their sensitivities from it, and node_dp's per-node sampler, clipper
and accountant train the final classifier (they accept every GDP level for row-wise models).
"""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_methods():
    from graphveil.plugins.gdp.dp_sage import DpSage
    from graphveil.plugins.gdp.dpdgc import Dpdgc
    from graphveil.plugins.gdp.gap import Gap
    from graphveil.plugins.gdp.rand_edge import RandEdgeSage

    return {"gap": Gap, "dpdgc": Dpdgc, "rand_edge_sage": RandEdgeSage, "dp_sage": DpSage}


@hookimpl
def graphveil_samplers():
    from graphveil.plugins.gdp.rooted import RootSubgraphSampler

    return {"root_subgraphs": RootSubgraphSampler}


@hookimpl
def graphveil_accountants():
    from graphveil.plugins.gdp.rooted_accountant import RootedRdpAccountant

    return {"rooted_rdp": RootedRdpAccountant}


@hookimpl
def graphveil_tasks():
    from graphveil.plugins.gdp.rooted_task import RootedNodeClassification

    return {"rooted_node_classification": RootedNodeClassification}


@hookimpl
def graphveil_models():
    from graphveil.plugins.gdp.modules import FullGraphSAGE, HopMLP, LinkX

    return {"linkx": LinkX, "sage_full": FullGraphSAGE, "hop_mlp": HopMLP}
