"""Federation overhead: a loopback federation round (three sites by default) vs the sites' local training.

Run from a source checkout (it starts SuperLink/SuperNodes through ``deploy/scripts``)::

    python bench/federation_overhead.py [--rounds 3] [--sites 3] [--local-steps 10] [--cache both|on|off]
                                        [--model tiny-bert]

The realistic round is the shipped app's default task (``connectors/graphveil/connectors/flower/app/pyproject.toml``:
MiniLM + LoRA, 10 local steps, batch 64, held-out evaluation at each site) on a third of the
bundled CiteSeer text graph per site; ``--model tiny-bert`` (max_length 16) is the small case.
Each site runs with ``threads = 1`` and ``share-utility-metrics = true`` (so it evaluates).
Three sites share this machine's cores (on 2 cores, a site that starts late finishes alone on one
core); ``--sites 1`` measures one site's round without that, as on a site's own machine.

* ``local``      the local training of a round: in warm processes started together (one
                 per site, the same contention as the federation's sites), each having
                 prepared its session, the local DP steps and the held-out evaluation; the
                 slowest site's wall time (from one "go" to the last site done), best of two
                 tries before and two after the federation;
* ``federated``  wall time of a server round from the server's round log (send the adapter,
                 every site runs its round in a guarded ClientApp process, replies,
                 aggregation), with the site's prepared cache (``prepared-cache``, the frozen
                 encoder layers' outputs kept between rounds) and, in the same run, without it
                 (``--cache both``, default); each site's guard forks the round's ClientApp
                 process from its fork server (``--fork-server off``: a fresh process per task).

Overhead = (federated round − local) / local. Where the rest goes, for each round's slowest
site, from the server's timestamps (``rounds.jsonl``) and the site's timing log line: ``to
site`` (message to the SuperNode, the executor's poll, the ClientApp process and Flower's task
pull, the FAB check), ``setup`` (config, model, graph, frozen states), ``train`` + ``evaluate``,
``other`` (configs, policy, ledger reads, reservation and release, lifecycle reporting: the
site's ``checks``, ``reserve``, ``release``, ``report`` laps), ``back`` (reply to the server) and
``aggregate``. Results: a table on stdout and ``federation_overhead.json`` in ``--out``.

GraphVeil's own overhead per round at a site, apart from Flower's waits (``--site-only``)::

    python bench/federation_overhead.py --site-only [--site-steps 10 40] [--rounds 3] [--model minilm]

Flower's SuperNode sleeps a fixed 3 s whenever a pull finds no message
(``flwr/supernode/start_client_internal.py``, ``time.sleep(3)`` in the pull loop, flwr 1.41.0),
so a round's wall time includes up to 3 s (1.5 s on average) that no GraphVeil setting reaches.
This mode leaves Flower's transport out and times what GraphVeil does per round at one site, the
way the site's guard runs it: this process imports what the guard's fork server imports
(:func:`graphveil.connectors.flower.guard.preimport`), then for every round FORKS a child (a
task's process), which deserialises the server's message content as Flower's object store
holds it (inflate), runs :func:`graphveil.connectors.flower.site.handle_train` with the real
session on a real train message (the server's adapter, the app's task, the site's node config,
ledger and prepared cache), and serialises the reply (deflate). The site's own timing line
gives the parts: ``checks`` (configs, policy, arrays' values, ledger opened), ``setup``
(session assembled, accountant bound from public numbers), ``reserve`` (spend reserved, graph
and frozen states loaded, arrays loaded), ``train``, ``release``, ``evaluate`` (held-out scores,
only at a site that set ``share-utility-metrics``; on here), ``report`` (lifecycle plugins).
GraphVeil's overhead = everything but ``train``. Goals: ≤ 1 s per round per site beyond
Flower's waits, and ≤ 10 % of the round at 40 local steps (overhead / (overhead + train), paired:
the same round). Round 1 misses the prepared cache (the frozen layers run over every entity,
once per site), so the goals are judged on rounds 2 onwards. ``--profile`` also prints where a
round's overhead goes (cProfile of one extra round with 1 local step).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROUNDS = 3
TIMINGS = re.compile(
    r"site (?P<site>\S+) round (?P<round>\d+) timings: started (?P<started>[\d.]+) ended (?P<ended>[\d.]+) "
    r"\(unix s\); (?P<parts>.*?); cpu (?P<cpu>[\d.]+) s; prepared cache (?P<cache>.*)$", re.M)


def _site_config(node_config: Path, run_config: dict, seed: int = 0):
    from graphveil.connectors.flower.settings import (
        FederationSettings,
        SiteSettings,
        site_run_config,
    )

    return site_run_config(FederationSettings.from_run_config(run_config), SiteSettings.from_toml(node_config), seed=seed)


def _app_run_config(overrides: dict) -> dict:
    import tomllib

    from flwr.common.config import flatten_dict

    from graphveil.connectors.flower.loopback import APP

    raw = tomllib.loads((APP / "pyproject.toml").read_text())
    return {**flatten_dict(raw["tool"]["flwr"]["app"]["config"]), **overrides}


def _load() -> float:
    return os.getloadavg()[0]


def warm_site(node_config: Path, run_config_json: str) -> None:
    """The ``--warm-site`` mode (one process per site): prepare the session, say ``ready``, then
    for every ``go`` line on stdin run one round's local steps and evaluation and print their
    seconds (wall and CPU)."""
    run_config = json.loads(run_config_json)
    from graphveil.run.session import TrainingSession

    config = _site_config(node_config, run_config)
    import torch

    torch.set_num_threads(config.threads or 1)
    session = TrainingSession(config)
    session.prepare()
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        wall, cpu = time.perf_counter(), time.process_time()
        session.train(int(run_config["local-steps"]))
        session.evaluate()
        print(json.dumps({"seconds": time.perf_counter() - wall, "cpu": time.process_time() - cpu}), flush=True)


def local_rounds(configs: dict[str, Path], run_config: dict, tries: int, env: dict) -> list[dict]:
    """``tries`` local rounds of the sites at once in warm processes (see the module note)."""
    procs = [subprocess.Popen([sys.executable, __file__, "--warm-site", str(path), json.dumps(run_config)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for path in configs.values()]
    out = []
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"warm site process failed (exit {p.wait()})")
        for _ in range(tries):
            load, started = _load(), time.perf_counter()
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            sites = [json.loads(p.stdout.readline()) for p in procs]
            out.append({"seconds": time.perf_counter() - started, "sites": sites, "load": load})
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()
    return out


def round_parts(rounds: list[dict], site_log: str) -> list[dict]:
    """Each round's parts (seconds) for its slowest site, from the server's round records and
    the sites' timing lines."""
    timings: dict[int, list[dict]] = {}
    for m in TIMINGS.finditer(site_log):
        parts = {k: float(v.split()[0]) for k, v in (p.split(" ", 1) for p in m["parts"].split(", "))}
        timings.setdefault(int(m["round"]), []).append({
            "site": m["site"], "started": float(m["started"]), "ended": float(m["ended"]),
            "cpu": float(m["cpu"]), "cache": m["cache"].strip(), **parts})
    out = []
    for r in rounds:
        sites = timings.get(r["round"], [])
        if not sites or r.get("started-at") is None:
            out.append({"round": r["round"], "seconds": r["seconds"]})
            continue
        slow = max(sites, key=lambda s: s["ended"])
        inside = slow["ended"] - slow["started"]
        known = slow.get("setup", 0) + slow.get("train", 0) + slow.get("evaluate", 0)
        out.append({
            "round": r["round"], "seconds": r["seconds"], "slowest_site": slow["site"],
            "to_site": slow["started"] - r["started-at"], "setup": slow.get("setup"),
            "train": slow.get("train"), "evaluate": slow.get("evaluate"), "other": inside - known,
            "back": r["replies-at"] - slow["ended"],
            "aggregate": r["seconds"] - (r["replies-at"] - r["started-at"]),
            "slowest_site_parts": slow,
            "site_cpu": {s["site"]: s["cpu"] for s in sites},
            "site_setup": {s["site"]: s.get("setup") for s in sites},
            "cache": {s["site"]: s["cache"] for s in sites}})
    return out


