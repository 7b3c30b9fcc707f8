"""A node-classification site (issue 27 point 2): its policy (paper 4's GDP unit and degree bound
D), refused before any data is read, and real DP-MLP / GAP rounds on a part of Cora.

Each policy case is checked twice: by ``check_site_policy`` (the key or reason named) and in the
ClientApp (refused without building a session, i.e. without reading the graph, and without
opening the ledger).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _fed_support import (
    DP_GCN_RUN_CONFIG,
    DP_SAGE_RUN_CONFIG,
    DPDGC_RUN_CONFIG,
    GAP_RUN_CONFIG,
    NODE_SITE_POLICY,
    NODE_TASK_RUN_CONFIG,
    RUN_CONFIG,
    SITE_POLICY,
    FakeSession,
    init_site_ledger,
    site_context,
    write_cora_sites,
)

from graphveil.connectors.flower import records
from graphveil.connectors.flower.settings import (
    NODE_TASK_ACCOUNTANTS,
    WEIGHTS_SCOPE_ACCOUNTANTS,
    FederationSettings,
    PolicyRefusal,
    SiteSettings,
    check_site_policy,
    site_run_config,
)
from graphveil.connectors.flower.site import _real_session, handle_train
from graphveil.contract.errors import ConfigError
from graphveil.ledger import PrivacyLedger
from graphveil.plugins.gdp.common import row_normalise

K_SITE = {"privacy-unit": "k_neighbor", "k-neighbors": 5, "degree-bound": 100}
K_SITE_NO_D = {"privacy-unit": "k_neighbor", "k-neighbors": 5, "degree-bound": None}
WEIGHTS = {"release-scope": "weights"}


def _site(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    values = {"site-name": "clinic-a", "data-source": "pyg", "data-path": str(tmp_path / "absent" / "graph.pt"),
              "epsilon-budget": 50.0, "ledger": str(tmp_path / "ledger.sqlite"), **NODE_SITE_POLICY, **extra}
    return {k: v for k, v in values.items() if v is not None}


def _run(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


#: (case, node-config changes, run config, what the refusal names)
CASES = [
    ("a relational task", {}, RUN_CONFIG, "task-kind"),
    ("a weaker level: edge", {}, _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "edge/replacement/predictions"}),
     "weaker level"),
    ("a weaker level: undirected edge", {},
     _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "undirected_edge/replacement/predictions"}), "weaker level"),
    ("a weaker level: k-neighbor", {},
     _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "k_neighbor/replacement/k=3/D=168/predictions"}), "weaker level"),
    ("a weaker level: smaller k", K_SITE,
     _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "k_neighbor/replacement/k=2/D=100/predictions"}), "weaker level"),
    ("another unit: add/remove", {}, _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "node"}), "another unit"),
    ("another unit: weights only", {}, _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "node/replacement/D=168"}),
     "another unit"),
    ("another unit: a stronger level", K_SITE,
     _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "node/replacement/D=100/predictions"}), "one unit per ledger"),
    ("another unit: a larger k", K_SITE,
     _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "k_neighbor/replacement/k=6/D=100/predictions"}),
     "one unit per ledger"),
    ("a larger D", {}, _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "node/replacement/D=169/predictions"}),
     "larger than this site's degree-bound"),
    ("a smaller D", {}, _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "node/replacement/D=100/predictions"}),
     "depend on the data"),
    ("a D where the site has none", K_SITE_NO_D,
     _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "k_neighbor/replacement/k=5/D=10/predictions"}),
     "sets no degree-bound"),
    ("a component of another unit", {}, _run(NODE_TASK_RUN_CONFIG, {"task.accountant.name": "split_rdp"}),
     "task.accountant.name: accountant 'split_rdp' (graph/replacement-level) does not analyse"),
    ("an accountant the site does not accept", {"accountants": "rooted_rdp"}, NODE_TASK_RUN_CONFIG, "accountants"),
    ("σ below the floor", {"min-noise-multiplier": 2.0}, NODE_TASK_RUN_CONFIG, "min-noise-multiplier"),
    ("σ calibrated to ε", {}, _run(NODE_TASK_RUN_CONFIG, {"task.privacy.noise_multiplier": None,
                                                        "task.privacy.target_epsilon": 4.0}),
     "task.privacy.target_epsilon"),
    ("a pinned sampling seed", {}, _run(NODE_TASK_RUN_CONFIG, {"task.seed": 3}), "task.seed"),
    ("clip norm above the range", {"max-clip-norm": 0.5}, NODE_TASK_RUN_CONFIG, "clipper.clip_norm"),
    # DP-GCN (paper 3): its predictions read raw neighbours; only a site's release-scope 'weights' allows it
    ("DP-GCN where predictions are covered (the default)", {}, DP_GCN_RUN_CONFIG,
     "task.sampler.name: sampler 'graph_splits' (graph/replacement-level) does not analyse this site's unit "
     "'node/replacement/D=168/predictions'"),
    ("DP-GCN asking weights only where the site covers predictions", {},
     _run(DP_GCN_RUN_CONFIG, {"task.privacy.unit": "node/replacement/D=168"}), "never the task's"),
    ("predictions asked where the site's scope is weights", WEIGHTS,
     _run(DP_GCN_RUN_CONFIG, {"task.privacy.unit": "node/replacement/D=168/predictions"}), "release-scope is 'weights'"),
    ("DP-MLP where the site's scope is weights", WEIGHTS, NODE_TASK_RUN_CONFIG,
     "sampler 'node_uniform_wor' (node/replacement/predictions-level) does not analyse this site's unit "
     "'node/replacement/D=168'"),
    ("DP-GCN's accountant not listed at a weights-scope site", {**WEIGHTS, "accountants": "node_rdp"},
     DP_GCN_RUN_CONFIG, "accountants"),
]


@pytest.mark.parametrize(("case", "node", "run", "named"), CASES, ids=[c[0] for c in CASES])
def test_each_node_level_policy_refuses_what_differs(tmp_path: Path, case: str, node: dict, run: dict,
                                                     named: str) -> None:
    site = SiteSettings.from_mapping(_site(tmp_path, **node))
    fed = FederationSettings.from_run_config(run)
    config = site_run_config(fed, site, seed=1)
    with pytest.raises(PolicyRefusal) as info:
        check_site_policy(site, fed, config, local_steps=3)
    assert named in str(info.value), str(info.value)


@pytest.fixture
def _no_sessions(flower_task):
    FakeSession.instances.clear()


@pytest.mark.usefixtures("_no_sessions")
@pytest.mark.parametrize(("case", "node", "run", "named"), CASES, ids=[c[0] for c in CASES])
def test_the_client_app_refuses_before_reading_the_graph_or_opening_the_ledger(
        tmp_path: Path, case: str, node: dict, run: dict, named: str) -> None:
    cfg = _site(tmp_path, **node)
    reply = handle_train(records.train_content(records.ArrayRecord(), 1, 3), site_context(5, cfg, run),
                         session_factory=FakeSession)
    site = dict(reply.config_records[records.SITE])
    assert site["status"] == records.REFUSED and named in site["reason"], site["reason"]
    assert site["reason"].startswith("site policy: ")
    assert FakeSession.instances == []  # no session: the graph was not read (its file does not even exist)
    assert not Path(cfg["ledger"]).exists()


def test_a_node_task_at_a_relational_site_is_refused(tmp_path: Path) -> None:
    values = {"site-name": "bank-a", "data-path": "/e.tsv", "data-entities": "/n.jsonl", "epsilon-budget": 5.0,
              "ledger": str(tmp_path / "l.sqlite"), **SITE_POLICY}
    site = SiteSettings.from_mapping(values)
    fed = FederationSettings.from_run_config(NODE_TASK_RUN_CONFIG)
    with pytest.raises(PolicyRefusal, match="node_classification task; this site's task-kind is 'relational'"):
        check_site_policy(site, fed, site_run_config(fed, site, seed=1), local_steps=3)


@pytest.mark.parametrize("run", [NODE_TASK_RUN_CONFIG, GAP_RUN_CONFIG,
                                 _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "node/replacement/D=168/predictions"}),
                                 _run(NODE_TASK_RUN_CONFIG, {"task.privacy.unit": "node/replacement/predictions"})],
                         ids=["dp_mlp", "gap", "the site's own unit", "the site's unit without D"])
def test_a_task_within_the_node_level_policy_passes_and_runs_under_the_sites_unit(tmp_path: Path, run: dict) -> None:
    site = SiteSettings.from_mapping(_site(tmp_path))
    fed = FederationSettings.from_run_config(run)
    config = site_run_config(fed, site, seed=1)
    check_site_policy(site, fed, config, local_steps=3)
    assert config.privacy.unit == "node/replacement/D=168/predictions"  # the site's, D included
    assert config.data.split.kind == "random_node" and config.data.source == "pyg"
    assert site.accepted_accountants == NODE_TASK_ACCOUNTANTS
    k_site = SiteSettings.from_mapping(_site(tmp_path, **K_SITE))
    assert site_run_config(fed, k_site, seed=1).privacy.unit == "k_neighbor/replacement/D=100/k=5/predictions"


@pytest.mark.parametrize(("node", "message"), [
    ({"degree-bound": None}, "degree-bound is required for privacy-unit 'node'"),
    ({"privacy-unit": "k_neighbor"}, "k-neighbors is required"),
    ({"k-neighbors": 3}, "k-neighbors applies to privacy-unit 'k_neighbor' only"),
    ({"privacy-unit": "edge"}, "degree-bound applies to privacy-unit 'node' or 'k_neighbor' only"),
    ({"min-records": 100}, "min-records applies to task-kind 'relational' only"),
    ({"degree-cap": 3}, "degree-cap applies to task-kind 'relational' only"),
    ({"task-kind": "relational", "privacy-unit": "k_neighbor", "k-neighbors": 2, "degree-bound": None},
     "applies to task-kind 'node_classification' only"),
    ({"task-kind": "relational", "privacy-unit": "edge", "min-records": 10}, "degree-bound applies to task-kind"),
    ({"task-kind": "relational", "privacy-unit": "edge", "min-records": 10, "degree-bound": None, **WEIGHTS},
     "release-scope applies to task-kind 'node_classification' only"),
    ({"release-scope": "everything"}, "release-scope"),
])
def test_the_node_config_names_what_a_node_classification_site_needs(tmp_path: Path, node: dict, message: str) -> None:
    values = {**_site(tmp_path), **node}
    with pytest.raises(ConfigError, match=message):
        SiteSettings.from_mapping({k: v for k, v in values.items() if v is not None})


@pytest.mark.parametrize(("node", "unit"), [
    ({}, "node/replacement/D=168"), (K_SITE, "k_neighbor/replacement/D=100/k=5"),
    ({"privacy-unit": "undirected_edge", "degree-bound": None}, "undirected_edge/replacement"),
    ({"privacy-unit": "edge", "degree-bound": None}, "edge/replacement")])
@pytest.mark.parametrize("asked", [None, "own"], ids=["the site's unit", "the task repeats it"])
def test_a_weights_scope_site_runs_dp_gcn_under_its_weights_only_unit(tmp_path: Path, node: dict, unit: str,
                                                                        asked: str | None) -> None:
    """At every GDP level: the site's unit lacks /predictions (so does the ledger's binding), the
    split accountant is its default, and DP-GCN's components analyse that unit."""
    site = SiteSettings.from_mapping(_site(tmp_path, **node, **WEIGHTS))
    run = DP_GCN_RUN_CONFIG if asked is None else _run(DP_GCN_RUN_CONFIG, {"task.privacy.unit": unit})
    fed = FederationSettings.from_run_config(run)
    config = site_run_config(fed, site, seed=1)
    check_site_policy(site, fed, config, local_steps=3)
    assert config.privacy.unit == unit == site.gdp_unit.value and not site.gdp_unit.protects_predictions
    assert site.accepted_accountants == WEIGHTS_SCOPE_ACCOUNTANTS == ("split_rdp",)


