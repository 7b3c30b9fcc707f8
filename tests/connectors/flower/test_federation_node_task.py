"""Federated node classification on a real loopback federation (issue 27 point 2).

SuperLink + three SuperNodes as processes (TLS, node auth), started through the deploy/ scripts
as in ``test_federation.py``. Each site holds a third of Cora (random nodes) as a PyG ``graph.pt``
and is a node-classification site at paper 4's node level. The app is the bundled one with a
DP-MLP task (:func:`~graphveil.connectors.flower.loopback.write_app`), and another with GAP, both
approved by hash at every site. Site 3 allows only D = 100 while the task asks D = 168: it refuses every round before
reading its graph. Then GAP runs on the same sites and ledgers (its classifier is shared; the
encoder and aggregates stay at each site).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from _fed_support import GAP_RUN_CONFIG, NODE_TASK_RUN_CONFIG, write_cora_sites

from graphveil.connectors.flower.loopback import LoopbackFederation, write_app, write_node_config

pytestmark = [pytest.mark.federation, pytest.mark.slow]

SITES = ("site-1", "site-2", "site-3")
DELTA, SIGMA, LOCAL_STEPS, ROUNDS, GAP_ROUNDS = 1e-4, 1.0, 3, 2, 1
UNIT = "node/replacement/D=168/predictions"
APP_CONFIG = {
    **{k: v for k, v in NODE_TASK_RUN_CONFIG.items() if k.startswith("task.")},
    "num-server-rounds": ROUNDS, "local-steps": LOCAL_STEPS, "strategy": "fedavg", "min-sites": 3,
    "round-timeout": 600.0, "sites-timeout": 120.0, "seed": 0,
    "task.privacy.unit": UNIT,
}
GAP_APP_CONFIG = {**APP_CONFIG, **{k: v for k, v in GAP_RUN_CONFIG.items() if k.startswith("task.")},
                  "num-server-rounds": GAP_ROUNDS}


@dataclass
class Federation:
    loop: LoopbackFederation
    mlp_dir: Path
    gap_dir: Path
    node_configs: dict[str, Path]

    @property
    def root(self) -> Path:
        return self.loop.root


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> Federation:
    from graphveil.connectors.flower.bundle import app_hash

    root = tmp_path_factory.mktemp("node-federation")
    app, gap_app = write_app(root / "app", APP_CONFIG), write_app(root / "gap-app", GAP_APP_CONFIG)
    approved = f"{app_hash(app)}, {app_hash(gap_app)}"  # each site approves both builds
    loop = LoopbackFederation(root)
    loop.env["OMP_NUM_THREADS"] = "1"
    try:
        loop.make_credentials(SITES)
        parts = write_cora_sites(root / "data", len(SITES))
        node_configs = {
            name: write_node_config(root / f"{name}.toml", {
                "site-name": name, "data-source": "pyg", "data-path": str(part), "epsilon-budget": 50.0,
                "delta": DELTA, "task-kind": "node_classification", "privacy-unit": "node",
                "degree-bound": 100 if name == "site-3" else 168, "share-epsilon": True,
                "ledger": str(root / "ledgers" / f"{name}.sqlite"), "threads": 1, "approved-apps": approved})
            for name, part in zip(SITES, parts, strict=True)
        }
        loop.start_server()
        loop.register(SITES)
        for name in SITES:
            loop.init_ledger(node_configs[name])
            loop.start_site(name, node_configs[name])
        loop.wait_online(len(SITES))
        mlp_dir, seconds, _ = loop.run({"output-dir": str(root / "server-out")}, app=app)
        gap_dir, gap_seconds, _ = loop.run({"output-dir": str(root / "server-out")}, app=gap_app)
        print(f"\nnode-task federation: DP-MLP {ROUNDS} rounds in {seconds:.1f} s, GAP {GAP_ROUNDS} in "
              f"{gap_seconds:.1f} s ({len(SITES)} sites)")
        yield Federation(loop, mlp_dir, gap_dir, node_configs)
    finally:
        loop.stop()


def _rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def test_two_sites_train_and_the_site_with_a_smaller_d_refuses_every_round(federation: Federation) -> None:
    for run_dir, rounds in ((federation.mlp_dir, ROUNDS), (federation.gap_dir, GAP_ROUNDS)):
        records = _rounds(run_dir)
        assert [r["round"] for r in records] == list(range(1, rounds + 1)) and all(r["aggregated"] for r in records)
        for r in records:
            status = {s["site"]: s for s in r["sites"]}
            assert {n: s["status"] for n, s in status.items()} == {"site-1": "trained", "site-2": "trained",
                                                                   "site-3": "refused"}
            assert status["site-3"]["reason"].startswith("site policy: task.privacy.unit")
            assert "larger than this site's degree-bound D=100" in status["site-3"]["reason"]


def test_the_global_model_is_trained_from_the_task_initialisation(federation: Federation) -> None:
    from graphveil.contract.host import default_host

    final = torch.load(federation.mlp_dir / "adapter" / "model.pt", weights_only=True)
    model = default_host().create("model", "mlp", {"hidden": 16, "layers": 2, "seed": 0}, where="test")

    class Schema:  # Cora's public schema: 1433 features, 7 classes
        x, num_features, num_classes = None, 1433, 7

    model.prepare(Schema())
    initial = model.trainable_state()
    assert {k: tuple(v.shape) for k, v in final.items()} == {k: tuple(v.shape) for k, v in initial.items()}
    assert all(torch.isfinite(v).all() for v in final.values())
    assert all(not torch.allclose(final[k], initial[k]) for k in final)  # every layer moved
    gap = torch.load(federation.gap_dir / "adapter" / "model.pt", weights_only=True)
    assert gap["net.0.weight"].shape == (16, 16 * 3)  # GAP's classifier on [H0 ‖ H1 ‖ H2], nothing else


def test_each_ledger_holds_its_sites_spends(federation: Federation) -> None:
    """Sites 1 and 2: one released entry per round (DP-MLP rounds, then GAP's), under the task's
    unit, ε as dp-accounting composes DP-MLP's steps (checked for the DP-MLP part) and as the
    server was told; site 3 refused before its ledger was opened: no entry at all."""
    import dp_accounting

    from graphveil.connectors.flower.settings import (
        FederationSettings,
        SiteSettings,
        site_run_config,
    )
    from graphveil.connectors.flower.site import _real_session
    from graphveil.ledger import PrivacyLedger
    from graphveil.privacy import DEFAULT_ORDERS

    for name in ("site-1", "site-2"):
        with PrivacyLedger(federation.root / "ledgers" / f"{name}.sqlite", create=False) as ledger:
            assert ledger.verify().ok and ledger.meta()["unit"] == UNIT
            entries = ledger.entries()
            assert [e.status for e in entries] == ["released"] * (ROUNDS + GAP_ROUNDS)
            assert all(e.note == "" for e in entries)  # each reservation covered what ran
            mlp_epsilon = entries[ROUNDS - 1].epsilon
        # independently: b of n without replacement, replace-one (Gaussian σ/2), ROUNDS·LOCAL_STEPS steps
        fed = FederationSettings.from_run_config(APP_CONFIG)
        session = _real_session(site_run_config(fed, SiteSettings.from_toml(federation.node_configs[name]), seed=0))
        session.prepare_accounting()
        n, b = session.sampling_profile.num_records, session.sampling_profile.batch_size
        acc = dp_accounting.rdp.RdpAccountant(list(DEFAULT_ORDERS),
                                              dp_accounting.privacy_accountant.NeighboringRelation.REPLACE_ONE)
        acc.compose(dp_accounting.SampledWithoutReplacementDpEvent(n, b, dp_accounting.GaussianDpEvent(SIGMA / 2)),
                    ROUNDS * LOCAL_STEPS)
        assert mlp_epsilon == pytest.approx(acc.get_epsilon(DELTA), rel=1e-6)
        told = [s["metrics"]["epsilon"] for r in _rounds(federation.mlp_dir) for s in r["sites"] if s["site"] == name]
        assert told[-1] == pytest.approx(mlp_epsilon, rel=1e-12)
        gap_told = [s["metrics"]["epsilon"] for r in _rounds(federation.gap_dir) for s in r["sites"] if s["site"] == name]
        assert gap_told[-1] == pytest.approx(entries[-1].epsilon, rel=1e-12) and gap_told[-1] > mlp_epsilon
    with PrivacyLedger(federation.root / "ledgers" / "site-3.sqlite", create=False) as ledger:
        assert ledger.entries() == []


def test_the_server_witnessed_the_ledgers_that_trained(federation: Federation) -> None:
    """Witness as for relational rounds: one head per trained round at sites 1 and 2, each
    ledger holding what the server saw; site 3 never opened its ledger, so sent no head."""
    from graphveil.ledger import PrivacyLedger
    from graphveil.ledger.witness import Witness

    path = federation.root / "server-out" / "ledger-witness.jsonl"
    witness = Witness(path)
    assert witness.sites().keys() == {"site-1", "site-2"}
    assert not any(s["flagged"] for s in witness.sites().values())
    for name in ("site-1", "site-2"):
        with PrivacyLedger(federation.root / "ledgers" / f"{name}.sqlite", create=False) as ledger:
            head = ledger.witness_head()
        assert [o.seq for o in witness.observations(name)] == list(range(1, ROUNDS + GAP_ROUNDS + 1))
        assert witness.observations(name)[-1].head == head.head


def test_the_server_received_only_the_classifier_and_scalars(federation: Federation) -> None:
    from graphveil.connectors.flower import records

    for run_dir in (federation.mlp_dir, federation.gap_dir):
        for line in (run_dir / "received.jsonl").read_text().splitlines():
            content = json.loads(line)["content"]
            assert set(content) <= {records.ARRAYS, records.METRICS, records.SITE}
            if content[records.SITE]["values"]["status"] == "trained":
                assert set(content[records.ARRAYS]["arrays"]) == {"net.0.weight", "net.0.bias", "net.2.weight",
                                                                  "net.2.bias"}
            else:
                assert records.ARRAYS not in content
    assert np.isfinite(json.loads((federation.gap_dir / "summary.json").read_text())["seconds"])