#: the goals of GraphVeil's own overhead per round at a site (issue 28, point 5)
GOAL_SECONDS, GOAL_SHARE, GOAL_STEPS = 1.0, 0.10, 40
#: the site's timing parts that are not training
OWN_PARTS = ("checks", "setup", "reserve", "release", "evaluate", "report")
#: what the round's parts are made of: (module, class or "", function, label); timed in the
#: forked round process by wrapping them (nested ones overlap: the model load is inside assemble)
INNER = (
    ("graphveil.ledger", "PrivacyLedger", "__init__", "ledger opened"),
    ("graphveil.run.session", "TrainingSession", "assemble", "session assembled"),
    ("graphveil.plugins.hf_lora.encoder", "", "_load", "  of it: model weights loaded"),
    ("graphveil.plugins.hf_lora.encoder", "", "add_lora", "  of it: LoRA injected"),
    ("graphveil.ledger", "PrivacyLedger", "reserve", "ledger reserve"),
    ("graphveil.data", "", "load_data", "graph loaded"),
    ("graphveil.run.session", "TrainingSession", "bind_accounting", "accountant bound"),
    ("graphveil.plugins.hf_common", "CachedLoraEncoder", "prepare", "frozen states (prepared cache)"),
    ("graphveil.plugins.hf_common", "", "frozen_key", "  of it: cache key (weights, texts)"),
    ("graphveil.run.prepared_cache", "PreparedCache", "load_or_compute", "  of it: cache file read"),
    ("graphveil.run.session", "TrainingSession", "load_trainable_state", "server arrays loaded"),
    ("graphveil.ledger", "PrivacyLedger", "release", "ledger release"),
    ("graphveil.run.session", "TrainingSession", "evaluate", "held-out evaluation"),
    ("graphveil.connectors.flower.records", "", "trained_content", "reply built"),
)


