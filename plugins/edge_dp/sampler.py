"""Poisson positives with decoupled negatives for edge-level DP (paper 2, Sec. 3.2 and Alg. 1)."""

from __future__ import annotations

from typing import ClassVar

from graphveil.profiles import PrivacyUnit, SamplingKind
from graphveil.sampling import PoissonTupleSampler


class PoissonDecoupledSampler(PoissonTupleSampler):
    """Poisson(γ = b/|E|) positives; each tuple's negatives uniform over V, independent of the data (paper 2, Sec. 3.2).

    Every edge of E is a positive independently with probability γ (no degree cap). Each of a
    tuple's k_neg negatives is a node drawn uniformly from V, independently of every other
    draw and of E, and paired with a random end of the tuple's positive. Removing or adding
    one relation therefore changes at most one tuple, so per-tuple clipping at C bounds the
    edge-level sensitivity by C (paper 2, Eq. 3).
    """

    sampling_kind: ClassVar[SamplingKind] = SamplingKind.POISSON_DECOUPLED
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.EDGE
