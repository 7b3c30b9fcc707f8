"""End to end through :class:`TrainingSession`: a private run really clips and really adds noise.

For each private method (entity-level standard clipping, entity-level FREQ-CLIP, edge-level
per-tuple clipping) a session with plain SGD takes real steps; the test records the batch the
session's sampler drew (wrapping ``session.sampler.sample`` from outside) and recomputes, by a
naive loop, every tuple's gradient at the pre-step parameters, the clip factors *by hand*
(min(1, threshold/‖g‖) with threshold C, or C·κ/(2·max-freq) for FREQ-CLIP with
κ = 4/(5 + K(1 + k_neg))) and the clipped sum S. With SGD at rate η the released gradient is
(θ_before − θ_after)/η = (S + z)/b̄ with b̄ the expected batch size, so
z = b̄·(θ_before − θ_after)/η − S is exactly the noise the step added:

* noise: at σ = 30, ‖z‖²/(σC)² must lie inside the χ²_D quantiles at 1e-9 on each side and z/(σC)
  must pass a KS test against N(0, 1) at p ≥ 1e-7 — fails if the noise is missing, the wrong
  scale, or the session ran the non-private step (then ‖z‖ ≪ σC√D);
* clipping: with a clip norm that binds, z must be pure noise, also along the direction of
  each alternative (no clipping, κ = 1, dividing by the realised batch size, the non-private
  step, a 10 % scale error), each asserted to be far enough to tell apart — so the test fails
  if any of them is what the session did;
* the noise is not reproducible from the run's seed (OS CSPRNG);
* the sampler the session uses caps degrees at K and draws WOR negatives.

Nothing here seeds the noise: every noise check is a statistical bound on a D-dimensional draw
(D = 1024 LoRA parameters) with a false-alarm probability below 1e-6.
"""

from __future__ import annotations

import math

import pytest
import torch
from _toy import K_NEG, METHODS, K, make_config, toy_graph
from scipy import stats

from graphveil.contract.host import PluginHost
from graphveil.contract.sampler import TupleBatch
from graphveil.data.graph import RelationalGraph
from graphveil.plugins.relational.losses import LossSpec, batch_losses
from graphveil.run.session import TrainingSession


@pytest.fixture(scope="module")
def host() -> PluginHost:
    from graphveil.contract.host import default_host

    return default_host()


@pytest.fixture(scope="module")
def graph() -> RelationalGraph:
    return toy_graph()


class Recorder:
    """A prepared session whose sampler draws are recorded (lifted to global entity indices)."""

    def __init__(self, session: TrainingSession) -> None:
        self.session = session
        session.prepare()
        self.batches: list[TupleBatch] = []
        original = session.sampler.sample

        def sample(generator: torch.Generator) -> TupleBatch:
            batch = original(generator)
            self.batches.append(batch)
            return batch

        session.sampler.sample = sample  # type: ignore[method-assign]
        self.params = list(session.encoder.trainable_parameters())
        cfg = session.config
        self.lr = cfg.training.lr
        self.loss = LossSpec.from_config(cfg.training)
        # The expected batch size, by hand: Poisson rate b/|records| times |records| is b.
        self.b_bar = float(cfg.sampler.params["batch_size"])

    def lift(self, batch: TupleBatch) -> TupleBatch:
        nodes = self.session.train_nodes

        def up(t: torch.Tensor) -> torch.Tensor:
            return torch.where(t >= 0, nodes[t.clamp(min=0)], torch.full_like(t, -1))

        return TupleBatch(up(batch.positives), up(batch.negatives), up(batch.anchors))

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1).double() for p in self.params])

    def step(self) -> tuple[TupleBatch, torch.Tensor, list[torch.Tensor]]:
        """One session step: (global batch, released gradient, per-tuple grads at θ_before)."""
        before = [p.detach().clone() for p in self.params]
        flat_before = self.flat()
        n_before = len(self.batches)
        self.session.train(1)
        assert len(self.batches) == n_before + 1, "the session did not draw exactly one batch"
        released = (flat_before - self.flat()) / self.lr
        after = [p.detach().clone() for p in self.params]
        batch = self.lift(self.batches[-1])
        with torch.no_grad():
            for p, b in zip(self.params, before, strict=True):
                p.copy_(b)
        per_tuple = naive_tuple_grads(self.session.encoder, self.params, batch, self.loss)
        with torch.no_grad():
            for p, a in zip(self.params, after, strict=True):
                p.copy_(a)
        return batch, released, per_tuple


