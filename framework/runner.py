"""``graphveil run``: one configured session from YAML to a complete run directory."""

from __future__ import annotations

import time
from typing import Any

import torch

from graphveil.config import RunConfig
from graphveil.data import RelationalGraph
from graphveil.host import PluginHost, read_only
from graphveil.outputs import RunDirectory, format_table
from graphveil.records_store import RecordsStore
from graphveil.session import TrainingSession

RESULT_COLUMNS = [
    ("name", "run", ""), ("prec1", "PREC@1", ".4f"), ("mrr", "MRR", ".4f"),
    ("epsilon", "ε spent", ".3f"), ("noise_multiplier", "σ", ".3f"), ("steps", "steps", "d"),
    ("seconds", "time (s)", ".0f"),
]


def run_training(config: RunConfig, *, host: PluginHost | None = None,
                 graph: RelationalGraph | None = None,
                 session: TrainingSession | None = None,
                 records_store: RecordsStore | None = None) -> dict[str, Any]:
    """Assemble (refusing mismatches before any data is read), prepare, train, evaluate, save.

    ``config.resolved.yaml`` holds the validated config: the sampling seed only if the user
    fixed one, a noise seed only if the user set ``privacy.research_noise_seed`` (recorded in
    ``privacy.json`` too); CSPRNG noise has no seed to write. ``records_store`` keeps the
    degree-capped Ē across runs on the same graph (see :class:`TrainingSession`).

    The run directory appears under its final name only when everything has been written.
    """
    if config.threads:
        torch.set_num_threads(config.threads)
    started = time.perf_counter()
    session = session or TrainingSession(config, host=host, graph=graph, records_store=records_store)
    session.assemble()
    session.prepare()
    out = RunDirectory(config.output.dir or RunDirectory.default_for(config.name))
    try:
        out.write_yaml("config.resolved.yaml", config.model_dump(mode="json"))
        train = session.train(on_step=lambda _s, m: out.log_metrics(m))
        evaluation = session.evaluate()
        report = session.privacy_report()
        out.write_json("privacy.json", report)
        out.write_json("evaluation.json", evaluation)
        session.encoder.save(out.path / "adapter")
        row = {"name": config.name, **evaluation, "epsilon": report["epsilon"],
               "noise_multiplier": report["noise_multiplier"], "steps": train["steps"],
               "seconds": time.perf_counter() - started}
        out.log_metrics({"final": True, **row})
        session.host.hook.graphveil_run_end(run_dir=out.final, report=read_only({**report, **evaluation}))
        run_dir = out.commit()
    except BaseException:
        out.discard()
        raise
    return {"run_dir": run_dir, "row": row, "table": format_table([row], RESULT_COLUMNS)}
