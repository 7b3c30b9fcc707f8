"""Gaussian noise ``N(0, (σC)²)`` for the Gaussian mechanism (paper 2, Eq. 3; paper 1, Alg. 3).

The noise is what hides a privacy unit, so whoever can reproduce it can subtract it from a
released gradient and recover the clipped sum. Hence:

* **Default — CSPRNG** (``mode == "csprng-4sum"``): the noise of one draw (one tensor of one
  :meth:`GaussianNoise.add_` call) is a function of 48 fresh bytes of the OS CSPRNG
  (``os.urandom``): an AES-256 key and a nonce, new for every draw. The keystream is AES-256 in
  counter mode (``cryptography``, i.e. OpenSSL with AES-NI/VAES) — the generate step of NIST
  SP 800-90A's CTR_DRBG. It is on no ``torch.Generator`` (in particular never on the run's
  sampling generator), and the key lives only inside the draw, so no seed exists to be written.
* **Research seed** (``mode == "research-seed"``): the same computation, but each draw's 48
  secret bytes come from the noise object's OWN ``torch.Generator`` seeded with the research
  seed (never the sampling generator): reproducible, for research only. Anyone who knows the
  seed can subtract the noise; a loud warning is logged once per process and ``privacy.json``
  records that the seed was set.

**Keystream layout and threads.** A draw of n coordinates is cut into chunks of ``B =``
:data:`_CHUNK` coordinates; the chunk ``c`` (coordinates ``[cB, cB + k)``, ``k ≤ B``) has the
96-bit nonce ``N_c = N + c`` (mod 2⁹⁶; ``N`` = bytes 32–43 of the secret) and reads the ``k + 1``
AES blocks ``AES_K(N_c ‖ 2) … AES_K(N_c ‖ k + 2)`` (a 32-bit big-endian block counter: counter
mode as AES-GCM runs it, the CTR_DRBG generate step with a 32-bit counter) — ``16(k + 1)`` bytes,
as ``2(k + 1)`` 64-bit words (native byte order) in two rows of ``k + 1``: ``u_0 … u_k`` then
``v_0 … v_k`` (``k + 1`` Box–Muller pairs, below). The blocks are produced by an AES-256-GCM
encryptor of zeros whose tag is never formed: OpenSSL's GCM code runs AES on 4 blocks per
instruction where the CPU has VAES, its CTR mode on one (here 1.6 against 2.1 ns per
coordinate). Chunks are handed to ``torch.get_num_threads()`` threads (OpenSSL's AES, numpy's
and torch's kernels run without the GIL). One key, distinct nonces, a counter that never wraps
within a chunk (``B + 2 < 2³²``): no AES input twice in a draw, so no block twice (AES is a
permutation). The noise is thus a function of ``(key, N, n)`` alone, the same for any thread
count; a test checks it against a reference that encrypts the counter blocks one by one (ECB).
Each chunk is added straight into the target tensor (no full-size float64 copy of the noise).

**Floating-point defence** (Mironov 2012; Holohan & Braghin 2021, "Secure Random Sampling in
Differential Privacy", ESORICS 2021, arXiv:2107.10138, Sec. 5.1; the attack on Opacus,
Jin et al. 2022, arXiv:2112.05307). One floating-point Box–Muller sample can be inverted: its
low-order bits reveal the uniforms, hence the unnoised value. The paper's fix sums 2n Box–Muller
samples (n pairs, i.e. 2n independent p-bit uniforms) and divides by √(2n); to test one
released value the attack must then search the 2n − 1 uniforms the value does not pin down,
2^(p(2n−1)): 2¹⁵⁹ for n = 2 and p = 53. Opacus' secure mode (``_generate_noise`` in
``opacus/optimizers/optimizer.py``) sums four ``torch.normal`` draws and halves them, citing
the same 2¹⁵⁹. Here, with pair ``j = (u_j, v_j)`` of a chunk, ``u = 1 − w·2⁻⁵³ ∈ (0, 1]`` and
``v = w·2⁻⁵³`` from the low 53 bits of its words, and its two Box–Muller outputs

    X_j = r_j cos φ_j,   Y_j = r_j sin φ_j,   r = √(−2 ln u),  φ = 2πv,

coordinate ``j`` of the chunk is

    z_j = (Y_j + X_{j+1}) / √2          (j = 0 … k − 1; X_0 and Y_k are not used):

a chain in which each pair gives its sine output to its own coordinate and its cosine output to
the previous one. Every output feeds one coordinate only, and a pair's two outputs are
independent N(0, 1) (exactly, in real arithmetic), so the coordinates are i.i.d. N(0, 1); a
test checks that adjacent coordinates are independent (it fails if the sine is replaced by the
cosine, which makes neighbours share a term). Why this is still the paper's defence:

* *one released coordinate* is a function of four independent 53-bit uniforms
  (``u_j, v_j, u_{j+1}, v_{j+1}``): testing it means searching the three it does not pin down,
  2¹⁵⁹ — the paper's n = 2 bound, as before;
* *several released coordinates at once*: the attacker who tests m adjacent coordinates must
  find the 2(m + 1) uniforms of their m + 1 pairs under m equations, m + 2 free uniforms,
  2^(53(m+2)) ≥ 2¹⁵⁹; any set of coordinates splits into such runs (chunks share no pair), so
  a single coordinate stays the cheapest target. This is why the pairs are chained: giving the
  cosine and the sine of the SAME two pairs to two coordinates would leave 4 − 2 = 2 free
  uniforms for that couple of coordinates, 2¹⁰⁶;
* sharing a pair's two outputs between coordinates is how ``torch.normal`` itself consumes
  Box–Muller pairs (CPU, contiguous, ≥ 16 elements: in each block of 16 the cosine output goes
  to element i and the sine output to element i + 8, ``NormalFill16`` in ATen's
  ``DistributionTemplates.h``), hence how Opacus' secure mode does: its coordinates i and i + 8
  are sums over the same four pairs.

The departure from the paper: each coordinate sums two Box–Muller outputs of two different pairs
rather than both outputs of each of its two pairs; the count of uniforms behind one coordinate
(four), hence the attack's work, is the paper's. Per coordinate this costs 16 bytes of
keystream, one log, one sqrt, one sine and one cosine (the previous construction, two cosines of
two pairs of its own, took 32 bytes and two of each but the sine). The mode keeps its recorded
name ``csprng-4sum`` (four uniforms per coordinate, the n = 2 defence).

**Precision: float64, rounded once to the parameter's dtype.** ``z`` is formed in float64 and
``tensor.add_(z, alpha=σC/√2)`` computes ``g + σC·z`` in float64 and rounds it once to the
tensor's dtype. Forming ``z`` (or any stage of it) in float32 would NOT be safe, though float32
sines and cosines cost about half as much: the uniforms would be cut to 24 bits (u, v and φ
carry 53), shrinking the attack's search far below 2¹⁵⁹, and a sum of two float32 terms of size
~1 is a multiple of 2⁻²³–2⁻²⁴, while float32 resolves much finer below 1/2, so small noise
values would sit on a coarse grid — the holes the attack tests for (a test measures this, and
one checks that the transform's values are not float32 numbers). So every stage before the
final rounding is float64: none of them can drop to float32 without dropping bits of the
uniforms. The
float64 grid (≤ 2⁻⁵⁰·σC) is visible through float32 (bfloat16: far less) only where the
released value is below about 2⁻²⁷·σC in magnitude, probability ≈ 4·10⁻⁹ per coordinate (the
previous code, float64 cast to float32, had the same bound). So the parameter's dtype is used
where that is safe: for the one final rounding.

**The fused CPU kernel.** Where the install built it (x86-64 Linux with a C compiler; a CPU
with AVX-512 or AVX2), each chunk's transform and add run in C (``_noise_kernel.c``, loaded by
:mod:`graphveil.engine.noise_kernel`): the same float64 quantities, combined in the same order,
on tiles that stay in the L1 cache, with its own vectorised elementary functions in place of
numpy's ``log`` and torch's ``sin`` and ``cos``: the radius from the exponent and mantissa of
``u`` (exact) and a series, the sine and cosine from the angle's octant read off the integer
word (an exact reduction) and Taylor polynomials on [0, π/4]; each within one float64 ulp of a
long-double reference (tested). The keystream, its layout and the chunks are unchanged, so the
noise is the same function of ``(key, N, n)`` to a few float64 ulp, and the argument above
holds as it stands: four 53-bit uniforms per coordinate, float64 to the one final rounding (an
ulp of error in ``sin`` moves a value by ~10⁻¹⁵ and takes no bit from the uniforms). A research
seed reproduces the same noise on machines with the same transform; between the kernel and the
torch transform it can differ in the last float64 bits (one draw of 10⁷ coordinates: 72 % of
the float64 values differed, by at most 3.9·10⁻¹⁵; none after rounding to float32). Without the
kernel, or for other dtypes (bfloat16, float16), the torch transform runs.

**Other devices (CUDA).** The noise is drawn on the tensor's device, never copied from the
host: a ``torch.Generator`` of that device (on CUDA: Philox4x32-10, Salmon et al., "Parallel
random numbers: as easy as 1, 2, 3", SC 2011) is created for each draw, seeded with 64 bits of
the draw's secret and, on CUDA, its counter offset set from 58 more; it fills the 53-bit words
and the same transform runs on the device. Only the 16 secret bytes cross from the host. Why
this keeps the guarantee: (a) the DP proof needs noise independent of the data and of all the
adversary sees; from any generator that holds against adversaries who cannot tell its output
from independent uniforms (computational DP, Mironov, Pandey, Reingold & Vadhan, CRYPTO 2009) —
the CPU path assumes this of AES. (b) Each draw's generator state is a function of 122 fresh OS
CSPRNG bits only: no state links two draws, nothing outlives the draw, and no seed is written —
the same key discipline as the CPU path. (c) The difference is the primitive: Philox is a keyed
bijection built for statistical quality (it passes TestU01's BigCrush with a margin of rounds),
not a vetted cipher, and its key has 64 bits. Reproducing a draw means finding key and offset
(2¹²² by brute force); Philox's invertibility under a known key does not shorten this because
raw Philox outputs are never released, only the floating-point transform above (2¹⁵⁹ to
invert) plus the gradient. A deployment that wants AES's assumption on a GPU run must move the
gradients to the CPU before the noise is added.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch

from graphveil.engine import noise_kernel

logger = logging.getLogger(__name__)
_WARNED = False

NoiseMode = Literal["csprng-4sum", "research-seed"]

#: Bytes of a draw's secret: an AES-256 key, then 16 bytes: the CPU path's 96-bit nonce is the
#: first 12 of them (the device path reads the secret its own way: module note).
_KEY_BYTES, _COUNTER_BYTES, _NONCE_BYTES = 32, 16, 12
#: A Box–Muller pair is two 64-bit words (u, v) = one AES block; a chunk of k coordinates
#: reads k + 1 pairs (the chain of the module note).
_WORDS = 2
_UNIFORM_BITS = 53
#: Coordinates per chunk: 1 MiB of keystream and 1.5 MiB of float64 work per thread; larger
#: chunks gained < 3 % in time per coordinate, smaller ones pay the ops' call overhead.
_CHUNK = 1 << 16
#: Coordinates per chunk on a non-CPU device (bounds the device's working memory to 40 MiB).
_DEVICE_CHUNK = 1 << 20
_ZEROS = memoryview(bytes(8 * _WORDS * (_CHUNK + 1)))


def _pairs(k: int) -> int:
    """Box–Muller pairs (= AES blocks) read by a chunk of ``k`` coordinates."""
    return k + 1


def _warn_research_seed_once() -> None:
    global _WARNED
    if not _WARNED:
        _WARNED = True
        logger.warning(
            "RESEARCH MODE: DP noise is drawn from a generator seeded with privacy.research_noise_seed. "
            "Anyone who knows that seed can regenerate the noise and subtract it from every released "
            "update: the run has NO privacy against them. Never use this for real data."
        )


def fresh_secret() -> bytes:
    """48 fresh bytes of the OS CSPRNG: one draw's AES-256 key, then its nonce (or counter) bytes."""
    return os.urandom(_KEY_BYTES + _COUNTER_BYTES)


