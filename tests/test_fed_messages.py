"""What a site sends and what the server does with it — in process, with a fake session.

The site handler runs with the TrainingSession contract implemented by ``FakeSession`` (fake
LoRA tensors, a dp-accounting accountant), so these tests check the connector logic: the
ledger is written before release, refusals, failures that leak nothing, and the server's
aggregation over trained replies only.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from test_fed_support import (
    RUN_CONFIG,
    FakeEncoder,
    FakeSession,
    LocalGrid,
    dp_accounting_epsilon,
    site_context,
)

from graphveil.connectors.flower import records
from graphveil.connectors.flower.settings import FederationSettings
from graphveil.connectors.flower.site import handle_train
from graphveil.connectors.flower.strategy import SiteRounds, make_strategy
from graphveil.errors import DataError
from graphveil.ledger import PrivacyLedger

RATE, DELTA, SIGMA = 0.02, 1e-5, 1.0


@pytest.fixture(autouse=True)
def _task_identity():
    """Messages can only be built inside a Flower task; pretend to be one."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    FakeSession.instances.clear()
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def node_config(tmp_path: Path, name: str = "bank-a", budget: float = 5.0, **extra) -> dict:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "edges.tsv").write_text("source\ttarget\n")
    (folder / "entities.jsonl").write_text("")
    return {"site-name": name, "data-path": str(folder / "edges.tsv"),
            "data-entities": str(folder / "entities.jsonl"), "epsilon-budget": budget,
            "ledger": str(folder / "ledger.sqlite"), "seed": 7, **extra}


def global_state() -> dict[str, torch.Tensor]:
    return FakeEncoder(seed=123).trainable_state()


def train_content(server_round: int = 1, steps: int = 3, state=None) -> RecordDict:
    return records.train_content(records.arrays_from_state(state or global_state()), server_round, steps)


# ------------------------------------------------------------------------------------------ site


def test_trained_reply_carries_only_the_adapter_and_scalars(tmp_path: Path) -> None:
    ctx = site_context(11, node_config(tmp_path), RUN_CONFIG)
    reply = handle_train(train_content(steps=3), ctx, session_factory=FakeSession)

    assert set(reply.keys()) == {records.ARRAYS, records.METRICS, records.SITE}
    arrays = records.state_from_arrays(reply.array_records[records.ARRAYS])
    assert set(arrays) == {"lora_A", "lora_B"}  # trainable tensors only, no frozen weights
    for name, start in global_state().items():  # trained from the *global* state, 3 steps
        torch.testing.assert_close(arrays[name], start + 0.5 * 3)
    metrics = dict(reply.metric_records[records.METRICS])
    assert set(metrics) == set(records.PRIVACY_METRICS) | set(records.UTILITY_METRICS)
    assert metrics["num-steps"] == 3 and metrics["tuples-used"] == 21
    assert metrics["epsilon"] == pytest.approx(dp_accounting_epsilon([(SIGMA, RATE, 3)], DELTA), rel=1e-12)
    assert metrics["epsilon-budget"] == 5.0 and metrics["delta"] == DELTA and metrics["mrr"] == 0.5
    assert dict(reply.config_records[records.SITE]) == {"site-name": "bank-a", "status": records.TRAINED}
    # the session the site built was told only about its own data, with a per-round seed
    (session,) = FakeSession.instances
    assert session.config.data.path == Path(ctx.node_config["data-path"])
    assert session.config.training.steps == 2 * 3  # rounds × local steps (σ calibration horizon)


def test_spend_accumulates_in_the_ledger_across_rounds_and_matches_the_accountant(tmp_path: Path) -> None:
    cfg = node_config(tmp_path)
    ctx = site_context(11, cfg, RUN_CONFIG)
    first = handle_train(train_content(1, 3), ctx, session_factory=FakeSession)
    second = handle_train(train_content(2, 4), ctx, session_factory=FakeSession)
    eps2 = second.metric_records[records.METRICS]["epsilon"]
    assert eps2 == pytest.approx(dp_accounting_epsilon([(SIGMA, RATE, 7)], DELTA), rel=1e-12)
    assert eps2 > first.metric_records[records.METRICS]["epsilon"]
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert [(e.status, e.round, e.steps) for e in ledger.entries()] == [("released", 1, 3), ("released", 2, 4)]
        assert ledger.spent_epsilon() == pytest.approx(eps2)
    # seeds differ between rounds (no repeated noise)
    assert FakeSession.instances[0].config.seed != FakeSession.instances[1].config.seed


