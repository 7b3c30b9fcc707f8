"""Poisson positives with decoupled negatives for edge-level DP (paper 2, Sec. 3.2 and Alg. 1)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field, model_validator

from graphveil.contract.profiles import PrivacyUnit, SamplingKind
from graphveil.sampling import PoissonTupleParams, PoissonTupleSampler


class PoissonDecoupledParams(PoissonTupleParams):
    """Options of the edge-level sampler."""

    min_records: int | None = Field(default=None, ge=1, description=(
        "m₀, a PUBLIC lower bound on the number of training relations: the rate is b/max(m, m₀) "
        "and the accountant analyses b/m₀, so ε is a function of public numbers only (a federated "
        "site's policy sets it: node config min-records); default: none, γ = b/m exactly"))

    @model_validator(mode="after")
    def _batch_within_floor(self) -> PoissonDecoupledParams:
        if self.min_records is not None and self.batch_size > self.min_records:
            raise ValueError(f"batch_size={self.batch_size} exceeds min_records={self.min_records}: "
                             "the accounted rate b/m₀ would exceed 1")
        return self


class PoissonDecoupledSampler(PoissonTupleSampler):
    """Poisson(γ = b/|E|) positives; each tuple's negatives uniform over V, independent of the data (paper 2, Sec. 3.2).

    Every edge of E is a positive independently with probability γ (no degree cap). Each of a
    tuple's k_neg negatives is a node drawn uniformly from V, independently of every other
    draw and of E, and paired with a random end of the tuple's positive. Removing or adding
    one relation therefore changes at most one tuple, so per-tuple clipping at C bounds the
    edge-level sensitivity by C (paper 2, Eq. 3).

    **Public size floor** (``min_records`` = m₀). Each relation is then included with
    probability γ' = b/max(m, m₀) and the profile states γ = b/m₀ ≥ γ', with b̄ = b. The
    accountant's analysis at γ upper-bounds the mechanism at γ': one step at rate γ' is a
    post-processing of one step at rate γ in Blackwell's sense — with Q = N(0, σ²) and
    P_q = (1−q)Q + q·N(1, σ²), the kernel "keep x with probability γ'/γ, else redraw x ~ Q"
    maps Q to Q and P_γ to P_γ' — so every divergence (RDP of every order, the hockey-stick
    divergences behind PLD) of (P_γ', Q) and (Q, P_γ') is at most that at γ, and adaptive
    composition keeps the order. ε then depends on b, m₀, σ, the steps and δ only: public.
    """

    Params: ClassVar[type[BaseModel]] = PoissonDecoupledParams
    sampling_kind: ClassVar[SamplingKind] = SamplingKind.POISSON_DECOUPLED
    unit: ClassVar[PrivacyUnit] = PrivacyUnit.EDGE

    def _size_floor(self) -> int | None:
        return self.params.min_records