def naive_tuple_grads(encoder, params, batch: TupleBatch, loss: LossSpec) -> list[torch.Tensor]:
    """Each tuple's gradient, one tuple at a time (flattened, float64)."""
    out = []
    for i in range(batch.size):
        one = TupleBatch(batch.positives[i : i + 1], batch.negatives[i : i + 1], batch.anchors[i : i + 1])
        grads = torch.autograd.grad(batch_losses(encoder, one, loss)[0], params)
        out.append(torch.cat([g.reshape(-1).double() for g in grads]))
    return out


def max_freq_by_hand(batch: TupleBatch) -> list[int]:
    """Paper 1, Alg. 1: freq(v) = #tuples whose node set contains v; max over the tuple's nodes."""
    node_sets = [{int(x) for x in (*batch.positives[i].tolist(), *batch.negatives[i].tolist()) if x >= 0}
                 for i in range(batch.size)]
    freq: dict[int, int] = {}
    for s in node_sets:
        for v in s:
            freq[v] = freq.get(v, 0) + 1
    return [max(freq[v] for v in s) for s in node_sets]


def thresholds_by_hand(method: str, batch: TupleBatch, clip_norm: float, kappa_one: bool = False) -> list[float]:
    if method != "entity_freq":
        return [clip_norm] * batch.size
    kappa = 1.0 if kappa_one else 4.0 / (5 + K * (1 + K_NEG))
    return [clip_norm * kappa / (2 * f) for f in max_freq_by_hand(batch)]


def clipped_sum(per_tuple: list[torch.Tensor], thresholds: list[float], dim: int) -> torch.Tensor:
    total = torch.zeros(dim, dtype=torch.float64)
    for g, t in zip(per_tuple, thresholds, strict=True):
        norm = float(g.norm())
        total += g * (min(1.0, t / norm) if norm > 0 else 1.0)
    return total


def chi_bounds(dim: int, p: float = 1e-9) -> tuple[float, float]:
    """ ‖z‖/(σC) for z ~ N(0, σ²C² I_dim) lies in these bounds except with probability 2p."""
    return math.sqrt(stats.chi2.ppf(p, dim)), math.sqrt(stats.chi2.isf(p, dim))


# ---------------------------------------------------------------------------------------------
# noise: the released gradient carries N(0, σ²C²) noise of exactly the predicted scale
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", list(METHODS))
def test_private_step_adds_noise_of_scale_sigma_c_over_b_bar(method, host, graph):
    sigma, clip_norm = 30.0, 0.5
    rec = Recorder(TrainingSession(make_config(method, sigma=sigma, clip_norm=clip_norm, lr=1.0),
                                   host=host, graph=graph))
    assert rec.session.noise_multiplier == sigma
    batch, released, per_tuple = rec.step()
    dim = released.numel()
    assert dim >= 500
    s = clipped_sum(per_tuple, thresholds_by_hand(method, batch, clip_norm), dim)
    z = rec.b_bar * released - s
    low, high = chi_bounds(dim)
    ratio = float(z.norm()) / (sigma * clip_norm)
    assert low <= ratio <= high, (
        f"noise norm / (σC) = {ratio:.3f} outside [{low:.3f}, {high:.3f}] (√D = {math.sqrt(dim):.2f}): "
        "the step did not add N(0, σ²C²) noise before dividing by b̄")
    # the whole released step has the norm σ·C·√D / b̄ predicted by σ, not a gradient step's
    predicted = sigma * clip_norm * math.sqrt(dim) / rec.b_bar
    assert 0.8 * predicted < float(released.norm()) < 1.2 * predicted
    assert stats.kstest((z / (sigma * clip_norm)).numpy(), "norm").pvalue > 1e-7
    assert rec.session.epsilon() > 0 and math.isfinite(rec.session.epsilon())


