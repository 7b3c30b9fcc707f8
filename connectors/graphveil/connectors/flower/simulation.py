"""Many sites on one machine: the GraphVeil Flower app on Flower's Simulation Engine (Ray).

``graphveil fed simulate CONFIG --sites N`` splits one graph among ``N`` virtual sites and runs
the SAME ServerApp and ClientApp a deployment runs (the bundled app's components,
``graphveil_fed.server_app:app`` / ``graphveil_fed.client_app:app``) on Flower's simulation
runtime, the way Flower's own ``flwr-simulation`` process runs an app (a ``Run`` whose app folder
holds the task, the ServerApp in a thread, one Ray actor per running ClientApp: Flower's
``flwr.simulation.run_simulation._run_simulation``, which its ``flwr-simulation`` process calls;
the public ``run_simulation`` hands the apps an empty run config, and ``flwr run`` on a local
simulation federation starts a detached SuperLink on a fixed port). Each virtual
SuperNode is a site with its own part of the graph, its own node config (its policy and budget)
and its own ledger, made by ``graphveil budget init`` as a real site's is.

**How a virtual node finds its node config.** Flower gives every simulated node only
``partition-id`` and ``num-partitions`` as its node config. Before the run this module writes
``<out>/sites/site-<i>/node-config.toml`` for every site and ``<out>/sites.json`` (partition id →
node config path), and points the environment variable
:data:`~.settings.SITES_ENV` at it; the ClientApp's :func:`~.settings.site_node_config` reads
the site's node config from there. The mapping comes from the
environment of the site's own process (Ray's workers inherit the driver's), never from the
server's messages or run config, so a server cannot point a site at another site's settings;
a deployed SuperNode (whose node config has its own ``site-name``) is never affected.

CONFIG is a GraphVeil run config (what ``graphveil run`` reads; its ``data`` names the WHOLE
graph to split), with three sections of its own (:class:`SimulationConfig`): ``federation``
(the app's federation keys: ``local-steps``, ``strategy``, ...), ``site`` (every site's node
config: ``epsilon-budget``, ``delta``, ``privacy-unit``, ...) and ``sites`` (per-site changes,
e.g. ``{site-3: {epsilon-budget: 0.5}}``). Everything else but ``name``, ``seed``, ``output`` and
``sweep`` is the shared task (``task.*`` of the app's run config); ``seed`` seeds the split;
``data.split``, if given, becomes every site's ``site-config`` (the split of its own part).

Nothing is written before every input is checked (the config, the sites' node configs, the
graph and its split, the output folder): bad input exits 2 with the problem named.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import math
import os
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from graphveil.connectors.flower.control import FLOWER_ENV
from graphveil.connectors.flower.settings import (
    SITES_ENV,
    FederationSettings,
    SiteSettings,
    _flatten,
    task_family,
    task_kind,
)
from graphveil.contract.errors import ConfigError
from graphveil.run.config import read_yaml_file

#: ``--partition`` names → :data:`graphveil.data.partition.KINDS`.
PARTITIONS = {"random": "random", "label-skew": "labels", "communities": "communities"}
#: A site's ``site-config`` holding the config's ``data.split`` (the split of each site's part).
SITE_CONFIG_FILE = "site-config.yaml"
#: Run-config keys that are not part of the shared task.
_NOT_TASK = ("data", "name", "seed", "output", "sweep", "federation", "site", "sites")
#: Ray's object store: Flower passes each round's arrays through it; adapters and GNN weights are
#: small, and the machine is shared (Ray's default takes 30 % of the RAM).
OBJECT_STORE_BYTES = 100 * 2**20


# ------------------------------------------------------------------------------ the config


@dataclass
class SimulationConfig:
    """CONFIG of ``graphveil fed simulate``: the run config (the whole graph's ``data``, the task)
    and the simulation's own sections."""

    path: Path
    run: dict[str, Any]
    federation: dict[str, Any] = field(default_factory=dict)
    site: dict[str, Any] = field(default_factory=dict)
    sites: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SimulationConfig:
        path = Path(path)
        raw = read_yaml_file(path, "simulation config")
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of sections (data, sampler, ..., site)")
        sections = {}
        for key in ("federation", "site", "sites"):
            value = raw.get(key, {}) or {}
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: {key}: expected a mapping, got {type(value).__name__}")
            sections[key] = value
        if not isinstance(raw.get("data"), dict):
            raise ConfigError(f"{path}: data: name the graph to split among the sites (a mapping, as in a "
                              "run config)")
        for name, over in sections["sites"].items():
            if not isinstance(over, dict):
                raise ConfigError(f"{path}: sites.{name}: expected a mapping of node config keys")
        return cls(path, {k: v for k, v in raw.items() if k not in ("federation", "site", "sites")},
                   sections["federation"], sections["site"], sections["sites"])

    def task(self) -> dict[str, Any]:
        """The shared task: the run config without the graph and the run-only sections."""
        return {k: copy.deepcopy(v) for k, v in self.run.items() if k not in _NOT_TASK}

    @property
    def seed(self) -> int:
        return int(self.run.get("seed", 0) or 0)


@dataclass
class Resources:
    """Ray resources: per virtual site (Flower's ``client_resources``) and for the whole runtime."""

    cpus_per_site: float = 1.0
    gpus_per_site: float = 0.0
    total_cpus: int = 1
    total_gpus: int = 0

    @classmethod
    def checked(cls, cpus_per_site: float, gpus_per_site: float, sites: int = 1) -> Resources:
        """Ray gets this process's cores, but no more than ``sites`` virtual sites use at once:
        Flower starts one actor (a process importing torch) per ``cpus_per_site`` cores Ray has,
        whatever the number of sites."""
        total = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if not 0 < cpus_per_site <= total:
            raise ConfigError(f"--cpus-per-site {cpus_per_site:g}: give a number in (0, {total}] (this "
                              f"machine's cores: {total})")
        gpus = 0
        if gpus_per_site < 0:
            raise ConfigError(f"--gpus-per-site {gpus_per_site:g}: must be >= 0")
        if gpus_per_site > 0:
            import torch

            gpus = torch.cuda.device_count()
            if not gpus or gpus_per_site > gpus:
                raise ConfigError(f"--gpus-per-site {gpus_per_site:g}: this machine has {gpus} CUDA GPU(s)")
        return cls(cpus_per_site, gpus_per_site, min(total, math.ceil(sites * cpus_per_site)),
                   min(gpus, math.ceil(sites * gpus_per_site)))

    def backend_config(self) -> dict[str, Any]:
        """Flower's ``backend_config``: ``client_resources`` per virtual site, Ray kept small."""
        return {
            "client_resources": {"num_cpus": self.cpus_per_site, "num_gpus": self.gpus_per_site},
            "init_args": {"num_cpus": self.total_cpus, "num_gpus": self.total_gpus,
                          "include_dashboard": False, "object_store_memory": OBJECT_STORE_BYTES,
                          "logging_level": "ERROR", "log_to_driver": True},
        }

    @property
    def concurrent_sites(self) -> int:
        """Virtual sites training at once (Ray actors that fit)."""
        by_cpu = int(self.total_cpus // self.cpus_per_site)
        return min(by_cpu, int(self.total_gpus // self.gpus_per_site)) if self.gpus_per_site else by_cpu


@dataclass
class Plan:
    """Everything checked, nothing written: the app's run config, each site's part of the graph
    and node config."""

    config: SimulationConfig
    out: Path
    fed: FederationSettings
    app_config: dict[str, Any]
    task_kind: str
    parts: list[Any]
    partition: Any
    node_configs: list[dict[str, Any]]
    resources: Resources


def site_name(index: int) -> str:
    return f"site-{index + 1}"


def plan(config_path: str | os.PathLike[str], *, sites: int, partition: str = "random", alpha: float = 0.5,
         rounds: int | None = None, out: str | os.PathLike[str] = "graphveil-sim",
         cpus_per_site: float = 1.0, gpus_per_site: float = 0.0) -> Plan:
    """Check every input and split the graph (in memory); raises :class:`ConfigError` (or another
    :class:`~graphveil.contract.errors.GraphVeilError`) naming the problem. Writes nothing."""
    if sites < 1:
        raise ConfigError(f"--sites {sites}: a simulation needs at least 1 site")
    if partition not in PARTITIONS:
        raise ConfigError(f"--partition {partition!r}: choose one of {', '.join(PARTITIONS)}")
    if rounds is not None and rounds < 1:
        raise ConfigError(f"--rounds {rounds}: at least 1 round")
    if not alpha > 0:
        raise ConfigError(f"--alpha {alpha:g}: must be > 0")
    resources = Resources.checked(cpus_per_site, gpus_per_site, sites)
    config = SimulationConfig.load(config_path)
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("graphveil fed simulate needs Flower's Simulation Engine (Ray): "
                          "pip install 'graphveil[simulation]'")
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty folder (a simulation writes its sites' "
                          "data, node configs and ledgers there: choose a new folder)")
    unknown = sorted(set(config.sites) - {site_name(i) for i in range(sites)})
    if unknown:
        raise ConfigError(f"{config.path}: sites.{unknown[0]}: no such site (the sites are site-1 … "
                          f"site-{sites})")
    fed = _federation(config, sites, rounds, out)
    task_kind = _task_kind(fed)  # the task validated as a RunConfig in _federation (no data read)
    node_configs = [_node_config(config, i, out, task_kind, resources) for i in range(sites)]
    parts, split = _split(config, sites, PARTITIONS[partition], alpha, task_kind)
    app_config = {k: v for k, v in fed.to_run_config().items() if v is not None}  # TOML has no null
    return Plan(config, out, fed, app_config, task_kind, parts, split, node_configs, resources)


def _federation(config: SimulationConfig, sites: int, rounds: int | None, out: Path) -> FederationSettings:
    values: dict[str, Any] = {"min-sites": sites, "sites-timeout": 60.0, "seed": config.seed,
                              **config.federation}
    for key in ("output-dir", "ledger-witness"):
        if key in values:
            raise ConfigError(f"{config.path}: federation.{key}: a simulation writes under --out")
    if rounds is not None:
        values["num-server-rounds"] = rounds
    values["output-dir"] = str(out / "server")
    flat = {**values, **{f"task.{k}": v for k, v in _flatten(config.task()).items()}}
    return FederationSettings.from_run_config(flat, f"{config.path} (federation and task)")


def _task_kind(fed: FederationSettings) -> str:
    from graphveil.contract.host import default_host

    config = fed.check_task()
    family = task_family(default_host(), config.task.name)
    kind = task_kind(family)
    if kind is not None:
        return kind
    raise ConfigError(f"task.name {config.task.name!r}: a {family!r}-family task cannot be federated "
                      f"(relational or node-classification tasks only)")


def _node_config(config: SimulationConfig, index: int, out: Path, task_kind: str,
                 resources: Resources) -> dict[str, Any]:
    """Site ``index``'s node config (checked): ``site``, then ``sites.<name>``, then what the
    simulation fixes (name, data files, ledger, task kind)."""
    name = site_name(index)
    folder = out / "sites" / name
    data = ({"data-source": "pyg", "data-path": str(folder / "graph.pt")} if task_kind == "node_classification"
            else {"data-source": "edge_list", "data-path": str(folder / "edges.tsv"),
                  "data-entities": str(folder / "entities.jsonl")})
    values = {"threads": max(1, int(resources.cpus_per_site)), **config.site, **config.sites.get(name, {})}
    for key in ("site-name", "ledger", "task-kind", *data):
        if key in values:
            raise ConfigError(f"{config.path}: site.{key}: a simulation sets it for each site")
    values.update({"site-name": name, "task-kind": task_kind, "ledger": str(folder / "ledger.sqlite"), **data})
    if "split" in config.run["data"] and "site-config" not in values:  # the config's split, at every site
        values["site-config"] = str(folder / SITE_CONFIG_FILE)
    SiteSettings.from_mapping(values, f"{config.path}: node config of {name} (site, sites.{name})")
    return values


def _split(config: SimulationConfig, sites: int, kind: str, alpha: float, task_kind: str) -> tuple[list[Any], Any]:
    """Load the whole graph as a run reads it and split it (:mod:`graphveil.data.partition`)."""
    from graphveil.connectors.flower.partition import load_source
    from graphveil.connectors.flower.site import _as_node_graph
    from graphveil.contract.errors import DataError, GraphVeilError
    from graphveil.data import NodeGraph
    from graphveil.data.partition import partition_graph

    data = {k: v for k, v in config.run["data"].items() if k != "split"}
    graph = load_source(**data)
    if task_kind == "node_classification" and not isinstance(graph, NodeGraph):
        graph = _as_node_graph(graph)
    elif task_kind == "relational" and (isinstance(graph, NodeGraph) or getattr(graph, "texts", None) is None):
        raise DataError(f"{config.path}: data: a relational task needs entity texts; graph "
                        f"{getattr(graph, 'name', '?')!r} has none")
    try:
        split = partition_graph(graph, sites, kind=kind, seed=config.seed, alpha=alpha)
    except GraphVeilError as exc:  # too many sites for the graph (or for α)
        raise type(exc)(f"{config.path}: --sites {sites} --partition {kind}: {exc}") from exc
    return split.parts(graph), split


# ------------------------------------------------------------------------------ writing and running


def write(p: Plan) -> Path:
    """Write the app, each site's data, node config and (initialised) ledger, and ``sites.json``;
    returns ``sites.json``. Called only after :func:`plan` checked everything."""
    from graphveil.connectors.flower.loopback import write_app, write_node_config
    from graphveil.connectors.flower.partition import write_node_graph, write_site_files
    from graphveil.ledger import init_ledger

    p.out.mkdir(parents=True, exist_ok=True)
    write_app(p.out / "app", p.app_config)
    listing = {}
    for i, (part, values) in enumerate(zip(p.parts, p.node_configs, strict=True)):
        folder = Path(values["ledger"]).parent
        if p.task_kind == "node_classification":
            write_node_graph(part, folder)
        else:
            write_site_files(part, folder)
        if values.get("site-config") == str(folder / SITE_CONFIG_FILE):
            (folder / SITE_CONFIG_FILE).write_text(
                yaml.safe_dump({"data": {"split": p.config.run["data"]["split"]}}), encoding="utf-8")
        toml = write_node_config(folder / "node-config.toml", values)
        init_ledger(values["ledger"], site=values["site-name"]).close()  # as `graphveil budget init`
        listing[str(i)] = str(toml)
    sites_json = p.out / "sites.json"
    sites_json.write_text(json.dumps(listing, indent=2), encoding="utf-8")
    return sites_json


def run(p: Plan, sites_json: Path) -> dict[str, Any]:
    """Run the app on Flower's simulation runtime (Ray), as Flower's ``flwr-simulation`` does;
    returns the simulation summary it also writes to ``<out>/summary.json``."""
    import tomllib
    from dataclasses import replace

    for key, value in FLOWER_ENV.items():  # no telemetry, no update check (before flwr reads them)
        os.environ.setdefault(key, value)
    from flwr.app import Context, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    app = p.out / "app"
    components = tomllib.loads((app / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["flwr"]["app"]["components"]
    run_id = secrets.randbits(63)
    flower_run = replace(Run.create_empty(run_id), primary_task_id=secrets.randbits(63),
                         federation_id=NOOP_FEDERATION_ID)
    # Flower builds messages only inside a task: the ServerApp's, as flwr-simulation's process is one.
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(p.app_config))
    os.environ[SITES_ENV] = str(sites_json)  # before Ray starts: its workers inherit it
    logging.getLogger("flwr").propagate = False  # Flower prints its own log; not twice through ours
    started = time.monotonic()
    error = None
    try:
        _run_simulation(
            server_app_attr=components["serverapp"], client_app_attr=components["clientapp"],
            num_supernodes=len(p.node_configs), backend_name="ray", backend_config=p.resources.backend_config(),
            app_dir=str(app), run=flower_run, server_app_context=context, is_app=True,
            exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE)
    except Exception as exc:  # the ServerApp's error (e.g. too few sites): recorded, exit 1
        error = f"{type(exc).__name__}: {exc}"
    finally:
        _stop_ray()
    seconds = time.monotonic() - started
    return _summarise(p, run_id, seconds, error)


def _stop_ray() -> None:
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # pragma: no cover - Ray's own shutdown noise
        pass


def _summarise(p: Plan, run_id: int, seconds: float, error: str | None) -> dict[str, Any]:
    """What each site's ledger holds (read locally: the simulation owns every site) and the
    server's own summary."""
    from graphveil.ledger import PrivacyLedger

    server = p.out / "server" / f"run-{run_id}" / "summary.json"
    server_summary = json.loads(server.read_text(encoding="utf-8")) if server.is_file() else {}
    sites = {}
    for values in p.node_configs:
        with PrivacyLedger(values["ledger"], create=False) as ledger:
            entries = ledger.entries()
            sites[values["site-name"]] = {
                "epsilon": ledger.spent_epsilon(), "epsilon-budget": float(values["epsilon-budget"]),
                "entries": [e.status for e in entries], "steps": ledger.total_steps()}
    status = "failed" if error or server_summary.get("status") != "completed" else "completed"
    summary = {"status": status, "error": error or server_summary.get("error"), "run-id": run_id,
               "sites": len(p.node_configs), "task-kind": p.task_kind,
               "partition": p.partition.summary(), "rounds": p.fed.num_server_rounds,
               "local-steps": p.fed.local_steps, "seconds": seconds,
               "resources": {"cpus-per-site": p.resources.cpus_per_site, "gpus-per-site": p.resources.gpus_per_site,
                             "cpus": p.resources.total_cpus, "concurrent-sites": p.resources.concurrent_sites},
               "server-run": str(server.parent), "site-ledgers": sites}
    (p.out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary


def format_summary(summary: Mapping[str, Any]) -> str:
    lines = [f"simulation {summary['status']}: {summary['sites']} sites, {summary['rounds']} rounds × "
             f"{summary['local-steps']} local steps in {summary['seconds']:.1f} s "
             f"({summary['resources']['concurrent-sites']} at once)"]
    if summary.get("error"):
        lines.append(f"error: {summary['error']}")
    lines.append(f"{'site':<10} {'ε spent':>10} {'budget':>10}  ledger entries")
    for name, site in summary["site-ledgers"].items():
        lines.append(f"{name:<10} {site['epsilon']:>10.4g} {site['epsilon-budget']:>10.4g}  "
                     f"{', '.join(site['entries']) or '-'}")
    lines.append(f"server run: {summary['server-run']}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ the command


def cmd_fed_simulate(args: argparse.Namespace) -> int:
    p = plan(args.config, sites=args.sites, partition=args.partition, alpha=args.alpha, rounds=args.rounds,
             out=args.out, cpus_per_site=args.cpus_per_site, gpus_per_site=args.gpus_per_site)
    summary = run(p, write(p))
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    sys.stdout.flush()
    return 0 if summary["status"] == "completed" else 1


def add_simulate_parser(fsub: Any) -> argparse.ArgumentParser:
    p = fsub.add_parser(
        "simulate", help="run the federation's ServerApp and ClientApp with N virtual sites on Flower's "
                         "Simulation Engine (Ray), each with its own part of the graph, node config and ledger")
    p.add_argument("config", metavar="CONFIG", help="simulation config YAML: a run config (data = the whole graph) with "
                                  "optional federation, site and sites sections")
    p.add_argument("--sites", type=int, required=True, metavar="N", help="number of virtual sites (>= 1)")
    p.add_argument("--partition", choices=tuple(PARTITIONS), default="random",
                   help="how the graph is split: random nodes, label skew (Dirichlet --alpha) or connected "
                        "communities (default: random)")
    p.add_argument("--alpha", type=float, default=0.5, metavar="A", help="Dirichlet α of --partition label-skew (default 0.5)")
    p.add_argument("--rounds", type=int, metavar="R", help="server rounds (default: federation.num-server-rounds, else 2)")
    p.add_argument("--cpus-per-site", type=float, default=1.0, metavar="C",
                   help="CPU cores reserved for each virtual site while it trains (Flower's client_resources "
                        "num_cpus; default 1): cores / this = sites training at once")
    p.add_argument("--gpus-per-site", type=float, default=0.0, metavar="G",
                   help="GPU share of each virtual site (e.g. 0.25: four sites per GPU; default 0)")
    p.add_argument("--out", default="graphveil-sim", metavar="DIR",
                   help="new folder for the app, each site's data, node config and ledger, and the server's "
                        "run (default: graphveil-sim)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_fed_simulate)
    return p
