"""What a site sends and what the server does with it — in process, with a fake session.

The site handler runs with the TrainingSession contract implemented by ``FakeSession`` (fake
LoRA tensors, a dp-accounting accountant), so these tests check the connector logic: the
ledger is written before release, refusals, failures that leak nothing, and the server's
aggregation over trained replies only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from _fed_support import (
    RUN_CONFIG,
    FakeEncoder,
    FakeSession,
    LocalGrid,
    dp_accounting_epsilon,
    global_state,
    node_config,
    public_view,
    site_context,
    train_content,
)
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from graphveil.connectors.flower import records
from graphveil.connectors.flower.settings import FederationSettings
from graphveil.connectors.flower.site import handle_train
from graphveil.connectors.flower.strategy import SiteRounds, make_strategy
from graphveil.contract.errors import DataError
from graphveil.ledger import PrivacyLedger, WitnessHead

RATE, DELTA, SIGMA = 0.02, 1e-5, 1.0


pytestmark = pytest.mark.usefixtures("fresh_fake_sessions")


def ledger_rows(cfg: dict) -> list[str]:
    """The kinds of the site's ledger rows (``bind`` of the site name at init, then its spends)."""
    with PrivacyLedger(cfg["ledger"]) as ledger:
        return [row["kind"] for row in ledger.events()]


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
    assert metrics["num-steps"] == 3 and "tuples-used" not in metrics
    assert metrics["epsilon"] == pytest.approx(dp_accounting_epsilon([(SIGMA, RATE, 3)], DELTA), rel=1e-9)
    assert metrics["epsilon-budget"] == 5.0 and metrics["delta"] == DELTA and metrics["mrr"] == 0.5
    site = dict(reply.config_records[records.SITE])
    with PrivacyLedger(ctx.node_config["ledger"]) as ledger:  # one round closed: released
        assert ledger.witness_head().seq == 1
        assert site == {"site-name": "bank-a", "status": records.TRAINED, "ledger-seq": 1,
                        "ledger-head": ledger.witness_head().head, "ledger-previous": ledger.genesis()}
    # the session the site built was told only about its own data, with a per-round seed, and
    # keeps its records in the site's ledger
    (session,) = FakeSession.instances
    assert isinstance(session.records_store, PrivacyLedger)
    assert Path(session.config.data.params["path"]) == Path(ctx.node_config["data-path"])
    assert session.config.training.steps == 2 * 3  # rounds × local steps (σ calibration horizon)


def test_spend_accumulates_in_the_ledger_across_rounds_and_matches_the_accountant(tmp_path: Path) -> None:
    cfg = node_config(tmp_path)
    ctx = site_context(11, cfg, RUN_CONFIG)
    first = handle_train(train_content(1, 3), ctx, session_factory=FakeSession)
    second = handle_train(train_content(2, 4), ctx, session_factory=FakeSession)
    eps2 = second.metric_records[records.METRICS]["epsilon"]
    assert eps2 == pytest.approx(dp_accounting_epsilon([(SIGMA, RATE, 7)], DELTA), rel=1e-9)
    assert eps2 > first.metric_records[records.METRICS]["epsilon"]
    with PrivacyLedger(cfg["ledger"]) as ledger:
        assert [(e.status, e.round, e.steps) for e in ledger.entries()] == [("released", 1, 3), ("released", 2, 4)]
        assert ledger.spent_epsilon() == pytest.approx(eps2)
    # seeds differ between rounds (no repeated noise)
    assert FakeSession.instances[0].config.seed != FakeSession.instances[1].config.seed


def test_utility_metrics_stay_home_when_the_site_says_so(tmp_path: Path) -> None:
    ctx = site_context(11, node_config(tmp_path, **{"share-utility-metrics": False}), RUN_CONFIG)
    reply = handle_train(train_content(), ctx, session_factory=FakeSession)
    assert set(reply.metric_records[records.METRICS]) == set(records.PRIVACY_METRICS)


