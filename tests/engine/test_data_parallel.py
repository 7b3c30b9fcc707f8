"""Data-parallel DP steps (issue 28.2): two gloo ranks release what one process releases.

Two processes (``torch.multiprocessing.spawn``, gloo over a file rendezvous) run the same
sequence of :func:`dp_step` calls as one process, with the research noise seed on rank 0: an
uneven split, micro-batches, a batch whose only example lies on rank 1 (rank 0's shard is empty),
an empty batch, and non-finite examples on both shards. The clipper reads a whole-batch
statistic, so a rank that clipped with its shard's view alone would differ. Noise drawn on every
rank, or clipped sums not all-reduced, change the weights far beyond the tolerance.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _toy import tiny_lora_encoder

from graphveil.contract.clipper import Clipper
from graphveil.contract.profiles import PrivacyUnit, SensitivityKind
from graphveil.contract.sampler import TupleBatch
from graphveil.engine.data_parallel import DataParallel
from graphveil.engine.dp_step import GaussianNoise, dp_step
from graphveil.plugins.relational.losses import LossSpec, batch_losses

N_ENTITIES, BAD, SIGMA, NOISE_SEED = 24, 0, 1.0, 11
INFONCE = LossSpec("infonce", temperature=0.2)
#: (batch size, micro-batch size, examples whose loss is NaN)
STEPS = ((7, None, ()), (7, 2, ()), (1, None, ()), (0, None, ()), (6, None, (1, 4)), (5, 2, (0,)))


class BatchShareClip(Clipper):
    """min(1, C/‖g‖) divided by how often the tuple's first entity is a first entity in the batch:
    a whole-batch statistic, as FREQ-CLIP's node frequencies are."""

    sensitivity_kind = SensitivityKind.PER_TUPLE_EDGE
    unit = PrivacyUnit.EDGE
    clip_norm = 0.05

    def factors(self, batch: TupleBatch, norms: torch.Tensor) -> torch.Tensor:
        first = batch.positives[:, 0]
        counts = (first[:, None] == first[None, :]).sum(1).to(norms.dtype)
        return torch.clamp(self.clip_norm / norms.clamp(min=1e-12), max=1.0) / counts


def losses(enc, batch: TupleBatch) -> torch.Tensor:
    """InfoNCE, NaN for tuples whose first entity is ``BAD`` (a non-finite example)."""
    nan = torch.where(batch.positives[:, 0] == BAD, float("nan"), 1.0)  # where() would leak NaN grads
    return batch_losses(enc, batch, INFONCE) * nan


def make_encoder():
    texts = [f"entity {i} " + "word " * (i % 5) for i in range(N_ENTITIES)]
    return tiny_lora_encoder(texts, max_length=8, lora_layers=1, seed=1)


def make_batch(b: int, seed: int, nan_at: tuple[int, ...]) -> TupleBatch:
    gen = torch.Generator().manual_seed(seed)
    ends = torch.randint(1, N_ENTITIES, (b, 2), generator=gen)
    ends[:, 1] = (ends[:, 0] + 1 + torch.randint(0, N_ENTITIES - 2, (b,), generator=gen)) % N_ENTITIES
    ends[list(nan_at), 0] = BAD
    negatives = torch.randint(0, N_ENTITIES, (b, 2), generator=gen)
    anchors = torch.gather(ends, 1, torch.randint(0, 2, (b, 2), generator=gen))
    return TupleBatch(ends, negatives, anchors)


def run_steps(group: DataParallel | None) -> dict:
    """The :data:`STEPS` on a fresh encoder; rank 0 (or the one process) holds the noise."""
    torch.manual_seed(0)
    enc = make_encoder()
    params = list(enc.trainable_parameters())
    if group is not None:
        if group.rank == 1:  # the broadcast must overwrite a rank's own initial weights
            with torch.no_grad():
                params[0].add_(1.0)
        group.broadcast_(params)
    noise = GaussianNoise(research_seed=NOISE_SEED) if group is None or group.rank == 0 else None
    opt = torch.optim.SGD(params, lr=0.5)
    metrics = []
    for i, (b, micro, nan_at) in enumerate(STEPS):
        m = dp_step(enc, make_batch(b, i, nan_at), clipper=BatchShareClip(), noise_multiplier=SIGMA,
                    expected_batch_size=4.0, optimizer=opt, loss=losses, noise=noise, micro_batch_size=micro,
                    group=group)
        metrics.append(m.as_dict())
    seed = group.broadcast_seed() if group is not None else None
    return {"weights": [p.detach().clone() for p in params], "metrics": metrics, "seed": seed}


def _rank(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        torch.save(run_steps(DataParallel(rank, world, torch.device("cpu"))), Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("ddp")
    mp.spawn(_rank, args=(2, str(tmp / "rendezvous"), str(tmp)), nprocs=2, join=True)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(2)]


@pytest.mark.slow
def test_two_ranks_release_the_one_process_update(two_ranks) -> None:
    one = run_steps(None)
    for rank in two_ranks:
        for got, want in zip(rank["weights"], one["weights"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # the steps moved the weights by far more than the tolerance, so noise added twice or a
    # missing all-reduce cannot hide in it
    start = [p.detach() for p in make_encoder().trainable_parameters()]
    assert max(float((w - s).abs().max()) for w, s in zip(one["weights"], start, strict=True)) > 1e-2


@pytest.mark.slow
def test_two_ranks_report_the_whole_batch(two_ranks) -> None:
    one = run_steps(None)["metrics"]
    for rank in two_ranks:
        got = rank["metrics"]
        assert [m["batch_size"] for m in got] == [m["batch_size"] for m in one] == [s[0] for s in STEPS]
        # non-finite examples of both shards are counted on every rank
        assert [m["nonfinite"] for m in got] == [m["nonfinite"] for m in one] == [len(s[2]) for s in STEPS]
        assert [m["clipped_fraction"] for m in got] == pytest.approx([m["clipped_fraction"] for m in one],
                                                                     nan_ok=True)
        assert [m["loss"] for m in got] == pytest.approx([m["loss"] for m in one], rel=1e-5, nan_ok=True)


@pytest.mark.slow
def test_the_sampling_seed_is_rank_zeros(two_ranks) -> None:
    assert two_ranks[0]["seed"] == two_ranks[1]["seed"]


def test_shards_cover_the_batch_once() -> None:
    for world in (1, 2, 3, 5):
        for size in (0, 1, 2, 7, 12):
            slices = [DataParallel(r, world, torch.device("cpu")).shard(size) for r in range(world)]
            assert slices[0][0] == 0 and slices[-1][1] == size
            assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))
