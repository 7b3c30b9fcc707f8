"""Federated node classification on a real loopback federation (issue 27 point 2).

SuperLink + three SuperNodes as processes (TLS, node auth), started through the deploy/ scripts
as in ``test_federation.py``. Each site holds a third of Cora (random nodes) as a PyG ``graph.pt``
and is a node-classification site at paper 4's node level. Four apps, each the bundled one with
a node task (:func:`~graphveil.connectors.flower.loopback.write_app`), approved by hash at every
site, run one after the other on the same sites and ledgers: DP-MLP (2 rounds), GAP (2 rounds:
its encoder and classifier are shared, round 2 starts every site's encoder from the server's;
the aggregates stay at each site), DPDGC and DP-SAGE (1 round each, few steps: the LINKX
classifier / the GraphSAGE weights shared; DP-Emb stays at each site, its projection R fixed by
the task). Site 3 allows only D = 100 while the tasks ask D = 168: it refuses every round before
reading its graph. Site 4 sets ``release-scope = "weights"`` (with its own ledger; its graph is a
copy of site 1's, as these sites are processes of one test): it refuses those four methods, whose
components analyse predictions covered, and is the only site that trains DP-GCN (1 round: the
GCN's weights shared), which sites 1–3 refuse before reading their graphs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from _fed_support import (
    DP_GCN_RUN_CONFIG,
    DP_SAGE_RUN_CONFIG,
    DPDGC_RUN_CONFIG,
    GAP_RUN_CONFIG,
    NODE_TASK_RUN_CONFIG,
    write_cora_sites,
)

from graphveil.connectors.flower.loopback import LoopbackFederation, write_app, write_node_config

pytestmark = [pytest.mark.federation, pytest.mark.slow]

SITES = ("site-1", "site-2", "site-3", "site-4")
DELTA, SIGMA, LOCAL_STEPS, ROUNDS, GAP_ROUNDS = 1e-4, 1.0, 3, 2, 2
UNIT = "node/replacement/D=168/predictions"
WEIGHTS_UNIT = "node/replacement/D=168"  # site 4's (release-scope weights), DP-GCN's
APP_CONFIG = {
    **{k: v for k, v in NODE_TASK_RUN_CONFIG.items() if k.startswith("task.")},
    "num-server-rounds": ROUNDS, "local-steps": LOCAL_STEPS, "strategy": "fedavg",
    "round-timeout": 600.0, "sites-timeout": 120.0, "seed": 0, "min-sites": len(SITES),
    "task.privacy.unit": UNIT,
}


def _app_config(run_config: dict, rounds: int, **task: object) -> dict:
    return {**{k: v for k, v in APP_CONFIG.items() if not k.startswith("task.")},
            **{k: v for k, v in run_config.items() if k.startswith("task.")}, "task.privacy.unit": UNIT,
            "num-server-rounds": rounds, **task}


GAP_APP_CONFIG = _app_config(GAP_RUN_CONFIG, GAP_ROUNDS)
#: one round each, at few steps: DP-Emb one full-batch epoch
DPDGC_APP_CONFIG = _app_config(DPDGC_RUN_CONFIG, 1, **{"task.method.embedding_training.epochs": 1,
                                                       "task.method.embedding_training.batch_size": 1000})
SAGE_APP_CONFIG = _app_config(DP_SAGE_RUN_CONFIG, 1)
#: DP-GCN asks the weights-only unit: only a site whose release-scope is 'weights' trains it
GCN_APP_CONFIG = {**_app_config(DP_GCN_RUN_CONFIG, 1), "task.privacy.unit": WEIGHTS_UNIT}
GCN_SHARED = {"convs.0.bias", "convs.0.lin.weight", "convs.1.bias", "convs.1.lin.weight"}
#: rounds per run, in the order they ran (each trained round is one entry in sites 1-2's ledgers)
RUNS = (("dp_mlp", ROUNDS), ("gap", GAP_ROUNDS), ("dpdgc", 1), ("dp_sage", 1))
#: what each method's trained replies carry: its shared weights only
CLASSIFIER = {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
GAP_ENCODER = {"gap_encoder/encoder.0.weight", "gap_encoder/encoder.0.bias", "gap_encoder/head.weight",
               "gap_encoder/head.bias"}
SHARED_PREFIXES = {"dpdgc": {"branch_x", "branch_z", "classifier"}, "dp_sage": {"convs"}}


@dataclass
class Federation:
    loop: LoopbackFederation
    runs: dict[str, Path]
    node_configs: dict[str, Path]

    @property
    def root(self) -> Path:
        return self.loop.root


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> Federation:
    from graphveil.connectors.flower.bundle import app_hash

    root = tmp_path_factory.mktemp("node-federation")
    configs = {"dp_mlp": APP_CONFIG, "gap": GAP_APP_CONFIG, "dpdgc": DPDGC_APP_CONFIG, "dp_sage": SAGE_APP_CONFIG,
               "dp_gcn": GCN_APP_CONFIG}
    apps = {name: write_app(root / f"{name}-app", config) for name, config in configs.items()}
    approved = ", ".join(app_hash(app) for app in apps.values())  # each site approves every build
    loop = LoopbackFederation(root)
    loop.env["OMP_NUM_THREADS"] = "1"
    try:
        loop.make_credentials(SITES)
        parts = write_cora_sites(root / "data", 3)
        node_configs = {
            name: write_node_config(root / f"{name}.toml", {
                "site-name": name, "data-source": "pyg", "data-path": str(part), "epsilon-budget": 100.0,
                "delta": DELTA, "task-kind": "node_classification", "privacy-unit": "node",
                "degree-bound": 100 if name == "site-3" else 168, "share-epsilon": True,
                **({"release-scope": "weights"} if name == "site-4" else {}),
                "ledger": str(root / "ledgers" / f"{name}.sqlite"), "threads": 1, "approved-apps": approved})
            for name, part in zip(SITES, [*parts, parts[0]], strict=True)
        }
        loop.start_server()
        loop.register(SITES)
        for name in SITES:
            loop.init_ledger(node_configs[name])
            loop.start_site(name, node_configs[name])
        loop.wait_online(len(SITES))
        runs, seconds = {}, {}
        for name, app in apps.items():
            runs[name], seconds[name], _ = loop.run({"output-dir": str(root / "server-out")}, app=app)
        print(f"\nnode-task federation ({len(SITES)} sites): " + ", ".join(
            f"{name} {rounds} round(s) in {seconds[name]:.1f} s" for name, rounds in (*RUNS, ("dp_gcn", 1))))
        yield Federation(loop, runs, node_configs)
    finally:
        loop.stop()


def _rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def test_two_sites_train_and_the_site_with_a_smaller_d_refuses_every_round(federation: Federation) -> None:
    for method, rounds in RUNS:
        records = _rounds(federation.runs[method])
        assert [r["round"] for r in records] == list(range(1, rounds + 1)) and all(r["aggregated"] for r in records)
        for r in records:
            status = {s["site"]: s for s in r["sites"]}
            assert {n: s["status"] for n, s in status.items()} == {"site-1": "trained", "site-2": "trained",
                                                                   "site-3": "refused", "site-4": "refused"}, method
            assert status["site-3"]["reason"].startswith("site policy: task.privacy.unit")
            assert "larger than this site's degree-bound D=100" in status["site-3"]["reason"]
            assert status["site-4"]["reason"].startswith("site policy: task.privacy.unit")  # it asks predictions
            assert "release-scope is 'weights'" in status["site-4"]["reason"]


def test_only_the_weights_scope_site_trains_dp_gcn(federation: Federation) -> None:
    """Sites 1-3 cover predictions: the task's weights-only unit is refused before their graphs
    are read; site 4 trains, and the round's model is its GCN."""
    (record,) = _rounds(federation.runs["dp_gcn"])
    status = {s["site"]: s for s in record["sites"]}
    assert record["aggregated"] and {n: s["status"] for n, s in status.items()} == {
        "site-1": "refused", "site-2": "refused", "site-3": "refused", "site-4": "trained"}
    for name in ("site-1", "site-2", "site-3"):
        assert status[name]["reason"].startswith("site policy: task.privacy.unit") and "another unit" in status[name]["reason"]
    model = torch.load(federation.runs["dp_gcn"] / "adapter" / "model.pt", weights_only=True)
    assert set(model) == GCN_SHARED and all(torch.isfinite(v).all() for v in model.values())


