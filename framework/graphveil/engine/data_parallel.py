"""Data-parallel DP-SGD within one site: the ranks of a ``torch.distributed`` process group.

One logical batch per step is drawn by every rank from the same seeded sampler (rank 0 draws
the sampling seed and :meth:`DataParallel.broadcast_seed` hands it to the others, so a fresh
seed stays fresh and is written nowhere), so the accountant sees exactly the single-process
sampling event. Rank ``r`` of ``W`` computes the per-example gradients of its contiguous shard
``[⌊rb/W⌋, ⌊(r+1)b/W⌋)`` (:meth:`DataParallel.shard`); the per-example norms and losses are
summed into one length-``b`` vector (:meth:`DataParallel.gather_examples`) so that the clipper
sees the whole batch and all norms, as in one process (FREQ-CLIP's node frequencies are batch
statistics); each rank accumulates its shard's clipped sum, rank 0 alone adds the noise, and one
all-reduce (:meth:`DataParallel.sum_`) gives every rank ``Σ factorᵢ·g(Tᵢ) + N(0, σ²C²)``. This is
Opacus' ``DistributedDPOptimizer`` (noise on rank 0 only, then an all-reduce of the summed
gradients); the division is by the expected LOGICAL batch size b̄, so the released value is the
one-process value up to the order of float additions.

Launch: ``graphveil run CONFIG --nproc N`` re-executes itself through ``torch.distributed.run``
(torchrun), or torchrun is called directly; :meth:`DataParallel.from_env` reads torchrun's
``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` and joins the group (gloo on CPU, NCCL on CUDA).
"""

from __future__ import annotations

import datetime
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from graphveil.contract.errors import PluginError

__all__ = ["DataParallel", "world_size_from_env"]

#: How long a rank waits for the others in one collective before the run fails (a rank that
#: died is normally noticed sooner by torchrun, which then stops the others).
_TIMEOUT = datetime.timedelta(minutes=10)


def world_size_from_env() -> int:
    """``WORLD_SIZE`` as torchrun sets it for its workers (1 when not launched by torchrun)."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(raw)
    except ValueError:
        raise PluginError(f"environment WORLD_SIZE={raw!r} is not an integer") from None
    if size < 1:
        raise PluginError(f"environment WORLD_SIZE={size} must be >= 1")
    return size


@dataclass
class DataParallel:
    """This process's place in the group: ``rank`` of ``world_size``, collectives on ``device``."""

    rank: int
    world_size: int
    device: torch.device

    @classmethod
    def from_env(cls) -> DataParallel:
        """Join torchrun's group: NCCL with one GPU per local rank where CUDA is present, else gloo."""
        if not dist.is_available():
            raise PluginError("torch.distributed is not available in this torch build")
        if not dist.is_initialized():
            if torch.cuda.is_available():
                local = int(os.environ.get("LOCAL_RANK", "0"))
                torch.cuda.set_device(local)
                dist.init_process_group("nccl", timeout=_TIMEOUT)
            else:
                dist.init_process_group("gloo", timeout=_TIMEOUT)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")
        return cls(dist.get_rank(), dist.get_world_size(), device)

    @property
    def writes(self) -> bool:
        """Whether this rank writes outputs, logs and hook calls (rank 0 only)."""
        return self.rank == 0

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # ----------------------------------------------------------------- set-up
    def broadcast_seed(self) -> int:
        """A fresh 63-bit sampling seed drawn by rank 0 from the OS, the same on every rank."""
        seed = torch.tensor([secrets.randbits(63) if self.rank == 0 else 0], dtype=torch.int64,
                            device=self.device)
        dist.broadcast(seed, src=0)
        return int(seed.item())

    def broadcast_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite ``tensors`` on every rank with rank 0's values (the initial weights)."""
        with torch.no_grad():
            for t in tensors:
                buffer = t.detach().to(self.device)
                dist.broadcast(buffer, src=0)
                if buffer is not t:
                    t.copy_(buffer)

    # ----------------------------------------------------------------- per step
    def shard(self, size: int) -> tuple[int, int]:
        """This rank's contiguous slice ``[start, stop)`` of a batch of ``size`` examples."""
        return self.rank * size // self.world_size, (self.rank + 1) * size // self.world_size

    def check_same_batch(self, size: int, fingerprint: int) -> None:
        """Refuse to go on when the ranks drew different batches (a sampler that does not use
        the generator it is given would break the one-draw accounting).

        Every rank adds ``(x, x²)`` for ``x`` its size and fingerprint; all ``x`` are equal iff
        ``W·Σx² = (Σx)²`` (Cauchy–Schwarz), exact in float64 for integers below 2²⁰.
        """
        x = torch.tensor([size % (1 << 20), fingerprint % (1 << 20)], dtype=torch.float64,
                         device=self.device)
        both = torch.cat([x, x * x])
        dist.all_reduce(both)
        total, squares = both[:2], both[2:]
        if not bool(torch.equal(total * total, squares * self.world_size)):
            raise PluginError(
                f"rank {self.rank}: the {self.world_size} ranks drew different batches this step; every "
                "rank must run the same seeded sampler (a sampler must draw only from the generator "
                "it is given)")

    def gather_examples(self, local: torch.Tensor, start: int, size: int) -> torch.Tensor:
        """The ``(k, size)`` whole-batch values from each rank's ``(k, stop - start)`` slice.

        A sum of zeros and one rank's value per position: exact, and a NaN or ∞ stays one.
        """
        out = torch.zeros(local.shape[0], size, dtype=local.dtype, device=self.device)
        out[:, start:start + local.shape[1]] = local.to(self.device)
        dist.all_reduce(out)
        return out.to(local.device)

    def sum_(self, tensors: Sequence[torch.Tensor]) -> None:
        """All-reduce (sum) ``tensors`` in place, flattened into one buffer: one collective."""
        if not tensors:
            return
        flat = torch.cat([t.detach().reshape(-1).to(self.device, torch.float64) for t in tensors])
        dist.all_reduce(flat)
        start = 0
        with torch.no_grad():
            for t in tensors:
                n = t.numel()
                t.copy_(flat[start:start + n].view_as(t))
                start += n
