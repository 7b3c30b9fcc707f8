"""Gaussian noise ``N(0, (σC)²)`` for the Gaussian mechanism (paper 2, Eq. 3; paper 1, Alg. 3).

The noise is what hides a privacy unit, so whoever can reproduce it can subtract it from a
released gradient and recover the clipped sum. Hence:

* **Default — CSPRNG** (``mode == "csprng-4sum"``): every standard normal comes from 53-bit
  uniforms (Box–Muller) of an AES-256-CTR keystream under a key of 32 fresh bytes from the OS
  CSPRNG (``os.urandom``), a new key for every draw — NIST SP 800-90A's CTR_DRBG construction.
  It is on no ``torch.Generator`` at all — in particular never on the run's sampling generator
  — and the key lives only inside the draw, so no seed exists to be written anywhere. (Reading
  ``os.urandom`` for every byte was about 2× slower: the noise of a fully fine-tuned encoder is tens
  of millions of coordinates per step.)
* **Research seed** (``mode == "research-seed"``): a fixed seed, for reproducible research
  only, on the noise object's OWN ``torch.Generator`` (never the sampling generator). Anyone
  who knows the seed can subtract the noise; a loud warning is logged once per process and
  ``privacy.json`` records that the seed was set.

Floating-point safety (both modes): a single floating-point Gaussian sample leaks its
low-order bits, which can reveal the unnoised value (Mironov 2012; Holohan & Braghin 2021,
"Secure Random Sampling in Differential Privacy", arXiv:2107.10138, Sec. 5.1; the attack on
Opacus, arXiv:2112.05307). As Opacus' secure mode does
(``opacus.optimizers.optimizer._generate_noise`` with ``secure_mode=True``: four
``torch.normal(0, std)`` draws summed and divided by 2), every output coordinate here is
``(z₁ + z₂ + z₃ + z₄) / 2`` for four independent standard normals ``zᵢ``: again exactly
N(0, 1), and the attack's cost grows from 2⁵³ to 2¹⁵⁹ (the paper's n = 2, i.e. 2n = 4 draws).
The sum is taken in float64, scaled by ``std``, then cast to the target dtype.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from typing import Literal

import numpy as np
import torch

logger = logging.getLogger(__name__)
_WARNED = False

#: Coordinates generated per chunk (bounds the float64 working memory to ~40 MB).
_CHUNK = 1 << 20

NoiseMode = Literal["csprng-4sum", "research-seed"]


def _warn_research_seed_once() -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        logger.warning(
            "RESEARCH MODE: DP noise is drawn from a generator seeded with privacy.research_noise_seed. "
            "Anyone who knows that seed can regenerate the noise and subtract it from every released "
            "update: the run has NO privacy against them. Never use this for real data."
        )


def csprng_bytes(n: int) -> bytearray:
    """``n`` bytes of AES-256-CTR keystream under a fresh key and counter from ``os.urandom``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    encryptor = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(os.urandom(16))).encryptor()
    out = bytearray(n + 15)  # update_into wants a block's slack
    written = encryptor.update_into(bytes(n), out)
    del out[written:]
    return out


def secure_standard_normal(n: int) -> np.ndarray:
    """``n`` i.i.d. N(0, 1) draws (float64) from :func:`csprng_bytes` via Box–Muller (one draw
    each, no 4-sum)."""
    pairs = (n + 1) // 2
    words = torch.frombuffer(csprng_bytes(16 * pairs), dtype=torch.int64).view(2, pairs)
    # 53-bit uniforms (the top 53 bits of each word): u1 in (0, 1] (safe for log), u2 in [0, 1).
    u = (words >> 11).bitwise_and_((1 << 53) - 1).to(torch.float64).mul_(2.0**-53)
    radius = u[0].add_(2.0**-53).log_().mul_(-2.0).sqrt_()
    angle = u[1].mul_(2.0 * math.pi)
    return torch.cat([radius * angle.cos(), radius * angle.sin()])[:n].numpy()


def secure_4sum_normal(n: int) -> np.ndarray:
    """``n`` i.i.d. N(0, 1) draws (float64), each ``(z₁+z₂+z₃+z₄)/2`` of four CSPRNG normals."""
    out = np.empty(n, dtype=np.float64)
    for start in range(0, n, _CHUNK):
        size = min(_CHUNK, n - start)
        z = secure_standard_normal(4 * size).reshape(4, size)
        np.sum(z, axis=0, out=out[start : start + size])
    out *= 0.5
    return out


class GaussianNoise:
    """Draws Gaussian noise for released gradients.

    :param research_seed: ``None`` (the default and the only private setting): OS CSPRNG.
        An int: reproducible noise from this object's own ``torch.Generator`` seeded with it —
        research only, the noise can be subtracted by anyone who knows the seed.
    """

    def __init__(self, *, research_seed: int | None = None) -> None:
        self.research_seed = research_seed
        self.generator: torch.Generator | None = None
        if research_seed is not None:
            if isinstance(research_seed, bool) or not isinstance(research_seed, int):
                raise ValueError(f"research_seed must be an int, got {research_seed!r}")
            self.generator = torch.Generator().manual_seed(research_seed)
            _warn_research_seed_once()

    @property
    def mode(self) -> NoiseMode:
        """``"csprng-4sum"`` or ``"research-seed"`` (recorded in ``privacy.json`` as ``noise``)."""
        return "csprng-4sum" if self.research_seed is None else "research-seed"

    def sample(self, shape: torch.Size | tuple[int, ...], std: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A tensor of i.i.d. ``N(0, std²)`` entries (each the 4-sum of standard normals ÷ 2)."""
        if not (std >= 0 and math.isfinite(std)):
            raise ValueError(f"noise std must be a finite number >= 0, got {std}")
        shape = torch.Size(shape)
        if self.generator is None:
            z = torch.from_numpy(secure_4sum_normal(shape.numel())).reshape(shape)
        else:
            z = torch.randn((4, *shape), generator=self.generator, dtype=torch.float64).sum(0).mul_(0.5)
        return (z * std).to(dtype)

    def add_(self, tensors: Iterable[torch.Tensor], std: float) -> None:
        """Add independent noise to each tensor in place (every coordinate, even if std is 0)."""
        for t in tensors:
            t.add_(self.sample(t.shape, std, t.dtype).to(t.device))