def test_by_default_a_reply_carries_only_public_scalars(tmp_path: Path) -> None:
    """No opt-in: no ε (it depends on b/|Ē|), no held-out scores, no tuple count; a budget
    refusal states no ε values either."""
    cfg = {k: v for k, v in node_config(tmp_path).items() if not k.startswith("share-")}
    cfg["epsilon-budget"] = dp_accounting_epsilon([(SIGMA, RATE, 3)], DELTA) * (1 + 1e-9)
    ctx = site_context(11, cfg, RUN_CONFIG)
    reply = handle_train(train_content(1, 3), ctx, session_factory=FakeSession)
    metrics = dict(reply.metric_records[records.METRICS])
    assert set(metrics) == set(records.PUBLIC_METRICS)
    assert metrics == {"num-steps": 3, "delta": DELTA, "epsilon-budget": cfg["epsilon-budget"], "noise-multiplier": SIGMA}
    for server_round in (2, 3):  # would pass the budget; then: spent
        reply = handle_train(train_content(server_round, 3), ctx, session_factory=FakeSession)
        site = dict(reply.config_records[records.SITE])
        assert site["status"] == records.REFUSED and "budget" in site["reason"]
        assert not any(ch.isdigit() for ch in site["reason"]), site["reason"]
        assert not set(reply.metric_records[records.METRICS]) & set(records.SPEND_METRICS)


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
    with PrivacyLedger(cfg["ledger"]) as ledger:
        assert [e.status for e in ledger.entries()] == ["released", "refused"]
    # 2 more steps still fit
    ok = handle_train(train_content(3, 2), ctx, session_factory=FakeSession)
    assert ok.metric_records[records.METRICS]["epsilon"] == pytest.approx(budget, rel=1e-9)


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
    def train(self, num_steps=None, **_):
        raise DataError("entities.jsonl, line 3: unknown entity 'patient-0042'")


def test_a_failure_after_the_reservation_is_charged_and_answered_like_a_trained_round(tmp_path: Path) -> None:
    """Once the spend is reserved, the reply's kind and fields do not depend on what the data did:
    a failure is charged in full and sends back the server's own arrays, in a trained reply."""
    quiet = {"share-utility-metrics": False}  # held-out scores are a non-private opt-in
    cfg = node_config(tmp_path, **quiet)
    sent = FakeEncoder(seed=4).trainable_state()
    ok = handle_train(train_content(1, 3, state=sent), site_context(11, cfg, RUN_CONFIG), session_factory=FakeSession)
    (tmp_path / "other").mkdir()
    cfg2 = node_config(tmp_path / "other", **quiet)
    bad = handle_train(train_content(1, 3, state=sent), site_context(11, cfg2, RUN_CONFIG),
                       session_factory=_LeakySession)
    assert public_view(bad) == public_view(ok)  # same fields, shapes and scalars
    assert "patient-0042" not in json.dumps(records.describe_content(bad))
    for key, value in records.state_from_arrays(bad.array_records[records.ARRAYS]).items():
        assert torch.equal(value, sent[key])  # the server's arrays, unchanged: nothing of the data
    with PrivacyLedger(cfg2["ledger"], create=False) as ledger:
        (entry,) = ledger.entries()
        assert entry.status == "withheld" and entry.steps == 3  # reserved before training: counted


class _UnreadableGraph(FakeSession):
    def prepare(self):
        raise DataError("edges.tsv, line 9: unknown entity 'patient-0042'")


def test_the_spend_is_reserved_before_the_graph_is_read_so_a_bad_graph_looks_like_any_round(tmp_path: Path) -> None:
    """Edge level with the site's size floor: the reservation comes first, so even a graph that
    fails to load gives a trained reply (the server's arrays back), charged in the ledger."""
    cfg = node_config(tmp_path, **{"share-utility-metrics": False})
    reply = handle_train(train_content(1, 3), site_context(11, cfg, RUN_CONFIG), session_factory=_UnreadableGraph)
    assert reply.config_records[records.SITE]["status"] == records.TRAINED
    assert "patient-0042" not in json.dumps(records.describe_content(reply))
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert [(e.status, e.steps) for e in ledger.entries()] == [("withheld", 3)]


