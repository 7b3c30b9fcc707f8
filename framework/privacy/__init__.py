"""Privacy accounting core: RDP → (ε, δ) conversion (Thm D.1) and the generic RDP accountant.

Analyses of particular sampling schemes live in plugins (coupled sampling in
``graphveil.plugins.entity_dp``, Poisson sampling via dp-accounting in ``graphveil.plugins.edge_dp``).
"""

from graphveil.privacy.conversion import (
    DEFAULT_ORDERS,
    rdp_to_epsilon,
    validate_delta,
    validate_orders,
)
from graphveil.privacy.rdp_accountant import (
    RdpAccountantBase,
    RdpParams,
    bisect_sigma,
    check_noise_multiplier,
    check_steps,
)

__all__ = [
    "DEFAULT_ORDERS",
    "RdpAccountantBase",
    "RdpParams",
    "bisect_sigma",
    "check_noise_multiplier",
    "check_steps",
    "rdp_to_epsilon",
    "validate_delta",
    "validate_orders",
]
