"""The fused CPU noise transform (``graphveil.engine._noise_kernel``, C) against the torch one.

The kernel replaces the arithmetic of ``noise.box_muller_chain`` + the add into the target; these
tests compile the C source of this checkout (so a mutated source is what runs) and compare it,
on both instruction sets, with the torch transform, which ``tests/run/test_noise.py`` pins to an
independent numpy reference. The statistical tests of the noise run on whichever transform the
install has (both, where it has the kernel).
"""

from __future__ import annotations

import ctypes
import math
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from graphveil.engine import noise, noise_kernel
from graphveil.engine.noise_kernel import Kernel

SOURCE = Path(noise_kernel.__file__).with_name("_noise_kernel.c")
COMPILER = shutil.which("cc") or shutil.which("gcc")
X86_LINUX = sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")
needs_compiler = pytest.mark.skipif(not (X86_LINUX and COMPILER), reason="the kernel builds on x86-64 Linux with a C compiler")
# tile (512) and lane (8, 4) boundaries on both sides, one coordinate, a whole chunk
SIZES = [1, 2, 3, 7, 8, 9, 511, 512, 513, 1029, noise._CHUNK]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's ``_noise_kernel.c``, compiled now with setup.py's flags."""
    out = tmp_path_factory.mktemp("kernel") / "noise_kernel.so"
    done = subprocess.run([COMPILER, "-O3", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC",
                           "-o", str(out), str(SOURCE), "-lm"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out


def kernel_at(path: Path, simd: str) -> Kernel:
    """The compiled kernel capped at ``simd``: a copy of the library of its own (the cap is the
    library's global state; ``compiled`` itself stays uncapped)."""
    own = path.with_name(f"{simd}.so")
    if not own.exists():
        shutil.copy2(path, own)
    kernel = Kernel(own)
    kernel._lib.gv_noise_cap_simd({"avx512": 2, "avx2": 1}[simd])
    kernel.simd = noise_kernel._SIMD.get(kernel._lib.gv_noise_simd())
    if kernel.simd != simd:
        pytest.skip(f"this CPU has no {simd}")
    return kernel


def words_for(k: int, seed: int) -> torch.Tensor:
    """A chunk's 2(k + 1) keystream words: uniform 64-bit patterns (the high bits must be masked)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**63), 2**63 - 1, (2 * (k + 1),), dtype=torch.int64, generator=gen)


def torch_transform(words: torch.Tensor) -> torch.Tensor:
    work = torch.empty(3 * (words.numel() // 2), dtype=torch.float64)
    return noise.box_muller_chain(words.clone(), work).clone()


@needs_compiler
@pytest.mark.parametrize("simd", ["avx512", "avx2"])
@pytest.mark.parametrize("k", SIZES)
def test_the_kernel_is_the_torch_transform(compiled: Path, simd: str, k: int) -> None:
    """float64 target: before + scale·√2z, the same √2z as the torch transform to ~1e-13 (the
    elementary functions are the kernel's own, within an ulp of numpy's and torch's); the words are only
    read; float32 target: the float64 sum rounded once."""
    kernel = kernel_at(compiled, simd)
    words = words_for(k, seed=k)
    kept = words.clone()
    z = torch_transform(words)
    before = torch.linspace(-3, 3, k, dtype=torch.float64)
    out = before.clone()
    kernel.chain_add_(words, out, 0.7)
    assert torch.equal(words, kept)
    torch.testing.assert_close(out, before + 0.7 * z, rtol=1e-13, atol=1e-13)
    got = before.float()
    kernel.chain_add_(words, got, 0.7)
    want = (before.float().double() + 0.7 * z).float()
    assert int((got != want).sum()) <= max(1, k // 10_000)  # an ulp of sin can flip a float32 rounding
    torch.testing.assert_close(got, want, rtol=2.0**-23, atol=0)


def edge_words() -> np.ndarray:
    """Words at the edges of the kernel's reductions: u = 1 and u = 2⁻⁵³, powers of two, the
    √½ switch of the radius' mantissa, and both sides of every octant boundary of the angle."""
    top = 1 << 53
    near_half = int((1 - 2**-0.5) * top)
    words = [0, 1, 2, top - 1, top - 2, top // 2 - 1, top // 2, top // 2 + 1, *(1 << e for e in range(53)),
             *range(near_half - 3, near_half + 4)]
    words += [o * (1 << 50) + d for o in range(8) for d in (-2, -1, 0, 1, 2) if 0 <= o * (1 << 50) + d < top]
    return np.array(words, dtype=np.uint64)


@needs_compiler
@pytest.mark.parametrize("simd", ["avx512", "avx2"])
def test_the_elementary_functions_are_within_an_ulp(compiled: Path, simd: str) -> None:
    """The kernel's radius √(−2 ln u) and sin/cos of φ = 2πw·2⁻⁵³ (its own series, polynomials and
    exact octant reduction) against long-double (64-bit mantissa) references, on the edges of the
    reductions and 20 000 random words: radius within one float64 ulp relative, sine and cosine
    within one ulp of 1 absolute (a wrong octant swap or sign, coefficient, threshold or ln 2 part
    is off by far more)."""
    assert np.finfo(np.longdouble).nmant >= 63, "needs x86 80-bit long double"
    kernel = kernel_at(compiled, simd)
    rng = np.random.default_rng(5)
    # high bits set too: the kernel must mask them
    words = np.concatenate([edge_words(), rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True)])
    n = words.size
    radius, sin, cos = np.empty(n), np.empty(n), np.empty(n)
    fn = kernel._lib.gv_pair_parts
    fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] + [ctypes.c_void_p] * 3
    assert fn(words.ctypes.data, words.ctypes.data, n, radius.ctypes.data, sin.ctypes.data, cos.ctypes.data) == 0
    w = (words & np.uint64((1 << 53) - 1)).astype(np.longdouble)
    u = 1 - w / np.longdouble(2**53)  # exact in long double
    want_radius = np.sqrt(-2 * np.log(u))
    phi = 2 * np.arccos(np.longdouble(-1)) * w / np.longdouble(2**53)
    ulp = 2.0**-52
    ok = want_radius > 0
    assert np.all(radius[~ok] == 0)
    assert float(np.max(np.abs(radius[ok] - want_radius[ok]) / want_radius[ok])) <= ulp
    assert float(np.max(np.abs(sin - np.sin(phi)))) <= ulp
    assert float(np.max(np.abs(cos - np.cos(phi)))) <= ulp