# ---------------------------------------------------------------------------------------------
# clipping: with negligible noise, the step is exactly the clipped sum over b̄
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", list(METHODS))
def test_private_step_releases_the_clipped_sum_over_the_expected_batch_size(method, host, graph):
    """Residual z = b̄·released − S is pure N(0, σ²C²) noise; every alternative is far from it.

    σ cannot be tiny (Thm C.1's accountant crawls below σ ≈ 0.05), so the comparisons are made
    where the noise is one-dimensional: along d = S_alt − S the residual's component is
    N(0, σ²C²) (|·| ≤ 6.1σC except with probability 1e-9) if the step released S, and
    ‖d‖ + N(0, σ²C²) if it released S_alt. An alternative counts only in steps where
    ‖d‖ ≥ 13σC (so it can be told apart); each required one must be told apart at least once.
    """
    sigma = 0.05 if method == "entity_standard" else 0.005
    clip_norm, lr = 1e-3, 100.0
    rec = Recorder(TrainingSession(make_config(method, sigma=sigma, clip_norm=clip_norm, lr=lr),
                                   host=host, graph=graph))
    bound = float(stats.norm.isf(0.5e-9)) * sigma * clip_norm  # 6.1σC
    low, high = chi_bounds(1024)
    required = {"no clipping", "non-private step (mean gradient)", "the clipped sum scaled by 1.5"}
    if method == "entity_freq":
        required.add("FREQ-CLIP with κ = 1")
    if method != "entity_standard":  # at σ = 0.05 only a far-off batch size would be distinguishable
        required.add("divide by the realised batch size")
    told_apart: set[str] = set()
    for _ in range(25):
        batch, released, per_tuple = rec.step()
        b, dim = batch.size, released.numel()
        assert dim == 1024
        thresholds = thresholds_by_hand(method, batch, clip_norm)
        s = clipped_sum(per_tuple, thresholds, dim)
        z = rec.b_bar * released - s
        ratio = float(z.norm()) / (sigma * clip_norm)
        assert low <= ratio <= high, f"residual / (σC) = {ratio:.3f} outside [{low:.3f}, {high:.3f}]"
        if b == 0:
            continue
        norms = [float(g.norm()) for g in per_tuple]
        assert sum(n > t for n, t in zip(norms, thresholds, strict=True)) >= max(1, b // 2), (
            "test setup: the clip norm must bind for most tuples")
        # what the step would have released without each safeguard
        unclipped = torch.stack(per_tuple).sum(0)
        alternatives = {
            "the clipped sum scaled by 1.5": 1.5 * s,
            "no clipping": unclipped,
            "non-private step (mean gradient)": unclipped / b * rec.b_bar,
            "divide by the realised batch size": s * (rec.b_bar / b),
        }
        if method == "entity_freq":
            alternatives["FREQ-CLIP with κ = 1"] = clipped_sum(
                per_tuple, thresholds_by_hand(method, batch, clip_norm, kappa_one=True), dim)
        for what, alt in alternatives.items():
            d = alt - s
            if float(d.norm()) < 13 * sigma * clip_norm:
                continue
            told_apart.add(what)
            along = float(torch.dot(z, d / d.norm()))
            assert abs(along) <= bound, (
                f"the released step leans towards '{what}': residual component {along:.3g} along it, "
                f"noise bound {bound:.3g}")
        if required <= told_apart:
            break
    assert required <= told_apart, f"test setup: never could tell the step from {required - told_apart}"