def _encryptor(secret: bytes, block_offset: int):  # noqa: ANN202 - a cryptography CipherContext
    """AES-256-CTR under ``secret``'s key, starting ``block_offset`` blocks past its counter."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    counter = (int.from_bytes(secret[_KEY_BYTES:], "big") + block_offset) % (1 << 128)
    return Cipher(algorithms.AES(secret[:_KEY_BYTES]), modes.CTR(counter.to_bytes(16, "big"))).encryptor()


def _chunk_encryptor(secret: bytes, chunk: int):  # noqa: ANN202 - a cryptography CipherContext
    """Chunk ``chunk``'s keystream (module note): AES-256-GCM under ``secret``'s key and the nonce
    ``N + chunk`` (mod 2⁹⁶); encrypting zeros gives the blocks ``AES_K(N_c ‖ 2), AES_K(N_c ‖ 3), …``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    nonce = (int.from_bytes(secret[_KEY_BYTES : _KEY_BYTES + _NONCE_BYTES], "big") + chunk) % (1 << 96)
    return Cipher(algorithms.AES(secret[:_KEY_BYTES]), modes.GCM(nonce.to_bytes(_NONCE_BYTES, "big"))).encryptor()


def csprng_bytes(n: int) -> bytearray:
    """``n`` bytes of AES-256-CTR keystream under a fresh key and counter from ``os.urandom``."""
    out = bytearray(n + 15)  # update_into wants a block's slack
    written = _encryptor(fresh_secret(), 0).update_into(bytes(n), out)
    del out[written:]
    return out


