"""Run config and node config of the federation, the Flower app project, partitions, CLI helpers."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from _fed_support import RUN_CONFIG, SITE_POLICY
from _paths import REPO

from graphveil.connectors.flower.bundle import bundled_app_dir
from graphveil.connectors.flower.commands import add_fed_parser
from graphveil.connectors.flower.control import write_connection
from graphveil.connectors.flower.partition import partition_graph, write_partition
from graphveil.connectors.flower.settings import (
    FederationSettings,
    SiteSettings,
    round_seed,
    site_run_config,
)
from graphveil.contract.errors import ConfigError
from graphveil.contract.host import default_host
from graphveil.data import RelationalGraph
from graphveil.data.loaders import check_data_options
from graphveil.plugins.standard.sources.edge_list import load_edge_list
from graphveil.run.config import RunConfig

APP = REPO / "connectors" / "graphveil" / "connectors" / "flower" / "app"


def site(tmp_path: Path, **extra) -> SiteSettings:
    base = {"site-name": "bank-a", "data-path": str(tmp_path / "e.tsv"), "data-entities": str(tmp_path / "n.jsonl"),
            "epsilon-budget": 3.0, "ledger": str(tmp_path / "l.sqlite"), "delta": 1e-5, "privacy-unit": "edge",
            "min-records": SITE_POLICY["min-records"]}
    return SiteSettings.from_mapping({**base, **extra})


# ------------------------------------------------------------------------------ run config


def test_app_pyproject_is_a_valid_flower_app_whose_defaults_validate() -> None:
    from flwr.cli.config_utils import load_and_validate
    from flwr.common.config import flatten_dict

    config, _ = load_and_validate(APP / "pyproject.toml")
    assert config["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "graphveil_fed.server_app:app", "clientapp": "graphveil_fed.client_app:app"}
    fed = FederationSettings.from_run_config(flatten_dict(config["tool"]["flwr"]["app"]["config"]))
    assert fed.strategy == "fedavg" and fed.task["encoder"]["name"] == "hf_lora"
    assert "data" not in fed.task
    assert bundled_app_dir() == APP
    # the app's modules re-export the real apps (what Flower loads from the FAB)
    import importlib
    import sys

    from graphveil.connectors.flower import server, site

    sys.path.insert(0, str(APP))
    try:
        server_app = importlib.import_module("graphveil_fed.server_app")
        client_app = importlib.import_module("graphveil_fed.client_app")
    finally:
        sys.path.remove(str(APP))
    assert server_app.app is server.app and client_app.app is site.app


def test_run_config_round_trips_and_names_bad_keys() -> None:
    fed = FederationSettings.from_run_config(RUN_CONFIG)
    assert fed.local_steps == 3 and fed.task["privacy"] == {"noise_multiplier": 1.0}
    assert fed.sites_timeout == 600.0
    with pytest.raises(ConfigError, match="sites-timeout"):
        FederationSettings.from_run_config({**RUN_CONFIG, "sites-timeout": 0})
    assert FederationSettings.from_run_config(fed.to_run_config()) == fed
    with pytest.raises(ConfigError, match="unknown key 'local_steps'"):
        FederationSettings.from_run_config({**RUN_CONFIG, "local_steps": 3})
    with pytest.raises(ConfigError, match="local-steps: Input should be greater than or equal to 1"):
        FederationSettings.from_run_config({**RUN_CONFIG, "local-steps": 0})
    with pytest.raises(ConfigError, match="strategy"):
        FederationSettings.from_run_config({**RUN_CONFIG, "strategy": "krum"})
    with pytest.raises(ConfigError, match="task.data"):
        FederationSettings.from_run_config({**RUN_CONFIG, "task.data.path": "/x"})
    with pytest.raises(ConfigError, match=r"task\.\*.*privacy"):
        FederationSettings.from_run_config({**RUN_CONFIG, "task.privacy.target_epsilon": 2.0})
    with pytest.raises(ConfigError, match="is a section, not a value"):
        FederationSettings.from_run_config({**RUN_CONFIG, "task.encoder": "x"})
    with pytest.raises(ConfigError, match="is a value, not a section"):
        FederationSettings.from_run_config({"task.seed": 1, "task.seed.x": 2})


def test_site_run_config_layers_task_site_yaml_and_node_config(tmp_path: Path) -> None:
    extra = tmp_path / "site.yaml"
    extra.write_text(yaml.safe_dump({"data": {"split": {"train_fraction": 0.6}}, "sampler": {"batch_size": 16},
                                     "privacy": {"delta": 0.5}}))
    fed = FederationSettings.from_run_config(RUN_CONFIG)
    cfg = site_run_config(fed, site(tmp_path, **{"site-config": str(extra), "delta": 1e-6, "threads": 1}), seed=42)
    assert cfg.data.source == "edge_list" and Path(cfg.data.params["path"]) == tmp_path / "e.tsv"
    assert cfg.data.split.train_fraction == 0.6
    assert cfg.sampler.params == {"batch_size": 16, "min_records": SITE_POLICY["min-records"]}
    assert cfg.privacy.delta == 1e-6  # the node config has the last word on δ
    assert cfg.seed == 42 and cfg.training.steps == 6 and cfg.threads == 1 and cfg.name == "bank-a"
    assert cfg.output.progress is False


def site_data_options(cfg: RunConfig) -> Any:
    """The site run config's data options as the site's session validates them when it assembles."""
    return check_data_options(cfg.data, default_host(), where=cfg.origin).params


def test_site_column_keys_round_trip_into_the_site_run_config(tmp_path: Path) -> None:
    fed = FederationSettings.from_run_config(RUN_CONFIG)
    cols = {"data-source-col": "id_1", "data-target-col": "id_2", "data-id-col": "node", "data-text-col": "abstract"}
    s = site(tmp_path, **cols)
    assert s.data_section() == {"source": "edge_list", "path": str(tmp_path / "e.tsv"),
                                "entities": str(tmp_path / "n.jsonl"), "source_col": "id_1", "target_col": "id_2",
                                "id_col": "node", "text_col": "abstract"}
    options = site_data_options(site_run_config(fed, s, seed=1))
    assert (options.source_col, options.target_col, options.id_col, options.text_col) == ("id_1", "id_2", "node", "abstract")
    # unset keys leave the loader's defaults, or what the site's own site-config YAML says
    assert site(tmp_path).data_section() == {"source": "edge_list", "path": str(tmp_path / "e.tsv"),
                                             "entities": str(tmp_path / "n.jsonl")}
    extra = tmp_path / "site.yaml"
    extra.write_text(yaml.safe_dump({"data": {"text_col": "body"}}))
    options = site_data_options(site_run_config(fed, site(tmp_path, **{"site-config": str(extra), "data-id-col": "node"}),
                                                seed=1))
    assert (options.source_col, options.id_col, options.text_col) == (None, "node", "body")
    # the same keys from a TOML node config, and the graph they describe loads
    (tmp_path / "e.tsv").write_text("id_1\tid_2\nx\ty\n")
    (tmp_path / "n.jsonl").write_text('{"node": "x", "abstract": "one"}\n{"node": "y", "abstract": "two"}\n')
    toml = tmp_path / "site.toml"
    toml.write_text(
        f'site-name = "bank-a"\ndata-path = "{tmp_path / "e.tsv"}"\ndata-entities = "{tmp_path / "n.jsonl"}"\n'
        f'epsilon-budget = 4.0\nledger = "{tmp_path / "l.sqlite"}"\ndelta = 1e-6\nprivacy-unit = "edge"\n'
        'min-records = 100\n'
        + "".join(f'{k} = "{v}"\n' for k, v in cols.items())
    )
    from graphveil.data import load_graph

    graph = load_graph(site_run_config(fed, SiteSettings.from_toml(toml), seed=1).data)
    assert graph.entity_ids == ["x", "y"] and graph.texts == ["one", "two"] and graph.edges.tolist() == [[0, 1]]


def test_site_column_key_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="give both data-source-col and data-target-col, or neither"):
        site(tmp_path, **{"data-source-col": "id_1"})
    with pytest.raises(ConfigError, match="data-id-col: String should have at least 1 character"):
        site(tmp_path, **{"data-id-col": ""})
    with pytest.raises(ConfigError, match="data-text-col applies only to data-source 'edge_list'"):
        SiteSettings.from_mapping({"site-name": "a", "ledger": "/l", "epsilon-budget": 1.0, "delta": 1e-6,
                                   "privacy-unit": "edge", "data-source": "citeseer", "data-text-col": "body"})
    # a column missing from the site's file names the run-config key (RUNBOOK §3 maps it to the node config key)
    from graphveil.contract.errors import DataError
    from graphveil.data import load_graph

    (tmp_path / "e.tsv").write_text("id_1\tid_2\nx\ty\n")
    (tmp_path / "n.jsonl").write_text('{"id": "x", "text": "one"}\n')
    fed = FederationSettings.from_run_config(RUN_CONFIG)
    cfg = site_run_config(fed, site(tmp_path, **{"data-source-col": "id_1", "data-target-col": "id2"}), seed=1)
    with pytest.raises(DataError, match=r"e\.tsv, line 1: header has no column 'id2' \(columns: id_1, id_2\); "
                                        r"set data\.target_col"):
        load_graph(cfg.data)


def test_round_seeds_never_repeat_and_are_fresh_without_a_pinned_seed(tmp_path: Path) -> None:
    pinned = site(tmp_path, seed=1)
    seeds = {round_seed(pinned, run, r) for run in (1, 2) for r in range(1, 20)}
    seeds |= {round_seed(site(tmp_path, seed=1, **{"site-name": "bank-b"}), 1, r) for r in range(1, 20)}
    assert len(seeds) == 2 * 19 + 19
    assert round_seed(pinned, 1, 1) == round_seed(pinned, 1, 1)
    free = site(tmp_path)
    assert round_seed(free, 1, 1) != round_seed(free, 1, 1)


# ------------------------------------------------------------------------------ node config


def test_node_config_errors_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="epsilon-budget: required key is missing"):
        SiteSettings.from_mapping({"site-name": "a", "ledger": "/l", "data-source": "citeseer"})
    with pytest.raises(ConfigError, match="privacy-unit"):
        site(tmp_path, **{"privacy-unit": "graph"})
    with pytest.raises(ConfigError, match="max-steps-per-round"):
        site(tmp_path, **{"max-steps-per-round": 0})
    defaults = site(tmp_path)
    assert (defaults.share_utility_metrics, defaults.share_epsilon) == (False, False)  # nothing non-private by default
    assert (defaults.min_noise_multiplier, defaults.max_steps_per_round) == (0.5, 100)
    with pytest.raises(ConfigError, match="epsilon-budget: must be a finite number > 0"):
        site(tmp_path, **{"epsilon-budget": 0.0})
    with pytest.raises(ConfigError, match="ledger: must be an absolute path"):
        site(tmp_path, ledger="ledger.sqlite")
    with pytest.raises(ConfigError, match="data-entities is required"):
        SiteSettings.from_mapping({"site-name": "a", "ledger": "/l", "epsilon-budget": 1.0, "data-path": "/e",
                                   "delta": 1e-6, "privacy-unit": "edge"})
    with pytest.raises(ConfigError, match="site-name"):
        site(tmp_path, **{"site-name": "a b"})
    with pytest.raises(ConfigError, match="unknown_key"):
        site(tmp_path, unknown_key=1)
    with pytest.raises(ConfigError, match="does not exist"):
        site(tmp_path).check_files()


def test_node_config_toml_and_site_dry_run(tmp_path: Path, capsys) -> None:
    (tmp_path / "e.tsv").write_text("source\ttarget\n")
    (tmp_path / "n.jsonl").write_text("")
    for name in ("ca.crt", "site.key"):
        (tmp_path / name).write_text("x")
    toml = tmp_path / "site.toml"
    toml.write_text(
        f'site-name = "bank-a"\ndata-path = "{tmp_path / "e.tsv"}"\ndata-entities = "{tmp_path / "n.jsonl"}"\n'
        f'epsilon-budget = 4.0\nledger = "{tmp_path / "l.sqlite"}"\ndelta = 1e-6\nprivacy-unit = "edge"\n'
        'min-records = 100\n'
    )
    assert SiteSettings.from_toml(toml).epsilon_budget == 4.0
    args = _parse(["fed", "site", "--node-config", str(toml), "--superlink", "127.0.0.1:8000",
                   "--ca", str(tmp_path / "ca.crt"), "--key", str(tmp_path / "site.key"), "--port", "9101", "--dry-run"])
    # the site never makes its own ledger: the operator runs `graphveil budget init` once
    with pytest.raises(ConfigError, match=f"ledger: {tmp_path / 'l.sqlite'} does not exist; .*"
                                          f"`graphveil budget init --ledger {tmp_path / 'l.sqlite'} --site bank-a`"):
        args.func(args)
    assert not (tmp_path / "l.sqlite").exists()
    from graphveil.apps.cli import main

    assert main(["budget", "init", "--ledger", str(tmp_path / "l.sqlite"), "--site", "bank-a"]) == 0
    capsys.readouterr()
    assert args.func(args) == 0
    # the dry run prints the app-pinning guard's command line, then the SuperNode's
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.split()[0].endswith("flower-supernode")]
    cmd = line.split()
    assert cmd[cmd.index("--node-config") + 1] == str(toml)
    assert cmd[cmd.index("--auth-supernode-private-key") + 1] == str(tmp_path / "site.key")
    assert "--insecure" not in cmd
    # an anchor the node config names must exist: only init (or init --reanchor) writes one
    anchor = tmp_path / "anchor" / "l.head"
    toml.write_text(toml.read_text() + f'ledger-anchor = "{anchor}"\n')
    with pytest.raises(ConfigError, match="ledger-anchor: .* does not exist; .*--reanchor"):
        args.func(args)
    assert not anchor.exists()
    (tmp_path / "l.sqlite.key").unlink()
    with pytest.raises(ConfigError, match=r"ledger \(its site key\): .*l\.sqlite\.key does not exist"):
        args.func(args)
    # a broken node config is refused before Flower starts
    toml.write_text('site-name = "bank-a"\n')
    args = _parse(["fed", "site", "--node-config", str(toml), "--superlink", "h:1", "--ca", str(tmp_path / "ca.crt"),
                   "--key", str(tmp_path / "site.key"), "--dry-run"])
    with pytest.raises(ConfigError, match="required key is missing"):
        args.func(args)


def test_server_dry_run_turns_tls_and_node_auth_on(tmp_path: Path, capsys) -> None:
    for name in ("ca.crt", "server.pem", "server.key"):
        (tmp_path / name).write_text("x")
    args = _parse(["fed", "server", "--ca", str(tmp_path / "ca.crt"), "--cert", str(tmp_path / "server.pem"),
                   "--key", str(tmp_path / "server.key"), "--port", "9999", "--dry-run"])
    assert args.func(args) == 0
    # the dry run prints the Fleet gateway's command line, then the SuperLink's
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.split()[0].endswith("flower-superlink")]
    cmd = line.split()
    assert {"--enable-supernode-auth", "--disable-runtime-dependency-installation"} <= set(cmd)
    assert cmd[cmd.index("--ssl-certfile") + 1] == str(tmp_path / "server.pem")
    assert "--insecure" not in cmd
    args = _parse(["fed", "server", "--ca", str(tmp_path / "nope"), "--cert", "x", "--key", "y", "--dry-run"])
    with pytest.raises(ConfigError, match="--ca"):
        args.func(args)


def test_connect_writes_a_flwr_connection(tmp_path: Path) -> None:
    (tmp_path / "ca.crt").write_text("x")
    path = write_connection("gv", "127.0.0.1:8000", str(tmp_path / "ca.crt"), flwr_home=tmp_path / "home")
    write_connection("other", "10.0.0.1:8000", str(tmp_path / "ca.crt"), flwr_home=tmp_path / "home")
    raw = tomllib.loads(path.read_text())
    assert raw["superlink"]["default"] == "gv"
    assert raw["superlink"]["gv"] == {"address": "127.0.0.1:8000", "root-certificates": str(tmp_path / "ca.crt")}
    assert raw["superlink"]["other"]["address"] == "10.0.0.1:8000"


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="graphveil")
    add_fed_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


# ------------------------------------------------------------------------------ partitions


def test_partition_is_disjoint_and_files_load_back_exactly(tmp_path: Path) -> None:
    import torch

    g = RelationalGraph(
        name="toy", entity_ids=[f"e{i}" for i in range(12)],
        edges=torch.tensor([[i, j] for i in range(12) for j in range(i + 1, 12) if (i + j) % 3 == 0]),
        texts=[f"text {i}" for i in range(12)], labels=torch.tensor([i % 2 for i in range(12)]), label_names=["x", "y"],
    )
    parts = partition_graph(g, 3, seed=1)
    ids = [set(p.entity_ids) for p in parts]
    assert sum(map(len, ids)) == 12 and set().union(*ids) == set(g.entity_ids)
    assert all(len(a & b) == 0 for i, a in enumerate(ids) for b in ids[i + 1:])
    # every kept edge lies inside one site; no edge crossing two sites is kept
    inside = {(g.entity_ids[u], g.entity_ids[v]) for u, v in g.edges.tolist()
              if any(g.entity_ids[u] in s and g.entity_ids[v] in s for s in ids)}
    kept = {(p.entity_ids[u], p.entity_ids[v]) for p in parts for u, v in p.edges.tolist()}
    assert {tuple(sorted(e)) for e in kept} == {tuple(sorted(e)) for e in inside}
    files = write_partition(g, 3, tmp_path, seed=1)
    for part, (edges, entities) in zip(parts, files, strict=True):
        back = load_edge_list(edges, entities)
        assert back.entity_ids == part.entity_ids and back.texts == part.texts
        assert {tuple(e) for e in back.edges.tolist()} == {tuple(e) for e in part.edges.tolist()}
    with pytest.raises(ConfigError):
        partition_graph(g, 13)


def test_waiting_for_a_run_polls_less_often_as_it_ages(monkeypatch) -> None:
    """Each status poll is a ``flwr list`` process (~1.8 s CPU): ``--wait`` polls every 2 s at
    first, then every tenth of the time waited, at most 30 s, and returns at ``finished``."""
    from graphveil.connectors.flower import control

    clock = {"t": 0.0}
    sleeps: list[float] = []
    monkeypatch.setattr(control.time, "monotonic", lambda: clock["t"])

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        clock["t"] += seconds

    monkeypatch.setattr(control.time, "sleep", sleep)
    monkeypatch.setattr(control, "run_status", lambda run_id, connection: {
        "status": "finished:completed" if clock["t"] >= 600 else "running"})
    assert control.wait_for_run(7, None, timeout=3600)["status"] == "finished:completed"
    assert sleeps[0] == 2.0 and max(sleeps) == 30.0
    assert all(b >= a for a, b in zip(sleeps[:-1], sleeps[1:], strict=True))  # never more often later
    assert len(sleeps) < 60  # a fixed 2 s would have polled 300 times in 600 s
    monkeypatch.setattr(control, "run_status", lambda run_id, connection: {"status": "running"})
    clock["t"], sleeps[:] = 0.0, []
    with pytest.raises(control.FlowerError, match="still 'running' after 100 s"):
        control.wait_for_run(7, None, timeout=100)
    assert clock["t"] <= 100 + 30
