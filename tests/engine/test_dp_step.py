"""The DP step (clip, noise, normalise by the expected batch size), the losses and the noise."""

from __future__ import annotations

import logging
import math

import pytest
import torch
from _toy import tiny_lora_encoder
from scipy import stats

from graphveil.contract.clipper import Clipper
from graphveil.contract.errors import PluginError
from graphveil.contract.profiles import PrivacyUnit, SensitivityKind
from graphveil.contract.sampler import TupleBatch
from graphveil.engine import noise as noise_module
from graphveil.engine.dp_step import (
    GaussianNoise,
    StepMetrics,
    build_optimizer,
    dp_step,
    nonprivate_step,
)
from graphveil.engine.noise import secure_standard_normal
from graphveil.engine.per_tuple import PerTupleGrad
from graphveil.plugins.relational.losses import LossSpec, batch_losses, tuple_losses
from graphveil.run.config import TrainingConfig

INFONCE = LossSpec("infonce", temperature=0.2)
N_ENTITIES = 30


class StandardClip(Clipper):
    """Per-tuple clipping at C: factor = min(1, C / ‖g‖)."""

    sensitivity_kind = SensitivityKind.PER_TUPLE_EDGE
    unit = PrivacyUnit.EDGE

    def __init__(self, clip_norm: float) -> None:
        self.clip_norm = clip_norm

    def factors(self, batch: TupleBatch, norms: torch.Tensor) -> torch.Tensor:
        return torch.clamp(self.clip_norm / norms.clamp(min=1e-12), max=1.0)


def make_encoder():
    texts = [f"entity {i} " + "word " * (i % 6) for i in range(N_ENTITIES)]
    return tiny_lora_encoder(texts, max_length=10, lora_layers=2, seed=1)


def make_batch(b: int, k: int, seed: int = 0, masked: int = 0) -> TupleBatch:
    gen = torch.Generator().manual_seed(seed)
    ends = torch.stack([torch.randperm(N_ENTITIES, generator=gen)[:2] for _ in range(b)]) if b else torch.zeros(0, 2, dtype=torch.long)
    negatives = torch.randint(0, N_ENTITIES, (b, k), generator=gen)
    which = torch.randint(0, 2, (b, k), generator=gen)
    anchors = torch.gather(ends, 1, which)
    if masked:
        negatives[:, -masked:] = -1
    return TupleBatch(ends, negatives, anchors)


def naive_tuple_grads(enc, batch: TupleBatch, loss: LossSpec) -> list[list[torch.Tensor]]:
    params = list(enc.trainable_parameters())
    out = []
    for i in range(batch.size):
        one = TupleBatch(batch.positives[i : i + 1], batch.negatives[i : i + 1], batch.anchors[i : i + 1])
        out.append(list(torch.autograd.grad(batch_losses(enc, one, loss)[0], params)))
    return out


def grads(enc) -> list[torch.Tensor]:
    return [p.grad.clone() for p in enc.trainable_parameters()]


def sgd0(enc) -> torch.optim.Optimizer:
    """An optimizer that leaves parameters (and p.grad) untouched, to inspect the released grad."""
    return torch.optim.SGD(list(enc.trainable_parameters()), lr=0.0)


@pytest.fixture(scope="module")
def enc():
    return make_encoder()


# ---------------------------------------------------------------------------------------------
# clipping, normalisation, noise in the step
# ---------------------------------------------------------------------------------------------


def test_post_clip_tuple_norms_are_below_threshold(enc):
    batch = make_batch(6, 3, seed=1)
    engine = PerTupleGrad(enc)
    with engine.record(num_groups=6):
        losses = batch_losses(enc, batch, INFONCE)
    norms = engine.compute(losses.sum())
    clip = StandardClip(float(norms.median()))
    factors = clip.factors(batch, norms)
    assert (factors < 1).any() and (factors == 1).any()
    naive = naive_tuple_grads(enc, batch, INFONCE)
    for f, g in zip(factors, naive, strict=True):  # recompute each tuple's gradient, then scale
        post = math.sqrt(sum(float((f * x).pow(2).sum()) for x in g))
        assert post <= clip.clip_norm * (1 + 1e-5)
    # and the step releases exactly that clipped sum divided by the expected batch size
    dp_step(enc, batch, clipper=clip, noise_multiplier=0.0, expected_batch_size=4.0,
            optimizer=sgd0(enc), loss=INFONCE, noise=GaussianNoise())
    for j, got in enumerate(grads(enc)):
        want = sum(factors[i] * naive[i][j] for i in range(6)) / 4.0
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


