"""The site's privacy policy (node config) against the server's task: one check, each key refused by name.

``check_site_policy`` runs in the ClientApp before any data is read or spend is reserved; the
table below has, for each policy key, a site and a task that violate it, and the key the refusal
must name. The end-to-end cases check that ``handle_train`` refuses without building a session
(no data read) and without creating the ledger.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _fed_support import RUN_CONFIG, SITE_POLICY, FakeEncoder, FakeSession, site_context

from graphveil.connectors.flower import records
from graphveil.connectors.flower.settings import (
    BUILTIN_ACCOUNTANTS,
    FederationSettings,
    PolicyRefusal,
    SiteSettings,
    check_site_policy,
    site_run_config,
)
from graphveil.connectors.flower.site import handle_train
from graphveil.contract.errors import ConfigError
from graphveil.run.config import PrivacyConfig

#: A node-level site: no size floor (the coupled accountants need the exact sizes).
NODE_SITE = {"privacy-unit": "node", "min-records": None}
NODE_TASK = {"task.sampler.name": "entity_poisson_wor", "task.clipper.name": "standard_clip",
             "task.accountant.name": "coupled_rdp_standard"}


def _site(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    folder = tmp_path / "site"
    folder.mkdir(exist_ok=True)
    (folder / "edges.tsv").write_text("source\ttarget\n")
    (folder / "entities.jsonl").write_text("")
    values = {"site-name": "bank-a", "data-path": str(folder / "edges.tsv"),
              "data-entities": str(folder / "entities.jsonl"), "epsilon-budget": 5.0,
              "ledger": str(folder / "ledger.sqlite"), **SITE_POLICY, **extra}
    return {k: v for k, v in values.items() if v is not None}


#: (case, node-config changes, run-config changes, local steps, key the refusal names)
CASES = [
    ("delta", {}, {"task.privacy.delta": 0.5}, 3, "task.privacy.delta"),
    ("privacy-unit", NODE_SITE, {}, 3, "privacy-unit"),
    ("privacy-unit (task of the other unit)", {}, NODE_TASK, 3, "privacy-unit"),
    ("accountants", {**NODE_SITE, "accountants": "coupled_rdp_freq"}, NODE_TASK, 3, "accountants"),
    ("min-noise-multiplier (default 0.5)", {}, {"task.privacy.noise_multiplier": 0.3}, 3, "min-noise-multiplier"),
    ("min-noise-multiplier (site's)", {"min-noise-multiplier": 1.5}, {}, 3, "min-noise-multiplier"),
    ("σ calibrated to a target ε", {}, {"task.privacy.noise_multiplier": None, "task.privacy.target_epsilon": 2.0},
     3, "task.privacy.target_epsilon"),
    ("max-steps-per-round (default 100)", {}, {}, 101, "max-steps-per-round"),
    ("max-steps-per-round (site's)", {"max-steps-per-round": 5}, {}, 6, "max-steps-per-round"),
    ("sampling seed", {}, {"task.seed": 1}, 3, "task.seed"),
    ("local steps >= 1", {}, {}, 0, "local-steps"),
    ("min-records is the site's", {}, {"task.sampler.min_records": 5}, 3, "task.sampler.min_records"),
    ("degree-cap is the site's", NODE_SITE, {**NODE_TASK, "task.sampler.degree_cap": 9}, 3,
     "task.sampler.degree_cap"),
    ("numerics: normalisation off", {}, {"task.encoder.normalize": False}, 3, "task.encoder.normalize"),
    ("clip norm above max-clip-norm", {"max-clip-norm": 2.0}, {"task.clipper.clip_norm": 3.0}, 3,
     "clipper.clip_norm"),
    ("clip norm below min-clip-norm (default 1e-4)", {}, {"task.clipper.clip_norm": 1e-6}, 3,
     "clipper.clip_norm"),
    ("privacy disabled", {}, {"task.privacy.enabled": False, "task.privacy.noise_multiplier": None,
                              "task.clipper.name": "no_clip", "task.accountant.name": "no_accounting"},
     3, "task.privacy.enabled"),
]
if "research_noise_seed" in PrivacyConfig.model_fields:
    CASES.append(("research noise seed", {}, {"task.privacy.research_noise_seed": 7}, 3,
                  "task.privacy.research_noise_seed"))


def _run_config(changes: dict[str, Any]) -> dict[str, Any]:
    out = {**RUN_CONFIG, **changes}
    return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize(("case", "node", "run", "steps", "key"), CASES, ids=[c[0] for c in CASES])
def test_each_policy_key_refuses_a_task_that_differs_naming_the_key(
        tmp_path: Path, case: str, node: dict, run: dict, steps: int, key: str) -> None:
    site = SiteSettings.from_mapping(_site(tmp_path, **node))
    fed = FederationSettings.from_run_config(_run_config(run))
    config = site_run_config(fed, site, seed=1)
    with pytest.raises(PolicyRefusal) as info:
        check_site_policy(site, fed, config, local_steps=steps)
    assert key in str(info.value), str(info.value)


def test_the_research_noise_seed_is_refused() -> None:
    """A task that pins the noise (``privacy.research_noise_seed``) is refused by name, whether
    or not this checkout's PrivacyConfig has the field yet (the raw task is checked)."""
    site = SiteSettings.from_mapping(_site(Path("/tmp"), **{"data-path": "/e.tsv", "data-entities": "/n.jsonl"}))
    fed = FederationSettings.from_run_config(RUN_CONFIG)
    config = site_run_config(fed, site, seed=1)
    raw = fed.model_copy(update={"task": {**fed.task, "privacy": {**fed.task["privacy"], "research_noise_seed": 7}}})
    with pytest.raises(PolicyRefusal, match="task.privacy.research_noise_seed"):
        check_site_policy(site, raw, config, local_steps=3)