def box_muller_chain(words: torch.Tensor, work: torch.Tensor) -> torch.Tensor:
    """``√2·z`` for the k coordinates of one chunk from its ``2(k + 1)`` uniform words (int64).

    The words are two rows of ``k + 1``: u_0 … u_k, then v_0 … v_k (pair j = (u_j, v_j)); with
    ``X_j = r_j cos φ_j`` and ``Y_j = r_j sin φ_j`` (both outputs of pair j), coordinate j is
    ``Y_j + X_{j+1} = √2·z_j`` (module note); the caller scales by ``std/√2``. ``work`` is
    float64 scratch of at least ``3k + 2`` elements on the words' device; ``words`` is masked in
    place to its low 53 bits. Returns a view into ``work``.
    """
    m = words.numel() // _WORDS
    k = m - 1
    words.bitwise_and_((1 << _UNIFORM_BITS) - 1)
    work[: 2 * m].copy_(words)  # exact: every value is below 2⁵³
    radius, angle, out = work[:m], work[m : 2 * m], work[2 * m : 2 * m + k]
    # u = 1 − w·2⁻⁵³ ∈ (0, 1] is exact, so ln u is accurate even as u → 1 (small radii)
    _log_(radius.mul_(-(2.0**-_UNIFORM_BITS)).add_(1.0)).mul_(-2.0)
    _sqrt_(radius)
    angle.mul_(2.0 * math.pi * 2.0**-_UNIFORM_BITS)
    torch.sin(angle[:k], out=out)  # Y_j: pair j's sine output goes to coordinate j
    nxt = angle[1:].cos_()  # X_{j+1}: pair j+1's cosine output goes to coordinate j too
    out.mul_(radius[:k])
    return out.addcmul_(radius[1:], nxt)


