"""The MLflow tracking plugin, read back through MLflow's own API.

* a real private run (tiny random BERT) with ``GRAPHVEIL_MLFLOW=1`` on a SQLite store: params
  are the resolved config with the planted secrets redacted, the step metrics are exactly
  ``metrics.jsonl``'s, the privacy report and the evaluation are ``privacy.json`` /
  ``evaluation.json``, the artifacts are the run directory's files;
* an in-process federation (the connector's server loop and site handler, ``FakeSession``)
  on a directory store: one run per site round tagged with the site's name, ε from the
  site's ledger, and the federation's run with one step per round;
* a session cut short (no ``graphveil_run_end``) is marked ``KILLED`` (``file:`` URI store);
* tracking that cannot work (mlflow missing, a store MLflow refuses, a server that is down)
  warns once and never raises; switched off, the plugin never imports mlflow.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from _toy import small_relational_graph

import graphveil.plugins.mlflow_tracking as tracking
from graphveil.contract.host import PluginHost, read_only
from graphveil.plugins.mlflow_tracking.redact import flatten, redact
from graphveil.run.config import config_from_dict

SECRET, TOKEN = "s3cr3t-pw", "tok-0123456789"

CONFIG = {
    "name": "tracked",
    # an unregistered source: the graph is passed in, the options stand for a database's
    "data": {"source": "warehouse", "url": f"postgresql://alice:{SECRET}@db:5432/bank",
             "api_token": TOKEN, "split": {"train_fraction": 0.6}},
    "sampler": {"name": "entity_poisson_wor", "batch_size": 6, "k_neg": 2, "degree_cap": 3},
    "clipper": {"name": "freq_clip", "clip_norm": 1.0},
    "accountant": {"name": "coupled_rdp_freq"},
    "encoder": {"name": "hf_lora", "model": "tiny-bert", "max_length": 8, "lora_layers": 1},
    "training": {"steps": 3, "lr": 0.01, "optimizer": "sgd"},
    "privacy": {"noise_multiplier": 1.0},
    "evaluation": {"batch_size": 16},
}


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One SQLite store for the module: creating its tables takes MLflow seconds."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture
def switched_on(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> tracking.Tracker:
    """``GRAPHVEIL_MLFLOW=1``, an experiment of the test's own, a fresh tracker."""
    monkeypatch.setenv(tracking.SWITCH, "1")
    monkeypatch.setenv(tracking.EXPERIMENT_ENV, request.node.name)
    fresh = tracking.Tracker()
    monkeypatch.setattr(tracking, "TRACKER", fresh)
    return fresh


def the_run(experiment: str, **filters: str):
    from mlflow import MlflowClient

    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    where = " and ".join(f"tags.`{k}` = '{v}'" for k, v in filters.items())
    return client, client.search_runs([exp.experiment_id], filter_string=where)


def test_secrets_are_redacted_and_the_config_flattened() -> None:
    config = {"data": {"url": "mysql://u:pw@h/db", "password_file": "/run/pw", "rows": [1, 2]},
              "mechanisms": [{"name": "m", "accessKey": "k"}], "name": "n"}
    flat = flatten(redact(config))
    assert flat == {"data.url": "mysql://u:***@h/db", "data.password_file": "***", "data.rows": "[1, 2]",
                    "mechanisms.0.name": "m", "mechanisms.0.accessKey": "***", "name": "n"}
    assert config["data"]["url"] == "mysql://u:pw@h/db"  # a copy: the config is untouched