def _time_inner(seconds: dict[str, float]) -> None:
    """Wrap every :data:`INNER` function so that its seconds add up in ``seconds``."""
    import functools
    import importlib

    for module, cls, name, label in INNER:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, _fn=fn, _label=label, **kwargs):  # noqa: ANN002, ANN003, ANN202
            t0 = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                seconds[_label] = seconds.get(_label, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)


def _site_round(conn, content_objects: dict[str, bytes], root_id: str, node_config: dict, run_config: dict,
                profile: bool) -> None:
    """One round in a forked child (a task's process): inflate, handle_train, deflate; the
    seconds of each and the site's timing line go back through ``conn``."""
    import logging

    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    from graphveil.connectors.flower.guard import _reseed_inherited_rngs
    from graphveil.connectors.flower.site import handle_train, log

    _reseed_inherited_rngs()
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log.addHandler(Keep())
    log.setLevel(logging.INFO)
    inner: dict[str, float] = {}
    _time_inner(inner)
    context = _context(node_config, run_config)
    t0 = time.perf_counter()
    content = inflate_object_from_contents(root_id, dict(content_objects))
    t1 = time.perf_counter()
    if profile:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        reply = prof.runcall(handle_train, content, context)
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
    else:
        reply = handle_train(content, context)
    t2 = time.perf_counter()
    objects = {oid: obj.deflate() for oid, obj in get_all_nested_objects(reply).items()}
    t3 = time.perf_counter()
    timing = next((m for m in map(TIMINGS.search, lines) if m), None)
    conn.send({"deserialise": t1 - t0, "handle_train": t2 - t1, "serialise": t3 - t2,
               "reply": (reply.object_id, objects), "status": str(reply["site"]["status"]),
               "parts": None if timing is None else _parts(timing), "log": lines, "inner": inner,
               "profile": text.getvalue() if profile else None})
    conn.close()


def _context(node_config: dict, run_config: dict):
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config=run_config)


def _parts(m: re.Match) -> dict[str, float]:
    return {k: float(v.split()[0]) for k, v in (p.split(" ", 1) for p in m["parts"].split(", "))}


def _initial(conn, run_config: dict) -> None:
    """The server's initial adapter (in a forked child: no torch operation in the parent)."""
    from graphveil.connectors.flower.server import build_encoder
    from graphveil.connectors.flower.settings import FederationSettings

    encoder = build_encoder(FederationSettings.from_run_config(run_config))
    conn.send({k: v.detach().numpy().copy() for k, v in encoder.trainable_state().items()})
    conn.close()


def _forked(target, *args):  # noqa: ANN001, ANN202 - any picklable result
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe(duplex=False)
    child = ctx.Process(target=target, args=(there, *args))
    child.start()
    there.close()
    try:
        result = here.recv()
    except EOFError:
        child.join()
        raise SystemExit(f"bench: the forked round process failed (exit {child.exitcode})") from None
    child.join()
    return result


