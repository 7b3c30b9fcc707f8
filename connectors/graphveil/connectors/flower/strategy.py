"""Server strategy: any Flower strategy over the sites' adapters, aware of refusals and dropouts.

:class:`SiteRounds` wraps a message-based Flower strategy (FedAvg by default, FedAdam as an
option, :func:`make_strategy`). Each round it

* logs sites that were seen before and are no longer connected, and goes on without them;
* writes what every reply carried to an audit log (:func:`records.describe_reply`);
* logs each site's status and reported spend (ε of δ, of its budget), and why a site refused
  or failed;
* checks every ``trained`` reply against the global adapter it was sent (same keys, shapes and
  dtypes, every value finite, a positive finite step count) and marks one that is not
  ``failed`` ("non-finite adapter", ...): it is never averaged in;
* hands the ledger head every reply carries (``ledger-seq``, ``ledger-head``,
  ``ledger-previous``) to the ledger witness (:class:`~graphveil.ledger.witness.Witness`): a
  site whose ledger went backwards or forked is logged as an error and its reply marked
  ``failed`` (never averaged in), with the witness's reason in ``rounds.jsonl``; a ``trained``
  reply without a head is marked ``failed`` too;
* reduces every reply to the keys it knows (extra records, metric or site keys are logged and
  dropped; a non-numeric value is dropped), so an odd reply cannot crash the run;
* hands only the ``trained`` replies — reduced to the adapter and the public step count — to
  the wrapped strategy, so a refusal or a failure never breaks aggregation; a round in which
  no site trained keeps the previous global adapter;
* waits at most ``sites_timeout`` seconds for ``min_sites`` connected sites before a round
  (Flower 1.41's FedAvg waits forever), then fails the run with :class:`SitesUnavailableError`.

Sites that opt in report held-out MRR with their update, so there is no separate evaluation round.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAdam, FedAvg, Strategy

from graphveil.connectors.flower import records
from graphveil.ledger.witness import Witness

RoundHook = Callable[[int, dict[str, Any]], None]


class SitesUnavailableError(RuntimeError):
    """Fewer than ``min-sites`` sites connected within ``sites-timeout``: the run fails."""


class _DeadlineGrid:
    """The grid as the wrapped strategy sees it in ``configure_train``: Flower's ``sample_nodes``
    polls ``get_node_ids`` until ``min_available_nodes`` are connected, without a limit; past
    ``deadline`` this raises :class:`SitesUnavailableError` instead."""

    def __init__(self, grid: Grid, *, min_sites: int, deadline: float, timeout: float,
                 server_round: int) -> None:
        self._grid, self._min, self._deadline = grid, min_sites, deadline
        self._timeout, self._round = timeout, server_round

    def get_node_ids(self) -> Iterable[int]:
        nodes = list(self._grid.get_node_ids())
        if len(nodes) < self._min and time.monotonic() >= self._deadline:
            message = (f"round {self._round}: {len(nodes)} site(s) connected after waiting "
                       f"{self._timeout:g} s (sites-timeout), fewer than min-sites = {self._min}; "
                       "the run stops")
            log(ERROR, "%s", message)
            raise SitesUnavailableError(message)
        return nodes

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


class PromptGrid:
    """``grid`` with a ``send_and_receive`` that asks for replies every ``poll`` seconds: Flower
    1.41's asks every 3 s, so a round waited 1.5 s on average after its last reply (a local
    call to the SuperLink's ServerAppIo API, cheap to make often). Same contract: push, then
    pull until every message has its reply or ``timeout`` passes."""

    def __init__(self, grid: Grid, poll: float = 0.2) -> None:
        self._grid, self._poll = grid, poll

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        waiting = set(self._grid.push_messages(messages))
        end = time.monotonic() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        while timeout is None or time.monotonic() < end:
            got = list(self._grid.pull_messages(waiting))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if not waiting:
                break
            time.sleep(self._poll)
        return replies

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)


def make_strategy(name: str, *, min_sites: int, fraction_train: float,
                  server_lr: float = 0.01, server_tau: float = 1e-3) -> FedAvg:
    """FedAvg (``"fedavg"``) or FedAdam (``"fedadam"``, Reddi et al. 2021) over the adapters,
    weighted by the public number of local steps."""
    common: dict[str, Any] = dict(
        fraction_train=fraction_train, fraction_evaluate=0.0, min_train_nodes=min_sites,
        min_evaluate_nodes=0, min_available_nodes=min_sites, weighted_by_key=records.WEIGHT,
        arrayrecord_key=records.ARRAYS, configrecord_key=records.CONFIG,
    )
    if name == "fedavg":
        return FedAvg(**common)
    if name == "fedadam":
        return FedAdam(**common, eta=server_lr, tau=server_tau)
    raise ValueError(f"unknown strategy {name!r}; choose fedavg or fedadam")


class SiteRounds(Strategy):
    """Wraps ``strategy`` (a FedAvg-family strategy) for GraphVeil sites.

    :param strategy: aggregates the trained replies.
    :param local_steps: DP steps each site is asked to run per round.
    :param audit_path: JSON-lines file receiving what each reply carried (``None``: no audit).
    :param on_round_end: called with ``(server_round, round_record)`` after each round.
    :param min_sites: connected sites a round needs (default: the strategy's ``min_available_nodes``).
    :param sites_timeout: seconds a round waits for them before the run fails.
    :param witness: the ledger witness the replies' ledger heads are checked against and
        recorded in (``None``: not checked — unit tests of aggregation only).
    """

    def __init__(self, strategy: FedAvg, *, local_steps: int, audit_path: Path | None = None,
                 on_round_end: RoundHook | None = None, min_sites: int | None = None,
                 sites_timeout: float = 600.0, witness: Witness | None = None) -> None:
        self.strategy = strategy
        self.witness = witness
        self.local_steps = local_steps
        self.min_sites = min_sites if min_sites is not None else int(getattr(strategy, "min_available_nodes", 1))
        self.sites_timeout = sites_timeout
        #: The global adapter of the current round (what the sites were sent): replies must match it.
        self.global_arrays: ArrayRecord | None = None
        self.audit_path = audit_path
        self.on_round_end = on_round_end
        self.site_names: dict[int, str] = {}
        self.rounds: list[dict[str, Any]] = []
        self._online: list[int] = []
        self._round_started = self._round_started_at = 0.0

    def summary(self) -> None:
        log(INFO, "\t├──> GraphVeil sites: %d local DP steps per round; refusals and dropouts are logged",
            self.local_steps)
        self.strategy.summary()

    def _name(self, node_id: int) -> str:
        return self.site_names.get(node_id, f"node {node_id}")

    # ------------------------------------------------------------------------------- train
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config[records.LOCAL_STEPS] = self.local_steps
        self._round_started, self._round_started_at = time.monotonic(), time.time()
        self.global_arrays = arrays
        self._online = list(grid.get_node_ids())
        gone = sorted(self._name(n) for n in self.site_names if n not in self._online)
        if gone:
            log(WARNING, "round %d: site(s) no longer connected: %s; continuing with %d connected site(s)",
                server_round, ", ".join(gone), len(self._online))
        waiting = _DeadlineGrid(grid, min_sites=self.min_sites, deadline=self._round_started + self.sites_timeout,
                                timeout=self.sites_timeout, server_round=server_round)
        return self.strategy.configure_train(server_round, arrays, config, waiting)  # type: ignore[arg-type]

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        replies_at = time.time()
        self._audit(server_round, replies)
        sites: list[dict[str, Any]] = []
        trained: list[Message] = []
        # an empty global model (round 1 of a node task: the server cannot size a model sized by the
        # sites' data): the first trained reply sets the keys and shapes
        reference = self.global_arrays if self.global_arrays else None
        for msg in replies:
            entry = self._witnessed(server_round, self._classify(msg, reference))
            sites.append(entry)
            if entry["status"] == records.TRAINED:
                if reference is None:  # no global adapter known: the first trained reply sets the shape
                    reference = msg.content.array_records[records.ARRAYS]
                trained.append(_for_aggregation(msg))
            self._log_site(server_round, entry)
        answered = {e["node-id"] for e in sites}
        missing = sorted(self._name(n) for n in self.site_names if n not in answered)
        if missing:
            log(WARNING, "round %d: no reply from %s (dropped out or timed out); the round goes on without them",
                server_round, ", ".join(missing))
        arrays: ArrayRecord | None = None
        if trained and self.global_arrays is not None and not len(self.global_arrays):
            # no model to step from: the first global model is the weighted mean (FedAvg), also under
            # FedAdam, which steps from it in later rounds
            arrays = weighted_mean(trained)
        elif trained:
            arrays, _ = self.strategy.aggregate_train(server_round, trained)
            if arrays is not None and self.global_arrays is not None:
                arrays = _like(arrays, self.global_arrays)  # FedAdam computes in float64
        else:
            log(WARNING, "round %d: no site trained; the global adapter is unchanged", server_round)
        record = {
            "round": server_round, "sites": sites, "missing": missing,
            "aggregated": arrays is not None,
            "seconds": time.monotonic() - self._round_started if self._round_started else None,
            # wall clock (unix s): sent to the sites, every reply in; for timing a round's parts
            "started-at": self._round_started_at if self._round_started else None,
            "replies-at": replies_at,
        }
        self.rounds.append(record)
        if self.on_round_end is not None:
            self.on_round_end(server_round, record)
        return arrays, _round_metrics(sites)

    def _classify(self, msg: Message, reference: ArrayRecord | None = None) -> dict[str, Any]:
        node_id = int(msg.metadata.src_node_id)
        if msg.has_error():
            return {"node-id": node_id, "site": self._name(node_id), "status": records.FAILED,
                    "reason": f"Flower error {int(msg.error.code)}: {msg.error.reason}", "metrics": {}}
        content = msg.content
        ignored = [f"record {k!r}" for k in content if k not in (records.ARRAYS, records.METRICS, records.SITE)]
        site = content.config_records.get(records.SITE)
        site_values = dict(site) if site is not None else {}
        ignored += [f"site key {k!r}" for k in site_values if k not in records.SITE_KEYS]
        name, status, reason = (_text(site_values.get(k)) for k in ("site-name", "status", "reason"))
        metrics: dict[str, float] = {}
        raw_metrics = content.metric_records.get(records.METRICS)
        for key, value in (dict(raw_metrics) if raw_metrics is not None else {}).items():
            if key in records.KNOWN_METRICS and isinstance(value, int | float) and not isinstance(value, bool):
                metrics[key] = float(value)
            else:
                ignored.append(f"metric {key!r}")
        entry: dict[str, Any] = {
            "node-id": node_id, "site": name or self._name(node_id), "status": status,
            "reason": reason, "metrics": metrics,
        }
        if ignored:
            log(WARNING, "reply from %s: ignored unexpected %s", entry["site"], ", ".join(ignored))
            entry["ignored"] = ignored
        if name:
            self.site_names[node_id] = name
        try:
            head = records.ledger_head_of(site_values)
        except ValueError as exc:
            head = None
            entry["ledger"] = f"malformed: {exc}"
        if head is not None and name:  # witnessed under the name the reply states
            entry["ledger"] = {"seq": head.seq, "head": head.head, "previous": head.previous}
        if status not in records.STATUSES or (status == records.TRAINED and records.ARRAYS not in content.array_records):
            entry.update(status=records.FAILED, reason="malformed reply (no site status or no arrays)")
        elif status == records.TRAINED and head is None:
            entry.update(status=records.FAILED, reason=(
                "rejected reply: no valid ledger head (ledger-seq, ledger-head) for the witness; not aggregated"))
        elif status == records.TRAINED:
            problem = _adapter_problem(content.array_records[records.ARRAYS], reference)
            steps = metrics.get(records.WEIGHT)
            if problem is None and (steps is None or not math.isfinite(steps) or steps <= 0):
                problem = f"bad {records.WEIGHT} ({steps!r})"
            if problem is not None:
                entry.update(status=records.FAILED, reason=f"rejected reply: {problem}; not aggregated")
        return entry

    def _witnessed(self, server_round: int, entry: dict[str, Any]) -> dict[str, Any]:
        """Check the reply's ledger head with the witness and record it; a site whose ledger went
        backwards or forked is an error, and its update is not aggregated."""
        head = entry.get("ledger")
        if self.witness is None or not isinstance(head, dict):
            return entry
        problem = self.witness.observe(entry["site"], head["seq"], head["head"], head["previous"],
                                       round=server_round, node=entry["node-id"], status=entry["status"])
        if problem is not None:
            log(ERROR, "round %d: LEDGER WITNESS: %s", server_round, problem)
            entry["witness"] = problem
            if entry["status"] == records.TRAINED:
                entry.update(status=records.FAILED, reason=f"rejected reply: {problem}; not aggregated")
        return entry

    def _log_site(self, server_round: int, entry: dict[str, Any]) -> None:
        m = entry["metrics"]
        if {"epsilon", "epsilon-budget", "delta"} <= m.keys():
            spend = f"ε={m['epsilon']:.4g} of budget {m['epsilon-budget']:.4g} (δ={m['delta']:.3g})"
        elif {"epsilon-budget", "delta"} <= m.keys():
            spend = f"ε not shared; budget {m['epsilon-budget']:.4g} (δ={m['delta']:.3g})"
        else:
            spend = "spend not reported"
        if entry["status"] == records.TRAINED:
            utility = f", held-out MRR {m['mrr']:.4f}" if "mrr" in m else ""
            log(INFO, "round %d: site %s trained %d steps, %s%s", server_round, entry["site"],
                int(m.get("num-steps", 0)), spend, utility)
        elif entry["status"] == records.REFUSED:
            log(WARNING, "round %d: site %s REFUSED the round: %s [%s]", server_round, entry["site"],
                entry["reason"], spend)
        else:
            log(WARNING, "round %d: site %s FAILED: %s", server_round, entry["site"], entry["reason"])

    def _audit(self, server_round: int, replies: list[Message]) -> None:
        if self.audit_path is None:
            return
        with self.audit_path.open("a", encoding="utf-8") as fh:
            for msg in replies:
                fh.write(json.dumps({"round": server_round, **records.describe_reply(msg)}) + "\n")

    # ------------------------------------------------------------------------------- evaluate
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _adapter_problem(arrays: ArrayRecord, reference: ArrayRecord | None) -> str | None:
    """Why a site's adapter cannot be averaged into ``reference`` (keys, shapes, dtypes, finiteness)."""
    if reference is not None:
        missing, extra = sorted(set(reference) - set(arrays)), sorted(set(arrays) - set(reference))
        if missing:
            return f"adapter lacks key {missing[0]!r}"
        if extra:
            return f"unexpected adapter key {extra[0]!r}"
    for key in sorted(arrays):
        try:
            value = arrays[key].numpy()
        except Exception as exc:  # undecodable payload
            return f"adapter key {key!r} cannot be decoded ({type(exc).__name__})"
        if reference is not None:
            want = reference[key]
            if tuple(value.shape) != tuple(want.shape):
                return f"adapter key {key!r} has shape {list(value.shape)}, expected {list(want.shape)}"
            if str(value.dtype) != str(want.dtype):
                return f"adapter key {key!r} has dtype {value.dtype}, expected {want.dtype}"
        if not np.issubdtype(value.dtype, np.floating):
            return f"adapter key {key!r} has dtype {value.dtype}, not floating point"
        if not np.isfinite(value).all():
            return f"non-finite adapter (NaN or Inf in {key!r})"
    return None


def _like(arrays: ArrayRecord, reference: ArrayRecord) -> ArrayRecord:
    """``arrays`` in ``reference``'s dtypes (the global adapter's dtypes never change)."""
    out = {}
    for key, value in arrays.items():
        data = value.numpy()
        if key in reference and str(reference[key].dtype) != str(data.dtype):
            data = data.astype(reference[key].numpy().dtype)
        out[key] = Array(np.ascontiguousarray(data))
    return ArrayRecord(out)


def weighted_mean(replies: list[Message]) -> ArrayRecord:
    """The replies' arrays averaged with their public step counts as weights (FedAvg), in their own dtype."""
    weights = [float(m.content.metric_records[records.METRICS][records.WEIGHT]) for m in replies]
    arrays = [m.content.array_records[records.ARRAYS] for m in replies]
    total = sum(weights)
    out = {}
    for key in arrays[0]:
        first = arrays[0][key].numpy()
        mean = sum(w * a[key].numpy().astype(np.float64) for w, a in zip(weights, arrays, strict=True)) / total
        out[key] = Array(np.ascontiguousarray(mean.astype(first.dtype)))
    return ArrayRecord(out)


def _for_aggregation(msg: Message) -> Message:
    """The reply as the wrapped strategy sees it: the adapter and the public step count only
    (the reply is reduced in place; it was audited and logged already)."""
    steps = float(msg.content.metric_records[records.METRICS].get(records.WEIGHT, 1))
    msg.content = RecordDict({
        records.ARRAYS: msg.content.array_records[records.ARRAYS],
        records.METRICS: MetricRecord({records.WEIGHT: steps}),
    })
    return msg


def _round_metrics(sites: list[dict[str, Any]]) -> MetricRecord:
    trained = [s for s in sites if s["status"] == records.TRAINED]
    out: dict[str, float] = {
        "sites-trained": len(trained),
        "sites-refused": sum(s["status"] == records.REFUSED for s in sites),
        "sites-failed": sum(s["status"] == records.FAILED for s in sites),
    }
    eps = [s["metrics"]["epsilon"] for s in sites if "epsilon" in s["metrics"]]
    if eps:
        out["epsilon-max"] = max(eps)
    mrr = [s["metrics"]["mrr"] for s in trained if "mrr" in s["metrics"] and math.isfinite(s["metrics"]["mrr"])]
    if mrr:
        out["mrr-mean"] = sum(mrr) / len(mrr)
    return MetricRecord(out)