def _bind_ledger(path: str, unit: str) -> None:
    """One reservation under ``unit`` (the ledger's first spend binds it), settled."""
    from graphveil.contract.profiles import (
        SamplingKind,
        SamplingProfile,
        SensitivityKind,
        SensitivityProfile,
    )
    from graphveil.contract.units import PrivacyUnit
    from graphveil.plugins.dp_gcn.accountant import SplitRdpAccountant
    from graphveil.plugins.node_dp.accountant import NodeReplaceRdpAccountant

    stated = PrivacyUnit.parse(unit)
    acc = (NodeReplaceRdpAccountant if stated.protects_predictions else SplitRdpAccountant)()
    acc.unit = stated
    acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 0.2, num_records=10, batch_size=2),
             SensitivityProfile(SensitivityKind.PER_EXAMPLE, stated, 1.0))
    with PrivacyLedger(path, create=False) as ledger:
        reservation = ledger.reserve(acc, noise_multiplier=1.0, steps=1, delta=1e-4, budget=50.0, site="clinic-a")
        acc.step(noise_multiplier=1.0, num_steps=1)
        ledger.release(reservation, acc)


@pytest.mark.usefixtures("_no_sessions")
@pytest.mark.parametrize(("bound", "node", "run"), [
    ("node/replacement/D=168/predictions", WEIGHTS, DP_GCN_RUN_CONFIG),
    ("node/replacement/D=168", {}, NODE_TASK_RUN_CONFIG)], ids=["predictions then weights", "weights then predictions"])