def test_utility_metrics_stay_home_when_the_site_says_so(tmp_path: Path) -> None:
    ctx = site_context(11, node_config(tmp_path, **{"share-utility-metrics": False}), RUN_CONFIG)
    reply = handle_train(train_content(), ctx, session_factory=FakeSession)
    assert set(reply.metric_records[records.METRICS]) == set(records.PRIVACY_METRICS)


def test_site_refuses_a_round_past_its_budget_and_says_why(tmp_path: Path) -> None:
    budget = dp_accounting_epsilon([(SIGMA, RATE, 5)], DELTA)  # room for 5 steps, not 6
    cfg = node_config(tmp_path, budget=budget)
    ctx = site_context(11, cfg, RUN_CONFIG)
    assert handle_train(train_content(1, 3), ctx, session_factory=FakeSession).config_records[records.SITE]["status"] == records.TRAINED
    reply = handle_train(train_content(2, 3), ctx, session_factory=FakeSession)

    assert records.ARRAYS not in reply  # nothing trained leaves
    site = reply.config_records[records.SITE]
    assert site["status"] == records.REFUSED and "past its budget" in site["reason"]
    metrics = reply.metric_records[records.METRICS]
    assert set(metrics) == set(records.REFUSAL_METRICS) and metrics["num-steps"] == 0
    assert metrics["projected-epsilon"] == pytest.approx(dp_accounting_epsilon([(SIGMA, RATE, 6)], DELTA))
    refused_session = FakeSession.instances[-1]
    for name, value in refused_session.trainable_state().items():  # never loaded, never trained
        torch.testing.assert_close(value, FakeEncoder(seed=refused_session.config.seed).trainable_state()[name])
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert [e.status for e in ledger.entries()] == ["released", "refused"]
    # 2 more steps still fit
    ok = handle_train(train_content(3, 2), ctx, session_factory=FakeSession)
    assert ok.metric_records[records.METRICS]["epsilon"] == pytest.approx(budget, rel=1e-12)