def test_clip_factors_are_what_the_clipper_reports(host, graph):
    """The session's clipper, given the recorded batch, computes the factors the test derives by hand."""
    clip_norm = 1e-3
    rec = Recorder(TrainingSession(make_config("entity_freq", sigma=1.0, clip_norm=clip_norm, lr=1.0),
                                   host=host, graph=graph))
    batch, _, per_tuple = rec.step()
    while batch.size == 0:
        batch, _, per_tuple = rec.step()
    norms = torch.tensor([float(g.norm()) for g in per_tuple])
    factors = rec.session.clipper.factors(batch, norms)
    want = [min(1.0, t / n) for t, n in zip(thresholds_by_hand("entity_freq", batch, clip_norm), norms.tolist(), strict=True)]
    torch.testing.assert_close(factors.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
    assert rec.session.privacy_report()["clip_scale"] == pytest.approx(4.0 / (5 + K * (1 + K_NEG)))


# ---------------------------------------------------------------------------------------------
# the noise source: not reproducible from the run's seed
# ---------------------------------------------------------------------------------------------


def test_noise_is_not_reproducible_from_the_run_seed(host, graph):
    """Two sessions with the same config and seed draw independent noise (OS CSPRNG).

    Fails if the noise comes from the run's (sampling) seed, from any fixed-seed generator, or
    from torch's global generator (reset to the same state before each step here).
    """
    sigma, clip_norm = 30.0, 0.5
    noises = []
    for _ in range(2):
        cfg = make_config("edge", sigma=sigma, clip_norm=clip_norm, lr=1.0, seed=123)
        rec = Recorder(TrainingSession(cfg, host=host, graph=graph))
        with torch.random.fork_rng():
            torch.manual_seed(0)  # nor from torch's global generator, whatever its state
            batch, released, per_tuple = rec.step()
        s = clipped_sum(per_tuple, thresholds_by_hand("edge", batch, clip_norm), released.numel())
        noises.append(rec.b_bar * released - s)
    a, b = noises
    corr = float(torch.dot(a, b) / (a.norm() * b.norm()))
    # independent N(0, I_D) directions: |corr| ~ 1/√D ≈ 0.03; identical seeds would give 1
    assert abs(corr) < 0.25, f"two runs with the same seed drew correlated noise (corr {corr:.3f})"


# ---------------------------------------------------------------------------------------------
# the session's sampler: degree cap K and NEG-SAMPLE-WOR
# ---------------------------------------------------------------------------------------------


def test_entity_session_samples_only_degree_capped_relations_and_wor_negatives(host, graph):
    cap = 2
    session = TrainingSession(make_config("entity_freq", sigma=1.0, clip_norm=1.0, lr=1.0, degree_cap=cap),
                              host=host, graph=graph)
    session.prepare()
    train = session.train_graph
    degrees = torch.bincount(train.edges.reshape(-1), minlength=train.num_nodes)
    assert int((degrees > cap).sum()) >= 5, "test setup: the cap must bind"
    assert session.sampling_profile.num_records <= train.num_nodes * cap // 2
    assert session.sampling_profile.num_records < train.num_edges
    gen = torch.Generator().manual_seed(0)
    seen: set[tuple[int, int]] = set()
    for _ in range(400):
        batch = session.sampler.sample(gen)
        seen.update(map(tuple, batch.positives.tolist()))
        negs = batch.negatives[batch.negatives >= 0]
        assert negs.unique().numel() == negs.numel(), "a node is a negative twice in one batch"
    covered = torch.bincount(torch.tensor(sorted(seen)).reshape(-1), minlength=train.num_nodes)
    assert int(covered.max()) <= cap, "the session sampled relations beyond the degree cap"
    # the sampler did visit most of Ē, so the check above had something to find
    assert len(seen) >= 0.9 * session.sampling_profile.num_records