def test_a_ledger_bound_under_one_release_scope_refuses_the_other_before_the_graph_is_read(
        tmp_path: Path, bound: str, node: dict, run: dict) -> None:
    """A site that changes its release-scope keeps its ledger's binding: spend under weights only
    (DP-GCN) never composes into a claim covering predictions, nor the reverse; the refusal comes
    before a session is built, and the ledger's own binding refuses it as well."""
    cfg = init_site_ledger(_site(tmp_path, **node))
    _bind_ledger(cfg["ledger"], bound)
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        rows = len(ledger.events())
    reply = handle_train(records.train_content(records.ArrayRecord(), 1, 3), site_context(5, cfg, run),
                         session_factory=FakeSession)
    site = dict(reply.config_records[records.SITE])
    assert site["status"] == records.REFUSED and f"ledger is bound to the privacy unit {bound!r}" in site["reason"]
    assert FakeSession.instances == []  # no session: the graph was not read
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert len(ledger.events()) == rows and ledger.meta()["unit"] == bound  # nothing written


# ------------------------------------------------------------------------------ real rounds on Cora


def _sessions() -> tuple[list[Any], Any]:
    built: list[Any] = []

    def factory(config, records_store=None):
        built.append(_real_session(config, records_store=records_store))
        return built[-1]

    return built, factory


