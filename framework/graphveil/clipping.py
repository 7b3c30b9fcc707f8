"""Per-tuple clipping shared by every clipper: factorᵢ = min(1, thresholdᵢ / ‖g(Tᵢ)‖).

A clipper only decides the per-tuple thresholds (a constant C for standard clipping, a
batch-dependent C/(2·max-freq(Tᵢ)) for FREQ-CLIP, paper 1 Alg. 1); :func:`per_tuple_factors`
turns thresholds and norms into scale factors, and :class:`ThresholdClipper` wires the two
into the :class:`~graphveil.components.Clipper` interface.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field

from graphveil.components import Clipper, TupleBatch
from graphveil.errors import GraphVeilError


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
