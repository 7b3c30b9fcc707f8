"""Privacy accounting core: RDP → (ε, δ) conversion (Thm D.1), the generic RDP accountant, default δ.

Analyses of particular sampling schemes live in plugins (coupled sampling in
``graphveil.plugins.entity_dp``, Poisson sampling via dp-accounting in ``graphveil.plugins.edge_dp``).
"""

from graphveil.privacy.conversion import (
    DEFAULT_ORDERS,
    rdp_to_epsilon,
    validate_delta,
    validate_orders,
)
from graphveil.privacy.delta import (
    DEFAULT_DELTA_RULE,
    default_delta,
    delta_too_large,
    delta_warning,
)
from graphveil.privacy.rdp_accountant import (
    RdpAccountantBase,
    RdpParams,
    bisect_sigma,
    check_noise_multiplier,
    check_steps,
)

__all__ = [
    "DEFAULT_DELTA_RULE",
    "DEFAULT_ORDERS",
    "RdpAccountantBase",
    "RdpParams",
    "bisect_sigma",
    "check_noise_multiplier",
    "check_steps",
    "default_delta",
    "delta_too_large",
    "delta_warning",
    "rdp_to_epsilon",
    "validate_delta",
    "validate_orders",
]
