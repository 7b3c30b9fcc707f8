"""Gaussian noise ``N(0, (σC)²)`` for the Gaussian mechanism (paper 2, Eq. 3; paper 1, Alg. 3).

Two sources:

* the run's seeded ``torch.Generator`` — reproducible, for research; not cryptographically
  secure, and said so once per process (as opacus does when ``secure_mode=False``);
* ``secure=True`` — standard normals by the Box–Muller transform of uniforms built from
  ``os.urandom`` (the OS CSPRNG), silently.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable

import numpy as np
import torch

logger = logging.getLogger(__name__)
_WARNED = False


def _warn_insecure_once() -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        logger.warning(
            "DP noise is drawn from the run's seeded PRNG, not a cryptographically secure RNG; "
            "set privacy.secure_rng=true for a deployment (the seed must then stay secret too)."
        )


def secure_standard_normal(n: int) -> np.ndarray:
    """``n`` i.i.d. N(0, 1) draws (float64) from ``os.urandom`` via Box–Muller."""
    pairs = (n + 1) // 2
    bits = np.frombuffer(os.urandom(16 * pairs), dtype=np.uint64).reshape(pairs, 2) >> np.uint64(11)
    # 53-bit uniforms: u1 in (0, 1] (safe for log), u2 in [0, 1).
    u1 = (bits[:, 0].astype(np.float64) + 1.0) * 2.0**-53
    u2 = bits[:, 1].astype(np.float64) * 2.0**-53
    radius = np.sqrt(-2.0 * np.log(u1))
    angle = 2.0 * math.pi * u2
    return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:n]


class GaussianNoise:
    """Draws Gaussian noise for released gradients.

    :param generator: the run's seeded generator (required unless ``secure``).
    :param secure: draw from the OS CSPRNG instead (``privacy.secure_rng``).
    """

    def __init__(self, generator: torch.Generator | None = None, *, secure: bool = False) -> None:
        if not secure and generator is None:
            raise ValueError("non-secure noise needs the run's seeded torch.Generator")
        self.generator = generator
        self.secure = secure

    def sample(self, shape: torch.Size | tuple[int, ...], std: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor of i.i.d. ``N(0, std²)`` entries."""
        if not (std >= 0 and math.isfinite(std)):
            raise ValueError(f"noise std must be a finite number >= 0, got {std}")
        shape = torch.Size(shape)
        if self.secure:
            z = torch.from_numpy(secure_standard_normal(shape.numel())).reshape(shape)
            return (z * std).to(dtype)
        _warn_insecure_once()
        return torch.randn(shape, generator=self.generator, dtype=dtype) * std

    def add_(self, tensors: Iterable[torch.Tensor], std: float) -> None:
        """Add independent noise to each tensor in place (every coordinate, even if std is 0)."""
        for t in tensors:
            t.add_(self.sample(t.shape, std, t.dtype))