def test_sigma_zero_releases_clipped_sum_over_expected_size_exactly(enc):
    batch = make_batch(5, 2, seed=2)
    clip = StandardClip(0.05)
    engine = PerTupleGrad(enc)
    with engine.record(num_groups=5):
        losses = batch_losses(enc, batch, INFONCE)
    factors = clip.factors(batch, engine.compute(losses.sum()))
    engine.accumulate(factors)
    want = [g / 7.5 for g in grads(enc)]
    metrics = dp_step(enc, batch, clipper=clip, noise_multiplier=0.0, expected_batch_size=7.5,
                      optimizer=sgd0(enc), loss=INFONCE, noise=GaussianNoise())
    for got, w in zip(grads(enc), want, strict=True):
        assert torch.equal(got, w)
    assert metrics.batch_size == 5 and metrics.clipped_fraction == int((factors < 1).sum()) / 5 > 0
    assert metrics.loss == pytest.approx(float(losses.detach().mean()))


def test_noise_changes_the_update_with_the_right_scale(enc):
    batch, clip, sigma, b_bar = make_batch(4, 2, seed=3), StandardClip(0.5), 2.0, 3.0
    released = {}
    for s in (0.0, sigma):
        dp_step(enc, batch, clipper=clip, noise_multiplier=s, expected_batch_size=b_bar,
                optimizer=sgd0(enc), loss=INFONCE, noise=GaussianNoise(research_seed=7))
        released[s] = torch.cat([g.flatten() for g in grads(enc)])
    diff = (released[sigma] - released[0.0]) * b_bar
    assert diff.numel() > 1000
    assert float(diff.std()) == pytest.approx(sigma * clip.clip_norm, rel=0.1)
    assert abs(float(diff.mean())) < 5 * sigma * clip.clip_norm / math.sqrt(diff.numel())


def test_same_seed_same_release(enc):
    batch, clip = make_batch(3, 2, seed=4), StandardClip(0.1)
    out = []
    for _ in range(2):
        dp_step(enc, batch, clipper=clip, noise_multiplier=1.0, expected_batch_size=3.0,
                optimizer=sgd0(enc), loss=INFONCE, noise=GaussianNoise(research_seed=11))
        out.append(grads(enc))
    assert all(torch.equal(a, b) for a, b in zip(*out, strict=True))


def test_empty_batch_still_adds_noise_and_steps():
    enc = make_encoder()
    before = [p.detach().clone() for p in enc.trainable_parameters()]
    opt = build_optimizer(enc.trainable_parameters(), TrainingConfig(optimizer="sgd", lr=1.0))
    metrics = dp_step(enc, make_batch(0, 3), clipper=StandardClip(1.0), noise_multiplier=1.0,
                      expected_batch_size=10.0, optimizer=opt, loss=INFONCE,
                      noise=GaussianNoise(research_seed=0))
    assert metrics.batch_size == 0 and math.isnan(metrics.loss)
    assert metrics.as_dict()["loss"] is None
    for p, old in zip(enc.trainable_parameters(), before, strict=True):
        torch.testing.assert_close(p.detach(), old - p.grad)  # SGD lr=1 stepped on pure noise
        assert float(p.grad.std()) == pytest.approx(0.1, rel=0.3)  # σC / b̄


