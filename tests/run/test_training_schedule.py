"""Training as the papers run it (issue 9, item 4): learning-rate schedule with warm-up, weight
decay, micro-batches of a logical batch — all from the run config, none of it in the accounting.

* the schedule's rate at chosen steps against the closed form (hand values, and transformers'
  schedules for the decay), through a real session and a federated site across rounds;
* weight decay: AdamW's decoupled term (θ₁ − θ₁' = −ηλθ₀ against plain Adam on the same noisy
  gradient), SGD's the same without momentum;
* micro-batches: the same update as the unchunked logical batch with FREQ-CLIP (whose node
  frequencies differ per chunk), one noise draw per logical batch;
* ε and σ identical with and without any of it; config errors name the field;
* one short run through the runner on the bundled CiteSeer with all of it on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from _paths import REPO
from _toy import toy_graph

from graphveil.contract.errors import ConfigError
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost, default_host
from graphveil.engine.dp_step import GaussianNoise, build_optimizer
from graphveil.engine.schedules import LrSchedule, lr_factor, warmup_steps
from graphveil.run.config import TrainingConfig, config_from_dict, load_config
from graphveil.run.session import TrainingSession

ENTITY_FREQ = ("entity_poisson_wor", "freq_clip", "coupled_rdp_freq")
EDGE = ("edge_poisson_decoupled", "per_tuple_clip", "edge_rdp")


def run_config(training: dict, *, method: tuple[str, str, str] = ENTITY_FREQ, clip_norm: float = 0.01,
               privacy: dict | None = None, batch_size: int = 8) -> dict:
    sampler, clipper, accountant = method
    training = {"steps": 4, "optimizer": "sgd", "lr": 0.5, "temperature": 0.2, **training}
    if "epochs" in training:
        del training["steps"]
    sampler_cfg = {"name": sampler, "batch_size": batch_size, "k_neg": 2}
    if sampler.startswith("entity"):
        sampler_cfg["degree_cap"] = 4
    return {
        "name": "schedule", "seed": 3,
        "data": {"split": {"train_fraction": 0.75, "seed": 3}},
        "sampler": sampler_cfg,
        "clipper": {"name": clipper, "clip_norm": clip_norm},
        "accountant": {"name": accountant},
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 12, "lora_layers": 1, "seed": 5},
        "training": training,
        "privacy": privacy or {"noise_multiplier": 1.0, "delta": 1e-5, "research_noise_seed": 7},
        "output": {"progress": False},
    }


@pytest.fixture(scope="module")
def graph():
    return toy_graph()


def session(graph, training: dict, **kw) -> TrainingSession:
    return TrainingSession(config_from_dict(run_config(training, **kw)), host=default_host(), graph=graph)


def flat(s: TrainingSession) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in s.encoder.trainable_parameters()])


def expected_factor(kind: str, t: int, total: int, w: int) -> float:
    """The closed form, written out again: warm-up (t+1)/W, then 1 / 1−p / (1+cos πp)/2."""
    if t < w:
        return (t + 1) / w
    p = min(1.0, (t - w) / (total - w))
    return {"constant": 1.0, "linear": 1 - p, "cosine": (1 + math.cos(math.pi * p)) / 2}[kind]


# ------------------------------------------------------------------------------ the schedule


@pytest.mark.parametrize(("kind", "warmup", "steps", "want"), [
    # T = 10, no warm-up: 1 at t = 0, p = t/10
    ("constant", 0.0, [0, 5, 9], [1.0, 1.0, 1.0]),
    ("linear", 0.0, [0, 3, 5, 9], [1.0, 0.7, 0.5, 0.1]),
    ("cosine", 0.0, [0, 3, 5, 9], [1.0, 0.7938926261, 0.5, 0.0244717419]),
    # T = 10, warmup 0.2: W = 2 steps at 1/2, 2/2, then p = (t-2)/8
    ("constant", 0.2, [0, 1, 2, 9], [0.5, 1.0, 1.0, 1.0]),
    ("linear", 0.2, [0, 1, 2, 6, 9], [0.5, 1.0, 1.0, 0.5, 0.125]),
    ("cosine", 0.2, [0, 1, 2, 6, 9], [0.5, 1.0, 1.0, 0.5, 0.0380602337]),
])
def test_factor_at_chosen_steps_is_the_closed_form(kind, warmup, steps, want) -> None:
    got = [lr_factor(kind, t, 10, warmup) for t in steps]
    assert got == pytest.approx(want, abs=1e-9)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
@pytest.mark.parametrize(("total", "warmup"), [(10, 0.0), (30, 0.1), (25, 0.1), (7, 0.5)])
def test_decay_after_warmup_is_transformers_schedule(kind, total, warmup) -> None:
    """After the warm-up the decay is transformers' (which reaches 0 at t = T); the warm-up starts
    one step later than theirs ((t+1)/W, theirs t/W: no private step is spent at rate 0)."""
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    w = warmup_steps(warmup, total)
    assert w == {0.0: 0, 0.1: math.ceil(total / 10), 0.5: 4}[warmup]  # 0.1·30 = 3 (not 4 from rounding)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    make = get_linear_schedule_with_warmup if kind == "linear" else get_cosine_schedule_with_warmup
    hf = make(opt, num_warmup_steps=w, num_training_steps=total)
    theirs = []
    for _ in range(total):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        hf.step()
    ours = [lr_factor(kind, t, total, warmup) for t in range(total)]
    assert ours[w:] == pytest.approx(theirs[w:], abs=1e-12)
    assert ours[:w] == pytest.approx([(t + 1) / w for t in range(w)])
    assert ours == pytest.approx([expected_factor(kind, t, total, w) for t in range(total)])
    assert lr_factor(kind, total, total, warmup) == 0.0 and lr_factor(kind, total + 5, total, warmup) == 0.0


def test_schedule_sets_every_group_and_refuses_bad_input() -> None:
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr": 0.4}, {"params": [b], "lr": 0.2}])
    sched = LrSchedule(opt, "linear", 4)
    assert sched.set_step(2) == pytest.approx(0.2)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.2, 0.1])
    with pytest.raises(ValueError, match="warmup must be in \\[0, 1\\)"):
        LrSchedule(opt, "cosine", 4, warmup=1.0)
    with pytest.raises(ValueError, match="unknown schedule 'step'"):
        LrSchedule(opt, "step", 4)  # type: ignore[arg-type]


def test_a_session_steps_the_schedule_once_per_optimizer_step_over_its_planned_steps(graph) -> None:
    """cosine, warm-up 0.25 of 8 planned steps (W = 2); trained as 3 + 5 steps of one session,
    the second call continues the schedule. The optimizer's rate is the scheduled one."""
    s = session(graph, {"steps": 8, "schedule": "cosine", "warmup": 0.25, "lr": 0.4}, method=EDGE)
    seen: list[tuple[float, float]] = []

    def on_step(_step: int, metrics: dict) -> None:
        seen.append((metrics["lr"], s.optimizer.param_groups[0]["lr"]))

    s.train(3, on_step=on_step)
    s.train(5, on_step=on_step)
    want = [0.4 * x for x in (0.5, 1.0, 1.0, (1 + math.cos(math.pi / 6)) / 2, 0.75, 0.5, 0.25,
                              (1 + math.cos(5 * math.pi / 6)) / 2)]
    assert [m for m, _ in seen] == pytest.approx(want)
    assert [o for _, o in seen] == pytest.approx(want)
    assert s.schedule_position == s.steps_done == 8


