"""The server: a Flower ServerApp that aggregates the sites' adapters and saves the result.

It never sees data. It builds the task's encoder only to produce the initial trainable
parameters (the LoRA adapter; the encoder's own seed makes them reproducible) and, at the end,
to save the final adapter Hugging Face style (``save_pretrained``). Per run it writes, under
``<output-dir>/run-<run id>/``:

* ``adapter/`` — the final global adapter;
* ``rounds.jsonl`` — one line per round: each site's status, reported spend and reason;
* ``received.jsonl`` — what every reply carried (array shapes, every scalar): the audit of
  what left each site;
* ``summary.json`` — settings, status (``completed``, or ``failed`` with the error), rounds
  completed, last spend reported per site.

Across runs it keeps the **ledger witness** (``ledger-witness``; default
``<output-dir>/ledger-witness.jsonl``, shared by every run with that output folder): each site's
ledger heads as its replies carried them (:mod:`graphveil.ledger.witness`). A site whose ledger
goes backwards or forks is logged as an error, its update is not aggregated, and it stays
refused until the operator clears it (``graphveil budget witness --clear``). An unreadable
witness file stops the run before its first round.

A round waits at most ``sites-timeout`` seconds for ``min-sites`` connected sites; then the run
fails (:class:`~.strategy.SitesUnavailableError`): the error is logged, ``summary.json`` says
``failed``, and the ServerApp exits non-zero, so Flower marks the run ``finished:failed``.
"""

from __future__ import annotations

import json
import shutil
import time
from logging import INFO
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common import log
from flwr.serverapp import Grid, ServerApp

from graphveil.connectors.flower import records
from graphveil.connectors.flower.settings import FederationSettings
from graphveil.connectors.flower.strategy import (
    PromptGrid,
    SiteRounds,
    SitesUnavailableError,
    make_strategy,
)
from graphveil.contract.host import PluginHost, default_host, read_only
from graphveil.ledger.witness import Witness


def build_encoder(fed: FederationSettings, host: PluginHost | None = None) -> Any:
    """The task's encoder (no data): source of the initial adapter and of the saved one; ``None``
    for a node-classification task, whose model (``task.model``) is sized by the sites' node
    features and classes: the server then starts from no arrays, each site trains round 1 from
    the task's own initialisation (pin ``task.model.seed`` so they start alike) and the first
    global model is the weighted mean of their replies."""
    config = fed.check_task()
    if config.encoder is None:
        return None
    host = host or default_host()
    return host.create("encoder", config.encoder.name, config.encoder.params, where="task.encoder")


def run_federation(grid: Grid, fed: FederationSettings, *, run_id: int = 0,
                   host: PluginHost | None = None, encoder: Any = None) -> dict[str, Any]:
    """Run ``fed.num_server_rounds`` rounds on ``grid``; returns the summary it also writes."""
    host = host or default_host()
    out_dir = Path(fed.output_dir) / f"run-{run_id}"
    out_dir.mkdir(parents=True, exist_ok=True)
    witness = Witness(fed.ledger_witness_path)  # read before any round: a corrupt file stops the run
    encoder = encoder if encoder is not None else build_encoder(fed, host)
    initial = records.arrays_from_state(encoder.trainable_state()) if encoder is not None else ArrayRecord()

    def round_end(server_round: int, record: dict[str, Any]) -> None:
        with (out_dir / "rounds.jsonl").open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        host.hook.graphveil_round_end(server_round=server_round, metrics=read_only(record))

    strategy = SiteRounds(
        make_strategy(fed.strategy, min_sites=fed.min_sites, fraction_train=fed.fraction_train,
                      server_lr=fed.server_lr, server_tau=fed.server_tau),
        local_steps=fed.local_steps, audit_path=out_dir / "received.jsonl", on_round_end=round_end,
        min_sites=fed.min_sites, sites_timeout=fed.sites_timeout, witness=witness,
    )
    started = time.time()
    try:
        result = strategy.start(grid=PromptGrid(grid), initial_arrays=initial, num_rounds=fed.num_server_rounds,
                                timeout=fed.round_timeout, train_config=ConfigRecord())
    except SitesUnavailableError as exc:
        summary = {"run-id": run_id, "status": "failed", "error": str(exc), "settings": fed.to_run_config(),
                   "rounds": len(strategy.rounds), "seconds": time.time() - started,
                   "sites": _last_spend(strategy.rounds)}
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
        raise
    final: ArrayRecord = result.arrays if len(result.arrays) else initial
    if encoder is not None:
        encoder.load_trainable_state(records.state_from_arrays(final))
        _save_adapter(encoder, out_dir / "adapter")
    else:  # a node task's model: its trainable state, torch.save'd (torch.load(..., weights_only=True))
        _save_state(records.state_from_arrays(final), out_dir / "adapter")
    summary = {
        "run-id": run_id,
        "status": "completed",
        "settings": fed.to_run_config(),
        "rounds": len(strategy.rounds),
        "rounds-aggregated": sum(r["aggregated"] for r in strategy.rounds),
        "seconds": time.time() - started,
        "sites": _last_spend(strategy.rounds),
        "adapter": str(out_dir / "adapter"),
        "ledger-witness": str(fed.ledger_witness_path),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    log(INFO, "GraphVeil federation finished: %d rounds, adapter saved to %s", summary["rounds"], summary["adapter"])
    return summary


def _save_adapter(encoder: Any, target: Path) -> None:
    """Write to ``<target>.partial`` and rename, so ``target`` is always complete."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    encoder.save(partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _save_state(state: dict[str, Any], target: Path) -> None:
    """Write ``state`` as ``<target>/model.pt`` through ``<target>.partial`` (always complete)."""
    import torch

    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    torch.save(state, partial / "model.pt")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def _last_spend(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    sites: dict[str, dict[str, Any]] = {}
    for record in rounds:
        for entry in record["sites"]:
            info = sites.setdefault(entry["site"], {"rounds-trained": 0})
            info["status"] = entry["status"]
            info["rounds-trained"] += entry["status"] == records.TRAINED
            if "epsilon" in entry["metrics"]:
                info["epsilon"] = entry["metrics"]["epsilon"]
                info["epsilon-budget"] = entry["metrics"].get("epsilon-budget")
                info["delta"] = entry["metrics"].get("delta")
            if entry["reason"]:
                info["reason"] = entry["reason"]
            if entry.get("witness"):
                info["witness"] = entry["witness"]
    return sites


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Flower entry point: the federation configured by the app's run config."""
    fed = FederationSettings.from_run_config(context.run_config)
    run_federation(grid, fed, run_id=int(context.run_id))
