"""A node-level site trains on ONE degree-capped Ē across rounds (issue 6, point 2).

Before: each round re-capped the graph with a fresh seed, so |Ē| (and γ) changed and the
ledger refused the next round. Now the site's ledger keeps Ē: round 2 reuses it, γ is the
same, and both rounds are released. Real TrainingSession (tiny random BERT), real ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _fed_support import init_site_ledger, site_context

from graphveil.connectors.flower import records
from graphveil.connectors.flower.site import _real_session, handle_train
from graphveil.data import load_bundled_citeseer
from graphveil.ledger import LedgerError, PrivacyLedger

RUN_CONFIG = {
    "num-server-rounds": 2, "local-steps": 2, "min-sites": 1,
    "task.sampler.name": "entity_poisson_wor", "task.sampler.batch_size": 16, "task.sampler.k_neg": 2,
    "task.sampler.degree_cap": 3,
    "task.clipper.name": "standard_clip", "task.accountant.name": "coupled_rdp_standard",
    "task.encoder.name": "hf_lora", "task.encoder.model": "tiny-bert", "task.encoder.max_length": 16,
    "task.privacy.noise_multiplier": 2.0, "task.evaluation.batch_size": 32,
}


pytestmark = pytest.mark.usefixtures("flower_task")


def _write_graph(folder: Path) -> tuple[Path, Path]:
    """One third of the bundled CiteSeer, as a site would hold it (edges.tsv + entities.jsonl)."""
    from graphveil.connectors.flower.partition import write_partition

    return write_partition(load_bundled_citeseer(), 3, folder, seed=0)[0]


def test_a_node_level_site_keeps_one_capped_relation_set_across_rounds(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    edges, entities = _write_graph(tmp_path)
    node_config = {
        "site-name": "bank-a", "data-path": str(edges), "data-entities": str(entities),
        "epsilon-budget": 1000.0, "ledger": str(tmp_path / "ledger.sqlite"), "delta": 1e-6,
        "privacy-unit": "node", "share-epsilon": True, "degree-cap": 3,
    }
    ctx = site_context(3, init_site_ledger(node_config), RUN_CONFIG)

    built = []

    def factory(config, records_store=None):
        session = _real_session(config, records_store=records_store)
        built.append(session)
        return session

    from graphveil.connectors.flower.settings import FederationSettings
    from graphveil.contract.host import default_host

    task = FederationSettings.from_run_config(RUN_CONFIG).check_task()
    encoder = default_host().create("encoder", task.encoder.name, task.encoder.params, where="test")
    state = encoder.trainable_state()
    for server_round in (1, 2):
        content = records.train_content(records.arrays_from_state(state), server_round, 2)
        reply = handle_train(content, ctx, session_factory=factory)
        site = dict(reply.config_records[records.SITE])
        assert site["status"] == records.TRAINED, site
        state = records.state_from_arrays(reply.array_records[records.ARRAYS])

    first, second = built
    assert first.sampling_profile.num_records == second.sampling_profile.num_records
    assert first.sampling_profile.rate == second.sampling_profile.rate
    assert torch.equal(first.sampler.records, second.sampler.records)
    assert first.records_key == second.records_key is not None
    with PrivacyLedger(node_config["ledger"], create=False) as ledger:
        assert ledger.verify().ok
        assert torch.equal(ledger.load_records(first.records_key), first.sampler.records)
        assert [e.status for e in ledger.entries()] == ["released", "released"]

    # Ē is pinned: a task asking another K is refused before the graph is read ...
    other = {**RUN_CONFIG, "task.sampler.degree_cap": 4}
    content = records.train_content(records.arrays_from_state(state), 3, 2)
    reply = handle_train(content, site_context(3, node_config, other), session_factory=factory)
    assert reply.config_records[records.SITE]["status"] == records.REFUSED
    assert "task.sampler.degree_cap" in reply.config_records[records.SITE]["reason"]
    assert len(built) == 2
    # ... and the ledger itself keeps one record set: a second key (other data, other options) is refused
    with PrivacyLedger(node_config["ledger"], create=False) as ledger:
        with pytest.raises(LedgerError, match="already holds the record set"):
            ledger.save_records("another-key", first.sampler.records[:3])
