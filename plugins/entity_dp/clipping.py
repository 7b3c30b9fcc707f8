"""Clippers for entity-level (node) DP relational learning (paper 1, Sec. 4.1).

* :class:`FreqClipper` — FREQ-CLIP (Alg. 1): tuple Tᵢ is clipped to C / (2·max-freq(Tᵢ)),
  where freq(v) counts the tuples of the batch in which node v occurs (|B⁺(v)| + |B⁻(v)|).
* :class:`StandardNodeClipper` — every tuple clipped to C; under node-level DP its
  sensitivity is (|B⁺(u)| + 2|B⁻(u)|)·C (Eq. 2), analysed by Thm C.1.

Caveat on FREQ-CLIP (tests/test_clipping_sensitivity.py): Prop. 4.1's proof (App. A) treats
the clipped gradients of the tuples that do not contain the removed node u* as equal in B
and B′. They are not when each batch is clipped with its own frequencies: removing u*'s
tuples lowers freq(v) of the other nodes v of those tuples and so raises the thresholds of
*other* tuples containing v. The sum then moves by at most
(C/4)·(2 + 3|B⁻(u*)| + |B⁺(u*)|·(1 + k_neg)) ≤ (C/4)·(5 + K(1 + k_neg)), and batches that
NEG-SAMPLE-WOR can draw reach C·(1 + K(1 + k_neg)/4) (7.25·C for K = 5, k_neg = 4) — not C.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from graphveil.clipping import ThresholdClipper
from graphveil.components import TupleBatch
from graphveil.profiles import PrivacyUnit, SensitivityKind


def max_frequencies(batch: TupleBatch) -> torch.Tensor:
    """``(b,)`` max-freq(Tᵢ) of paper 1, Alg. 1 (lines 2–5), ignoring ``-1`` padding.

    freq(v) = number of tuples of the batch whose node set {uᵢ, vᵢ, vᵢ₁, …, vᵢₖ} contains v
    (counted once per tuple however often v occurs in it); max-freq(Tᵢ) = max of freq over
    the node set of Tᵢ. The anchors are ends of the positive edge and add no node.
    """
    if batch.size == 0:
        return torch.zeros(0, dtype=torch.long)
    if bool((batch.positives < 0).any()):
        raise ValueError("positive edges must not contain -1 padding")
    # numpy: single-threaded, so it does not stall when OpenMP threads compete for a busy CPU.
    nodes = np.sort(batch.entities().numpy(), axis=1)
    once = np.ones(nodes.shape, dtype=bool)  # first occurrence of a node within its tuple
    once[:, 1:] = nodes[:, 1:] != nodes[:, :-1]
    present = nodes >= 0
    distinct, slot = np.unique(nodes, return_inverse=True)
    slot = slot.reshape(nodes.shape)
    freq = np.bincount(slot[present & once], minlength=distinct.size)
    return torch.from_numpy(np.where(present, freq[slot], 0).max(axis=1))


class FreqClipper(ThresholdClipper):
    """FREQ-CLIP: clip tuple Tᵢ to C / (2·max-freq(Tᵢ)) (paper 1, Alg. 1, Prop. 4.1).

    ``factorᵢ = min(1, C / (2·max-freq(Tᵢ)·‖g(Tᵢ)‖))``. With NEG-SAMPLE-WOR negatives
    (|B⁻(u)| ≤ 1) paper 1 states sensitivity C per node (Prop. 4.1); see the module note:
    that holds only if the other tuples' thresholds did not move with the batch.
    """

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.FREQ_CLIP_NODE
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.NODE

    def thresholds(self, batch: TupleBatch) -> torch.Tensor:
        return self.clip_norm / (2.0 * max_frequencies(batch).to(torch.float64))


class StandardNodeClipper(ThresholdClipper):
    """Standard per-tuple clipping at C under node-level DP: sensitivity (|B⁺(u)| + 2|B⁻(u)|)·C (paper 1, Eq. 2, Thm C.1)."""

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.STANDARD_TUPLE_NODE
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.NODE

    def thresholds(self, batch: TupleBatch) -> float:
        return self.clip_norm
