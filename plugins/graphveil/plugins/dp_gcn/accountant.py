"""RDP of b-of-s graph splits sampled without replacement, one split replaced (dp-accounting)."""

from __future__ import annotations

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
from graphveil.plugins.dp_gcn.units import SPLIT_REPLACE, SplitUnits
from graphveil.privacy import RdpAccountantBase, RdpParams
from graphveil.privacy.rdp_accountant import dp_event_rdp


def split_step_event(num_splits: int, batch_size: int, noise_multiplier: float) -> Any:
    """The dp-accounting event of one step: ``SampledWithoutReplacementDpEvent(s, b, Gaussian(σ/2))``.

    Replacing one split changes at most one example of a batch (the split, if drawn), moving the
    clipped sum by at most 2C; the noise std is σC, so relative to the sensitivity the Gaussian's
    noise multiplier is σ/2 (Wang, Balle & Kasiviswanathan 2019, Thm 27, under REPLACE_ONE).
    With s = b = 1 (the whole training graph every step) this is the Gaussian mechanism
    ``GaussianDpEvent(σ/2)`` itself.
    """
    from graphveil.plugins.node_dp.accountant import (
        node_step_event,  # node_rdp's step, a split per example
    )

    return node_step_event(num_splits, batch_size, noise_multiplier)


class SplitRdpAccountant(SplitUnits, RdpAccountantBase):
    """Split-level (replacement) RDP of b-of-s WOR split batches with per-split clipping (dp-accounting).

    Each step is :func:`split_step_event` composed by ``dp_accounting.rdp.RdpAccountant`` under
    ``REPLACE_ONE`` (s and b are public). Paper 3 accounts the same steps with the moments
    accountant of Poisson sampling at q = b/s and sensitivity C, i.e. add/remove of a whole
    split — which covers one node only through group privacy; see
    :mod:`graphveil.plugins.dp_gcn.units`. The same curve is the run's under a weights-only GDP
    unit (``privacy.unit`` such as ``node/replacement/D=…``: :class:`~.units.SplitUnits`), since
    one such unit changes one split.
    """

    Params = RdpParams
    mechanism: ClassVar[str] = "split_rdp"
    unit: ClassVar[PrivacyUnit] = SPLIT_REPLACE
    supports: ClassVar[frozenset[tuple[SamplingKind, SensitivityKind]]] = frozenset({
        (SamplingKind.UNIFORM_WOR, SensitivityKind.PER_EXAMPLE),
    })
    #: the analysis holds only if split i's example reads split i's rows alone
    structures: ClassVar[frozenset[ExampleStructure]] = frozenset({ExampleStructure.COMPONENTS})

    def __init__(self, params: Any = None) -> None:
        super().__init__(params)
        self._s: int | None = None
        self._b: int | None = None

    def bind(self, sampling: SamplingProfile, sensitivity: SensitivityProfile) -> None:
        """Check the pair, s ≥ b ≥ 1 and C > 0.

        :raises ProfileMismatchError: for a pair outside :attr:`supports` or another unit.
        :raises PrivacyError: for split counts or clip norms that cannot be analysed.
        """
        from graphveil.plugins.node_dp.accountant import wor_sizes

        self.check_pair(sampling, sensitivity)
        self._s, self._b = s, b = wor_sizes(sampling, sensitivity, batch="splits per step", total="s")
        self._set_profile({"sampling": sampling.kind.value, "sensitivity": sensitivity.kind.value,
                           "num_splits": s, "batch_size": b})

    def per_step_rdp(self, noise_multiplier: float, orders: Sequence[float] | None = None) -> np.ndarray:
        import dp_accounting

        if self._s is None or self._b is None:
            raise PrivacyError(f"accountant {self.mechanism!r} is not bound to a sampling profile yet")
        return dp_event_rdp(split_step_event(self._s, self._b, noise_multiplier), self._step_orders(orders),
                            dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE)