def site_only(args: argparse.Namespace, root: Path, env_overrides: dict) -> dict:
    """GraphVeil's own per-round overhead at one site (the module note's ``--site-only``)."""
    import tomllib

    import torch
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
    from flwr.supercore.inflatable.inflatable_utils import inflate_object_from_contents

    from graphveil.connectors.flower import records
    from graphveil.connectors.flower.guard import preimport
    from graphveil.connectors.flower.loopback import write_node_config
    from graphveil.connectors.flower.partition import write_partition
    from graphveil.data import load_bundled_citeseer
    from graphveil.ledger import init_ledger

    os.environ.update(env_overrides)
    started = time.perf_counter()
    preimport()
    print(f"preimport (the fork server's, once per site): {time.perf_counter() - started:.1f} s", flush=True)
    edges, entities = write_partition(load_bundled_citeseer(), 3, root / "data", seed=0)[0]
    out: dict[str, list[dict]] = {}
    for steps in args.site_steps:
        overrides = {"num-server-rounds": args.rounds, "min-sites": 1, "local-steps": steps}
        if args.batch_size is not None:
            overrides["task.sampler.batch_size"] = args.batch_size
        if args.model == "tiny-bert":
            overrides.update({"task.encoder.model": "tiny-bert", "task.encoder.max_length": 16})
        run_config = _app_run_config(overrides)
        tag = f"site-only-{steps}"
        ledger = root / tag / "ledger.sqlite"
        ledger.parent.mkdir(parents=True, exist_ok=True)
        init_ledger(ledger, site="site-1").close()
        path = write_node_config(root / tag / "node.toml", {
            "site-name": "site-1", "data-source": "edge_list", "data-path": str(edges),
            "data-entities": str(entities), "epsilon-budget": 1e4, "delta": 1e-5, "privacy-unit": "edge",
            "min-records": 64, "ledger": str(ledger), "threads": 1, "share-utility-metrics": True,
            "prepared-cache": str(root / tag / "cache")})
        node_config = tomllib.loads(path.read_text(encoding="utf-8"))
        state = _forked(_initial, run_config)
        rounds = out.setdefault(str(steps), [])
        for r in range(1, args.rounds + 1 + int(args.profile and steps == args.site_steps[-1])):
            profile = r > args.rounds  # one extra round, profiled, with 1 local step
            content = records.train_content(
                records.arrays_from_state({k: torch.from_numpy(v) for k, v in state.items()}), r,
                1 if profile else steps)
            objects = {oid: obj.deflate() for oid, obj in get_all_nested_objects(content).items()}
            load = _load()
            res = _forked(_site_round, objects, content.object_id, node_config, run_config, profile)
            if res["parts"] is None or res["status"] != records.TRAINED:
                raise SystemExit(f"bench: round {r} at {steps} steps did not train ({res['status']}):\n"
                                 + "\n".join(res["log"][-5:]))
            reply = inflate_object_from_contents(*res["reply"])
            state = {k: v.numpy() for k, v in reply[records.ARRAYS].items()}
            if profile:
                print(f"\nprofile of round {r} (1 local step), cumulative:\n{res['profile']}")
                continue
            parts = res["parts"]
            own = sum(parts.get(k, 0.0) for k in OWN_PARTS) + res["deserialise"] + res["serialise"]
            row = {"round": r, "load": load, **parts, "deserialise": res["deserialise"],
                   "serialise": res["serialise"], "handle_train": res["handle_train"], "own": own,
                   "own_without_evaluate": own - parts.get("evaluate", 0.0),
                   "share": own / (own + parts["train"]), "inner": res["inner"]}
            rounds.append(row)
            print(f"{steps} steps, round {r}: train {parts['train']:.2f} s, GraphVeil's own {own:.2f} s "
                  f"({row['share']:.1%} of the round), load {load:.1f}", flush=True)
    return out


