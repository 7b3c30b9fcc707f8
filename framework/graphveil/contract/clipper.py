"""The clipper family: turns per-example gradient norms into scale factors with a declared
sensitivity, and the per-tuple clipping every built-in clipper shares.

factorᵢ = min(1, thresholdᵢ / ‖g(Tᵢ)‖): a clipper only decides the per-tuple thresholds (a
constant C for standard clipping, a batch-dependent C/(2·max-freq(Tᵢ)) for FREQ-CLIP, paper 1
Alg. 1); :func:`per_tuple_factors` turns thresholds and norms into scale factors, and
:class:`ThresholdClipper` wires the two into the :class:`Clipper` interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.contract.errors import GraphVeilError
from graphveil.contract.options import NoParams
from graphveil.contract.profiles import SamplingProfile, SensitivityKind, SensitivityProfile
from graphveil.contract.sampler import TupleBatch
from graphveil.contract.units import ClaimsUnit


class Clipper(ClaimsUnit, ABC):
    """Turns per-tuple gradient norms into per-tuple scale factors in (0, 1].

    The clipped sum Σᵢ factorᵢ·g(Tᵢ) must have the declared sensitivity with respect to the
    privacy unit, with noise N(0, σ²C²) added on top by the engine.
    """

    Params: ClassVar[type[BaseModel]] = NoParams
    sensitivity_kind: ClassVar[SensitivityKind]
    clip_norm: float

    def bind(self, sampling: SamplingProfile) -> None:  # noqa: B027 - optional hook, no-op by default
        """Attach the sampling profile of this run (default: nothing to do).

        Called once by the session after the sampler has prepared the graph and before the
        accountant is bound, so a clipper whose sensitivity depends on the sampling (e.g. on
        the degree cap K and k_neg) can calibrate itself; raise if the profile is unusable.
        """

    @abstractmethod
    def factors(self, batch: TupleBatch, norms: torch.Tensor) -> torch.Tensor:
        """Per-tuple scale factors (shape ``(b,)``) given per-tuple gradient norms."""

    @property
    def kappa(self) -> float | None:
        """The factor on C each example is clipped to when it is not C itself (FREQ-CLIP clips at
        C·κ so that its sum moves by at most C per unit), or ``None`` (default: clipped at C)."""
        return None

    @property
    def profile(self) -> SensitivityProfile:
        return SensitivityProfile(self.sensitivity_kind, self.unit, float(self.clip_norm))


def per_tuple_factors(norms: torch.Tensor, thresholds: torch.Tensor | float) -> torch.Tensor:
    """``min(1, threshold / norm)`` elementwise; 1 where the norm is 0.

    So ‖factorᵢ·gᵢ‖ = min(‖gᵢ‖, thresholdᵢ) ≤ thresholdᵢ (paper 1, Sec. 3 "standard clipping":
    gᵢ / max(1, ‖gᵢ‖/C)).

    :param norms: ``(b,)`` per-tuple gradient norms (≥ 0, finite).
    :param thresholds: a scalar or ``(b,)`` tensor of thresholds (> 0).
    :raises GraphVeilError: on a non-finite norm (clipping could not bound it).
    """
    norms = norms.detach()
    thresholds = torch.as_tensor(thresholds, dtype=norms.dtype, device=norms.device)
    if thresholds.ndim and thresholds.shape != norms.shape:
        raise ValueError(f"thresholds shape {tuple(thresholds.shape)} != norms shape {tuple(norms.shape)}")
    if not bool(torch.isfinite(norms).all()):
        raise GraphVeilError("a per-tuple gradient norm is NaN or infinite; clipping cannot bound it")
    if bool((norms < 0).any()) or bool((thresholds <= 0).any()):
        raise ValueError("norms must be >= 0 and thresholds > 0")
    ratio = thresholds / torch.where(norms > 0, norms, torch.ones_like(norms))
    return torch.where(norms > thresholds, ratio, torch.ones_like(ratio))


class ClipNormParams(BaseModel):
    """Options of a clipper with one clip norm C."""

    model_config = ConfigDict(extra="forbid")

    clip_norm: float = Field(default=1.0, gt=0, allow_inf_nan=False,
                             description="clip norm C; the Gaussian noise is N(0, σ²C²)")


class ThresholdClipper(Clipper):
    """A clipper defined by its per-tuple thresholds; factors via :func:`per_tuple_factors`."""

    Params: ClassVar[type[BaseModel]] = ClipNormParams

    def __init__(self, params: BaseModel | None = None) -> None:
        self.params = params if params is not None else self.Params()
        self.clip_norm = float(self.params.clip_norm)

    @abstractmethod
    def thresholds(self, batch: TupleBatch) -> torch.Tensor | float:
        """Per-tuple thresholds: a scalar or a ``(b,)`` tensor."""

    def factors(self, batch: TupleBatch, norms: torch.Tensor) -> torch.Tensor:
        if norms.shape != (batch.size,):
            raise ValueError(f"expected {batch.size} per-tuple norms, got shape {tuple(norms.shape)}")
        return per_tuple_factors(norms, self.thresholds(batch))