def test_the_global_model_is_trained_from_the_task_initialisation(federation: Federation) -> None:
    from graphveil.contract.host import default_host

    final = torch.load(federation.runs["dp_mlp"] / "adapter" / "model.pt", weights_only=True)
    model = default_host().create("model", "mlp", {"hidden": 16, "layers": 2, "seed": 0}, where="test")

    class Schema:  # Cora's public schema: 1433 features, 7 classes
        x, num_features, num_classes = None, 1433, 7

    model.prepare(Schema())
    initial = model.trainable_state()
    assert {k: tuple(v.shape) for k, v in final.items()} == {k: tuple(v.shape) for k, v in initial.items()}
    assert all(torch.isfinite(v).all() for v in final.values())
    assert all(not torch.allclose(final[k], initial[k]) for k in final)  # every layer moved
    gap = torch.load(federation.runs["gap"] / "adapter" / "model.pt", weights_only=True)
    assert set(gap) == CLASSIFIER | GAP_ENCODER  # the classifier and the encoder, nothing of the aggregates
    assert gap["net.0.weight"].shape == (16, 16 * 3)  # the classifier on [H0 ‖ H1 ‖ H2]
    assert gap["gap_encoder/encoder.0.weight"].shape == (16, 1433) and gap["gap_encoder/head.weight"].shape == (7, 16)
    assert all(torch.isfinite(v).all() for v in gap.values())


