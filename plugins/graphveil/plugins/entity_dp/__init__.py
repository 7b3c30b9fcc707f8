"""Entity-level (node) DP for relational learning (paper: entity-level-dp-relational-learning).

Degree capping + Poisson positives + NEG-SAMPLE-WOR (Alg. 2), FREQ-CLIP (Alg. 1) and standard
per-tuple clipping, and the coupled-sampling RDP accountant (Thm 3, Eq. 3; Thm C.1, Eq. 47).
"""

from graphveil.contract.hookspecs import hookimpl


@hookimpl
def graphveil_samplers():
    from graphveil.plugins.entity_dp.sampler import (
        PoissonWithReplacementNegSampler,
        PoissonWORSampler,
    )

    return {"entity_poisson_wor": PoissonWORSampler, "entity_poisson_wr": PoissonWithReplacementNegSampler}


@hookimpl
def graphveil_clippers():
    from graphveil.plugins.entity_dp.clipping import FreqClipper, StandardNodeClipper

    return {"freq_clip": FreqClipper, "standard_clip": StandardNodeClipper}


@hookimpl
def graphveil_accountants():
    from graphveil.plugins.entity_dp.accountant import (
        CoupledRdpAccountant,
        CoupledRdpFreqAccountant,
        CoupledRdpStandardAccountant,
    )

    return {
        "coupled_rdp": CoupledRdpAccountant,
        "coupled_rdp_freq": CoupledRdpFreqAccountant,
        "coupled_rdp_standard": CoupledRdpStandardAccountant,
    }
