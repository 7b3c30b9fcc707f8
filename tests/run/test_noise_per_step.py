"""``TrainingSession.noise_per_step``: the noise scale it states is the noise the DP steps add."""

from __future__ import annotations

import math

import pytest
import torch

from graphveil.apps.demo import demo_configs
from graphveil.run.session import TrainingSession


def _session(key: str) -> TrainingSession:
    configs = {cfg.name: cfg for _, cfg in demo_configs(quick=True, progress=False)}
    session = TrainingSession(configs[key])
    session.prepare()
    return session


@pytest.mark.parametrize(("key", "kappa_below_one"), [("entity_standard", False), ("entity_freq", True),
                                                      ("edge", False)])
def test_stated_noise_is_the_noise_added(key: str, kappa_below_one: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    session = _session(key)
    stated = session.noise_per_step()
    assert stated is not None and session.privacy_report()["noise_per_step"] == stated
    params = list(session.encoder.trainable_parameters())
    assert stated["trainable_weights"] == sum(p.numel() for p in params) == 1433
    assert (stated["tuple_norm_bound"] < 1.0) == kappa_below_one  # FREQ-CLIP: C·κ
    # every tuple clipped to zero: what reaches the optimizer is the noise alone, divided by b̄
    monkeypatch.setattr(session.clipper, "factors", lambda batch, norms: torch.zeros_like(norms))
    seen = []
    monkeypatch.setattr(session.optimizer, "step", lambda: seen.append(torch.cat([p.grad.flatten() for p in params])))
    session.train(20)
    noise = torch.stack(seen).double()
    assert noise.std().item() == pytest.approx(stated["std_per_weight"], rel=0.03)  # 28 660 draws
    assert noise.norm(dim=1).mean().item() == pytest.approx(stated["norm"], rel=0.03)
    assert stated["norm"] == pytest.approx(stated["std_per_weight"] * math.sqrt(1433))


def test_no_statement_without_private_training() -> None:
    session = _session("nonprivate")
    assert session.noise_per_step() is None and "noise_per_step" not in session.privacy_report()
