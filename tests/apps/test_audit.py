"""The one-run audit: its ε lower bound (Steinke, Nasr & Jagielski 2023), canaries, guesses, runs.

* The bound: the δ = 0 closed form when every guess is right, 0 at chance accuracy, monotone in
  v and δ, the p-value against an exact rational evaluation of the theorem's right-hand side,
  and validity: under the worst (ε, δ)-DP mechanism per canary (randomized response, revealing
  the bit with probability δ) the bound exceeds ε with probability ≤ 5 % — computed exactly
  over every outcome, not simulated.
* Canaries: in/out structure at the entity and the edge unit, on the training side of the split.
* Runs (slow): for each private method the bound stays below the claimed ε; a non-private run
  that memorises its canaries is caught (bound > 1). Everything is seeded (sampling, research
  noise seed, membership), so the runs are deterministic.
"""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _paths import REPO
from scipy import stats

from graphveil.apps.audit import (
    canary_scores,
    format_audit,
    guess,
    guess_grid,
    judge,
    plant_canaries,
    run_audit,
)
from graphveil.contract.errors import ConfigError, PrivacyError
from graphveil.contract.units import PrivacyUnit
from graphveil.data.graph import RelationalGraph
from graphveil.data.split import split_key, split_position
from graphveil.privacy.one_run_audit import all_correct_bound, audit_p_value, epsilon_lower_bound
from graphveil.run.config import SplitConfig, config_from_dict

# ---------------------------------------------------------------------------------------------
# the bound
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("r", [1, 4, 5, 20, 100, 1000])
def test_all_correct_at_delta_zero_is_the_closed_form(r):
    """q^r = 0.05 with q = e^ε/(1+e^ε): ε = log(q/(1−q)), q = 0.05^{1/r} (0 if negative: r < 5)."""
    q = 0.05 ** (1 / r)
    want = max(0.0, math.log(q / (1 - q)))
    assert epsilon_lower_bound(m=r, r=r, v=r, delta=0.0) == pytest.approx(want, abs=1e-7)
    assert all_correct_bound(r) == pytest.approx(want, rel=1e-12)


def test_closed_form_values_by_hand():
    # r = 1: q = 0.05 < 1/2, nothing can be shown; r = 20 and 100: the values the README quotes
    assert epsilon_lower_bound(10, 1, 1, 0.0) == 0.0
    assert epsilon_lower_bound(100, 20, 20, 0.0) == pytest.approx(1.8227, abs=1e-4)
    assert epsilon_lower_bound(100, 100, 100, 0.0) == pytest.approx(3.4930, abs=1e-4)


@pytest.mark.parametrize("delta", [1e-4, 1e-6])
def test_delta_only_lowers_the_all_correct_bound_and_vanishes_as_it_does(delta):
    for r in (10, 50, 200):
        with_delta = epsilon_lower_bound(200, r, r, delta)
        assert 0 < with_delta < all_correct_bound(r)
    assert epsilon_lower_bound(1000, 200, 200, 1e-12) == pytest.approx(all_correct_bound(200), abs=1e-6)