def _site_session(run_config: dict, node_config: Path):  # noqa: ANN202 - a TrainingSession
    """A site's session for ``run_config``, accounting bound from its public sizes (no release
    run): what the plan runs, computed apart from the federation."""
    from graphveil.connectors.flower.settings import (
        FederationSettings,
        SiteSettings,
        site_run_config,
    )
    from graphveil.connectors.flower.site import _real_session

    fed = FederationSettings.from_run_config(run_config)
    session = _real_session(site_run_config(fed, SiteSettings.from_toml(node_config), seed=0))
    session.prepare_accounting()
    return session


def test_each_ledger_holds_its_sites_spends(federation: Federation) -> None:
    """Sites 1 and 2: one released entry per round (DP-MLP's rounds, GAP's, DPDGC's, DP-SAGE's),
    each reservation covering what ran, under the site's unit; DP-MLP's ε as dp-accounting
    composes its steps; the whole ledger as every round's planned releases and steps — GAP's
    encoder DP-SGD and aggregation hops charged in both rounds, whichever encoder they started
    from; ε as the server was told; site 3 refused before its ledger was opened: no entry."""
    import dp_accounting

    from graphveil.ledger import PrivacyLedger
    from graphveil.privacy import DEFAULT_ORDERS

    configs = {"dp_mlp": APP_CONFIG, "gap": GAP_APP_CONFIG, "dpdgc": DPDGC_APP_CONFIG, "dp_sage": SAGE_APP_CONFIG}
    for name in ("site-1", "site-2"):
        node_config = federation.node_configs[name]
        with PrivacyLedger(federation.root / "ledgers" / f"{name}.sqlite", create=False) as ledger:
            assert ledger.verify().ok and ledger.meta()["unit"] == UNIT
            entries = ledger.entries()
            assert [e.status for e in entries] == ["released"] * sum(r for _, r in RUNS)
            assert all(e.note == "" for e in entries)  # each reservation covered what ran
            orders, total = ledger.total_rdp()
        assert orders == [float(a) for a in DEFAULT_ORDERS]
        expected = sum(rounds * np.asarray(_site_session(configs[method], node_config).planned_rdp(LOCAL_STEPS))
                       for method, rounds in RUNS)
        np.testing.assert_allclose(total, expected, rtol=1e-9)
        # independently: b of n without replacement, replace-one (Gaussian σ/2), ROUNDS·LOCAL_STEPS steps
        session = _site_session(APP_CONFIG, node_config)
        n, b = session.sampling_profile.num_records, session.sampling_profile.batch_size
        acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_ORDERS),
                                              dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(SIGMA / 2)),
                    ROUNDS * LOCAL_STEPS)
        assert entries[ROUNDS - 1].epsilon == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)
        told = [s["metrics"]["epsilon"] for method, _ in RUNS for r in _rounds(federation.runs[method])
                for s in r["sites"] if s["site"] == name]
        assert told == pytest.approx([e.epsilon for e in entries], rel=1e-12)
    with PrivacyLedger(federation.root / "ledgers" / "site-3.sqlite", create=False) as ledger:
        assert ledger.entries() == []
    # site 4: the DP-GCN round alone, bound to the weights-only unit; b = 2 of s = 10 splits, one
    # split replaced (Gaussian σ/2), LOCAL_STEPS steps
    with PrivacyLedger(federation.root / "ledgers" / "site-4.sqlite", create=False) as ledger:
        assert ledger.verify().ok and ledger.meta()["unit"] == WEIGHTS_UNIT
        (entry,) = ledger.entries()
        assert entry.status == "released" and entry.note == "" and entry.steps == LOCAL_STEPS
        acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_ORDERS),
                                              dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(10, 2, dp_accounting.GaussianDpEvent(SIGMA / 2)),
                    LOCAL_STEPS)
        assert ledger.spent_epsilon() == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)
    (record,) = _rounds(federation.runs["dp_gcn"])
    (told,) = [s["metrics"]["epsilon"] for s in record["sites"] if s["site"] == "site-4"]
    assert told == pytest.approx(acc.get_epsilon(DELTA), rel=1e-12)