def test_bad_node_config_and_low_sigma(tmp_path: Path) -> None:
    cfg = node_config(tmp_path)
    cfg["epsilon-budget"] = -1.0
    reply = handle_train(train_content(), site_context(11, cfg, RUN_CONFIG), session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.FAILED
    assert "reading the node config" in reply.config_records[records.SITE]["reason"]

    cfg = node_config(tmp_path, name="bank-b", **{"min-noise-multiplier": 2.0})
    n = len(FakeSession.instances)
    reply = handle_train(train_content(), site_context(12, cfg, RUN_CONFIG), session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.REFUSED
    assert "min-noise-multiplier" in reply.config_records[records.SITE]["reason"]
    assert len(FakeSession.instances) == n  # refused before the session (and the data)
    assert ledger_rows(cfg) == ["bind"]  # only init's binding of the site name: nothing reserved
    assert records.LEDGER_SEQ not in reply.config_records[records.SITE]  # refused before opening it


def test_every_reply_after_the_ledger_opened_carries_its_witness_head_and_the_server_checks_it(
        tmp_path: Path) -> None:
    """Every reply after the ledger opened carries (ledger-seq, ledger-head, ledger-previous): the
    sequence number advances by one per round the ledger closed and each previous head is the
    last reply's head. The server's witness accepts them; after the site restores a backup of its
    ledger, its next trained reply goes backwards and is not aggregated."""
    import shutil

    from graphveil.ledger.witness import Witness

    cfg = node_config(tmp_path, budget=dp_accounting_epsilon([(SIGMA, RATE, 9)], DELTA) * (1 + 1e-9))
    ctx = site_context(11, cfg, RUN_CONFIG)
    replies = [handle_train(train_content(1, 3), ctx, session_factory=FakeSession)]
    shutil.copy(cfg["ledger"], tmp_path / "backup.sqlite")
    replies += [handle_train(train_content(2, 3), ctx, session_factory=_LeakySession),  # withheld: answered as trained
                handle_train(train_content(3, 3), ctx, session_factory=FakeSession),
                handle_train(train_content(4, 3), ctx, session_factory=FakeSession),  # past the budget
                handle_train(train_content(5, 3, state=_malformed("nan")), ctx, session_factory=FakeSession)]
    sites = [dict(r.config_records[records.SITE]) for r in replies]
    assert [s["status"] for s in sites] == ["trained", "trained", "trained", "refused", "refused"]
    assert [s[records.LEDGER_SEQ] for s in sites[:4]] == [1, 2, 3, 4]
    assert records.LEDGER_SEQ not in sites[4]  # malformed arrays: refused before the ledger is opened
    with PrivacyLedger(cfg["ledger"]) as ledger:
        assert sites[0][records.LEDGER_PREVIOUS] == ledger.genesis()
        assert sites[3][records.LEDGER_HEAD] == ledger.witness_head().head == ledger.head()[1]
    for before, after in zip(sites[:3], sites[1:4], strict=True):
        assert after[records.LEDGER_PREVIOUS] == before[records.LEDGER_HEAD] != after[records.LEDGER_HEAD]

    rounds: list[dict] = []
    witness = Witness(tmp_path / "server" / "ledger-witness.jsonl")
    strategy = SiteRounds(make_strategy("fedavg", min_sites=1, fraction_train=1.0), local_steps=3,
                          on_round_end=lambda r, rec: rounds.append(rec), witness=witness)
    for server_round, reply in enumerate(replies, start=1):
        strategy.aggregate_train(server_round, [_reply(11, reply)])
    assert [s.get("witness") for r in rounds for s in r["sites"]] == [None] * 5
    assert [(o.seq, o.head) for o in witness.observations("bank-a")] == [
        (s[records.LEDGER_SEQ], s[records.LEDGER_HEAD]) for s in sites[:4]]
    # the operator restores the backup taken after round 1; round 6 trains on it
    shutil.copy(tmp_path / "backup.sqlite", cfg["ledger"])
    restored = handle_train(train_content(6, 3), ctx, session_factory=FakeSession)
    assert restored.config_records[records.SITE]["status"] == records.TRAINED  # the site cannot tell
    assert restored.config_records[records.SITE][records.LEDGER_SEQ] == 2
    arrays, metrics = strategy.aggregate_train(6, [_reply(11, restored)])
    (entry,) = rounds[-1]["sites"]
    assert arrays is None and metrics["sites-trained"] == 0 and not rounds[-1]["aggregated"]
    assert entry["status"] == records.FAILED and "went backwards: checkpoint 2 after 4" in entry["witness"]
    assert entry["reason"].startswith("rejected reply: the ledger of site 'bank-a' went backwards")
    json.dumps(rounds)  # the round log stays writable


def test_an_unreadable_witness_file_stops_the_run_before_its_first_round(tmp_path: Path) -> None:
    from graphveil.connectors.flower.server import run_federation
    from graphveil.ledger.witness import WitnessError

    witness = tmp_path / "witness.jsonl"
    witness.write_text('{"site": "a", "seq": 1, "head": "zz", "time": 1}\n')
    run_config = {**RUN_CONFIG, "output-dir": str(tmp_path / "out"), "ledger-witness": str(witness)}
    grid = LocalGrid({1: site_context(1, node_config(tmp_path, "a"), run_config)})
    with pytest.raises(WitnessError, match=f"{witness}, line 1: ledger head 'zz'"):
        run_federation(grid, FederationSettings.from_run_config(run_config), run_id=4, encoder=FakeEncoder(seed=5))
    assert grid.sent == []


def test_a_trained_reply_without_a_ledger_head_is_not_aggregated() -> None:
    rounds: list[dict] = []
    strategy = SiteRounds(make_strategy("fedavg", min_sites=1, fraction_train=1.0), local_steps=3,
                          on_round_end=lambda r, rec: rounds.append(rec))
    bare = _trained(1, "a", 1.0)
    for key in records.LEDGER_KEYS:
        del bare.content[records.SITE][key]
    bad = _trained(2, "b", 1.0)
    bad.content[records.SITE][records.LEDGER_HEAD] = "not a hash"
    arrays, _ = strategy.aggregate_train(1, [bare, bad, _trained(3, "c", 3.0)])
    np.testing.assert_allclose(arrays["w"].numpy(), np.full((2, 2), 3.0))  # c only
    status = {s["site"]: (s["status"], s["reason"]) for s in rounds[0]["sites"]}
    assert status["a"][0] == status["b"][0] == records.FAILED and "no valid ledger head" in status["a"][1]
    assert "malformed: ledger-head 'not a hash'" in next(s for s in rounds[0]["sites"] if s["site"] == "b")["ledger"]


# ---------------------------------------------------------------------------------------- server


def _reply(node: int, content: RecordDict) -> Message:
    """A reply from ``node``, as the server receives it."""
    return Message(content, reply_to=Message(RecordDict(), node, "train"))


def _head(seq: int, tag: str = "") -> WitnessHead:
    """A witness head as a site's ledger would send it (distinct hex per (seq, tag))."""
    def digest(n: int) -> str:
        return hashlib.sha256(f"{tag}:{n}".encode()).hexdigest()

    return WitnessHead(seq, digest(seq), digest(seq - 1) if seq else None)


def _trained(node: int, name: str, value: float, steps: int = 3, head: WitnessHead | None = None) -> Message:
    state = {"w": torch.full((2, 2), value)}
    metrics = {"num-steps": steps, "epsilon": 1.0, "delta": DELTA, "epsilon-budget": 4.0,
               "noise-multiplier": SIGMA, "mrr": 0.3, "prec1": 0.2}
    return _reply(node, records.trained_content(name, state, metrics, ledger_head=head or _head(1, name)))


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
    original = grid.push_messages

    def push(messages):
        messages = list(messages)
        calls["n"] += bool(messages)  # the (empty) evaluation exchanges do not count
        if calls["n"] == 3:
            grid.drop.add(2)  # b dies during round 3
        return original(messages)

    grid.push_messages = push

    from graphveil.contract.hookspecs import hookimpl
    from graphveil.contract.host import PluginHost

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
    # the witness, kept beside the run folders: each site's checkpoints as its replies carried them
    # (c: trained, then refused twice as spent, before any ledger row: its checkpoint stays 1)
    from graphveil.ledger.witness import Witness

    assert summary["ledger-witness"] == str(tmp_path / "out" / "ledger-witness.jsonl")
    witness = Witness(summary["ledger-witness"])
    assert {n: [o.seq for o in witness.observations(n)] for n in "abc"} == {"a": [1, 2, 3], "b": [1, 2], "c": [1]}
    for name in "abc":
        with PrivacyLedger(sites[" abc".index(name)]["ledger"]) as ledger:
            assert witness.observations(name)[-1].head == ledger.witness_head().head
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


def test_the_site_owns_delta(tmp_path: Path) -> None:
    cfg = node_config(tmp_path)
    del cfg["delta"]
    reply = handle_train(train_content(), site_context(11, cfg, RUN_CONFIG), session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.FAILED  # no δ: the node config is invalid
    assert "reading the node config" in reply.config_records[records.SITE]["reason"]
    # a task that asks another δ is refused (the "ε = 0 with δ = 0.5" hole), naming the key
    reply = handle_train(train_content(), site_context(11, node_config(tmp_path), {**RUN_CONFIG, "task.privacy.delta": 0.5}),
                         session_factory=FakeSession)
    assert reply.config_records[records.SITE]["status"] == records.REFUSED
    assert "task.privacy.delta" in reply.config_records[records.SITE]["reason"]
    assert ledger_rows(node_config(tmp_path)) == ["bind"]  # nothing reserved
    reply = handle_train(train_content(), site_context(11, node_config(tmp_path, delta=1e-6), RUN_CONFIG),
                         session_factory=FakeSession)
    assert reply.metric_records[records.METRICS]["delta"] == 1e-6


def test_a_ledger_from_another_mechanism_is_a_refusal_that_names_no_numbers(tmp_path: Path) -> None:
    from _fed_support import OtherMechanism

    class OtherSession(FakeSession):
        def __init__(self, config, **kw):
            super().__init__(config, **kw)
            self.accountant = OtherMechanism()

    cfg = node_config(tmp_path)
    ctx = site_context(11, cfg, RUN_CONFIG)
    handle_train(train_content(1, 3), ctx, session_factory=FakeSession)
    reply = handle_train(train_content(2, 3), ctx, session_factory=OtherSession)
    site = reply.config_records[records.SITE]
    assert site["status"] == records.REFUSED and "ledger" in site["reason"]
    assert "test_other_mechanism" not in site["reason"]  # details stay in the site's log
    with PrivacyLedger(cfg["ledger"]) as ledger:
        assert [e.status for e in ledger.entries()] == ["released"]


# ------------------------------------------------------------------------------ robustness


def _malformed(kind: str) -> dict[str, torch.Tensor]:
    state = global_state()
    if kind == "extra key":
        state["lora_C"] = torch.zeros(2)
    elif kind == "missing key":
        del state["lora_B"]
    elif kind == "shape":
        state["lora_A"] = torch.zeros(8, 4)
    elif kind == "dtype":
        state["lora_A"] = state["lora_A"].double()
    elif kind == "nan":
        state["lora_B"][1, 2] = float("nan")
    elif kind == "inf":
        state["lora_A"][0, 0] = float("-inf")
    return state


@pytest.mark.parametrize(("kind", "key"), [
    ("extra key", "lora_C"), ("missing key", "lora_B"), ("shape", "lora_A"), ("dtype", "lora_A"),
    ("nan", "lora_B"), ("inf", "lora_A"),
])
def test_malformed_arrays_from_the_server_are_refused_before_any_spend(tmp_path: Path, kind: str, key: str) -> None:
    cfg = node_config(tmp_path)
    ctx = site_context(11, cfg, RUN_CONFIG)
    handle_train(train_content(1, 3), ctx, session_factory=FakeSession)
    with PrivacyLedger(cfg["ledger"]) as ledger:
        before = (ledger.spent_epsilon(), [(e.status, e.round) for e in ledger.entries()])
    for server_round in (2, 3):  # two bad rounds: still no spend (was ε 1.29 with nothing released)
        reply = handle_train(train_content(server_round, 3, state=_malformed(kind)), ctx, session_factory=FakeSession)
        site = reply.config_records[records.SITE]
        assert site["status"] == records.REFUSED and repr(key) in site["reason"], site["reason"]
        assert "malformed arrays" in site["reason"] and records.ARRAYS not in reply
    with PrivacyLedger(cfg["ledger"]) as ledger:
        assert (ledger.spent_epsilon(), [(e.status, e.round) for e in ledger.entries()]) == before


def _with(msg: Message, *, arrays: dict | None = None, metrics: dict | None = None, extra: dict | None = None) -> Message:
    content = msg.content
    if arrays is not None:
        content[records.ARRAYS] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
    if metrics is not None:
        content[records.METRICS] = MetricRecord(metrics)
    for name, record in (extra or {}).items():
        content[name] = record
    return msg


def test_strategy_rejects_bad_adapters_and_survives_extra_keys(tmp_path: Path) -> None:
    """Real flwr Messages, as the SuperLink hands them to the ServerApp: a NaN adapter, an extra
    or misshapen tensor and a bad step count are marked failed and never averaged; extra records,
    metric keys and site keys are dropped and logged, and the run goes on."""
    rounds: list[dict] = []
    strategy = SiteRounds(make_strategy("fedavg", min_sites=1, fraction_train=1.0), local_steps=3,
                          audit_path=tmp_path / "received.jsonl", on_round_end=lambda r, rec: rounds.append(rec))
    strategy.global_arrays = ArrayRecord({"w": Array(np.zeros((2, 2), dtype=np.float32))})
    nan = np.ones((2, 2), dtype=np.float32)
    nan[0, 1] = np.nan
    replies = [
        _trained(1, "good", 1.0),
        _with(_trained(2, "nan", 1.0), arrays={"w": nan}),
        _with(_trained(3, "inf", 1.0), arrays={"w": np.full((2, 2), np.inf, dtype=np.float32)}),
        _with(_trained(4, "extra-tensor", 1.0), arrays={"w": np.ones((2, 2), np.float32), "evil": np.ones(3, np.float32)}),
        _with(_trained(5, "shape", 1.0), arrays={"w": np.ones((3, 2), np.float32)}),
        _with(_trained(6, "steps", 1.0), metrics={"num-steps": 0.0}),
        _with(_trained(7, "extra-keys", 3.0),
              metrics={"num-steps": 3, "epsilon": 1.0, "gradient-norm": 12.5, "mrr": [0.1, 0.2]},
              extra={"debug": MetricRecord({"x": 1.0}), "more": ConfigRecord({"y": [b"\x00", b"\x01"]})}),
    ]
    replies[6].content[records.SITE]["secret"] = "x"
    arrays, metrics = strategy.aggregate_train(1, replies)

    status = {s["site"]: (s["status"], s["reason"]) for s in rounds[0]["sites"]}
    assert status["good"][0] == status["extra-keys"][0] == records.TRAINED
    assert status["nan"] == (records.FAILED, "rejected reply: non-finite adapter (NaN or Inf in 'w'); not aggregated")
    assert "non-finite adapter" in status["inf"][1]
    assert "unexpected adapter key 'evil'" in status["extra-tensor"][1]
    assert "shape [3, 2], expected [2, 2]" in status["shape"][1]
    assert "bad num-steps" in status["steps"][1]
    # the mean of the two good replies only (weights 3 and 3), still float32
    np.testing.assert_allclose(arrays["w"].numpy(), np.full((2, 2), 2.0))
    assert arrays["w"].numpy().dtype == np.float32
    assert metrics["sites-trained"] == 2 and metrics["sites-failed"] == 5
    (extra,) = [s for s in rounds[0]["sites"] if s["site"] == "extra-keys"]
    assert extra["metrics"] == {"num-steps": 3.0, "epsilon": 1.0}
    assert set(extra["ignored"]) == {"record 'debug'", "record 'more'", "metric 'gradient-norm'", "metric 'mrr'",
                                     "site key 'secret'"}
    json.dumps(rounds)  # the round log stays writable
    assert len((tmp_path / "received.jsonl").read_text().splitlines()) == 7


def test_fedadam_keeps_the_global_dtype() -> None:
    strategy = make_strategy("fedadam", min_sites=1, fraction_train=1.0)
    strategy.current_arrays = {"w": np.zeros((2, 2), dtype=np.float32)}
    wrapped = SiteRounds(strategy, local_steps=3)
    wrapped.global_arrays = ArrayRecord({"w": Array(np.zeros((2, 2), dtype=np.float32))})
    arrays, _ = wrapped.aggregate_train(1, [_trained(1, "a", 1.0), _trained(2, "b", 3.0)])
    assert arrays["w"].numpy().dtype == np.float32  # FedAdam computes in float64; sites check dtypes


def test_too_few_sites_fail_the_run_after_sites_timeout(tmp_path: Path) -> None:
    """In process (the real-Flower version is in test_federation.py): Flower's FedAvg would poll
    get_node_ids forever; the round gives up after sites-timeout with an error naming min-sites."""
    import time

    from graphveil.connectors.flower.server import run_federation
    from graphveil.connectors.flower.strategy import SitesUnavailableError

    run_config = {**RUN_CONFIG, "output-dir": str(tmp_path / "out"), "min-sites": 2, "sites-timeout": 1.5}
    grid = LocalGrid({1: site_context(1, node_config(tmp_path, "a"), run_config),
                      2: site_context(2, node_config(tmp_path, "b"), run_config)})
    grid.offline.add(2)
    started = time.monotonic()
    with pytest.raises(SitesUnavailableError, match=r"1 site\(s\) connected .* fewer than min-sites = 2"):
        run_federation(grid, FederationSettings.from_run_config(run_config), run_id=3, encoder=FakeEncoder(seed=5))
    assert 1.5 <= time.monotonic() - started < 10
    assert grid.sent == []  # no site was asked anything
    summary = json.loads((tmp_path / "out" / "run-3" / "summary.json").read_text())
    assert summary["status"] == "failed" and "min-sites = 2" in summary["error"]


def test_a_site_refuses_to_train_on_a_ledger_restored_from_a_backup(tmp_path: Path) -> None:
    """With ``ledger-anchor`` on another volume, an old copy of the ledger put back after more
    spend is detected: the round fails before any training or spend, nothing is released."""
    import shutil

    anchor = tmp_path / "anchor-volume" / "ledger.head"
    cfg = node_config(tmp_path, **{"ledger-anchor": str(anchor)})
    ctx = site_context(11, cfg, RUN_CONFIG)
    assert handle_train(train_content(1, 3), ctx, session_factory=FakeSession).config_records[records.SITE]["status"] == records.TRAINED
    backup = tmp_path / "backup.sqlite"
    shutil.copy(cfg["ledger"], backup)
    assert handle_train(train_content(2, 3), ctx, session_factory=FakeSession).config_records[records.SITE]["status"] == records.TRAINED
    assert anchor.is_file()
    shutil.copy(backup, cfg["ledger"])  # the operator restores the old backup
    reply = handle_train(train_content(3, 3), ctx, session_factory=FakeSession)
    site = dict(reply.config_records[records.SITE])
    assert site["status"] != records.TRAINED and records.ARRAYS not in reply.array_records
    assert "LedgerError" in site["reason"]
    assert len(FakeSession.instances) == 2  # no session was built for round 3: no data read


def test_prompt_grid_pulls_until_every_reply_is_in_or_the_timeout() -> None:
    """The ServerApp asks for replies every ``poll`` seconds instead of Flower's 3 s, and, as
    Flower's grid, returns once every message has its reply, or what came by ``timeout``."""
    import time
    from types import SimpleNamespace

    from graphveil.connectors.flower.strategy import PromptGrid

    class SlowGrid:  # replies to message i become available at the (i+2)-th pull
        def __init__(self) -> None:
            self.pulls = 0

        def push_messages(self, messages):
            return [f"m{i}" for i, _ in enumerate(messages)]

        def pull_messages(self, ids):
            self.pulls += 1
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i))
                    for i in ids if int(i[1:]) + 2 <= self.pulls]

    grid = SlowGrid()
    started = time.monotonic()
    replies = PromptGrid(grid, poll=0.05).send_and_receive(["a", "b", "c"], timeout=30)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert grid.pulls == 4 and time.monotonic() - started < 2  # no 3 s sleeps between pulls
    never = SlowGrid()
    never.pull_messages = lambda ids: []
    started = time.monotonic()
    assert PromptGrid(never, poll=0.05).send_and_receive(["a"], timeout=0.3) == []
    assert 0.3 <= time.monotonic() - started < 1.5