def _log_(x: torch.Tensor) -> torch.Tensor:
    """``x.log_()``; on CPU by numpy, whose SIMD float64 log is ~3× faster than torch's here."""
    if x.device.type != "cpu":
        return x.log_()
    np.log(x.numpy(), out=x.numpy())
    return x


def _sqrt_(x: torch.Tensor) -> torch.Tensor:
    """``x.sqrt_()``; on CPU by numpy (~1.6× faster than torch's float64 sqrt here)."""
    if x.device.type != "cpu":
        return x.sqrt_()
    np.sqrt(x.numpy(), out=x.numpy())
    return x


class _Scratch(threading.local):
    """One thread's chunk buffers: keystream bytes, their int64 view, float64 work."""

    def __init__(self) -> None:
        self.stream = bytearray(len(_ZEROS) + 16)  # update_into wants a block's slack
        self.words = torch.frombuffer(self.stream, dtype=torch.int64, count=_WORDS * _pairs(_CHUNK))
        self.work = torch.empty(3 * _pairs(_CHUNK), dtype=torch.float64)


_SCRATCH = _Scratch()
_POOL: tuple[int, int, ThreadPoolExecutor] | None = None  # (pid, workers, pool)
_POOL_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads (rebuilt after a fork or a thread-count change:
    a forked child inherits the pool object but not its threads)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None or _POOL[:2] != (os.getpid(), workers):
            if _POOL is not None and _POOL[0] == os.getpid():
                _POOL[2].shutdown(wait=False)
            _POOL = (os.getpid(), workers, ThreadPoolExecutor(workers, thread_name_prefix="graphveil-noise"))
        return _POOL[2]


