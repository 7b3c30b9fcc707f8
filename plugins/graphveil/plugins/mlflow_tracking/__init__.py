"""MLflow experiment tracking: the reference example of a lifecycle plugin.

Install ``pip install 'graphveil[mlflow]'`` and set ``GRAPHVEIL_MLFLOW=1``; without that switch
the plugin does nothing and never imports mlflow. MLflow's own variables say where:
``MLFLOW_TRACKING_URI`` (a server ``http://…``, ``sqlite:///path/mlflow.db``, or a directory /
``file:`` URI, which MLflow 3 opens only with ``MLFLOW_ALLOW_FILE_STORE=true``; unset: MLflow's
default ``sqlite:///mlflow.db``) and ``MLFLOW_EXPERIMENT_NAME`` (default ``graphveil``).

One MLflow run per training session:

* :func:`graphveil_step_end` opens it at the session's first step and logs every number of the
  step record (loss, ε spent, clipped fraction, learning rate, batch size) at that step;
* :func:`graphveil_run_end` logs the resolved run config flattened as params (secrets redacted,
  :mod:`.redact`), the report's numbers as metrics (ε, δ, σ, the evaluation), its words as
  ``report.*`` params (unit, accountant, sampler, clipper), the run directory's files as
  artifacts (the adapter or model, ``privacy.json``, ``evaluation.json``, ``metrics.jsonl``, the
  redacted config), and closes the run. A federated site reports each round with
  ``run_dir=None`` and ``site`` / ``server_round`` in the report: the run is tagged
  ``graphveil.site`` and the report is logged as ``report.json``.

The server's :func:`graphveil_round_end` logs one run per federation, one step per round.

It only observes: it reads the read-only views and files it is given. Tracking never fails a
run: the first MLflow error (an unreachable server, a refused store, mlflow missing) is
warned once, and tracking stays off for the rest of the process.
"""

from __future__ import annotations

import atexit
import math
import os
import time
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from graphveil.contract.hookspecs import hookimpl
from graphveil.plugins.mlflow_tracking.redact import flatten, mask_secrets, redact
from graphveil.run.outputs import RunDirectory

SWITCH = "GRAPHVEIL_MLFLOW"
EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
DEFAULT_EXPERIMENT = "graphveil"
SITE_TAG = "graphveil.site"
ROUND_TAG = "graphveil.server_round"
MAX_PARAM_LENGTH = 6000  # MLflow's limit on a param value
BATCH = 100  # MLflow's limit on params per log_batch call


class TrackingWarning(UserWarning):
    """MLflow tracking stopped; the run itself goes on."""


def enabled() -> bool:
    return os.environ.get(SWITCH, "").strip().lower() in {"1", "true", "yes", "on"}