def _independent_epsilon(n: int, b: int, sigma: float, steps: int, delta: float) -> float:
    """dp-accounting's ε of ``steps`` per-node DP-SGD steps (b of n without replacement, replace-one
    sensitivity 2C: Gaussian(σ/2)) on the ledger's order grid."""
    import dp_accounting

    from graphveil.privacy import DEFAULT_ORDERS

    acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_ORDERS),
                                          dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(sigma / 2))
    acc.compose(event, steps)
    return acc.get_epsilon(delta)


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_dp_mlp_rounds_on_a_part_of_cora_train_and_the_ledger_holds_each_spend(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    part = write_cora_sites(tmp_path / "data")[0]
    cfg = init_site_ledger(_site(tmp_path, **{"data-path": str(part), "share-epsilon": True}))
    built, factory = _sessions()
    arrays = records.ArrayRecord()  # round 1: the server holds no model yet
    for server_round in (1, 2):
        reply = handle_train(records.train_content(arrays, server_round, 3),
                             site_context(5, cfg, NODE_TASK_RUN_CONFIG), session_factory=factory)
        site = dict(reply.config_records[records.SITE])
        assert site["status"] == records.TRAINED, site
        new = reply.array_records[records.ARRAYS]
        shapes = {k: tuple(v.numpy().shape) for k, v in new.items()}
        assert shapes == {"net.0.weight": (16, 1433), "net.0.bias": (16,), "net.2.weight": (7, 16), "net.2.bias": (7,)}
        if server_round == 2:  # trained from the server's arrays: every weight moved
            assert all(not np.array_equal(new[k].numpy(), arrays[k].numpy()) for k in new)
        arrays = new
    first = built[0]
    n, b = first.sampling_profile.num_records, first.sampling_profile.batch_size
    assert b == 32 and n == int(first.task.split.train.numel())
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert ledger.verify().ok
        assert ledger.meta()["unit"] == "node/replacement/D=168/predictions"
        assert [e.status for e in ledger.entries()] == ["released", "released"]
        expected = _independent_epsilon(n, b, 1.0, 6, 1e-4)
        assert ledger.spent_epsilon() == pytest.approx(expected, rel=1e-6)
    assert float(reply.metric_records[records.METRICS]["epsilon"]) == pytest.approx(expected, rel=1e-6)


#: GAP whose encoder barely moves in training (Adam: about lr per step), so a round's reply shows
#: which weights the encoder started from
GAP_FROZEN_ENCODER = {**GAP_RUN_CONFIG, "task.method.encoder_training.lr": 1e-7}
ENCODER_KEYS = {"gap_encoder/encoder.0.weight", "gap_encoder/encoder.0.bias", "gap_encoder/head.weight",
                "gap_encoder/head.bias"}


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_gap_rounds_share_the_encoder_and_classifier_and_reserve_releases_and_steps(tmp_path: Path) -> None:
    """Round 1 starts from the task's seeded encoder; round 2 from the server's (here: round 1's
    reply moved by 0.25): the reply's encoder is within Adam's 1e-7 steps of it and the classifier
    trained on. The aggregates never join the reply; each round's reservation covers exactly the
    encoder's DP-SGD, the aggregation hops and the classifier's steps that ran."""
    from graphveil.privacy.conversion import rdp_to_epsilon

    torch.set_num_threads(1)
    part = write_cora_sites(tmp_path / "data")[1]
    cfg = init_site_ledger(_site(tmp_path, **{"data-path": str(part), "site-name": "clinic-b"}))
    built, factory = _sessions()
    first = handle_train(records.train_content(records.ArrayRecord(), 1, 3),
                         site_context(6, cfg, GAP_FROZEN_ENCODER), session_factory=factory)
    assert dict(first.config_records[records.SITE])["status"] == records.TRAINED
    state = records.state_from_arrays(first.array_records[records.ARRAYS])
    classifier = {"net.0.weight": (16, 16 * 3), "net.0.bias": (16,), "net.2.weight": (7, 16), "net.2.bias": (7,)}
    assert {k: tuple(v.shape) for k, v in state.items() if k in classifier} == classifier  # on [H0 ‖ H1 ‖ H2]
    assert set(state) == set(classifier) | ENCODER_KEYS  # nothing of the aggregates
    sent = {k: v + 0.25 if k in ENCODER_KEYS else v for k, v in state.items()}
    second = handle_train(records.train_content(records.arrays_from_state(sent), 2, 3),
                          site_context(6, cfg, GAP_FROZEN_ENCODER), session_factory=factory)
    assert dict(second.config_records[records.SITE])["status"] == records.TRAINED
    back = records.state_from_arrays(second.array_records[records.ARRAYS])
    for key in ENCODER_KEYS:  # started from the server's encoder, not from the seeded one
        assert torch.allclose(back[key], sent[key], atol=1e-4) and not torch.allclose(back[key], state[key], atol=0.1)
    assert all(not torch.equal(back[k], sent[k]) for k in classifier)  # trained from the server's classifier
    first_session, second_session = built
    assert torch.equal(second_session.released["gap_aggregates"][:, :16],  # H0: the started encoder's rows
                       row_normalise(second_session.plan.releases[0].mechanism.model.embed(second_session.task.dataset.x)))
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        entries = ledger.entries()
        assert [e.status for e in entries] == ["released", "released"]
        assert all(e.note == "" for e in entries)  # each reservation covered all that ran
        for session in built:
            assert session.accountant.events_rdp().max() > 0  # the encoder's DP-SGD and the hops ...
            assert session.steps_done == 3  # ... and the classifier's steps
        np.testing.assert_allclose(first_session.accountant.total_rdp(), second_session.accountant.total_rdp())
        orders = first_session.accountant.orders
        twice = rdp_to_epsilon(orders, 2 * np.asarray(first_session.accountant.total_rdp()), 1e-4)[0]
        assert ledger.spent_epsilon() == pytest.approx(twice, rel=1e-6)


# ------------------------------------------------------------------------------ the server's first model


def _reply(node: int, name: str, state: dict[str, torch.Tensor], steps: int) -> Any:
    import hashlib

    from flwr.app import Message, RecordDict

    from graphveil.ledger import WitnessHead

    head = WitnessHead(1, hashlib.sha256(name.encode()).hexdigest(), hashlib.sha256(b"0").hexdigest())
    content = records.trained_content(name, state, {"num-steps": steps, "delta": 1e-4, "epsilon-budget": 5.0,
                                                    "noise-multiplier": 1.0}, ledger_head=head)
    return Message(content, reply_to=Message(RecordDict(), node, "train"))


@pytest.mark.usefixtures("flower_task")
@pytest.mark.parametrize("strategy", ["fedavg", "fedadam"])
def test_without_a_global_model_the_first_is_the_step_weighted_mean_of_the_replies(strategy: str) -> None:
    """Round 1 of a node task: the server sent no arrays (its model is sized by the sites' data);
    the first global model is FedAvg's mean under either strategy, keys and shapes set by the replies."""
    from graphveil.connectors.flower.strategy import SiteRounds, make_strategy

    rounds = SiteRounds(make_strategy(strategy, min_sites=1, fraction_train=1.0), local_steps=3)
    rounds.global_arrays = records.ArrayRecord()  # what configure_train saw
    a = {"w": torch.full((2, 3), 1.0), "b": torch.zeros(3)}
    b = {"w": torch.full((2, 3), 5.0), "b": torch.ones(3)}
    bad = {"w": torch.zeros(4)}  # another shape than the first trained reply: not aggregated
    arrays, metrics = rounds.aggregate_train(1, [_reply(1, "a", a, 3), _reply(2, "b", b, 1), _reply(3, "c", bad, 3)])
    np.testing.assert_allclose(arrays["w"].numpy(), np.full((2, 3), (3 * 1.0 + 1 * 5.0) / 4))
    np.testing.assert_allclose(arrays["b"].numpy(), np.full(3, 0.25))
    assert arrays["w"].numpy().dtype == np.float32
    assert metrics["sites-trained"] == 2 and metrics["sites-failed"] == 1


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_a_dp_sage_round_shares_the_sage_weights_and_accounts_its_rooted_steps(tmp_path: Path) -> None:
    """Its output perturbation is a release after training (evaluation): not part of a round."""
    from graphveil.plugins.gdp.rooted_accountant import RootedRdpAccountant

    torch.set_num_threads(1)
    part = write_cora_sites(tmp_path / "data")[2]
    cfg = init_site_ledger(_site(tmp_path, **{"data-path": str(part), "site-name": "clinic-c",
                                              "share-utility-metrics": True}))
    built, factory = _sessions()
    reply = handle_train(records.train_content(records.ArrayRecord(), 1, 3),
                         site_context(7, cfg, DP_SAGE_RUN_CONFIG), session_factory=factory)
    assert dict(reply.config_records[records.SITE])["status"] == records.TRAINED
    metrics = dict(reply.metric_records[records.METRICS])
    assert np.isnan(metrics["mrr"]) and np.isnan(metrics["prec1"])  # no evaluation at a node site ...
    assert {k.split(".")[0] for k in reply.array_records[records.ARRAYS]} == {"convs"}
    (session,) = built
    assert isinstance(session.accountant, RootedRdpAccountant) and not session.accountant.events_rdp().any()
    assert "dp_sage_outputs" not in session.released  # ... so the output perturbation never ran
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        (entry,) = ledger.entries()
        assert entry.status == "released" and entry.note == "" and entry.steps == 3
        fresh = session.accountant.__class__(session.accountant.params)  # the same analysis, 3 steps at once
        fresh.unit = session.accountant.unit
        fresh.bind(session.sampling_profile, session.clipper.profile)
        fresh.step(noise_multiplier=40.0, num_steps=3)
        assert ledger.spent_epsilon() == pytest.approx(fresh.get_epsilon(1e-4), rel=1e-9)


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_a_gap_round_past_the_budget_is_refused_before_any_release_runs(tmp_path: Path) -> None:
    """The encoder training and the aggregation hops are data-dependent releases: a round the
    budget cannot cover refuses before computing them (only sizes were read)."""
    torch.set_num_threads(1)
    part = write_cora_sites(tmp_path / "data")[0]
    cfg = init_site_ledger(_site(tmp_path, **{"data-path": str(part), "epsilon-budget": 0.5}))
    built, factory = _sessions()
    reply = handle_train(records.train_content(records.ArrayRecord(), 1, 3),
                         site_context(8, cfg, GAP_RUN_CONFIG), session_factory=factory)
    site = dict(reply.config_records[records.SITE])
    assert site["status"] == records.REFUSED and "past its privacy budget" in site["reason"], site
    (session,) = built
    assert dict(session.released) == {} and not session.accountant.events_rdp().any()
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert [e.status for e in ledger.entries()] == ["refused"]


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_a_dpdgc_round_shares_the_classifier_and_reserves_the_embedding_release(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    part = write_cora_sites(tmp_path / "data")[0]
    cfg = init_site_ledger(_site(tmp_path, **{"data-path": str(part), "epsilon-budget": 1000.0}))
    built, factory = _sessions()
    reply = handle_train(records.train_content(records.ArrayRecord(), 1, 3),
                         site_context(9, cfg, DPDGC_RUN_CONFIG), session_factory=factory)
    assert dict(reply.config_records[records.SITE])["status"] == records.TRAINED
    keys = set(reply.array_records[records.ARRAYS])
    assert {k.split(".")[0] for k in keys} == {"branch_x", "branch_z", "classifier"}  # LINKX only: no W⁽ᴬ⁾
    (session,) = built
    assert "dpdgc_embedding" in session.released and session.accountant.events_rdp().any()
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        (entry,) = ledger.entries()
        assert entry.status == "released" and entry.note == ""  # the reservation covered the release
        assert ledger.spent_epsilon() == pytest.approx(session.accountant.get_epsilon(1e-4), rel=1e-6)


@pytest.mark.slow
@pytest.mark.usefixtures("flower_task")
def test_dp_gcn_rounds_at_a_weights_scope_site_share_the_gcn_and_reserve_its_split_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two DP-GCN rounds where the site's release-scope is 'weights': the replies carry the GCN's
    weights only, no prediction of the graph is computed after training (scores NaN although the
    site shares them), the ledger is bound to the weights-only unit, and its ε is dp-accounting's
    b-of-s sampled-without-replacement Gaussian(σ/2) under replace-one for the 6 steps run."""
    from graphveil.plugins.dp_gcn.task import SplitNodeClassification

    predicted: list[int] = []
    real_predict = SplitNodeClassification.predict
    monkeypatch.setattr(SplitNodeClassification, "predict",
                        lambda self, model: predicted.append(1) or real_predict(self, model))
    torch.set_num_threads(1)
    part = write_cora_sites(tmp_path / "data")[0]
    cfg = init_site_ledger(_site(tmp_path, **{"data-path": str(part), "share-epsilon": True,
                                              "share-utility-metrics": True, **WEIGHTS}))
    built, factory = _sessions()
    arrays = records.ArrayRecord()
    for server_round in (1, 2):
        reply = handle_train(records.train_content(arrays, server_round, 3),
                             site_context(5, cfg, DP_GCN_RUN_CONFIG), session_factory=factory)
        site = dict(reply.config_records[records.SITE])
        assert site["status"] == records.TRAINED, site
        new = reply.array_records[records.ARRAYS]
        assert {k: tuple(v.numpy().shape) for k, v in new.items()} == {
            "convs.0.bias": (16,), "convs.0.lin.weight": (16, 1433), "convs.1.bias": (7,), "convs.1.lin.weight": (7, 16)}
        if server_round == 2:  # trained from the server's arrays
            assert all(not np.array_equal(new[k].numpy(), arrays[k].numpy()) for k in new)
        metrics = dict(reply.metric_records[records.METRICS])
        assert np.isnan(metrics["mrr"]) and np.isnan(metrics["prec1"])
        arrays = new
    assert predicted == []  # no prediction of any node after training
    for session in built:
        assert session.unit.value == "node/replacement/D=168" and session.accountant.unit == session.unit
        assert session.steps_done == 3 and session.sampling_profile.num_records == 10
    with PrivacyLedger(cfg["ledger"], create=False) as ledger:
        assert ledger.verify().ok and ledger.meta()["unit"] == "node/replacement/D=168"
        entries = ledger.entries()
        assert [e.status for e in entries] == ["released", "released"] and all(e.note == "" for e in entries)
        # b = 2 of s = 10 splits, one split replaced moves the clipped sum by 2C: Gaussian(σ/2)
        expected = _independent_epsilon(10, 2, 1.0, 6, 1e-4)
        assert ledger.spent_epsilon() == pytest.approx(expected, rel=1e-6)
    assert float(metrics["epsilon"]) == pytest.approx(expected, rel=1e-6)
    first, second = built  # each round's own accountant: 3 steps each, the ledger composes them
    assert first.accountant.get_epsilon(1e-4) == pytest.approx(_independent_epsilon(10, 2, 1.0, 3, 1e-4), rel=1e-6)


def test_a_pyg_graph_for_a_node_task_needs_features_and_a_label_for_every_node() -> None:
    """Until the pyg source gives node graphs itself, the site takes a relational graph with
    features and labels as the node graph it is (both edge directions), and names what is missing."""
    from graphveil.connectors.flower.site import _as_node_graph
    from graphveil.contract.errors import DataError
    from graphveil.data import RelationalGraph

    def graph(**extra: Any) -> RelationalGraph:
        return RelationalGraph(name="g", entity_ids=["a", "b", "c"], edges=torch.tensor([[0, 1], [1, 2]]), **extra)

    node = _as_node_graph(graph(features=torch.eye(3), labels=torch.tensor([0, 1, 1]), label_names=["x", "y"]))
    assert node.node_ids == ["a", "b", "c"] and node.class_names == ["x", "y"] and node.num_undirected_edges == 2
    assert {tuple(e) for e in node.edge_index.t().tolist()} == {(0, 1), (1, 0), (1, 2), (2, 1)}
    with pytest.raises(DataError, match="features and labels"):
        _as_node_graph(graph(labels=torch.tensor([0, 1, 1]), label_names=["x", "y"]))
    with pytest.raises(DataError, match="1 node\\(s\\) have no label"):
        _as_node_graph(graph(features=torch.eye(3), labels=torch.tensor([0, -1, 1]), label_names=["x", "y"]))
