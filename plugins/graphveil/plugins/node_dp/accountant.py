"""RDP of the sampled-without-replacement Gaussian under replace-one adjacency (dp-accounting)."""

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
from graphveil.plugins.node_dp.units import NODE_GDP, RowWiseGdpUnits
from graphveil.privacy import RdpAccountantBase, RdpParams
from graphveil.privacy.rdp_accountant import dp_event_rdp


class NodeReplaceRdpAccountant(RowWiseGdpUnits, RdpAccountantBase):
    """Node-level (replacement) RDP of b-of-n WOR batches with per-node clipping (dp-accounting).

    Replacing one node changes at most one example of a batch, moving the clipped sum by at
    most 2C; with noise std σC the Gaussian's noise multiplier relative to that sensitivity is
    σ/2. Each step is dp-accounting's ``SampledWithoutReplacementDpEvent(n, b, Gaussian(σ/2))``
    under ``REPLACE_ONE`` (Wang, Balle & Kasiviswanathan 2019, Thm 27).
    """

    Params = RdpParams
    mechanism: ClassVar[str] = "node_rdp"
    unit: ClassVar[PrivacyUnit] = NODE_GDP
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.UNIFORM_WOR, SensitivityKind.PER_EXAMPLE),
    })
    structures: ClassVar[frozenset[ExampleStructure]] = frozenset({ExampleStructure.ROWS})
    #: replace-one sensitivity of a sum of per-example-clipped gradients, in units of C
    REPLACEMENT_SENSITIVITY: ClassVar[float] = 2.0

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._n: int | None = None
        self._b: int | None = None

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Check the pair, n ≥ b ≥ 1 and C > 0.

        :raises ProfileMismatchError: for a pair outside :attr:`supports` or another unit.
        :raises PrivacyError: for batch sizes or clip norms that cannot be analysed.
        """
        self.check_pair(sampling, sensitivity)
        n, b = wor_sizes(sampling, sensitivity)
        if sampling.examples_per_unit != 1:
            raise PrivacyError(f"accountant {self.mechanism!r} analyses one example per node; the sampler's "
                               f"examples share nodes (up to {sampling.examples_per_unit} per node): use "
                               "an accountant for rooted subgraphs (rooted_rdp)")
        self._n, self._b = n, b
        self._set_profile({"sampling": sampling.kind.value, "sensitivity": sensitivity.kind.value,
                           "n": n, "batch_size": b})

    def per_step_rdp(self, noise_multiplier: float, orders: Sequence[float] | None = None) -> np.ndarray:
        import dp_accounting  # here, not at import: it costs seconds of CLI start-up

        if self._n is None or self._b is None:
            raise PrivacyError(f"accountant {self.mechanism!r} is not bound to a sampling profile yet")
        return dp_event_rdp(node_step_event(self._n, self._b, noise_multiplier), self._step_orders(orders),
                            dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE)


def wor_sizes(sampling: SamplingProfile, sensitivity: SensitivityProfile, *,
              batch: str = "batch size", total: str = "n") -> tuple[int, int]:
    """(n, b) of a b-of-n sampled-without-replacement profile, after the checks every such
    accountant makes: 1 ≤ b ≤ n and a finite clip norm C > 0 (``batch`` and ``total`` name
    b and n in the message).

    :raises PrivacyError: naming the sizes or the clip norm.
    """
    n, b = int(sampling.num_records), int(sampling.batch_size)
    if not 1 <= b <= n:
        raise PrivacyError(f"need 1 <= {batch} <= {total}, got b={b}, {total}={n}")
    if not (sensitivity.clip_norm > 0 and math.isfinite(sensitivity.clip_norm)):
        raise PrivacyError(f"clip norm C must be a finite number > 0, got {sensitivity.clip_norm!r}")
    return n, b


def node_step_event(n: int, b: int, noise_multiplier: float, group: int = 1) -> Any:
    """The dp-accounting event of one per-node DP-SGD step (b of n nodes without replacement,
    clip C, noise std σC) under replace-one, when replacing one unit changes ``group`` examples.

    ``group = 1``: ``SampledWithoutReplacementDpEvent(n, b, Gaussian(σ/2))`` (one example moves
    the clipped sum by ≤ 2C; Wang, Balle & Kasiviswanathan 2019, Thm 27). ``group > 1``: at
    most min(group, b) examples of the batch change, moving the sum by ≤ 2C·min(group, b); no
    amplification by sampling is claimed for a group (none is analysed), so the step is
    ``Gaussian(σ / (2·min(group, b)))`` — exact for full batches (b = n), conservative otherwise.
    """
    import dp_accounting

    if group < 1:
        raise PrivacyError(f"group size must be >= 1, got {group}")
    sensitivity = NodeReplaceRdpAccountant.REPLACEMENT_SENSITIVITY
    if group == 1:
        return dp_accounting.SampledWithoutReplacementDpEvent(
            n, b, dp_accounting.GaussianDpEvent(noise_multiplier / sensitivity))
    return dp_accounting.GaussianDpEvent(noise_multiplier / (sensitivity * min(group, b)))