@pytest.mark.parametrize("delta", [0.0, 1e-5])
@pytest.mark.parametrize("r", [2, 10, 50, 400])
def test_chance_accuracy_gives_zero(r, delta):
    assert epsilon_lower_bound(r, r, r // 2, delta) == 0.0
    assert epsilon_lower_bound(2 * r, r, r // 2, delta) == 0.0


@pytest.mark.parametrize("delta", [0.0, 1e-5, 1e-3])
def test_monotone_in_correct_guesses(delta):
    bounds = [epsilon_lower_bound(500, 60, v, delta) for v in range(61)]
    assert all(a <= b for a, b in zip(bounds, bounds[1:], strict=False))
    assert bounds[30] == 0.0 and bounds[60] > bounds[50] > 0


def test_monotone_decreasing_in_delta_and_canaries():
    deltas = [0.0, 1e-6, 1e-5, 1e-4, 1e-3]
    bounds = [epsilon_lower_bound(1000, 100, 90, d) for d in deltas]
    assert all(a > b for a, b in zip(bounds, bounds[1:], strict=False))
    # m enters only through the δ term: more canaries, same guesses → a weaker bound
    assert epsilon_lower_bound(10_000, 100, 90, 1e-4) < epsilon_lower_bound(1000, 100, 90, 1e-4)
    assert epsilon_lower_bound(10_000, 100, 90, 0.0) == epsilon_lower_bound(1000, 100, 90, 0.0)


def exact_p_value(m: int, r: int, v: int, q: Fraction, delta: Fraction) -> Fraction:
    """The theorem's right-hand side in exact rationals, straight from the binomial pmf."""
    pmf = [math.comb(r, j) * q**j * (1 - q) ** (r - j) for j in range(r + 1)]
    tail = sum(pmf[v:], Fraction(0))
    alpha = max((sum(pmf[v - i : v], Fraction(0)) / i for i in range(1, v + 1)), default=Fraction(0))
    return min(Fraction(1), tail + 2 * m * delta * alpha)


@pytest.mark.parametrize(("m", "r", "v", "delta"), [
    (100, 40, 36, Fraction(1, 10**4)), (1000, 200, 190, Fraction(1, 10**5)), (60, 60, 50, Fraction(1, 10**3)),
    (50, 20, 20, Fraction(0)), (30, 10, 0, Fraction(1, 100)), (200, 100, 99, Fraction(1, 10**6)),
])
def test_p_value_matches_exact_rational_arithmetic(m, r, v, delta):
    """At ε = ln 3 the accuracy q = 3/4 is rational: the float p-value must equal the exact one."""
    want = exact_p_value(m, r, v, Fraction(3, 4), delta)
    got = audit_p_value(m, r, v, math.log(3), float(delta))
    assert got == pytest.approx(float(want), rel=1e-9, abs=1e-300)


def test_bound_is_where_the_p_value_crosses_the_level():
    """The bound is the sup of ε whose p-value is below 5 %: just below it rejected, just above not;
    checked against a dense grid of exact p-values (q rational on the grid)."""
    m, r, v, delta = 500, 60, 52, 1e-4
    eps = epsilon_lower_bound(m, r, v, delta)
    assert audit_p_value(m, r, v, eps - 1e-6, delta) < 0.05 <= audit_p_value(m, r, v, eps + 1e-6, delta)
    # the grid of accuracies q = k/1000 (ε = logit q) around the bound, in exact arithmetic
    q_low = Fraction(math.floor(1000 / (1 + math.exp(-eps))), 1000)
    q_high = q_low + Fraction(1, 1000)
    assert math.log(q_low / (1 - q_low)) <= eps < math.log(q_high / (1 - q_high))
    assert exact_p_value(m, r, v, q_low, Fraction(1, 10**4)) < Fraction(5, 100)
    assert exact_p_value(m, r, v, q_high, Fraction(1, 10**4)) >= Fraction(5, 100)


@pytest.mark.parametrize(("eps0", "delta", "m"), [(1.0, 0.0, 200), (2.0, 0.0, 60), (1.0, 1e-3, 200), (2.0, 1e-3, 100)])
def test_the_bound_is_valid_for_the_worst_mechanism(eps0, delta, m):
    """Per canary: with probability δ reveal S_i, else ε₀-randomized response — (ε₀, δ)-DP in each
    coordinate. Guessing every canary, v ~ Binomial(m, δ + (1 − δ)·q₀). The chance over v that
    the bound exceeds ε₀ must be ≤ 5 % (exact sum over all v)."""
    q0 = 1 / (1 + math.exp(-eps0))
    acc = delta + (1 - delta) * q0
    # the bound is monotone in v (tested above): find the first v whose bound exceeds ε₀
    first = next(v for v in range(m + 2) if v > m or epsilon_lower_bound(m, m, v, delta) > eps0)
    assert first <= m, "test setup: some outcome must refute ε₀"
    false_alarm = float(stats.binom.sf(first - 1, m, acc))
    assert 0 < false_alarm <= 0.05
    # and it is not vacuous: at the median outcome the bound is a real fraction of ε₀
    median = int(stats.binom.median(m, acc))
    assert epsilon_lower_bound(m, m, median, delta) > 0.3 * eps0


@pytest.mark.parametrize(("args", "what"), [
    ((10, 11, 5, 0.0), "guesses <= canaries"), ((10, 5, 6, 0.0), "correct <= guesses"),
    ((10, 5, -1, 0.0), "0 <= correct"), ((10, 5, 3, 1.0), "delta must be in"),
    ((10, 5, 3, -1e-9), "delta must be in"),
])
def test_bad_counts_are_refused(args, what):
    with pytest.raises(PrivacyError, match=what):
        epsilon_lower_bound(*args)
    with pytest.raises(PrivacyError, match="confidence"):
        epsilon_lower_bound(10, 5, 3, 0.0, confidence=1.0)


# ---------------------------------------------------------------------------------------------
# guesses
# ---------------------------------------------------------------------------------------------


def test_guess_takes_top_and_bottom_halves():
    scores = torch.tensor([0.5, 3.0, -1.0, 2.0, 0.0, -2.0], dtype=torch.float64)
    assert guess(scores, 4).tolist() == [0, 1, -1, 1, 0, -1]
    assert guess(scores, 3).tolist() == [0, 1, 0, 1, 0, -1]
    assert guess(scores, 6).tolist() == [1, 1, -1, 1, -1, -1]
    assert guess_grid(100) == [10, 20, 50, 100] and guess_grid(100, 30) == [30]
    assert guess_grid(8) == [2, 4, 8]


def test_judge_takes_the_best_guess_count_at_a_bonferroni_level():
    included = torch.tensor([True, False] * 40)
    scores = included.double() + 0.01 * torch.arange(80)  # perfectly separated
    verdict = judge(scores, included, delta=1e-5)
    assert verdict["level_per_guess_count"] == pytest.approx(0.05 / 4)
    assert [t["correct"] for t in verdict["tried"]] == [8, 16, 40, 80]
    assert verdict["guesses"] == 80 and verdict["correct"] == 80
    assert verdict["epsilon_lower_bound"] == epsilon_lower_bound(80, 80, 80, 1e-5, 1 - 0.05 / 4)
    # scores that carry no information: membership by index parity, scores by index
    assert judge(torch.arange(80).double(), included, delta=1e-5)["epsilon_lower_bound"] == 0.0


def test_printed_report_names_every_number():
    included = torch.tensor([True, False] * 10)
    verdict = judge(included.double(), included, delta=1e-5)
    result = {"method": "entity-level DP (entity_poisson_wor, standard_clip, coupled_rdp_standard)",
              "unit": "node", "relations_per_canary": 5, "claimed_epsilon": 10.0, "delta": 1e-5, **verdict}
    text = format_audit(result)
    assert "claimed ε (δ)" in text and "10.000 (δ = 1e-05)" in text
    assert "canaries m" in text and "20 (10 in)" in text
    assert f"empirical ε lower bound (95 %)  {verdict['epsilon_lower_bound']:.3f}" in text
    assert f"correct v                       {verdict['correct']}" in text
    assert "∞ (non-private)" in format_audit({**result, "claimed_epsilon": math.inf})


# ---------------------------------------------------------------------------------------------
# canaries
# ---------------------------------------------------------------------------------------------


def small_graph(n: int = 40, pairs: int = 80) -> RelationalGraph:
    """``n`` entities with short texts and about ``pairs`` random relations."""
    gen = torch.Generator().manual_seed(1)
    e = torch.randint(0, n, (pairs, 2), generator=gen)
    e = torch.unique(torch.stack([e.min(1).values, e.max(1).values], 1)[e[:, 0] != e[:, 1]], dim=0)
    texts = [f"entity {i} on topic {i % 7} and method {i % 5}" for i in range(n)]
    return RelationalGraph("small", [f"n{i}" for i in range(n)], e, texts=texts)


def split(kind: str = "transfer") -> SplitConfig:
    return SplitConfig(kind=kind, train_fraction=0.6, seed=4)


@pytest.mark.parametrize("unit", [PrivacyUnit.NODE, PrivacyUnit.EDGE])
def test_canaries_come_and_go_as_the_unit(unit):
    graph, m, degree = small_graph(), 12, 3
    included = torch.tensor([True, False, False, True] * 3)
    c = plant_canaries(graph, split(), unit, included, degree=degree, negatives=5, seed=0)
    g = c.graph
    n0 = graph.num_nodes
    assert g.entity_ids[:n0] == graph.entity_ids and g.texts[:n0] == graph.texts
    assert torch.equal(g.edges[: graph.num_edges], graph.edges)
    per = degree + 1 if unit == PrivacyUnit.NODE else 2
    assert c.probe.num_nodes == m * per and c.probe.num_edges == 0
    key = split_key(4)
    assert all(split_position(key, e) < 0.6 for e in c.probe.entity_ids), "a canary entity is not training data"
    position = {e: i for i, e in enumerate(g.entity_ids)}
    edges = {tuple(x) for x in g.edges[graph.num_edges:].tolist()}
    assert all(u < v for u, v in edges)
    expected = set()
    for i in range(m):
        ids = c.probe.entity_ids[i * per : (i + 1) * per]
        rel = c.relations[i]
        assert rel.shape == ((degree, 2) if unit == PrivacyUnit.NODE else (1, 2))
        if unit == PrivacyUnit.NODE:
            assert (ids[0] in position) == bool(included[i]), "the canary entity must come and go with it"
            assert all(p in position for p in ids[1:]), "partners stay in the data either way"
        else:
            assert all(p in position for p in ids), "both ends of an edge canary stay in the data"
        if included[i]:
            expected |= {tuple(sorted((position[c.probe.entity_ids[a]], position[c.probe.entity_ids[b]])))
                         for a, b in rel.tolist()}
        texts = [c.probe.texts[j] for j in range(i * per, (i + 1) * per)]
        assert all(t in g.texts for t in texts[1 if unit == PrivacyUnit.NODE and not included[i] else 0:])
    assert edges == expected
    assert len(set(c.probe.texts)) == m * per, "every fresh entity has its own text"
    # negatives: k fresh entities of OTHER canaries, per canary
    assert c.negatives.shape == (m, 5)
    assert all(int(x) // per != i for i in range(m) for x in c.negatives[i])


def test_two_graphs_canaries_join_graph_a():
    from graphveil.data.two_graphs import join_graphs

    a, b = small_graph(), small_graph()
    joined = join_graphs(a, b)
    two = SimpleNamespace(kind="two_graphs", train_fraction=0.5, seed=0)  # eval_data: already joined
    c = plant_canaries(joined, two, PrivacyUnit.EDGE, torch.tensor([True, False, True]), seed=1)
    assert c.graph.train.num_nodes == a.num_nodes + 6 and c.graph.held_out.num_nodes == b.num_nodes
    assert c.graph.train.num_edges == a.num_edges + 2


# ---------------------------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------------------------

#: a tiny random BERT, fully fine-tuned (with LoRA on a 32-wide model the non-private run
#: memorised too few canaries: bound 0.29 at rank 8, 0.76 at two layers of rank 16);
#: 64 canaries (192 fresh entities at K = 2) on a 96-entity graph
TINY = {"name": "hf_lora", "model": "tiny-bert", "max_length": 12, "finetune": "full", "seed": 5}
METHODS = {
    "entity_standard": ("entity_poisson_wor", "standard_clip", "coupled_rdp_standard"),
    "entity_freq": ("entity_poisson_wor", "freq_clip", "coupled_rdp_freq"),
    "edge": ("edge_poisson_decoupled", "per_tuple_clip", "edge_rdp"),
}
M, STEPS, LR = 64, 100, 1e-3


def audit_config(method: str, *, private: bool, epsilon: float = 1.0):
    sampler, clipper, accountant = METHODS[method]
    sampler_cfg = {"name": sampler, "batch_size": 32, "k_neg": 4}
    if sampler.startswith("entity"):
        sampler_cfg["degree_cap"] = 2
    raw = {
        "name": f"audit-{method}",
        "data": {"split": {"train_fraction": 0.75, "seed": 3}},
        "sampler": sampler_cfg,
        "clipper": {"name": clipper, "clip_norm": 1.0} if private else {"name": "no_clip"},
        "accountant": {"name": accountant} if private else {"name": "no_accounting"},
        "encoder": TINY,
        "training": {"steps": STEPS, "optimizer": "adam", "lr": LR, "temperature": 0.1},
        "privacy": ({"target_epsilon": epsilon, "delta": 1e-5, "research_noise_seed": 11} if private
                    else {"enabled": False}),
        "output": {"progress": False},
        "seed": 7,
    }
    return config_from_dict(raw)


@pytest.fixture(scope="module")
def toy() -> RelationalGraph:
    return small_graph(96, 400)


@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_private_runs_stay_below_their_claim(method, toy, tmp_path):
    """ε = 1 claimed: the same training without clipping and noise shows ε > 2.2 (next test), so
    a run whose noise or clipping were broken would cross the claim; the private run must not."""
    result = run_audit(audit_config(method, private=True, epsilon=1.0), canaries=M, seed=1, graph=toy,
                       output=tmp_path / "audit")
    assert result["claimed_epsilon"] <= 1.0 + 1e-9
    assert result["epsilon_lower_bound"] <= result["claimed_epsilon"]
    assert (tmp_path / "audit" / "audit.json").is_file()


@pytest.mark.slow
def test_a_non_private_run_is_caught(toy, tmp_path):
    """No clipping, no noise, 100 Adam steps: included canaries' relations are memorised (measured:
    63 of 64 guesses right, bound 2.22; the most 64 guesses can show at the grid's level is 2.65)."""
    result = run_audit(audit_config("entity_standard", private=False), canaries=M, seed=1, graph=toy,
                       output=tmp_path / "audit")
    assert math.isinf(result["claimed_epsilon"])
    assert result["epsilon_lower_bound"] > 1.0, result["tried"]


def test_scores_read_only_the_two_states(toy):
    """Same weights before and after: every score is exactly 0 (nothing but the states enters)."""
    from graphveil.contract.host import default_host

    options = {k: v for k, v in TINY.items() if k != "name"}
    encoder = default_host().create("encoder", "hf_lora", options, where="encoder")
    c = plant_canaries(toy, split(), PrivacyUnit.NODE, torch.tensor([True, False] * 4), degree=2, seed=2)
    state = encoder.trainable_state()
    from graphveil.plugins.relational.losses import LossSpec

    scores = canary_scores(encoder, c, state, state, LossSpec())
    assert scores.shape == (8,) and torch.equal(scores, torch.zeros(8, dtype=torch.float64))


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("argv", "message"), [
    (["--canaries", "1"], "--canaries must be >= 2"),
    (["--guesses", "30", "--canaries", "20"], "--guesses must be between 2 and --canaries"),
    (["--confidence", "1.5"], "--confidence must be in (0, 1)"),
])
def test_cli_refuses_bad_options_before_anything_is_written(argv, message, tmp_path, capsys):
    from graphveil.apps.cli import main

    cfg = write(tmp_path / "run.yaml", "name: x\nprivacy: {enabled: false}\nclipper: {name: no_clip}\n"
                "accountant: {name: no_accounting}\nsampler: {name: edge_poisson_decoupled}\n"
                "encoder: {name: hf_lora, model: tiny-bert}\n")
    out = tmp_path / "out"
    assert main(["audit", str(cfg), "--output", str(out), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and not Path(str(out) + ".partial").exists()


def test_cli_refuses_a_run_that_is_not_relational(tmp_path, capsys):
    from graphveil.apps.cli import main

    cfg = write(tmp_path / "node.yaml", (REPO / "examples" / "dp_mlp_cora.yaml").read_text(encoding="utf-8"))
    out = tmp_path / "out"
    assert main(["audit", str(cfg), "--output", str(out)]) == 2
    assert "audits relational runs" in capsys.readouterr().err
    assert not out.exists()


def test_cli_missing_config(tmp_path, capsys):
    from graphveil.apps.cli import main

    assert main(["audit", str(tmp_path / "nope.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_unknown_unit_is_refused():
    with pytest.raises(ConfigError, match="not audited"):
        plant_canaries(small_graph(), split(), PrivacyUnit.parse("k_neighbor/replacement/k=2"),
                       torch.tensor([True, False]))
