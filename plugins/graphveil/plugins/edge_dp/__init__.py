"""Edge-level DP for relational fine-tuning (paper: privately-learning-from-graphs-llm-finetuning).

Poisson positives with decoupled negatives (drawn uniformly from V per tuple, independent of
the data), per-tuple clipping at C, and accounting by dp-accounting's RDP analysis of the
Poisson-subsampled Gaussian (``edge_rdp``) or by its privacy loss distribution (``edge_pld``,
tighter; reports the RDP ε beside).
"""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_samplers():
    from graphveil.plugins.edge_dp.sampler import PoissonDecoupledSampler

    return {"edge_poisson_decoupled": PoissonDecoupledSampler}


@hookimpl
def graphveil_clippers():
    from graphveil.plugins.edge_dp.clipping import PerTupleEdgeClipper

    return {"per_tuple_clip": PerTupleEdgeClipper}


@hookimpl
def graphveil_accountants():
    from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
    from graphveil.plugins.edge_dp.pld_accountant import EdgePldAccountant

    return {"edge_rdp": EdgeRdpAccountant, "edge_pld": EdgePldAccountant}


@hookimpl
def graphveil_methods():
    from graphveil.plugins.edge_dp.rr_baseline import RrFinetune

    return {"rr_finetune": RrFinetune}
