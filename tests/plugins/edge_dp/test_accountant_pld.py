"""``edge_pld``: PLD accounting of edge-level DP-SGD, checked against independent analyses.

* Opacus' PRV accountant (Gopi et al. 2021; the accounting paper 2 uses) on single and mixed-σ
  histories: the PLD ε is within 2 % of its estimate;
* at γ = 1 the steps are one Gaussian mechanism with σ/√T, whose exact ε(δ) is known in closed
  form (Balle & Wang 2018, Thm 8): the PLD ε is above it (an upper bound) and within 1 %;
* the RDP bound of ``edge_rdp`` is never below it, and the report gives both;
* step-by-step composition (the training loop) equals composing all steps at once;
* calibration is tight and never above the RDP σ; releases and foreign state are refused.
"""

from __future__ import annotations

import math

import pytest
from opacus.accountants import PRVAccountant

from graphveil.contract.errors import PrivacyError
from graphveil.contract.host import PluginHost
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
from graphveil.plugins.edge_dp.pld_accountant import EdgePldAccountant

EDGE = SensitivityProfile(SensitivityKind.PER_TUPLE_EDGE, PrivacyUnit.EDGE, 1.0)


def bound(cls: type = EdgePldAccountant, rate: float = 0.01) -> EdgeRdpAccountant:
    acc = cls()
    acc.bind(SamplingProfile(SamplingKind.POISSON_DECOUPLED, rate, 100_000), EDGE)
    return acc


def prv_epsilon(rate: float, history: list[tuple[float, int]], delta: float) -> float:
    prv = PRVAccountant()
    prv.history = [(sigma, rate, steps) for sigma, steps in history]
    return prv.get_epsilon(delta)


HISTORIES = [
    (0.01, [(1.0, 1000)]),
    (0.003, [(0.8, 3000)]),
    (0.02, [(0.7, 200), (1.4, 300), (0.7, 100)]),
    (64 / 6000, [(0.4, 94)]),  # paper 2's regime: σ ≈ 0.3-0.5, one epoch
]


@pytest.mark.parametrize(("rate", "history"), HISTORIES)
def test_pld_agrees_with_opacus_prv_and_is_below_rdp(rate: float, history: list[tuple[float, int]]) -> None:
    acc, rdp = bound(rate=rate), bound(EdgeRdpAccountant, rate=rate)
    for sigma, steps in history:
        acc.step(noise_multiplier=sigma, num_steps=steps)
        rdp.step(noise_multiplier=sigma, num_steps=steps)
    for delta in (1e-5, 1e-7):
        report = acc.report(delta)
        prv = prv_epsilon(rate, history, delta)
        assert report["epsilon_pld"] == pytest.approx(prv, rel=0.02), (report["epsilon_pld"], prv)
        assert report["epsilon_rdp"] == pytest.approx(rdp.get_epsilon(delta), rel=1e-12)
        assert report["epsilon_pld"] < report["epsilon_rdp"]
        assert acc.get_epsilon(delta) == report["epsilon"] == report["epsilon_pld"]
        assert report["alpha"] is None and report["accounting"].startswith("pld")