def test_epochs_plan_the_schedule(graph) -> None:
    """training.epochs: the schedule spans the steps planned from the data (linear to 0)."""
    s = session(graph, {"epochs": 1.0, "schedule": "linear", "lr": 1.0}, method=EDGE)
    lrs: list[float] = []
    s.train(on_step=lambda _s, m: lrs.append(m["lr"]))
    total = s.planned_steps
    assert total > 2 and len(lrs) == total
    assert lrs == pytest.approx([1 - t / total for t in range(total)])


# ------------------------------------------------------------------------------ weight decay


def test_build_optimizer_weight_decay_and_defaults() -> None:
    params = [torch.nn.Parameter(torch.ones(2))]
    assert type(build_optimizer(params, TrainingConfig())) is torch.optim.Adam  # default unchanged
    assert build_optimizer(params, TrainingConfig()).defaults["weight_decay"] == 0
    adamw = build_optimizer(params, TrainingConfig(weight_decay=0.1))
    assert type(adamw) is torch.optim.AdamW and adamw.defaults["weight_decay"] == 0.1
    sgd = build_optimizer(params, TrainingConfig(optimizer="sgd", weight_decay=0.1))
    assert type(sgd) is torch.optim.SGD and sgd.defaults["weight_decay"] == 0.1
    assert sgd.defaults["momentum"] == 0


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_weight_decay_is_the_decoupled_term_on_the_same_noisy_gradient(graph, optimizer) -> None:
    """Same batch, same research noise, same θ₀: with decay λ the step lands −ηλθ₀ away from the
    step without it (AdamW vs Adam; SGD without momentum). Adam's coupled L2 would not: its first
    step is −η·sign-like(g̃ + λθ₀), which moves only where the sign of g̃ + λθ₀ differs."""
    lr, decay = 0.01, 0.5
    before, after = [], []
    for wd in (0.0, decay):
        s = session(graph, {"steps": 1, "optimizer": optimizer, "lr": lr, "weight_decay": wd})
        s.prepare()
        before.append(flat(s).clone())
        s.train()
        after.append(flat(s).clone())
    torch.testing.assert_close(before[0], before[1], rtol=0, atol=0)
    theta0 = before[0]
    assert float(theta0.abs().max()) > 0.01
    torch.testing.assert_close(after[1] - after[0], -lr * decay * theta0, rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------------------ micro-batches


def _recorded(s: TrainingSession) -> tuple[list, list[int]]:
    """(the sampler's logical batches, the sizes of the batches the task's loss was run on)."""
    s.prepare()
    batches: list = []
    chunks: list[int] = []
    sample, losses = s.sampler.sample, s.task.losses

    def recording(generator):
        batch = sample(generator)
        batches.append(batch)
        return batch

    def chunk_losses(model, batch):
        chunks.append(batch.size)
        return losses(model, batch)

    s.sampler.sample = recording  # type: ignore[method-assign]
    s.task.losses = chunk_losses  # type: ignore[method-assign]
    return batches, chunks


def test_micro_batches_give_the_logical_batch_update_with_freq_clip_and_one_noise_draw(graph) -> None:
    """Entity-level FREQ-CLIP, σ = 1 with a research seed, a clip norm that binds every tuple:
    chunks of 3 give the same parameters, losses, clipped shares and ε as the whole batch, and
    the noise generator advanced by exactly one draw per parameter per step."""
    from graphveil.plugins.entity_dp.clipping import max_frequencies

    runs = []
    for micro in (None, 3):
        s = session(graph, {"micro_batch_size": micro, "schedule": "cosine", "warmup": 0.25})
        batches, chunks = _recorded(s)
        theta0 = flat(s).clone()
        metrics: list[dict] = []
        s.train(on_step=lambda _s, m, out=metrics: out.append(m))
        runs.append((s, batches, chunks, metrics))
    (whole, batches, whole_chunks, m_whole), (micro, _, micro_chunks, m_micro) = runs
    sizes = [b.size for b in batches]
    assert whole_chunks == sizes and all(b > 3 for b in sizes)  # every logical batch is split below
    assert micro_chunks == [min(3, b - i) for b in sizes for i in range(0, b, 3)]
    assert all(m["clipped_fraction"] == 1.0 for m in m_whole)
    # guard: FREQ-CLIP's frequencies over a chunk are not those over the logical batch
    assert any(not torch.equal(max_frequencies(b.select(torch.arange(3))), max_frequencies(b)[:3])
               for b in batches)
    torch.testing.assert_close(flat(micro), flat(whole), rtol=1e-5, atol=1e-7)
    assert float((flat(whole) - theta0).abs().max()) > 1e-3  # the steps moved θ
    for a, b in zip(m_micro, m_whole, strict=True):
        assert a["batch_size"] == b["batch_size"] and a["clipped_fraction"] == b["clipped_fraction"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5) and a["epsilon"] == b["epsilon"]
    # one noise draw per logical batch: the research generator moved as far as 4 steps of one
    # draw per parameter tensor (GaussianNoise takes one draw's secret from it for each)
    reference = GaussianNoise(research_seed=7)
    for _ in range(4):
        for _p in whole.encoder.trainable_parameters():
            reference.draw_secret()
    for s in (whole, micro):
        assert torch.equal(s.noise.generator.get_state(), reference.generator.get_state())


def test_nonprivate_training_micro_batched_is_the_same_run(graph) -> None:
    out = []
    for micro in (None, 2):
        s = session(graph, {"micro_batch_size": micro, "schedule": "linear", "weight_decay": 0.1},
                    privacy={"enabled": False})
        s.train()
        out.append(flat(s))
    torch.testing.assert_close(out[1], out[0], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ privacy


@pytest.mark.parametrize("method", [ENTITY_FREQ, EDGE], ids=["entity_freq", "edge"])
def test_epsilon_and_sigma_do_not_depend_on_schedule_decay_or_micro_batches(graph, method) -> None:
    privacy = {"target_epsilon": 6.0, "delta": 1e-5}
    plain = session(graph, {}, method=method, privacy=privacy)
    full = session(graph, {"schedule": "cosine", "warmup": 0.25, "weight_decay": 0.05, "micro_batch_size": 3,
                           "optimizer": "adam", "lr": 0.01}, method=method, privacy=privacy)
    for s in (plain, full):
        s.train()
    assert full.noise_multiplier == plain.noise_multiplier > 0
    assert full.steps_done == plain.steps_done == 4
    assert full.epsilon() == plain.epsilon() <= 6.0 + 1e-9
    assert full.privacy_report()["epsilon"] == plain.privacy_report()["epsilon"]


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize(("field", "value", "message"), [
    ("warmup", 1.0, "training.warmup: must be a fraction of the planned steps in [0, 1)"),
    ("warmup", -0.1, "training.warmup: must be a fraction of the planned steps in [0, 1)"),
    ("warmup", float("nan"), "training.warmup: must be a fraction"),
    ("micro_batch_size", 0, "training.micro_batch_size: must be an integer >= 1"),
    ("micro_batch_size", 2.5, "training.micro_batch_size: must be an integer >= 1"),
    ("micro_batch_size", True, "training.micro_batch_size: must be an integer >= 1"),
    ("weight_decay", -0.01, "training.weight_decay: must be a finite number >= 0"),
    ("schedule", "step", "training.schedule: Input should be 'constant', 'linear' or 'cosine'"),
])
def test_bad_training_fields_are_refused_naming_file_and_field(tmp_path: Path, field, value, message) -> None:
    raw = run_config({field: value})
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)
    assert f"(got {value!r})" in str(err.value)


def test_defaults_keep_todays_training() -> None:
    t = TrainingConfig()
    assert (t.schedule, t.warmup, t.weight_decay, t.micro_batch_size) == ("constant", 0.0, 0.0, None)
    assert TrainingConfig(warmup=0.1).schedule == "constant"  # warm-up alone is allowed
    overridden = load_config_from(["training.schedule=linear", "training.micro_batch_size=16"])
    assert overridden.training.schedule == "linear" and overridden.training.micro_batch_size == 16


def load_config_from(overrides: list[str]):
    return load_config(REPO / "examples" / "entity_freq_clip.yaml", overrides)


# ------------------------------------------------------------------------------ federated rounds


class _StepLog:
    def __init__(self) -> None:
        self.lrs: list[float] = []

    @hookimpl
    def graphveil_step_end(self, step, metrics):
        self.lrs.append(metrics["lr"])


@pytest.mark.usefixtures("flower_task")
def test_a_site_continues_one_schedule_across_rounds(tmp_path: Path) -> None:
    """2 rounds × 2 local steps, linear decay over T = 4: round 1 trains at lr·(1, 3/4), round 2
    at lr·(1/2, 1/4) — although the site builds a new session each round."""
    from _fed_support import init_site_ledger, site_context

    from graphveil.connectors.flower import records
    from graphveil.connectors.flower.partition import write_partition
    from graphveil.connectors.flower.settings import FederationSettings
    from graphveil.connectors.flower.site import handle_train
    from graphveil.data import load_bundled_citeseer

    edges, entities = write_partition(load_bundled_citeseer(), 3, tmp_path, seed=0)[0]
    run = {
        "num-server-rounds": 2, "local-steps": 2, "min-sites": 1,
        "task.sampler.name": "edge_poisson_decoupled", "task.sampler.batch_size": 8, "task.sampler.k_neg": 2,
        "task.clipper.name": "per_tuple_clip", "task.accountant.name": "edge_rdp",
        "task.encoder.name": "hf_lora", "task.encoder.model": "tiny-bert", "task.encoder.max_length": 12,
        "task.privacy.noise_multiplier": 2.0, "task.training.schedule": "linear", "task.training.lr": 0.02,
    }
    node = {"site-name": "bank-a", "data-path": str(edges), "data-entities": str(entities),
            "epsilon-budget": 1000.0, "ledger": str(tmp_path / "ledger.sqlite"), "delta": 1e-6,
            "privacy-unit": "edge", "min-records": 64}
    log = _StepLog()
    host = PluginHost()
    host.register(log, "step-log")
    built: list[TrainingSession] = []

    def factory(config, records_store=None):
        built.append(TrainingSession(config, host=host, records_store=records_store))
        return built[-1]

    task = FederationSettings.from_run_config(run).check_task()
    state = default_host().create("encoder", task.encoder.name, task.encoder.params, where="test").trainable_state()
    ctx = site_context(3, init_site_ledger(node), run)
    for server_round in (1, 2):
        reply = handle_train(records.train_content(records.arrays_from_state(state), server_round, 2), ctx,
                             session_factory=factory)
        assert reply.config_records[records.SITE]["status"] == records.TRAINED
        state = records.state_from_arrays(reply.array_records[records.ARRAYS])
    assert len(built) == 2 and all(s.planned_steps == 4 for s in built)
    assert log.lrs == pytest.approx([0.02, 0.015, 0.01, 0.005])


# ------------------------------------------------------------------------------ end to end


def test_a_run_with_cosine_warmup_decay_and_micro_batches(tmp_path: Path) -> None:
    from graphveil.run.runner import run_training

    raw = {
        "name": "schedule-run", "seed": 1,
        "data": {"source": "citeseer", "max_entities": 2000, "split": {"train_fraction": 0.7, "seed": 0}},
        "sampler": {"name": "edge_poisson_decoupled", "batch_size": 16, "k_neg": 2},
        "clipper": {"name": "per_tuple_clip", "clip_norm": 1.0},
        "accountant": {"name": "edge_rdp"},
        "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 12, "lora_layers": 1, "seed": 5},
        "training": {"steps": 10, "optimizer": "adam", "lr": 0.01, "schedule": "cosine", "warmup": 0.1,
                     "weight_decay": 0.01, "micro_batch_size": 4},
        "privacy": {"target_epsilon": 4.0},
        "evaluation": {"max_edges": 32},
        "output": {"progress": False, "dir": str(tmp_path / "run")},
    }
    run_training(config_from_dict(raw), host=default_host())
    out = tmp_path / "run"
    steps = [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "step" in m]
    assert [m["step"] for m in steps] == list(range(1, 11))
    # W = ceil(0.1·10) = 1: step 1 at lr, then a half cosine over the 9 others towards 0 at t = 10
    assert [m["lr"] for m in steps] == pytest.approx([0.01] + [0.005 * (1 + math.cos(math.pi * (t - 1) / 9))
                                                               for t in range(1, 10)])
    assert max(m["batch_size"] for m in steps) > 4  # the logical batches were larger than a chunk
    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["steps"] == 10 and 0 < privacy["epsilon"] <= 4.0 + 1e-9
    resolved = yaml.safe_load((out / "config.resolved.yaml").read_text())["training"]
    assert (resolved["schedule"], resolved["warmup"], resolved["weight_decay"], resolved["micro_batch_size"]) == (
        "cosine", 0.1, 0.01, 4)
    evaluation = json.loads((out / "evaluation.json").read_text())
    assert 0 <= evaluation["prec1"] <= evaluation["mrr"] <= 1