def test_spent_budget_is_refused_without_touching_the_data(tmp_path: Path) -> None:
    cfg = node_config(tmp_path, budget=dp_accounting_epsilon([(SIGMA, RATE, 3)], DELTA))
    ctx = site_context(11, cfg, RUN_CONFIG)
    handle_train(train_content(1, 3), ctx, session_factory=FakeSession)
    n = len(FakeSession.instances)
    reply = handle_train(train_content(2, 3), ctx, session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.REFUSED
    assert "budget spent" in reply.config_records[records.SITE]["reason"]
    assert len(FakeSession.instances) == n  # no session: the graph was not loaded


class _LeakySession(FakeSession):
    def train(self, num_steps=None):
        raise DataError("entities.jsonl, line 3: unknown entity 'patient-0042'")


def test_a_failure_leaks_no_data_and_the_reserved_spend_still_counts(tmp_path: Path) -> None:
    cfg = node_config(tmp_path)
    reply = handle_train(train_content(1, 3), site_context(11, cfg, RUN_CONFIG), session_factory=_LeakySession)
    site = dict(reply.config_records[records.SITE])
    assert site["status"] == records.FAILED
    assert "patient-0042" not in json.dumps(records.describe_content(reply))
    assert site["reason"] == "DataError while training; details are in the site's log"
    assert records.ARRAYS not in reply
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        (entry,) = ledger.entries()
        assert entry.status == "withheld" and entry.steps == 3  # reserved before training: counted


def test_bad_node_config_and_low_sigma(tmp_path: Path) -> None:
    cfg = node_config(tmp_path)
    cfg["epsilon-budget"] = -1.0
    reply = handle_train(train_content(), site_context(11, cfg, RUN_CONFIG), session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.FAILED
    assert "reading the node config" in reply.config_records[records.SITE]["reason"]

    cfg = node_config(tmp_path, name="bank-b", **{"min-noise-multiplier": 2.0})
    reply = handle_train(train_content(), site_context(12, cfg, RUN_CONFIG), session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.REFUSED
    assert "below this site's minimum" in reply.config_records[records.SITE]["reason"]
    assert not Path(cfg["ledger"]).exists() or PrivacyLedger(cfg["ledger"]).spent_epsilon() == 0.0


# ---------------------------------------------------------------------------------------- server


def _reply(node: int, content: RecordDict) -> Message:
    """A reply from ``node``, as the server receives it."""
    return Message(content, reply_to=Message(RecordDict(), node, "train"))


def _trained(node: int, name: str, value: float, steps: int = 3) -> Message:
    state = {"w": torch.full((2, 2), value)}
    metrics = {"num-steps": steps, "epsilon": 1.0, "delta": DELTA, "epsilon-budget": 4.0,
               "noise-multiplier": SIGMA, "tuples-used": 9, "mrr": 0.3, "prec1": 0.2}
    return _reply(node, records.trained_content(name, state, metrics))


def test_strategy_aggregates_trained_replies_only_and_logs_each_site(tmp_path: Path) -> None:
    audit = tmp_path / "received.jsonl"
    rounds: list[dict] = []
    strategy = SiteRounds(make_strategy("fedavg", min_sites=1, fraction_train=1.0), local_steps=3,
                          audit_path=audit, on_round_end=lambda r, rec: rounds.append(rec))
    refused = _reply(3, records.refused_content("c", records.REFUSED, "budget spent", {
        "num-steps": 0, "epsilon": 4.0, "delta": DELTA, "epsilon-budget": 4.0, "projected-epsilon": 4.5}))
    arrays, metrics = strategy.aggregate_train(1, [_trained(1, "a", 1.0), _trained(2, "b", 3.0, steps=1), refused])

    # FedAvg weighted by the public step counts (3 and 1): (3·1 + 1·3) / 4
    np.testing.assert_allclose(arrays["w"].numpy(), np.full((2, 2), 1.5))
    assert dict(metrics) == pytest.approx({"sites-trained": 2, "sites-refused": 1, "sites-failed": 0,
                                           "epsilon-max": 4.0, "mrr-mean": 0.3})
    assert [(s["site"], s["status"]) for s in rounds[0]["sites"]] == [("a", "trained"), ("b", "trained"), ("c", "refused")]
    lines = [json.loads(x) for x in audit.read_text().splitlines()]
    assert [ln["node-id"] for ln in lines] == [1, 2, 3]
    assert lines[0]["content"]["arrays"] == {"type": "ArrayRecord", "arrays": {"w": {"shape": [2, 2], "dtype": "float32"}}}

    # round 2: a dropped site (Flower error reply) and a missing one; nobody trains
    from flwr.app import Error

    dead = Message(Error(code=5, reason="node unavailable"), reply_to=Message(RecordDict(), 1, "train"))
    arrays, metrics = strategy.aggregate_train(2, [dead, refused])
    assert arrays is None and metrics["sites-failed"] == 1
    assert rounds[1]["missing"] == ["b"]
    assert rounds[1]["sites"][0]["site"] == "a" and "node unavailable" in rounds[1]["sites"][0]["reason"]


def test_fedadam_option_applies_the_adaptive_server_step() -> None:
    strategy = make_strategy("fedadam", min_sites=1, fraction_train=1.0, server_lr=0.1, server_tau=1e-3)
    start = np.zeros((2, 2), dtype=np.float32)
    strategy.current_arrays = {"w": start}
    wrapped = SiteRounds(strategy, local_steps=3)
    arrays, _ = wrapped.aggregate_train(1, [_trained(1, "a", 1.0), _trained(2, "b", 3.0)])
    delta = 2.0  # FedAvg mean minus the current global
    m, v = (1 - 0.9) * delta, (1 - 0.99) * delta**2
    eta = 0.1 * np.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    np.testing.assert_allclose(arrays["w"].numpy(), start + eta * m / (np.sqrt(v) + 1e-3), rtol=1e-6)


def test_server_loop_in_process_survives_a_refusal_and_a_dropout(tmp_path: Path) -> None:
    from graphveil.connectors.flower.server import run_federation

    budget_c = dp_accounting_epsilon([(SIGMA, RATE, 3)], DELTA)  # site c can do one round only
    sites = {1: node_config(tmp_path, "a"), 2: node_config(tmp_path, "b"), 3: node_config(tmp_path, "c", budget=budget_c)}
    run_config = {**RUN_CONFIG, "output-dir": str(tmp_path / "out"), "num-server-rounds": 3}
    grid = LocalGrid({n: site_context(n, cfg, run_config) for n, cfg in sites.items()})
    fed = FederationSettings.from_run_config(run_config)

    calls = {"n": 0}
    original = grid.send_and_receive

    def send(messages, *, timeout=None):
        messages = list(messages)
        calls["n"] += bool(messages)  # the (empty) evaluation exchanges do not count
        if calls["n"] == 3:
            grid.drop.add(2)  # b dies during round 3
        return original(messages, timeout=timeout)

    grid.send_and_receive = send

    from graphveil.hookspecs import hookimpl
    from graphveil.host import PluginHost

    class RoundWatcher:
        seen: list[tuple[int, int]] = []

        @hookimpl
        def graphveil_round_end(self, server_round, metrics):
            self.seen.append((server_round, len(metrics["sites"])))

    host = PluginHost(autoload=False)
    host.register(RoundWatcher(), "watcher")
    summary = run_federation(grid, fed, run_id=9, encoder=FakeEncoder(seed=5), host=host)
    assert RoundWatcher.seen == [(1, 3), (2, 3), (3, 3)]

    out = tmp_path / "out" / "run-9"
    rounds = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    statuses = [{s["site"]: s["status"] for s in r["sites"]} for r in rounds]
    assert statuses == [{"a": "trained", "b": "trained", "c": "trained"},
                        {"a": "trained", "b": "trained", "c": "refused"},
                        {"a": "trained", "b": "failed", "c": "refused"}]
    assert summary["rounds"] == 3 and summary["rounds-aggregated"] == 3
    assert summary["sites"]["c"]["epsilon"] == pytest.approx(budget_c)
    # every message the server sent carried the global adapter and the round's config only
    assert all(set(m.content.keys()) == {"arrays", "config"} for m in grid.sent)
    assert {int(m.content["config"]["local-steps"]) for m in grid.sent} == {3}
    # final adapter = start + 3 rounds × 0.5·3 (every site moves every tensor by the same amount)
    saved = torch.load(out / "adapter" / "adapter.pt")
    for name, start in FakeEncoder(seed=5).trainable_state().items():
        torch.testing.assert_close(saved[name], start + 3 * 1.5)
    assert not (out / "adapter.partial").exists()
    # the audit shows exactly what left each site
    audit = [json.loads(x) for x in (out / "received.jsonl").read_text().splitlines()]
    assert len(audit) == 9
    for line in audit:
        for record in line.get("content", {}).values():
            if record["type"] == "ArrayRecord":
                assert set(record["arrays"]) == {"lora_A", "lora_B"}
            elif record["type"] == "ConfigRecord":
                assert set(record["values"]) <= set(records.SITE_KEYS)
            else:
                assert set(record["values"]) <= set(records.PRIVACY_METRICS + records.UTILITY_METRICS + records.REFUSAL_METRICS)


def test_arrays_round_trip_exactly() -> None:
    state = {"a.lora_A.weight": torch.randn(3, 5), "b.lora_B.weight": torch.randn(5, 3).double()}
    back = records.state_from_arrays(records.arrays_from_state(state))
    for k, v in state.items():
        assert back[k].dtype == v.dtype
        torch.testing.assert_close(back[k], v, rtol=0, atol=0)
    assert isinstance(records.arrays_from_state(state), ArrayRecord)
    rec = ArrayRecord({"x": Array(np.ones(2))})
    assert records.describe_content(RecordDict({"a": rec, "m": MetricRecord({"k": 1.0}), "c": ConfigRecord({"s": "x"})})) == {
        "a": {"type": "ArrayRecord", "arrays": {"x": {"shape": [2], "dtype": "float64"}}},
        "m": {"type": "MetricRecord", "values": {"k": 1.0}},
        "c": {"type": "ConfigRecord", "values": {"s": "x"}},
    }


def test_site_refuses_without_an_explicit_delta(tmp_path: Path) -> None:
    run_config = {k: v for k, v in RUN_CONFIG.items() if k != "task.privacy.delta"}
    reply = handle_train(train_content(), site_context(11, node_config(tmp_path), run_config), session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.REFUSED
    assert "no δ set" in reply.config_records[records.SITE]["reason"]
    reply = handle_train(train_content(), site_context(11, node_config(tmp_path, delta=1e-6), run_config),
                         session_factory=FakeSession)
    assert reply.metric_records[records.METRICS]["delta"] == 1e-6


def test_a_ledger_from_another_mechanism_is_a_refusal_that_names_no_numbers(tmp_path: Path) -> None:
    from test_fed_support import OtherMechanism

    class OtherSession(FakeSession):
        def __init__(self, config, **kw):
            super().__init__(config, **kw)
            self.accountant = OtherMechanism()

    cfg = node_config(tmp_path)
    ctx = site_context(11, cfg, RUN_CONFIG)
    handle_train(train_content(1, 3), ctx, session_factory=FakeSession)
    reply = handle_train(train_content(2, 3), ctx, session_factory=OtherSession)
    site = reply.config_records[records.SITE]
    assert site["status"] == records.REFUSED and "separate ledger" in site["reason"]
    assert "test_other_mechanism" not in site["reason"]  # details stay in the site's log
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert [e.status for e in ledger.entries()] == ["released"]
