"""Paper 4's graph DP (GDP) methods: GAP, DPDGC and RandEdge+SAGE, at edge, node and k-neighbor level.

A run states its GDP level in ``privacy.unit`` (see :mod:`graphveil.plugins.gdp.levels`);
the methods' releases take their sensitivities from it, and node_dp's per-node sampler, clipper
and accountant train the final classifier (they accept every GDP level for row-wise models).
"""

from graphveil.hookspecs import hookimpl


@hookimpl
def graphveil_methods():
    from graphveil.plugins.gdp.dpdgc import Dpdgc
    from graphveil.plugins.gdp.gap import Gap
    from graphveil.plugins.gdp.rand_edge import RandEdgeSage

    return {"gap": Gap, "dpdgc": Dpdgc, "rand_edge_sage": RandEdgeSage}


@hookimpl
def graphveil_models():
    from graphveil.plugins.gdp.modules import FullGraphSAGE, LinkX

    return {"linkx": LinkX, "sage_full": FullGraphSAGE}
