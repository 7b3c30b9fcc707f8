"""The fused CPU noise transform: ``_noise_kernel.c``, built at install time where it can be.

:meth:`Kernel.chain_add_` is :func:`graphveil.engine.noise.box_muller_chain` followed by the add into the
target, in one C pass over tiles that stay in the L1 cache (AVX-512 or AVX2). Same float64
quantities combined in the same order, rounded once into the target; only the elementary
functions are other implementations — the kernel's own ``log``-based radius and ``sin``/``cos``
with an exact octant reduction of the integer angle, each within one float64 ulp of a
long-double reference (``tests/engine/test_noise_kernel.py`` measures them and compares the two
transforms). The keystream, its layout, the chunks and their threads stay in ``noise.py``: this
module only replaces the arithmetic.

The extension is optional (``setup.py``): on a platform without it (not x86-64 Linux, no C
compiler at install time, a CPU without AVX2) :data:`KERNEL` is ``None`` and the noise keeps the
torch transform. ``GRAPHVEIL_NOISE_KERNEL=off`` turns the kernel off (to compare the two).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from pathlib import Path

import torch

logger = logging.getLogger(__name__)
_ENV = "GRAPHVEIL_NOISE_KERNEL"
_SIMD = {2: "avx512", 1: "avx2"}


class Kernel:
    """The kernel's C functions loaded from one shared library (ctypes releases the GIL while they
    run, so the draw's threads compute in parallel)."""

    def __init__(self, path: str | Path) -> None:
        self._lib = lib = ctypes.CDLL(str(path))
        self.simd = _SIMD.get(lib.gv_noise_simd())
        self._add = {}
        for dtype, name, ctype in ((torch.float32, "gv_chain_add_f32", ctypes.c_float),
                                   (torch.float64, "gv_chain_add_f64", ctypes.c_double)):
            fn = getattr(lib, name)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctype), ctypes.c_double]
            fn.restype = ctypes.c_int
            self._add[dtype] = (fn, ctype)

    def supports(self, out: torch.Tensor) -> bool:
        """Whether :meth:`chain_add_` can write ``out``: float32 or float64, contiguous, CPU."""
        return self.simd is not None and out.dtype in self._add and out.device.type == "cpu" and out.is_contiguous()

    def chain_add_(self, words: torch.Tensor, out: torch.Tensor, scale: float) -> None:
        """``out += scale·√2·z`` for the ``k = out.numel()`` coordinates of one chunk, from its
        ``2(k + 1)`` contiguous int64 keystream words (u_0 … u_k, then v_0 … v_k)."""
        k = out.numel()
        if not self.supports(out) or words.dtype != torch.int64 or not words.is_contiguous() \
                or words.numel() != 2 * (k + 1) or words.device.type != "cpu":
            raise ValueError(f"noise kernel: {2 * (k + 1)} contiguous CPU int64 words and a contiguous CPU "
                             f"float32/float64 output of {k} needed, got {words.dtype} x {words.numel()} and {out.dtype}")
        fn, ctype = self._add[out.dtype]
        if fn(words.data_ptr(), k, ctypes.cast(out.data_ptr(), ctypes.POINTER(ctype)), float(scale)) != 0:
            raise RuntimeError("noise kernel: this CPU has neither AVX-512 nor AVX2")


def built_path() -> Path | None:
    """The installed extension's file, if the install built it (found, not imported: it is a plain
    shared library, not a Python module)."""
    spec = importlib.util.find_spec("graphveil.engine._noise_kernel")
    return Path(spec.origin) if spec is not None and spec.origin else None


def _load() -> Kernel | None:
    if os.environ.get(_ENV, "").strip().lower() in ("0", "off", "false", "no"):
        return None
    path = built_path()
    if path is None:
        return None
    try:
        kernel = Kernel(path)
    except (OSError, AttributeError) as exc:  # unloadable (e.g. another platform's build) or stale
        logger.warning("the noise kernel %s cannot be used (%s); the noise runs its torch transform", path, exc)
        return None
    return kernel if kernel.simd is not None else None


#: The kernel this process uses (``None``: the torch transform); ``KERNEL.simd`` names its ISA.
KERNEL: Kernel | None = _load()


def transform_name() -> str:
    """Which transform this process's CPU noise runs: ``"c-kernel-avx512"``, ``"c-kernel-avx2"``
    or ``"torch"`` (recorded in ``privacy.json``: a research seed reproduces its noise exactly
    only on the same transform)."""
    return f"c-kernel-{KERNEL.simd}" if KERNEL is not None else "torch"