def _in_threads(tasks: Sequence[Callable[[], None]], threads: int) -> None:
    """Run ``tasks`` on ``threads`` threads (the caller's among them), each taking the next task."""
    if threads <= 1 or len(tasks) <= 1:
        for task in tasks:
            task()
        return
    lock, order = threading.Lock(), iter(tasks)

    def worker() -> None:
        while True:
            with lock:
                task = next(order, None)
            if task is None:
                return
            task()

    futures = [_pool(threads - 1).submit(worker) for _ in range(min(threads, len(tasks)) - 1)]
    try:
        worker()
    finally:
        # A helper that has not started yet (a busy machine) is not waited for: every task is
        # done. One that runs is: never return while a thread still writes into the tensor.
        for future in futures:
            future.cancel()
        wait(futures)
    for future in futures:
        if not future.cancelled():
            future.result()


def keystream_noise_add_(flat: torch.Tensor, scale: float, secret: bytes, threads: int | None = None) -> None:
    """Add ``scale·√2·z`` (module note) to the contiguous 1-D CPU tensor ``flat``, in place.

    ``secret`` is the draw's 48 secret bytes; ``threads`` defaults to ``torch.get_num_threads()``.
    """
    _run_chunks(_keystream_chunks(flat, scale, secret), threads)


def _run_chunks(tasks: Sequence[Callable[[], None]], threads: int | None = None) -> None:
    """Run chunk tasks (of one draw or of several) on ``threads`` threads (default: torch's)."""
    threads = threads or torch.get_num_threads()  # read before the chunks' own setting below
    with _intra_op_threads(1):
        _in_threads(tasks, threads)


