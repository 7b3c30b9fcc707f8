"""RDP of DP-SGD on rooted subgraphs: b of n roots without replacement, G examples per node.

Daigavane et al. (2021, Thm 1), under replacement adjacency. Fix the batch S (b of the n
training roots, the same distribution for both neighbouring graphs since n is public). Given S,
the noisy sum of clipped gradients is N(Σ_S g, σ²C²) on one graph and N(Σ_S g', σ²C²) on the
other; they differ in the ρ_S = |S ∩ changed| examples a replaced node reaches (≤ G of the n
roots, :func:`~graphveil.plugins.gdp.rooted.changed_examples`), each by ≤ 2C, so the means are
≤ 2ρ_S·C apart and Ψ_α = E_Q (P/Q)^α of the pair is ≤ exp(α(α−1)(2ρ_S)²/(2σ²)). Ψ_α is jointly
convex in (P, Q) for α > 1, so the mixtures over S satisfy

    ε(α) ≤ 1/(α−1) · log E_ρ exp(2α(α−1)ρ²/σ²),   ρ ~ Hypergeometric(n roots, G changed, b drawn),

with G replaced by min(G, n). A larger G only shifts ρ up (stochastic order) and the integrand
grows with ρ, so the bound holds for any graph whose node reaches at most G examples. Special
cases (tests): b = n gives ρ = min(G, n) surely, the Gaussian mechanism at σ/(2·min(G, n));
G = 1 is a valid (looser) bound of the sampled-without-replacement Gaussian of node_rdp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import (
    ExampleStructure,
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.plugins.gdp.rooted import NodeLevelWithBound
from graphveil.plugins.node_dp.accountant import wor_sizes
from graphveil.plugins.node_dp.units import NODE_GDP
from graphveil.privacy import RdpAccountantBase, RdpParams

#: ℓ2 change of one example's clipped gradient when its data is replaced, in units of C
REPLACEMENT_SENSITIVITY = 2.0


def rooted_step_rdp(orders: Sequence[float], n: int, b: int, group: int, noise_multiplier: float) -> np.ndarray:
    """ε(α) of one step (module docstring) at every order α > 1.

    :param n: training roots; ``b``: roots per step (1 ≤ b ≤ n); ``group``: G ≥ 1.
    :param noise_multiplier: σ, noise std σ·C.
    """
    from scipy.special import logsumexp
    from scipy.stats import hypergeom

    if not 1 <= b <= n or group < 1:
        raise PrivacyError(f"need 1 <= b <= n and G >= 1, got n={n}, b={b}, G={group}")
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise PrivacyError(f"noise multiplier must be a finite number > 0, got {noise_multiplier!r}")
    changed = min(group, n)
    rho = np.arange(max(0, b - (n - changed)), min(changed, b) + 1, dtype=float)
    log_pmf = hypergeom.logpmf(rho, n, changed, b)
    alphas = np.asarray(orders, dtype=float)[:, None]
    shift = REPLACEMENT_SENSITIVITY * rho[None, :] / noise_multiplier  # mean gap in noise stds
    log_psi = logsumexp(log_pmf[None, :] + alphas * (alphas - 1) * shift**2 / 2, axis=1)
    return np.maximum(log_psi, 0.0) / (alphas[:, 0] - 1)


class RootedRdpAccountant(NodeLevelWithBound, RdpAccountantBase):
    """Node-level GDP of DP-SGD on rooted subgraphs (uniform b-of-n roots, per-example clipping).

    Reads n, b and G (``examples_per_unit``) from the sampler's profile; refuses a profile
    without G (no out-degree bound) and any unit but paper 4's node level with D.
    """

    Params = RdpParams
    mechanism: ClassVar[str] = "rooted_rdp"
    unit: ClassVar[PrivacyUnit] = NODE_GDP
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.UNIFORM_WOR, SensitivityKind.PER_EXAMPLE),
    })
    structures: ClassVar[frozenset[ExampleStructure]] = frozenset({ExampleStructure.ROOT_SUBGRAPHS})
    #: a batch may hold b changed examples (G ≥ n for D = 100, L = 2): σ in the thousands is
    #: what such a budget takes, so calibration searches further than the base's 1000
    SIGMA_RANGE: ClassVar[tuple[float, float]] = (0.05, 1e6)

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._sizes: tuple[int, int, int] | None = None

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Check the pair, 1 ≤ b ≤ n, G ≥ 1 and C > 0. A profile without G (no out-degree bound)
        binds, but every ε and σ asked of it raises :class:`PrivacyError`.

        :raises ProfileMismatchError: for a pair outside :attr:`supports` or another unit.
        :raises PrivacyError: for sizes that cannot be analysed.
        """
        self.check_pair(sampling, sensitivity)
        n, b, group = int(sampling.num_records), int(sampling.batch_size), sampling.examples_per_unit
        self._sizes = None
        if group is None or self.unit.degree_bound is None:
            # a non-private run binds too (and never asks for ε); a private one fails at calibration
            self._set_profile({"n": n, "batch_size": b, "examples_per_unit": None})
            return
        wor_sizes(sampling, sensitivity)
        if group < 1:
            raise PrivacyError(f"need G >= 1 changed examples per node, got G={group}")
        self._sizes = (n, b, int(group))
        self._set_profile({"sampling": sampling.kind.value, "sensitivity": sensitivity.kind.value,
                           "n": n, "batch_size": b, "examples_per_unit": int(group),
                           "analysis": "hypergeometric mixture (Daigavane et al. 2021, Thm 1), replace-one"})

    def per_step_rdp(self, noise_multiplier: float, orders: Sequence[float] | None = None) -> np.ndarray:
        if self._sizes is None:
            raise PrivacyError(f"accountant {self.mechanism!r} needs the out-degree bound D that limits how "
                               "many rooted subgraphs one node reaches: state privacy.unit "
                               "'node/replacement/D=<D>/predictions' (paper 4: D=100)")
        n, b, group = self._sizes
        return rooted_step_rdp(self._step_orders(orders), n, b, group, noise_multiplier)
