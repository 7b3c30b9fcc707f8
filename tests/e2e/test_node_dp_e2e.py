"""End to end through :class:`TrainingSession`: a private DP-MLP run really clips and adds noise.

Same method as tests/e2e/test_private_run_e2e.py for the relational methods: plain SGD at rate η,
the batch the session's sampler drew is recorded, every node's gradient at the pre-step weights
is recomputed by a naive loop, clipped by hand (min(1, C/‖g‖)), and summed to S. The released
gradient is (θ_before − θ_after)/η = (S + z)/b, so z = b·(θ_before − θ_after)/η − S is exactly
the noise the step added. At σ = 2 with a binding C, z/(σC) must look like N(0, 1) over the
D ≈ 600 weights (χ² and KS bounds with false-alarm rates below 1e-6), which fails if the noise
is missing or mis-scaled, clipping is skipped (then z carries S − Σg, far larger than σC) or
the session runs the non-private step. Nothing seeds the noise.
"""

from __future__ import annotations

import pytest
import torch
from _toy import toy_nodes
from scipy import stats

from graphveil.run.config import config_from_dict
from graphveil.run.session import TrainingSession

B = 16


def session(sigma: float, clip: float, lr: float) -> TrainingSession:
    raw = {
        "name": "e2e-dp-mlp", "seed": 1,
        "data": {"source": "planetoid", "split": {"kind": "random_node", "val_fraction": 0.1,
                                                  "test_fraction": 0.2, "seed": 4}},
        "task": {"name": "node_classification"},
        "model": {"name": "mlp", "hidden": 16, "layers": 3, "seed": 2},
        "sampler": {"name": "node_uniform_wor", "batch_size": B},
        "clipper": {"name": "per_node_clip", "clip_norm": clip},
        "accountant": {"name": "node_rdp"},
        "training": {"steps": 2, "optimizer": "sgd", "lr": lr},
        "privacy": {"noise_multiplier": sigma, "delta": 1e-4},
        "output": {"progress": False},
    }
    s = TrainingSession(config_from_dict(raw), graph=toy_nodes())
    s.prepare()
    return s


def released_noise(s: TrainingSession, clip: float, lr: float) -> torch.Tensor:
    params = list(s.encoder.trainable_parameters())
    drawn = []
    original = s.sampler.sample
    s.sampler.sample = lambda gen: drawn.append(original(gen)) or drawn[-1]  # type: ignore[method-assign]
    before = [p.detach().clone() for p in params]
    flat_before = torch.cat([p.reshape(-1) for p in before]).double()
    s.train(1)
    after = torch.cat([p.detach().reshape(-1) for p in params]).double()
    nodes = s.task.lift(drawn[-1]).nodes
    # naive per-node gradients at θ_before (the step already moved the weights: restore a copy)
    with torch.no_grad():
        for p, b in zip(params, before, strict=True):
            p.copy_(b)
    x, y = s.task.features(), s.task.dataset.y
    total = torch.zeros_like(flat_before)
    for node in nodes.tolist():
        grads = torch.autograd.grad(
            torch.nn.functional.cross_entropy(s.encoder(x[node : node + 1]), y[node : node + 1]), params)
        g = torch.cat([t.reshape(-1) for t in grads]).double()
        total += g * min(1.0, clip / float(g.norm()))
    return B * (flat_before - after) / lr - total


@pytest.mark.parametrize("run", range(2))
def test_a_private_dp_mlp_step_clips_each_node_and_adds_sigma_c_noise(run: int) -> None:
    sigma, clip, lr = 2.0, 0.05, 0.01
    s = session(sigma, clip, lr)
    z = released_noise(s, clip, lr) / (sigma * clip)
    d = z.numel()
    chi2 = float((z**2).sum())
    assert stats.chi2.ppf(1e-9, d) < chi2 < stats.chi2.ppf(1 - 1e-9, d), (chi2, d)
    assert stats.kstest(z.numpy(), "norm").pvalue > 1e-7


def test_the_clip_norm_binds_in_this_setting() -> None:
    """The noise check above can tell clipping apart: Σ(g − clipped g) is far above σC√D."""
    sigma, clip = 2.0, 0.05
    s = session(sigma, clip, 0.01)
    x, y = s.task.features(), s.task.dataset.y
    params = list(s.encoder.trainable_parameters())
    gap = None
    for i in s.task.split.train[:B].tolist():
        g = torch.cat([t.reshape(-1) for t in torch.autograd.grad(
            torch.nn.functional.cross_entropy(s.encoder(x[i : i + 1]), y[i : i + 1]), params)]).double()
        diff = g * (1 - min(1.0, clip / float(g.norm())))
        gap = diff if gap is None else gap + diff
    assert float(gap.norm()) > 5 * sigma * clip * gap.numel() ** 0.5