class Tracker:
    """The MLflow client, and the runs this process has open (one session, one federation)."""

    def __init__(self) -> None:
        self.client: Any = None
        self.off = False
        self.session_run: str | None = None
        self.federation_run: str | None = None

    def active(self) -> bool:
        return enabled() and not self.off

    @contextmanager
    def guard(self) -> Any:
        """Any error ends tracking for this process with one warning, never the run."""
        try:
            yield
        except Exception as exc:  # an observer must not fail the run it observes
            self.off = True
            if isinstance(exc, ImportError) and exc.name == "mlflow":
                reason = f"{SWITCH} is set but mlflow is not installed: pip install 'graphveil[mlflow]'"
            else:
                reason = f"{type(exc).__name__}: {mask_secrets(str(exc)).splitlines()[0] if str(exc) else ''}"
            warnings.warn(f"MLflow tracking is off for the rest of this process ({reason})",
                          TrackingWarning, stacklevel=2)

    def _client(self) -> Any:
        if self.client is None:
            from mlflow import MlflowClient  # the extra; imported only when switched on

            self.client = MlflowClient()  # MLFLOW_TRACKING_URI, or MLflow's default store
            atexit.register(self.close_open)
        return self.client

    def _start(self, **tags: str) -> str:
        client = self._client()
        name = os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        return client.create_run(experiment_id, tags=tags).info.run_id

    # ------------------------------------------------------------------ a training session
    def step(self, step: int, metrics: Mapping[str, Any]) -> None:
        if step == 1 or self.session_run is None:  # a new session: the last one never ended
            self._end_session("KILLED")
            self.session_run = self._start()
        self._log_metrics(self.session_run, {k: v for k, v in metrics.items() if k != "step"}, step)

    def run_end(self, run_dir: Path | None, report: Mapping[str, Any]) -> None:
        run_id = self.session_run or self._start()
        client = self.client
        site = report.get("site")
        if site is not None:
            client.set_tag(run_id, SITE_TAG, str(site))
            client.set_tag(run_id, ROUND_TAG, str(report.get("server_round")))
            client.update_run(run_id, name=f"{site}-round{report.get('server_round')}")
        scalars = {k: v for k, v in report.items() if k not in ("site", "server_round")}
        self._log_metrics(run_id, scalars, int(report.get("steps") or 0))
        words = {f"report.{k}": v for k, v in scalars.items() if isinstance(v, str | bool)}
        if run_dir is None:
            self._log_params(run_id, words)
            client.log_dict(run_id, redact(report), "report.json")  # plain dicts and lists
        else:
            self._log_run_directory(run_id, Path(run_dir), words)
        client.set_terminated(run_id, "FINISHED")
        self.session_run = None

    def _log_run_directory(self, run_id: str, run_dir: Path, words: dict[str, Any]) -> None:
        """Params from ``config.resolved.yaml`` (redacted), every file but that one as an
        artifact, and the redacted config in its place."""
        folder = run_dir if run_dir.is_dir() else RunDirectory.staging_path(run_dir)
        config = redact(yaml.safe_load((folder / "config.resolved.yaml").read_text(encoding="utf-8")) or {})
        if config.get("name"):
            self.client.update_run(run_id, name=str(config["name"]))
        self._log_params(run_id, {**flatten(config), **words})
        for path in sorted(folder.iterdir()):
            if path.name == "config.resolved.yaml":
                self.client.log_dict(run_id, config, path.name)
            elif path.is_dir():
                self.client.log_artifacts(run_id, str(path), path.name)
            else:
                self.client.log_artifact(run_id, str(path))

    def _end_session(self, status: str) -> None:
        if self.session_run is not None:
            run_id, self.session_run = self.session_run, None
            self.client.set_terminated(run_id, status)

    # ------------------------------------------------------------------ the federation (server)
    def round_end(self, server_round: int, record: Mapping[str, Any]) -> None:
        if self.federation_run is None:
            self.federation_run = self._start(**{"graphveil.role": "federation"})
        sites = record.get("sites", ())
        numbers: dict[str, Any] = {
            "aggregated": float(bool(record.get("aggregated"))), "seconds": record.get("seconds"),
            "sites_missing": len(record.get("missing", ())),
        }
        for status in {s.get("status") for s in sites}:
            numbers[f"sites_{status}"] = sum(s.get("status") == status for s in sites)
        for s in sites:  # what each site chose to report (ε only with share-epsilon)
            numbers.update({f"{s.get('site')}.{k}": v for k, v in s.get("metrics", {}).items()})
        self._log_metrics(self.federation_run, numbers, server_round)

    def close_open(self) -> None:
        """At exit: a session that never reported its end was cut short; a federation is done."""
        if self.off:
            return
        with self.guard():
            self._end_session("KILLED")
            if self.federation_run is not None:
                run_id, self.federation_run = self.federation_run, None
                self.client.set_terminated(run_id, "FINISHED")

    # ------------------------------------------------------------------ MLflow calls
    def _log_metrics(self, run_id: str, values: Mapping[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, float(v), now, step) for key, v in values.items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and not math.isnan(v)]
        if metrics:
            self.client.log_batch(run_id, metrics=metrics)

    def _log_params(self, run_id: str, values: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(key, str(v)[:MAX_PARAM_LENGTH]) for key, v in values.items()]
        for start in range(0, len(params), BATCH):
            self.client.log_batch(run_id, params=params[start:start + BATCH])


TRACKER = Tracker()


@hookimpl
def graphveil_step_end(step: int, metrics: Mapping[str, Any]) -> None:
    if TRACKER.active():
        with TRACKER.guard():
            TRACKER.step(step, metrics)


@hookimpl
def graphveil_run_end(run_dir: Path | None, report: Mapping[str, Any]) -> None:
    if TRACKER.active():
        with TRACKER.guard():
            TRACKER.run_end(run_dir, report)


@hookimpl
def graphveil_round_end(server_round: int, metrics: Mapping[str, Any]) -> None:
    if TRACKER.active():
        with TRACKER.guard():
            TRACKER.round_end(server_round, metrics)