@needs_compiler
def test_the_two_instruction_sets_agree(compiled: Path) -> None:
    words = words_for(noise._CHUNK, seed=3)
    outs = []
    for simd in ("avx512", "avx2"):
        out = torch.zeros(noise._CHUNK, dtype=torch.float64)
        kernel_at(compiled, simd).chain_add_(words, out, 1.0)
        outs.append(out)
    torch.testing.assert_close(*outs, rtol=1e-13, atol=1e-13)


@needs_compiler
def test_the_install_runs_the_kernel_of_this_source(compiled: Path) -> None:
    """Where the kernel can be built, the install built it, the noise uses it, and it computes
    exactly what this checkout's source does (a stale build would not)."""
    if Kernel(compiled).simd is None:
        pytest.skip("this CPU has neither AVX-512 nor AVX2")
    assert noise_kernel.built_path() is not None, "the install did not build graphveil.engine._noise_kernel"
    assert noise_kernel.KERNEL is not None and noise_kernel.KERNEL.simd == Kernel(compiled).simd
    words = words_for(1029, seed=9)
    installed, fresh = torch.zeros(1029, dtype=torch.float64), torch.zeros(1029, dtype=torch.float64)
    noise_kernel.KERNEL.chain_add_(words, installed, 1.0)
    Kernel(compiled).chain_add_(words, fresh, 1.0)
    assert torch.equal(installed, fresh)


@needs_compiler
def test_the_kernel_refuses_what_it_cannot_write(compiled: Path) -> None:
    kernel = Kernel(compiled)
    if kernel.simd is None:
        pytest.skip("this CPU has neither AVX-512 nor AVX2")
    words = words_for(10, seed=1)
    for out in (torch.zeros(10, dtype=torch.bfloat16), torch.zeros(20)[::2], torch.zeros(11)):
        with pytest.raises(ValueError, match="noise kernel"):
            kernel.chain_add_(words, out, 1.0)
    with pytest.raises(ValueError, match="noise kernel"):
        kernel.chain_add_(words.int(), torch.zeros(10), 1.0)


def test_the_switch_turns_the_kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHVEIL_NOISE_KERNEL", "off")
    assert noise_kernel._load() is None
    secret = bytes(range(48))
    out = torch.zeros(1000, dtype=torch.float64)
    monkeypatch.setattr(noise_kernel, "KERNEL", None)
    noise.keystream_noise_add_(out, 1 / math.sqrt(2), secret)
    assert 0.8 < float(out.std()) < 1.2


def test_an_unloadable_kernel_falls_back_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """A kernel file that cannot be loaded (here: not a shared library) is reported and skipped."""
    broken = tmp_path / "_noise_kernel.so"
    broken.write_bytes(b"not an ELF file")
    monkeypatch.delenv("GRAPHVEIL_NOISE_KERNEL", raising=False)
    monkeypatch.setattr(noise_kernel, "built_path", lambda: broken)
    with caplog.at_level("WARNING", logger="graphveil.engine.noise_kernel"):
        assert noise_kernel._load() is None
    assert "cannot be used" in caplog.text
