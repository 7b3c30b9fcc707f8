"""Clippers for entity-level (node) DP relational learning (paper 1, Sec. 4.1).

* :class:`FreqClipper` — FREQ-CLIP (Alg. 1) with a calibrated norm: tuple Tᵢ is clipped to
  C·κ / (2·max-freq(Tᵢ)), where freq(v) counts the tuples of the batch in which node v occurs
  (|B⁺(v)| + |B⁻(v)|) and κ = 4 / (5 + K(1 + k_neg)) (:func:`sensitivity_bound`).
* :class:`StandardNodeClipper` — every tuple clipped to C; under node-level DP its
  sensitivity is (|B⁺(u)| + 2|B⁻(u)|)·C (Eq. 2), analysed by Thm C.1.

Departure from the paper (why κ): Prop. 4.1 states that Alg. 1 at norm C has sensitivity C per
node with NEG-SAMPLE-WOR negatives. Its proof (App. A) treats the clipped gradients of the
tuples B₀ that do not contain the removed node u* as equal in B and B′. They are not when each
batch is clipped with its own frequencies (as Alg. 1 and Alg. 3 do): removing u*'s tuples
lowers freq(v) of the other nodes v of those tuples and so raises the thresholds of *other*
tuples containing v. Alg. 1 at norm C then moves the sum by up to
(C/4)·(2 + 3|B⁻(u*)| + |B⁺(u*)|·(1 + k_neg)) ≤ (C/4)·(5 + K(1 + k_neg)), and batches that
NEG-SAMPLE-WOR can draw reach C·(1 + K(1 + k_neg)/4) — 7.25·C for K = 5, k_neg = 4
(tests/plugins/entity_dp/test_clipping_sensitivity.py). Running Alg. 1 at norm C·κ scales every clipped
gradient, hence the bound, by κ, so the clipped sum has sensitivity ≤ C and Theorem 3 (which
assumes sensitivity C against noise N(0, σ²C²)) applies exactly; the noise stays σ·C.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch
from pydantic import BaseModel

from graphveil.contract.clipper import ThresholdClipper
from graphveil.contract.errors import PrivacyError, ProfileMismatchError
from graphveil.contract.profiles import PrivacyUnit, SamplingKind, SamplingProfile, SensitivityKind
from graphveil.contract.sampler import TupleBatch


def max_frequencies(batch: TupleBatch) -> torch.Tensor:
    """``(b,)`` max-freq(Tᵢ) of paper 1, Alg. 1 (lines 2–5), ignoring ``-1`` padding.

    freq(v) = number of tuples of the batch whose node set {uᵢ, vᵢ, vᵢ₁, …, vᵢₖ} contains v
    (counted once per tuple however often v occurs in it); max-freq(Tᵢ) = max of freq over
    the node set of Tᵢ. The anchors are ends of the positive edge and add no node.
    """
    if batch.size == 0:
        return torch.zeros(0, dtype=torch.long, device=batch.positives.device)
    if bool((batch.positives < 0).any()):
        raise ValueError("positive edges must not contain -1 padding")
    # numpy: single-threaded, so it does not stall when OpenMP threads compete for a busy CPU.
    # .cpu(): the batch may live on the GPU with the model; the result goes back to its device.
    nodes = np.sort(batch.entities().cpu().numpy(), axis=1)
    once = np.ones(nodes.shape, dtype=bool)  # first occurrence of a node within its tuple
    once[:, 1:] = nodes[:, 1:] != nodes[:, :-1]
    present = nodes >= 0
    distinct, slot = np.unique(nodes, return_inverse=True)
    slot = slot.reshape(nodes.shape)
    freq = np.bincount(slot[present & once], minlength=distinct.size)
    return torch.from_numpy(np.where(present, freq[slot], 0).max(axis=1)).to(batch.positives.device)


def sensitivity_bound(K: int | None, k_neg: int) -> float:
    """Node-level sensitivity of Alg. 1 at norm C, in units of C: (5 + K(1 + k_neg)) / 4.

    Setting (paper 1, Sec. 4.1): positives from a graph of maximal degree K, NEG-SAMPLE-WOR
    negatives, B′ ~ B for a removed node u*: R = B⁺(u*) (|R| ≤ K) is dropped, in N = B⁻(u*)
    (|N| ≤ 1) u* is replaced and the tuples get new gradients (N′), B₀ keeps its gradients; each
    batch is clipped with its own frequencies. With c = C/2:

    * R ∪ N in B: every such tuple has max-freq ≥ freq(u*) = |R| + |N|, so together ≤ c;
      N′ in B′: ≤ c each. Subtotal ≤ c(1 + |N|).
    * B₀: a tuple's clipped gradient moves by at most the change of its threshold,
      c·|1/max-freq − 1/max-freq′|. Charge it to the node v attaining max-freq in the batch
      where it is larger: the move is ≤ c·|Δfreq(v)| / (freq(v)·freq′(v)), and at most
      min(freq(v), freq′(v)) tuples of B₀ are charged to v, so v's share is
      ≤ c·|Δ| / (min + |Δ|) ≤ c·|Δ|/2. Over v ≠ u*, Σ_v |Δfreq(v)| ≤ |R|(1 + k_neg) (the other
      nodes of R's tuples) + |N| (the replacement z). Subtotal ≤ (c/2)(|R|(1 + k_neg) + |N|).

    Sum: (C/4)(2 + 3|N| + |R|(1 + k_neg)) ≤ (C/4)(5 + K(1 + k_neg)). Checked on sampled and
    constructed batches by ``test_paper_alg1_recomputed_frequencies_bound`` and
    ``test_paper_alg1_sensitivity_grows_with_k_and_k_neg`` (which reaches (C/4)(4 + K(1 + k_neg)))
    in tests/plugins/entity_dp/test_clipping_sensitivity.py.

    :raises PrivacyError: unless K ≥ 1 and k_neg ≥ 0 are integers.
    """
    if K is None or isinstance(K, bool) or int(K) != K or K < 1:
        raise PrivacyError(f"FREQ-CLIP needs a degree cap K >= 1 (paper 1, Alg. 3), got K={K!r}")
    if isinstance(k_neg, bool) or int(k_neg) != k_neg or k_neg < 0:
        raise PrivacyError(f"FREQ-CLIP needs k_neg to be an integer >= 0, got k_neg={k_neg!r}")
    return (5 + int(K) * (1 + int(k_neg))) / 4


class FreqClipper(ThresholdClipper):
    """FREQ-CLIP at a calibrated norm: clip tuple Tᵢ to C·κ / (2·max-freq(Tᵢ)) (paper 1, Alg. 1).

    ``factorᵢ = min(1, C·κ / (2·max-freq(Tᵢ)·‖g(Tᵢ)‖))`` with κ = 1 / :func:`sensitivity_bound`
    (K, k_neg) = 4 / (5 + K(1 + k_neg)), so the clipped sum has sensitivity ≤ C per node and
    Theorem 3 applies with noise N(0, σ²C²). Paper 1 runs Alg. 1 at κ = 1 and claims sensitivity C
    (Prop. 4.1); that misses the threshold changes of the untouched tuples (module note).

    :meth:`bind` must be called with the sampler's profile (the session does) before
    :meth:`factors`; it needs NEG-SAMPLE-WOR negatives (|B⁻(u)| ≤ 1) and a degree cap K.
    """

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.FREQ_CLIP_NODE
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.NODE

    def __init__(self, params: BaseModel | None = None) -> None:
        super().__init__(params)
        self._kappa: float | None = None
        self._k_neg = 0

    def bind(self, sampling: SamplingProfile) -> None:
        """Set κ = 4 / (5 + K(1 + k_neg)) from the sampler's degree cap K and k_neg.

        :raises ProfileMismatchError: the sampler is not NEG-SAMPLE-WOR (the bound needs |B⁻(u)| ≤ 1).
        :raises PrivacyError: no degree cap K ≥ 1 or a bad k_neg.
        """
        if sampling.kind is not SamplingKind.COUPLED_POISSON_WOR:
            raise ProfileMismatchError(
                f"FREQ-CLIP bounds node-level sensitivity only with NEG-SAMPLE-WOR negatives "
                f"({SamplingKind.COUPLED_POISSON_WOR.value}, |B-(u)| <= 1; paper 1, Sec. 4.1), "
                f"got sampling {sampling.kind.value}"
            )
        self._kappa = 1.0 / sensitivity_bound(sampling.degree_cap, sampling.k_neg)
        self._k_neg = int(sampling.k_neg)

    @property
    def kappa(self) -> float:
        """κ, the factor on C in Alg. 1's threshold (raises before :meth:`bind`)."""
        if self._kappa is None:
            raise PrivacyError(
                "FreqClipper is not bound to a sampling profile: call bind(sampler_profile) first "
                "(its clip norm C*kappa depends on the degree cap K and k_neg)"
            )
        return self._kappa

    def thresholds(self, batch: TupleBatch) -> torch.Tensor:
        kappa = self.kappa
        if batch.k_neg > self._k_neg:  # κ was calibrated for at most k_neg negatives per tuple
            raise PrivacyError(f"FreqClipper was bound for k_neg={self._k_neg}, got a batch with k_neg={batch.k_neg}")
        return self.clip_norm * kappa / (2.0 * max_frequencies(batch).to(torch.float64))


class StandardNodeClipper(ThresholdClipper):
    """Standard per-tuple clipping at C under node-level DP: sensitivity (|B⁺(u)| + 2|B⁻(u)|)·C (paper 1, Eq. 2, Thm C.1)."""

    sensitivity_kind: ClassVar[SensitivityKind] = SensitivityKind.STANDARD_TUPLE_NODE
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.NODE

    def thresholds(self, batch: TupleBatch) -> float:
        return self.clip_norm