def _keystream_chunks(flat: torch.Tensor, scale: float, secret: bytes) -> list[Callable[[], None]]:
    """The chunk tasks of one draw into ``flat`` (see :func:`keystream_noise_add_`)."""
    n, kernel = flat.numel(), noise_kernel.KERNEL

    def chunk(start: int) -> Callable[[], None]:
        def run() -> None:
            k, scratch = min(_CHUNK, n - start), _SCRATCH
            words = _WORDS * _pairs(k)
            _chunk_encryptor(secret, start // _CHUNK).update_into(_ZEROS[: 8 * words], scratch.stream)
            target = flat[start : start + k]
            if kernel is not None and kernel.supports(target):
                kernel.chain_add_(scratch.words[:words], target, scale)
            else:
                target.add_(box_muller_chain(scratch.words[:words], scratch.work), alpha=scale)

        return run

    return [chunk(start) for start in range(0, n, _CHUNK)]


@contextmanager
def _intra_op_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` for the calling thread, restored after.

    The chunks' ops are small (≤ 65 537 elements) and run in the draw's own threads; torch's
    MKL-backed float64 ``cos`` would otherwise fork an OpenMP team from every one of them (its
    grain is 2 048 elements): oversubscribed cores, and stalls on a loaded machine. Threads of
    the noise pool take this setting when they first run torch code, i.e. inside a draw.
    """
    before = torch.get_num_threads()
    if before != count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        if before != count:
            torch.set_num_threads(before)


def generator_noise_add_(flat: torch.Tensor, scale: float, secret: bytes) -> None:
    """Add ``scale·√2·z`` to the contiguous 1-D tensor ``flat`` from a generator of its device.

    The generator is created for this draw and keyed from ``secret`` (module note **Other
    devices**): 64 bits of seed and, on CUDA (Philox), a counter offset from 58 more bits. The
    words and the transform stay on ``flat``'s device. Runs on CPU too (mt19937 seeded with the
    64 bits), which is how the path is tested without a GPU.
    """
    generator = torch.Generator(device=flat.device)
    generator.manual_seed(int.from_bytes(secret[:8], "little"))
    if flat.device.type == "cuda":  # Philox: a secret counter start too (a multiple of 4)
        generator.set_offset((int.from_bytes(secret[8:16], "little") >> 6) << 2)
    n = flat.numel()
    chunk = min(_DEVICE_CHUNK, n)
    words = torch.empty(_WORDS * _pairs(chunk), dtype=torch.int64, device=flat.device)
    work = torch.empty(3 * _pairs(chunk), dtype=torch.float64, device=flat.device)
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        w = words[: _WORDS * _pairs(k)].random_(0, 1 << _UNIFORM_BITS, generator=generator)
        flat[start : start + k].add_(box_muller_chain(w, work), alpha=scale)


def on_keystream(device: torch.device) -> bool:
    """Whether noise for a tensor on ``device`` comes from the AES keystream (CPU) or from a
    per-draw generator on the device itself (module note **Other devices**)."""
    return device.type == "cpu"


def secure_standard_normal(n: int) -> np.ndarray:
    """``n`` i.i.d. N(0, 1) draws (float64) from the CSPRNG, each the 4-uniform sum of the module note."""
    out = torch.zeros(n, dtype=torch.float64)
    keystream_noise_add_(out, 1 / math.sqrt(2), fresh_secret())
    return out.numpy()


class GaussianNoise:
    """Draws Gaussian noise for released gradients.

    :param research_seed: ``None`` (the default and the only private setting): OS CSPRNG.
        An int: reproducible noise, each draw's secret from this object's own ``torch.Generator``
        seeded with it — research only, the noise can be subtracted by anyone who knows the seed.
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

    def draw_secret(self) -> bytes:
        """A new draw's 48 secret bytes: fresh from the OS, or from the research generator."""
        if self.generator is None:
            return fresh_secret()
        size = _KEY_BYTES + _COUNTER_BYTES
        return torch.randint(0, 256, (size,), dtype=torch.uint8, generator=self.generator).numpy().tobytes()

    def sample(self, shape: torch.Size | tuple[int, ...], std: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A CPU tensor of i.i.d. ``N(0, std²)`` entries of ``dtype`` (one draw)."""
        out = torch.zeros(torch.Size(shape), dtype=dtype)
        self.add_([out], std)
        return out

    def add_(self, tensors: Iterable[torch.Tensor], std: float) -> None:
        """Add independent noise to each tensor in place (every coordinate, even if std is 0):
        one draw, with its own secret, per tensor, written into the tensor chunk by chunk.

        The CPU draws' chunks run together on torch's threads (a model's many small tensors
        would each be too small to split, leaving a thread idle); every draw still has its own
        secret, taken in the tensors' order, so the noise is the same as drawn one by one."""
        if not (std >= 0 and math.isfinite(std)):
            raise ValueError(f"noise std must be a finite number >= 0, got {std}")
        scale = std / math.sqrt(2)  # z is formed as √2·z (module note)
        chunks: list[Callable[[], None]] = []
        staged: list[tuple[torch.Tensor, torch.Tensor]] = []
        for t in tensors:
            secret = self.draw_secret()
            # a non-contiguous tensor gets the draw in float64 first: still one rounding
            flat = t.view(-1) if t.is_contiguous() else torch.zeros(t.numel(), dtype=torch.float64, device=t.device)
            if on_keystream(t.device):
                chunks.extend(_keystream_chunks(flat, scale, secret))
            else:
                generator_noise_add_(flat, scale, secret)
            if not t.is_contiguous():
                staged.append((t, flat))
        _run_chunks(chunks)
        for t, flat in staged:
            t.add_(flat.view(t.shape))