@pytest.mark.slow
def test_a_private_run_is_read_back_through_mlflow(
        tmp_path: Path, sqlite_store: Path, switched_on: tracking.Tracker, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    from graphveil.run.runner import run_training

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{sqlite_store / 'mlflow.db'}")
    monkeypatch.chdir(sqlite_store)  # MLflow puts a SQLite store's artifacts under ./mlruns
    out = tmp_path / "run"
    config = config_from_dict({**CONFIG, "output": {"dir": str(out), "progress": False}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracking.TrackingWarning)
        run_training(config, graph=small_relational_graph())

    client, runs = the_run(request.node.name)
    assert len(runs) == 1
    run = runs[0]
    run_id = run.info.run_id
    assert (run.info.status, run.info.run_name) == ("FINISHED", "tracked")

    params = run.data.params
    assert params["sampler.name"] == "entity_poisson_wor" and params["training.steps"] == "3"
    assert params["data.url"] == "postgresql://alice:***@db:5432/bank" and params["data.api_token"] == "***"
    assert not [k for k, v in params.items() if SECRET in v or TOKEN in v]

    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in steps if not x.get("final")]
    assert [x["step"] for x in steps] == [1, 2, 3]
    for key in ("loss", "clipped_fraction", "lr"):
        history = client.get_metric_history(run_id, key)
        assert [(m.step, m.value) for m in history] == [(x["step"], pytest.approx(x[key])) for x in steps], key

    privacy = json.loads((out / "privacy.json").read_text())
    evaluation = json.loads((out / "evaluation.json").read_text())
    epsilons = [(m.step, m.value) for m in client.get_metric_history(run_id, "epsilon")]
    # each step's ε spent, then the report's at the last step (the same value)
    assert epsilons == [(x["step"], pytest.approx(x["epsilon"])) for x in steps] + [(3, pytest.approx(privacy["epsilon"]))]
    assert 0 < privacy["epsilon"] < float("inf")
    metrics = run.data.metrics
    for key in ("delta", "noise_multiplier", "clip_norm"):
        assert metrics[key] == pytest.approx(privacy[key]), key
    for key in ("mrr", "prec1"):
        assert metrics[key] == pytest.approx(evaluation[key]), key
    assert (params["report.unit"], params["report.accountant"]) == (privacy["unit"], "coupled_rdp_freq")

    names = {a.path for a in client.list_artifacts(run_id)}
    assert names == {"adapter", "config.resolved.yaml", "evaluation.json", "metrics.jsonl", "privacy.json"}
    assert "adapter/adapter_model.safetensors" in {a.path for a in client.list_artifacts(run_id, "adapter")}
    logged = Path(client.download_artifacts(run_id, "config.resolved.yaml", str(tmp_path)))
    assert SECRET not in logged.read_text() and TOKEN not in logged.read_text()
    assert yaml.safe_load(logged.read_text())["data"]["api_token"] == "***"
    assert TOKEN in (out / "config.resolved.yaml").read_text()  # the run directory itself is untouched


def test_a_federation_logs_each_site_round_tagged_with_the_site(
        tmp_path: Path, switched_on: tracking.Tracker, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest, flower_task: None) -> None:
    """The connector's own loop in process: server rounds and site rounds (``handle_train``
    with the ``FakeSession`` double and a real ledger) report through the lifecycle hooks."""
    from _fed_support import RUN_CONFIG, FakeEncoder, LocalGrid, node_config, site_context

    from graphveil.connectors.flower.server import run_federation
    from graphveil.connectors.flower.settings import FederationSettings
    from graphveil.ledger import PrivacyLedger

    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "store"))  # a directory
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps it in maintenance mode
    sites = {1: node_config(tmp_path, "bank-a"), 2: node_config(tmp_path, "bank-b")}
    run_config = {**RUN_CONFIG, "output-dir": str(tmp_path / "out"), "num-server-rounds": 2}
    grid = LocalGrid({n: site_context(n, cfg, run_config) for n, cfg in sites.items()})
    host = PluginHost(autoload=False)
    host.register(tracking, "mlflow")
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracking.TrackingWarning)
        run_federation(grid, FederationSettings.from_run_config(run_config), run_id=4,
                       encoder=FakeEncoder(seed=5), host=host)
        switched_on.close_open()  # what the ServerApp process does at exit

    client, site_runs = the_run(request.node.name, **{"graphveil.site": "bank-a"})
    assert sorted(r.info.run_name for r in site_runs) == ["bank-a-round1", "bank-a-round2"]
    with PrivacyLedger(sites[1]["ledger"], create=False) as ledger:
        spent = [e.epsilon for e in ledger.entries()]
    for run in site_runs:
        r = int(run.data.tags[tracking.ROUND_TAG])
        assert run.info.status == "FINISHED" and run.data.params["report.unit"] == "edge"
        assert run.data.metrics["epsilon"] == pytest.approx(spent[r - 1])  # the site's total after round r
        assert run.data.metrics["mrr"] == 0.5  # FakeSession's evaluation
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"report.json"}
    assert len(the_run(request.node.name, **{"graphveil.site": "bank-b"})[1]) == 2

    _, (federation,) = the_run(request.node.name, **{"graphveil.role": "federation"})
    assert federation.info.status == "FINISHED"
    trained = client.get_metric_history(federation.info.run_id, "sites_trained")
    assert [(m.step, m.value) for m in trained] == [(1, 2.0), (2, 2.0)]
    rounds = [json.loads(x) for x in (tmp_path / "out" / "run-4" / "rounds.jsonl").read_text().splitlines()]
    reported = {s["site"]: s["metrics"]["epsilon"] for s in rounds[-1]["sites"]}
    assert reported["bank-a"] == pytest.approx(spent[-1])
    assert federation.data.metrics["bank-a.epsilon"] == pytest.approx(reported["bank-a"])


