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
])
def test_the_node_config_names_what_a_node_classification_site_needs(tmp_path: Path, node: dict, message: str) -> None:
    values = {**_site(tmp_path), **node}
    with pytest.raises(ConfigError, match=message):
        SiteSettings.from_mapping({k: v for k, v in values.items() if v is not None})


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