def test_micro_batched_step_equals_whole_batch_step_on_the_lora_encoder(enc):
    """Chunks of 2 tuples: same clipped sum as the whole batch (σ = 0), the clipper sees all 5."""
    batch, clip = make_batch(5, 2, seed=8), StandardClip(0.05)
    released, metrics = [], []
    for micro in (None, 2):
        metrics.append(dp_step(enc, batch, clipper=clip, noise_multiplier=0.0, expected_batch_size=5.0,
                               optimizer=sgd0(enc), loss=INFONCE, noise=GaussianNoise(), micro_batch_size=micro))
        released.append(grads(enc))
    assert 0 < metrics[0].clipped_fraction == metrics[1].clipped_fraction
    for got, want in zip(released[1], released[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_tuple_batch_select_keeps_tuples_whole():
    batch = make_batch(4, 3, seed=9, masked=1)
    part = batch.select(torch.tensor([2, 0]))
    assert part.size == 2 and part.k_neg == 3
    for name in ("positives", "negatives", "anchors"):
        assert torch.equal(getattr(part, name), getattr(batch, name)[[2, 0]])


def test_clipper_with_bad_factors_is_refused(enc):
    class Broken(StandardClip):
        def factors(self, batch, norms):
            return torch.full_like(norms, 2.0)

    with pytest.raises(PluginError, match="Broken must return 2 factors in \\[0, 1\\]"):
        dp_step(enc, make_batch(2, 1), clipper=Broken(1.0), noise_multiplier=1.0, expected_batch_size=2.0,
                optimizer=sgd0(enc), loss=INFONCE, noise=GaussianNoise())


def test_anchor_must_be_an_end_of_its_positive(enc):
    batch = make_batch(2, 2)
    batch.anchors[1, 0] = [x for x in range(N_ENTITIES) if x not in batch.positives[1].tolist()][0]
    with pytest.raises(PluginError, match="negative 0 of tuple 1"):
        batch_losses(enc, batch, INFONCE)


def test_masked_negatives_in_a_batch_are_ignored(enc):
    full = make_batch(3, 3, seed=5)
    masked = make_batch(3, 3, seed=5, masked=1)
    dropped = TupleBatch(full.positives, full.negatives[:, :2], full.anchors[:, :2])
    for spec in (INFONCE, LossSpec("hinge", margin=0.9)):
        torch.testing.assert_close(batch_losses(enc, masked, spec), batch_losses(enc, dropped, spec))


def test_nonprivate_step_is_the_mean_loss_gradient(enc):
    batch = make_batch(4, 2, seed=6)
    want = torch.autograd.grad(batch_losses(enc, batch, INFONCE).mean(), list(enc.trainable_parameters()))
    metrics = nonprivate_step(enc, batch, clipper=None, noise_multiplier=0.0, expected_batch_size=1.0,
                              optimizer=sgd0(enc), loss=INFONCE, noise=None)
    for got, w in zip(grads(enc), want, strict=True):
        torch.testing.assert_close(got, w)
    assert metrics.batch_size == 4 and metrics.clipped_fraction == 0.0


def test_nonprivate_step_micro_batched_is_the_same_mean_gradient(enc):
    batch = make_batch(5, 2, seed=10)
    out = []
    for micro in (None, 2):
        nonprivate_step(enc, batch, optimizer=sgd0(enc), loss=INFONCE, micro_batch_size=micro)
        out.append(grads(enc))
    for got, want in zip(out[1], out[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_build_optimizer_from_training_config(enc):
    adam = build_optimizer(enc.trainable_parameters(), TrainingConfig(optimizer="adam", lr=0.01))
    sgd = build_optimizer(enc.trainable_parameters(), TrainingConfig(optimizer="sgd", lr=0.5))
    assert isinstance(adam, torch.optim.Adam) and adam.defaults["lr"] == 0.01
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["lr"] == 0.5
    assert LossSpec.from_config(TrainingConfig(loss="hinge", margin=0.3)) == LossSpec("hinge", 0.05, 0.3)


def test_metrics_as_dict():
    assert StepMetrics(1.5, 3, 0.5, float("nan")).as_dict() == {
        "loss": 1.5, "batch_size": 3, "clipped_fraction": 0.5, "mean_grad_norm": None, "nonfinite": 0
    }


# ---------------------------------------------------------------------------------------------
# losses, by hand
# ---------------------------------------------------------------------------------------------


def _emb(*rows):
    return torch.tensor([rows], dtype=torch.float32)


def test_infonce_by_hand():
    # u=v → s⁺=1; n₁ ⟂ u → 0; n₂ = −v → −1 (scale does not matter: cosine scores)
    emb = _emb([1, 0], [2, 0], [0, 3], [-1, 0])
    got = tuple_losses(emb, torch.tensor([[0, 1]]), torch.tensor([[True, True]]), kind="infonce", temperature=0.5)
    want = -math.log(math.exp(2) / (math.exp(2) + math.exp(0) + math.exp(-2)))
    assert float(got) == pytest.approx(want, rel=1e-6)


def test_hinge_by_hand():
    # s⁺ = 0; n₁ = u paired with u → s=1: 0.5−0+1 = 1.5; n₂ = −v paired with v → s=−1: max(0, −0.5) = 0
    emb = _emb([1, 0], [0, 1], [1, 0], [0, -1])
    got = tuple_losses(emb, torch.tensor([[0, 1]]), torch.tensor([[True, True]]), kind="hinge", margin=0.5)
    assert float(got) == pytest.approx(1.5)


@pytest.mark.parametrize("kind", ["infonce", "hinge"])
def test_masked_negative_has_no_value_and_no_gradient(kind):
    emb = torch.randn(2, 5, 4, requires_grad=True)
    anchors = torch.tensor([[0, 1, 0], [1, 1, 0]])
    mask = torch.tensor([[True, False, True], [True, True, False]])
    losses = tuple_losses(emb, anchors, mask, kind=kind, temperature=0.3, margin=0.7)
    for i in range(2):
        keep = mask[i].nonzero().flatten()
        alone = tuple_losses(
            emb[i : i + 1, [0, 1, *(keep + 2).tolist()]], anchors[i : i + 1, keep], mask[i : i + 1, keep],
            kind=kind, temperature=0.3, margin=0.7,
        )
        torch.testing.assert_close(losses[i], alone[0])
    (grad,) = torch.autograd.grad(losses.sum(), emb)
    assert torch.equal(grad[0, 3], torch.zeros(4)) and torch.equal(grad[1, 4], torch.zeros(4))


def test_losses_reject_bad_shapes():
    with pytest.raises(ValueError, match="anchors_pos"):
        tuple_losses(torch.randn(2, 4, 3), torch.zeros(2, 3), torch.ones(2, 2, dtype=torch.bool), kind="hinge")
    with pytest.raises(ValueError, match="unknown loss"):
        tuple_losses(torch.randn(1, 2, 3), torch.zeros(1, 0), torch.ones(1, 0, dtype=torch.bool), kind="l2")


# ---------------------------------------------------------------------------------------------
# noise sources
# ---------------------------------------------------------------------------------------------


def test_secure_noise_is_standard_normal():
    z = secure_standard_normal(200_001)
    assert z.shape == (200_001,)
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert z.std() == pytest.approx(1.0, rel=0.01)
    # KS statistic below the 1e-6 critical value (≈ 2.69/√n)
    assert stats.kstest(z, "norm").statistic < 2.69 / math.sqrt(z.size)
    sample = GaussianNoise().sample((300, 300), std=3.0)
    assert sample.dtype == torch.float32 and float(sample.std()) == pytest.approx(3.0, rel=0.02)


def test_research_seed_warns_once_and_csprng_not(caplog, monkeypatch):
    monkeypatch.setattr(noise_module, "_WARNED", False)
    with caplog.at_level(logging.WARNING, logger="graphveil.engine.noise"):
        GaussianNoise().sample((3,), 1.0)
        assert not caplog.records
        seeded = GaussianNoise(research_seed=0)
        a = seeded.sample((3,), 1.0)
        seeded.sample((3,), 1.0)
        GaussianNoise(research_seed=1)
    assert len(caplog.records) == 1 and "RESEARCH MODE" in caplog.records[0].message
    assert torch.equal(a, GaussianNoise(research_seed=0).sample((3,), 1.0))


def test_noise_arguments_checked():
    with pytest.raises(TypeError):
        GaussianNoise(torch.Generator())  # no generator can be handed in (e.g. the sampling one)
    with pytest.raises(ValueError, match="research_seed must be an int"):
        GaussianNoise(research_seed="7")
    with pytest.raises(ValueError, match="std"):
        GaussianNoise().sample((2,), float("nan"))


# ---------------------------------------------------------------------------------------------
# non-finite examples: a bounded contribution, never an error
# ---------------------------------------------------------------------------------------------


def _poisoning(bad_entity: int, value: float):
    """Per-tuple losses in which every tuple whose positive touches ``bad_entity`` is ×``value``
    (NaN or ∞): a per-example overflow decided by the example's own data."""

    def losses(model, batch):
        out = batch_losses(model, batch, INFONCE)
        scale = torch.ones_like(out)  # not torch.where: its backward multiplies 0 by the NaN branch
        scale[(batch.positives == bad_entity).any(1)] = value
        return out * scale

    return losses


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("micro", [None, 2])
def test_a_non_finite_example_contributes_nothing_and_the_step_goes_on(enc, value, micro):
    batch, clip = make_batch(8, 2, seed=12), StandardClip(0.05)
    bad_entity = int(batch.positives[3, 0])
    hit = (batch.positives == bad_entity).any(1)
    assert 0 < int(hit.sum()) < 8
    metrics = dp_step(enc, batch, clipper=clip, noise_multiplier=0.0, expected_batch_size=6.0,
                      optimizer=sgd0(enc), loss=_poisoning(bad_entity, value), noise=GaussianNoise(),
                      micro_batch_size=micro)
    released = grads(enc)
    assert all(bool(torch.isfinite(g).all()) for g in released)
    assert metrics.nonfinite == int(hit.sum()) and metrics.batch_size == 8
    # what the batch without those tuples releases, at the same expected size
    dp_step(enc, batch.select((~hit).nonzero().reshape(-1)), clipper=clip, noise_multiplier=0.0,
            expected_batch_size=6.0, optimizer=sgd0(enc), loss=INFONCE, noise=GaussianNoise())
    for got, want in zip(released, grads(enc), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-8)


def test_a_batch_of_only_non_finite_examples_releases_noise_alone(enc):
    batch = make_batch(3, 2, seed=13)
    everyone = torch.tensor(float("nan"))
    metrics = dp_step(enc, batch, clipper=StandardClip(1.0), noise_multiplier=0.0, expected_batch_size=3.0,
                      optimizer=sgd0(enc), loss=lambda m, b: batch_losses(m, b, INFONCE) * everyone,
                      noise=GaussianNoise())
    assert metrics.nonfinite == 3 and metrics.as_dict()["loss"] is None
    assert all(bool((g == 0).all()) for g in grads(enc))