def test_a_session_that_never_ends_is_marked_killed(
        tmp_path: Path, switched_on: tracking.Tracker, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "store").as_uri())  # a file: URI
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    host = PluginHost(autoload=False)
    host.register(tracking, "mlflow")
    host.hook.graphveil_step_end(step=1, metrics=read_only({"step": 1, "loss": 0.9}))  # cut short
    _observe_a_session(host)  # the next session starts at step 1
    host.hook.graphveil_step_end(step=1, metrics=read_only({"step": 1, "loss": 0.7}))  # cut short by exit
    switched_on.close_open()
    client, runs = the_run(request.node.name)
    by_loss = {client.get_metric_history(r.info.run_id, "loss")[0].value: r for r in runs}
    assert {loss: r.info.status for loss, r in by_loss.items()} == {0.9: "KILLED", 0.5: "FINISHED", 0.7: "KILLED"}
    finished = by_loss[0.5].info.run_id
    assert [(m.step, m.value) for m in client.get_metric_history(finished, "loss")] == [(1, 0.5), (2, 0.4)]
    assert by_loss[0.5].data.metrics["epsilon"] == 1.0


def _observe_a_session(host: PluginHost) -> None:
    host.hook.graphveil_step_end(step=1, metrics=read_only({"step": 1, "loss": 0.5}))
    host.hook.graphveil_step_end(step=2, metrics=read_only({"step": 2, "loss": 0.4}))
    host.hook.graphveil_run_end(run_dir=None, report=read_only({"epsilon": 1.0, "steps": 2}))


@pytest.mark.parametrize(("setting", "message"), [
    ("missing", "mlflow is not installed: pip install 'graphveil[mlflow]'"),
    ("file store refused", "MLFLOW_ALLOW_FILE_STORE"),
    ("server down", "MlflowException"),
])
def test_tracking_that_cannot_work_warns_once_and_never_raises(
        tmp_path: Path, switched_on: tracking.Tracker, monkeypatch: pytest.MonkeyPatch,
        setting: str, message: str) -> None:
    if setting == "missing":
        monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` meets when absent
    elif setting == "file store refused":
        monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", str(tmp_path / "store"))
    else:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://bob:hunter2@127.0.0.1:9")  # nothing listens
        monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    host = PluginHost(autoload=False)
    host.register(tracking, "mlflow")
    with pytest.warns(tracking.TrackingWarning) as caught:
        _observe_a_session(host)
        _observe_a_session(host)
    assert len(caught) == 1 and message in str(caught[0].message)
    assert "hunter2" not in str(caught[0].message)
    assert switched_on.off and switched_on.session_run is None


def test_switched_off_it_does_nothing_and_never_imports_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracking.SWITCH, raising=False)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # importing it would raise
    monkeypatch.setattr(tracking, "TRACKER", tracking.Tracker())
    host = PluginHost(autoload=False)
    host.register(tracking, "mlflow")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _observe_a_session(host)
    assert tracking.TRACKER.client is None and not tracking.TRACKER.off


def test_the_plugin_is_registered_through_the_entry_point_group() -> None:
    from importlib.metadata import entry_points

    (ep,) = [ep for ep in entry_points(group="graphveil") if ep.name == "mlflow"]
    assert ep.value == "graphveil.plugins.mlflow_tracking"
    assert PluginHost().pm.get_plugin("mlflow") is tracking


def test_every_leak_of_issue_25_is_redacted() -> None:
    """URLs with '@' or '/' in the password, secret query parameters, libpq strings, and the
    secret names that were not secret (passwordfile, pgpass, db_pw, authorization, cookie, token)."""
    secret = "p@ss/w0rd"
    config = {"data": {"url": f"postgresql://bob:{secret}@db/graph",
                       "mirror": f"postgresql://bob@db/graph?password={secret}&sslmode=require",
                       "dsn": f"host=db password='{secret}' user=bob"},
              "passwordfile": secret, "pgpass": secret, "db_pw": secret, "authorization": secret,
              "cookie": secret, "token": secret, "tokenizer": "bert-base"}
    flat = flatten(redact(config))
    assert not [k for k, v in flat.items() if "w0rd" in str(v) or "p@ss" in str(v)], flat
    assert flat == {"data.url": "postgresql://bob:***@db/graph",
                    "data.mirror": "postgresql://bob@db/graph?password=***&sslmode=require",
                    "data.dsn": "host=db password=*** user=bob", "passwordfile": "***", "pgpass": "***",
                    "db_pw": "***", "authorization": "***", "cookie": "***", "token": "***",
                    "tokenizer": "bert-base"}