def exact_gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε(δ) of one Gaussian mechanism, sensitivity 1 (Balle & Wang 2018, Thm 8), by bisection."""
    phi = lambda x: 0.5 * math.erfc(-x / math.sqrt(2))  # noqa: E731

    def delta_at(eps: float) -> float:
        return phi(-eps * sigma + 0.5 / sigma) - math.exp(eps) * phi(-eps * sigma - 0.5 / sigma)

    lo, hi = 0.0, 100.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if delta_at(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize(("sigma", "steps"), [(2.0, 1), (5.0, 10), (20.0, 400)])
def test_full_batch_is_the_exact_gaussian_mechanism(sigma: float, steps: int) -> None:
    acc = bound(rate=1.0)
    acc.step(noise_multiplier=sigma, num_steps=steps)
    exact = exact_gaussian_epsilon(sigma / math.sqrt(steps), 1e-5)
    assert exact <= acc.get_epsilon(1e-5) <= exact * 1.01


def test_step_by_step_equals_all_at_once_and_projection_leaves_no_trace() -> None:
    one_by_one, at_once = bound(), bound()
    for i in range(60):
        one_by_one.step(noise_multiplier=0.9 if i < 40 else 1.3)
        eps = one_by_one.get_epsilon(1e-5)  # what the training loop asks after every step
    at_once.step(noise_multiplier=0.9, num_steps=40)
    at_once.step(noise_multiplier=1.3, num_steps=20)
    assert eps == pytest.approx(at_once.get_epsilon(1e-5), rel=1e-6)
    state = one_by_one.state_dict()
    one_by_one.step(noise_multiplier=0.9, num_steps=500)
    assert one_by_one.get_epsilon(1e-5) > eps
    one_by_one.load_state_dict(state)
    assert one_by_one.get_epsilon(1e-5) == pytest.approx(eps, rel=1e-12)


def test_calibration_is_tight_and_never_above_the_rdp_sigma() -> None:
    acc, rdp = bound(), bound(EdgeRdpAccountant)
    sigma = acc.calibrate(target_epsilon=4.0, delta=1e-5, num_steps=1000)
    sigma_rdp = rdp.calibrate(target_epsilon=4.0, delta=1e-5, num_steps=1000)
    assert sigma < sigma_rdp
    probe = bound()
    probe.step(noise_multiplier=sigma, num_steps=1000)
    assert probe.get_epsilon(1e-5) <= 4.0
    looser = bound()
    looser.step(noise_multiplier=sigma * (1 - 3 * acc.CALIBRATE_RTOL), num_steps=1000)
    assert looser.get_epsilon(1e-5) > 4.0
    assert len(acc) == 0  # calibration records nothing


def test_no_steps_is_zero_and_releases_and_foreign_state_are_refused() -> None:
    acc = bound()
    assert acc.get_epsilon(1e-5) == 0.0
    with pytest.raises(PrivacyError, match="edge_rdp"):
        acc.compose_event(None, "pma")
    with pytest.raises(PrivacyError, match="edge_rdp"):
        acc.calibrate(target_epsilon=1.0, delta=1e-5, num_steps=10, releases=lambda s: [])
    other = bound(EdgeRdpAccountant)
    other.step(noise_multiplier=1.0, num_steps=5)
    with pytest.raises(PrivacyError, match="mechanism"):
        acc.load_state_dict(other.state_dict())
    finer = EdgePldAccountant(EdgePldAccountant.Params(value_discretization_interval=1e-4))
    finer.bind(SamplingProfile(SamplingKind.POISSON_DECOUPLED, 0.01, 100_000), EDGE)
    with pytest.raises(PrivacyError, match="profile"):
        finer.load_state_dict(acc.state_dict())  # ε depends on the grid


def test_registered_for_the_edge_unit() -> None:
    acc = PluginHost().create("accountant", "edge_pld", {"value_discretization_interval": 1e-3})
    assert isinstance(acc, EdgePldAccountant) and acc.unit is PrivacyUnit.EDGE


def test_a_run_with_edge_pld_calibrates_trains_and_reports_both_epsilons(tmp_path) -> None:
    import json

    from graphveil.contract.host import default_host
    from graphveil.run.config import config_from_dict
    from graphveil.run.runner import run_training

    host = default_host()
    raw = {
        "name": "pld-run", "seed": 1,
        "data": {"source": "citeseer", "max_entities": 2000, "split": {"train_fraction": 0.7, "seed": 0}},
        "sampler": {"name": "edge_poisson_decoupled", "batch_size": 16, "k_neg": 2},
        "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_pld"},
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 12, "lora_layers": 1, "seed": 5},
        "training": {"steps": 6, "optimizer": "sgd", "lr": 0.01},
        "privacy": {"target_epsilon": 4.0},
        "evaluation": {"max_edges": 32},
        "output": {"progress": False, "dir": str(tmp_path / "run")},
    }
    run_training(config_from_dict(raw), host=host)
    report = json.loads((tmp_path / "run" / "privacy.json").read_text())
    assert report["accountant"] == "edge_pld" and report["accounting"].startswith("pld")
    assert report["epsilon"] == report["epsilon_pld"] <= 4.0 < report["epsilon_rdp"]
    assert report["epsilon"] == pytest.approx(4.0, rel=0.01)  # calibrated to the target by PLD