def test_the_server_witnessed_the_ledgers_that_trained(federation: Federation) -> None:
    """Witness as for relational rounds: one head per trained round at sites 1 and 2, each
    ledger holding what the server saw; site 3 never opened its ledger, so sent no head."""
    from graphveil.ledger import PrivacyLedger
    from graphveil.ledger.witness import Witness

    path = federation.root / "server-out" / "ledger-witness.jsonl"
    witness = Witness(path)
    assert witness.sites().keys() == {"site-1", "site-2", "site-4"}
    assert not any(s["flagged"] for s in witness.sites().values())
    for name in ("site-1", "site-2"):
        with PrivacyLedger(federation.root / "ledgers" / f"{name}.sqlite", create=False) as ledger:
            head = ledger.witness_head()
        assert [o.seq for o in witness.observations(name)] == list(range(1, sum(r for _, r in RUNS) + 1))
        assert witness.observations(name)[-1].head == head.head
    with PrivacyLedger(federation.root / "ledgers" / "site-4.sqlite", create=False) as ledger:
        head = ledger.witness_head()
    assert [o.seq for o in witness.observations("site-4")] == [1]  # the DP-GCN round; refusals before its ledger
    assert witness.observations("site-4")[-1].head == head.head


def test_the_server_received_only_each_methods_shared_weights_and_scalars(federation: Federation) -> None:
    """DP-MLP: the MLP; GAP: the classifier and the encoder (round 2's replies too: the sites took
    the server's encoder — one they could not take fails the round, withheld in the ledger, which
    the ledger test rules out), never the aggregates; DPDGC: the LINKX classifier, no DP-Emb
    weight; DP-SAGE: the GraphSAGE convolutions."""
    from graphveil.connectors.flower import records

    for method, rounds in (*RUNS, ("dp_gcn", 1)):
        trained_rounds = set()
        for line in (federation.runs[method] / "received.jsonl").read_text().splitlines():
            received = json.loads(line)
            content = received["content"]
            assert set(content) <= {records.ARRAYS, records.METRICS, records.SITE}
            if content[records.SITE]["values"]["status"] == "trained":
                keys = set(content[records.ARRAYS]["arrays"])
                trained_rounds.add(received["round"])
                if method == "dp_gcn":
                    assert keys == GCN_SHARED, keys
                elif method in SHARED_PREFIXES:
                    assert {k.split(".")[0] for k in keys} == SHARED_PREFIXES[method], (method, keys)
                else:
                    assert keys == (CLASSIFIER | GAP_ENCODER if method == "gap" else CLASSIFIER), (method, keys)
            else:
                assert records.ARRAYS not in content
        assert trained_rounds == set(range(1, rounds + 1))
        assert np.isfinite(json.loads((federation.runs[method] / "summary.json").read_text())["seconds"])