def print_site_only(result: dict[str, list[dict]]) -> None:
    warm = [row for rows in result.values() for row in rows if row["round"] > 1]
    if warm:
        print("\nwhere GraphVeil's own seconds go, warm rounds (median, min-max; nested rows overlap):")
        for _, _, _, label in INNER:
            values = [row["inner"].get(label, 0.0) for row in warm]
            print(f"  {label:34s} {statistics.median(values):6.3f}  ({min(values):.3f}-{max(values):.3f})")
    cols = ("checks", "setup", "reserve", "release", "evaluate", "report", "deserialise", "serialise")
    print("\nGraphVeil's own work per round at one site (s), apart from Flower's waits; goals: own ≤ "
          f"{GOAL_SECONDS:g} s per round, own ≤ {GOAL_SHARE:.0%} of the round at {GOAL_STEPS} local steps")
    print("steps round  load  " + "  ".join(f"{c:>8}" for c in cols)
          + "     train  own  own-eval  share  goal ≤1 s  goal ≤10 %")
    for steps, rows in result.items():
        for row in rows:
            warm = row["round"] > 1  # round 1 fills the prepared cache (once per site)
            met_s = ("met" if row["own"] <= GOAL_SECONDS else "missed") if warm else "(cold)"
            met_p = (("met" if row["share"] <= GOAL_SHARE else "missed") if int(steps) >= GOAL_STEPS else "–") \
                if warm else "(cold)"
            print(f"{steps:>5} {row['round']:5d} {row['load']:5.1f}  "
                  + "  ".join(f"{row.get(c, 0.0):8.3f}" for c in cols)
                  + f"  {row['train']:8.2f} {row['own']:5.2f} {row['own_without_evaluate']:8.2f} "
                    f"{row['share']:6.1%}  {met_s:>9}  {met_p:>10}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--local-steps", type=int, help="local DP steps per round (default: the app's, 10)")
    parser.add_argument("--model", default="minilm", choices=("minilm", "tiny-bert"),
                        help="encoder model (default: the app's MiniLM; tiny-bert with max_length 16)")
    parser.add_argument("--batch-size", type=int, help="sampler batch size (default: the app's, 64)")
    parser.add_argument("--out", help="folder for the federation's files and the JSON result")
    parser.add_argument("--cache", choices=("both", "on", "off"), default="both",
                        help="federate with the sites' prepared cache, without it, or both (default)")
    parser.add_argument("--sites", type=int, choices=(1, 2, 3), default=3,
                        help="sites in the federation (each a third of CiteSeer; default 3). With 1, the "
                             "round is not slowed by other sites sharing this machine's cores")
    parser.add_argument("--fork-server", choices=("on", "off"), default="on",
                        help="the guard's fork server (default on; off: a fresh ClientApp process per task)")
    parser.add_argument("--site-only", action="store_true",
                        help="GraphVeil's own per-round work at one site, apart from Flower (module note)")
    parser.add_argument("--site-steps", type=int, nargs="+", default=[10, GOAL_STEPS],
                        help="local steps per round for --site-only (default: 10 40)")
    parser.add_argument("--profile", action="store_true",
                        help="with --site-only: profile one extra round of 1 local step")
    parser.add_argument("--warm-site", nargs=2, metavar=("NODE_CONFIG", "RUN_CONFIG_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warm_site:
        warm_site(Path(args.warm_site[0]), args.warm_site[1])
        return 0

    from graphveil.connectors.flower.guard import FORK_SERVER_ENV
    from graphveil.connectors.flower.loopback import LoopbackFederation, write_node_config
    from graphveil.connectors.flower.partition import write_partition
    from graphveil.data import load_bundled_citeseer

    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="graphveil-fed-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.site_only:
        result = site_only(args, root, {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
        (root / "site_overhead.json").write_text(json.dumps(result, indent=2))
        print_site_only(result)
        print(f"results: {root / 'site_overhead.json'}")
        return 0
    sites = tuple(f"site-{i + 1}" for i in range(args.sites))
    overrides: dict = {"num-server-rounds": args.rounds, "min-sites": len(sites),
                       "output-dir": str(root / "server-out")}
    if args.local_steps is not None:
        overrides["local-steps"] = args.local_steps
    if args.batch_size is not None:
        overrides["task.sampler.batch_size"] = args.batch_size
    if args.model == "tiny-bert":
        overrides.update({"task.encoder.model": "tiny-bert", "task.encoder.max_length": 16})
    run_config = _app_run_config(overrides)
    parts = write_partition(load_bundled_citeseer(), 3, root / "data", seed=0)[: len(sites)]

    def node_configs(tag: str, cache: bool) -> dict[str, Path]:
        return {name: write_node_config(root / f"{name}-{tag}.toml", {
            "site-name": name, "data-source": "edge_list", "data-path": str(edges),
            "data-entities": str(entities), "epsilon-budget": 1e4, "delta": 1e-5, "privacy-unit": "edge", "min-records": 64,
            "ledger": str(root / f"ledgers-{tag}" / f"{name}.sqlite"), "threads": 1,
            "share-utility-metrics": True, "prepared-cache": str(root / "cache" / name) if cache else "off"})
            for name, (edges, entities) in zip(sites, parts, strict=True)}

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    local = local_rounds(node_configs("local", False), run_config, 2, env)

    def federate(cache: bool) -> dict:
        tag = f"cache-{'on' if cache else 'off'}"
        configs = node_configs(tag, cache)
        with LoopbackFederation(root / f"federation-{tag}") as loop:
            loop.env["OMP_NUM_THREADS"] = "1"
            loop.env[FORK_SERVER_ENV] = "1" if args.fork_server == "on" else "0"
            loop.make_credentials(sites)
            loop.start_server()
            loop.register(sites)
            for name in sites:
                loop.init_ledger(configs[name])
                loop.start_site(name, configs[name])
            loop.wait_online(len(sites))
            # let the fork servers import, as they have long before a run at a real site
            time.sleep(20 if args.fork_server == "on" else 0)
            load_before = _load()
            run_dir, total, _ = loop.run({**overrides, "output-dir": str(root / f"server-out-{tag}")})
            load_after = _load()
            site_log = "\n".join(loop.log(name) for name in sites)
        rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
        untrained = [(r["round"], s["site"], s["reason"]) for r in rounds for s in r["sites"]
                     if s["status"] != "trained"]
        for entry in untrained:  # kept in the table: such a round is not a full round
            print(f"warning: {tag}: round {entry[0]}: {entry[1]} did not train: {entry[2]}", file=sys.stderr)
        return {"untrained": untrained, "round_seconds": [r["seconds"] for r in rounds], "run_seconds": total,
                "parts": round_parts(rounds, site_log), "load_before_after": [load_before, load_after]}

    modes = {"both": (True, False), "on": (True,), "off": (False,)}[args.cache]
    federations = {("cache_on" if m else "cache_off"): federate(m) for m in modes}
    local += local_rounds(node_configs("local", False), run_config, 2, env)
    local_best = min(t["seconds"] for t in local)
    result = {
        "sites": len(sites), "rounds": args.rounds, "model": run_config["task.encoder.model"],
        "local_steps": run_config["local-steps"], "batch_size": run_config["task.sampler.batch_size"],
        "fork_server": args.fork_server, "local_round_seconds": local_best, "local_tries": local,
        **{key: {**fed, "median": statistics.median(fed["round_seconds"]),
                 "overhead_share": (statistics.median(fed["round_seconds"]) - local_best) / local_best}
           for key, fed in federations.items()},
    }
    (root / "federation_overhead.json").write_text(json.dumps(result, indent=2))
    print(f"{len(sites)}-site loopback federation, {result['model']}, {result['local_steps']} local steps of batch "
          f"{result['batch_size']} + held-out evaluation per round ({args.rounds} rounds; TLS + SuperNode "
          f"auth on; fork server {args.fork_server}; 2-core machine shared by all processes)")
    tries = ", ".join(f"{t['seconds']:.2f} (load {t['load']:.1f})" for t in local)
    print(f"  local round (slowest of {len(sites)} warm site(s) at once): {local_best:.2f} s best; tries {tries}")
    for key, fed in federations.items():
        print(f"  federated round, {key.replace('_', ' ')}: median {result[key]['median']:.2f} s, overhead "
              f"{result[key]['overhead_share']:+.1%}; load {fed['load_before_after'][0]:.1f} -> "
              f"{fed['load_before_after'][1]:.1f}; whole run {fed['run_seconds']:.1f} s")
        print("    round  seconds  to-site  setup  train  eval  other  back  aggregate  (slowest site)  site CPU s"
              "   GraphVeil's own  Flower's way")
        for p in fed["parts"]:
            if "to_site" not in p:
                print(f"    {p['round']:5d}  {p['seconds']:7.2f}  (no site timings)")
                continue
            cpu = "/".join(f"{c:.1f}" for c in p["site_cpu"].values())
            print(f"    {p['round']:5d}  {p['seconds']:7.2f}  {p['to_site']:7.2f}  {p['setup']:5.2f}  "
                  f"{p['train']:5.2f}  {p['evaluate'] or 0:4.2f}  {p['other']:5.2f}  {p['back']:4.2f}  "
                  f"{p['aggregate']:9.3f}  {p['slowest_site']:14s}  {cpu}   "
                  f"{p['setup'] + (p['evaluate'] or 0) + p['other']:15.2f}  {p['to_site'] + p['back']:12.2f}")
        print("    GraphVeil's own: setup + eval + other at the slowest site (everything it does in the round but "
              "train; goal <= 1 s); Flower's way: to site + back (SuperNode polls, ClientApp process, pulls, "
              "pushes; --site-only times GraphVeil's part without it)")
    print(f"results: {root / 'federation_overhead.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