def test_a_task_within_the_policy_passes(tmp_path: Path) -> None:
    for node, run in (({}, {}), (NODE_SITE, NODE_TASK),
                      ({}, {"task.privacy.delta": SITE_POLICY["delta"]})):  # the site's own δ may be repeated
        site = SiteSettings.from_mapping(_site(tmp_path, **node))
        fed = FederationSettings.from_run_config(_run_config(run))
        config = site_run_config(fed, site, seed=1)
        check_site_policy(site, fed, config, local_steps=100)
        assert config.privacy.delta == site.delta
    assert SiteSettings.from_mapping(_site(tmp_path)).accepted_accountants == BUILTIN_ACCOUNTANTS["edge"]
    assert SiteSettings.from_mapping(_site(tmp_path, accountants="edge_rdp, other")).accepted_accountants == ("edge_rdp", "other")


@pytest.mark.parametrize("key", ["delta", "privacy-unit"])
def test_delta_and_privacy_unit_are_required(tmp_path: Path, key: str) -> None:
    values = _site(tmp_path)
    del values[key]
    with pytest.raises(ConfigError, match=f"{key}: required key is missing"):
        SiteSettings.from_mapping(values)


def test_graphveil_fed_site_exits_2_on_missing_policy_keys(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main

    values = _site(tmp_path)
    del values["delta"]
    toml = tmp_path / "site.toml"
    toml.write_text("".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in values.items()))
    for name in ("ca.crt", "site.key"):
        (tmp_path / name).write_text("x")
    code = main(["fed", "site", "--node-config", str(toml), "--superlink", "127.0.0.1:8000",
                 "--ca", str(tmp_path / "ca.crt"), "--key", str(tmp_path / "site.key"), "--dry-run"])
    assert code == 2
    assert "delta: required key is missing" in capsys.readouterr().err


# ------------------------------------------------------------------------------ in the ClientApp


@pytest.fixture
def _task_identity(flower_task):
    FakeSession.instances.clear()


@pytest.mark.usefixtures("_task_identity")
@pytest.mark.parametrize(("case", "node", "run", "steps", "key"), CASES, ids=[c[0] for c in CASES])
def test_the_client_app_refuses_before_reading_data_or_opening_the_ledger(
        tmp_path: Path, case: str, node: dict, run: dict, steps: int, key: str) -> None:
    cfg = _site(tmp_path, **node)
    content = records.train_content(records.arrays_from_state(FakeEncoder(seed=1).trainable_state()), 1, steps)
    reply = handle_train(content, site_context(11, cfg, _run_config(run)), session_factory=FakeSession)
    site = dict(reply.config_records[records.SITE])
    assert site["status"] == records.REFUSED and key in site["reason"], site["reason"]
    assert site["reason"].startswith("site policy: ")
    assert records.ARRAYS not in reply and dict(reply.metric_records[records.METRICS]) == {}
    assert FakeSession.instances == []  # no session: the graph was not loaded
    assert not Path(cfg["ledger"]).exists()  # nothing reserved, not even a ledger file


def test_the_site_config_pins_what_it_sets(tmp_path: Path) -> None:
    """A task may repeat a value the site's site-config sets, never contradict it; a numerics key
    the site pins to a non-default value may then be asked for."""
    pins = tmp_path / "pins.yaml"
    pins.write_text("encoder:\n  normalize: false\ntraining:\n  temperature: 0.1\n")
    site = SiteSettings.from_mapping(_site(tmp_path, **{"site-config": str(pins)}))
    for run, refused in (({"task.training.temperature": 0.5}, "task.training.temperature"),
                         ({"task.training.temperature": 0.1, "task.encoder.normalize": False}, None)):
        fed = FederationSettings.from_run_config(_run_config(run))
        config = site_run_config(fed, site, seed=1)
        if refused is None:
            check_site_policy(site, fed, config, local_steps=3)
            assert config.network.params["normalize"] is False
        else:
            with pytest.raises(PolicyRefusal, match=refused):
                check_site_policy(site, fed, config, local_steps=3)


def test_the_site_fixes_the_accounted_numbers_in_the_run_config(tmp_path: Path) -> None:
    fed = FederationSettings.from_run_config(RUN_CONFIG)
    edge = site_run_config(fed, SiteSettings.from_mapping(_site(tmp_path)), seed=1)
    assert edge.sampler.params["min_records"] == SITE_POLICY["min-records"]
    node_fed = FederationSettings.from_run_config(_run_config(NODE_TASK))
    node = site_run_config(node_fed, SiteSettings.from_mapping(_site(tmp_path, **NODE_SITE, **{"degree-cap": 3})),
                           seed=1)
    assert node.sampler.params["degree_cap"] == 3


@pytest.mark.parametrize(("node", "message"), [
    ({"min-records": None}, "min-records is required for privacy-unit 'edge'"),
    ({"privacy-unit": "node"}, "min-records applies to privacy-unit 'edge' only"),
    ({"min-clip-norm": 2.0, "max-clip-norm": 1.0}, "exceeds max-clip-norm"),
])
def test_size_floor_and_clip_range_are_checked_in_the_node_config(tmp_path: Path, node: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SiteSettings.from_mapping(_site(tmp_path, **node) | {k: v for k, v in node.items() if v is not None})
