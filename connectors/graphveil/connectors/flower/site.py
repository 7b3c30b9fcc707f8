"""The site: a Flower ClientApp that trains on the site's own graph under the site's own budget.

One train message = one round at the site (:func:`handle_train`). Every bit of the reply is
public (a function of the task and the site's policy) or covered by the accounted mechanism
(deploy/RUNBOOK.md §5):

1. read the node config (graph, budget, ledger, policy) and the run's task; refuse at once a task
   the site's policy does not allow (:func:`~.settings.check_site_policy`: δ, privacy unit,
   accountant, σ floor, steps per round, the site's own size floor and degree cap, pinned
   values, clip norm range, no pinned seed or noise), and server arrays that do not decode,
   are not floating point, hold NaN/Inf or exceed ``max-abs-weight`` — nothing read yet;
2. refuse if the ledger already shows the budget spent, or (node classification) is bound to
   another unit than the one the site's policy states now (its level, D, k or
   ``release-scope``: :func:`_check_ledger_unit`); assemble the site's
   :class:`~graphveil.run.session.TrainingSession` (no data read). At edge level, with the site's
   public size floor ``min-records``, its accountant is bound from public numbers alone
   (:meth:`~graphveil.run.session.TrainingSession.bind_public_accounting`); at node level the
   coupled accountant needs |Ē| and n, so the graph is prepared first; a node-classification
   task (``task-kind``) reads its graph's sizes (public there too) and binds its accountant
   (:meth:`~graphveil.run.session.TrainingSession.prepare_accounting`), but a plan that
   releases before training (GAP's encoder and aggregates, DPDGC's DP-Emb) runs those releases
   only after step 3;
3. write the round's spend to the ledger *before* training (:meth:`PrivacyLedger.reserve`), or
   refuse the round if it would pass the budget (ε values only if the site set ``share-epsilon``);
   for a plan with releases before training, the whole round — those releases and the steps
   (:meth:`~graphveil.run.session.TrainingSession.planned_rdp`) — is reserved at once;
4. from here on the reply is a trained one whatever happens: hand the releases before training
   their part of the arrays (``<release>/<weight>``: GAP's encoder starts from the server's),
   prepare the graph (edge level) and run those releases, check the arrays' keys and shapes, load
   the model's (none: round 1 of a node task, whose server holds no model yet — the task's own
   initialisation), run the local DP steps and confirm the spend
   (:meth:`PrivacyLedger.release`). A failure is charged in full (withheld) and answered with
   the server's own arrays; non-finite examples never fail a step
   (:mod:`graphveil.engine.dp_step`). The learning-rate schedule spans the whole federation
   (``training.steps`` = rounds × local steps): round ``r`` trains at its positions
   ``(r-1)·local_steps …``, though the session (and the optimizer's state) is new each round;
5. tell lifecycle plugins at the site (``graphveil_run_end`` with ``run_dir=None``), then reply
   with the updated parameters (the model's and the weights its releases share, each the output
   of an accounted DP-SGD stage: :meth:`~graphveil.run.session.TrainingSession.trainable_state`)
   and public scalars (:mod:`.records`) — nothing else leaves but
   the ledger's witness head: every reply sent after the ledger was opened (trained, refused or
   failed) carries it, for the server's witness (:mod:`graphveil.ledger.witness`); a reply
   refused before (node config, policy, arrays) carries none, as the site has not touched its
   ledger for that round.

Errors before the reservation are logged at the site in full; the server only learns which
stage failed, because an exception text may quote the data. Each trained round logs its
timings at the site (wall-clock start and end, set-up, training and evaluation seconds); they
are not sent.
"""

from __future__ import annotations

import functools
import logging
import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from graphveil.connectors.flower import records
from graphveil.connectors.flower.settings import (
    TASK_KINDS,
    FederationSettings,
    PolicyRefusal,
    SiteSettings,
    check_site_policy,
    round_seed,
    site_node_config,
    site_run_config,
    task_family,
)
from graphveil.contract.errors import PrivacyError
from graphveil.ledger import BudgetExhaustedError, PrivacyLedger, WitnessHead
from graphveil.run.config import RunConfig

log = logging.getLogger(__name__)

#: ``factory(config, records_store=ledger)`` builds the site's session (no data read yet).
SessionFactory = Callable[..., Any]


def _real_session(config: RunConfig, records_store: Any = None) -> Any:
    return _site_session_class()(config, records_store=records_store)


@functools.cache
def _site_session_class() -> type:
    """:class:`~graphveil.run.session.TrainingSession` reading the site's graph with
    :func:`_site_graph` (imported on first use: the ClientApp module stays light)."""
    from graphveil.run.session import TrainingSession

    class SiteSession(TrainingSession):
        def prepare_accounting(self) -> None:
            if self.graph is None and not self._accounting_bound:
                self.graph = _site_graph(self)
            super().prepare_accounting()

    return SiteSession


def _site_graph(session: Any) -> Any:
    """The site's graph from its data section. For a node-classification task, a relational
    graph that carries features and a label for every node (``data-source = "pyg"`` on a ``Data``
    with ``x`` and ``y``, as the data sources read it before node-graph loading landed) is taken
    as the node graph it is; once the source gives a :class:`~graphveil.data.NodeGraph` itself,
    this changes nothing."""
    from graphveil.data import NodeGraph, RelationalGraph

    cfg = session.config
    graph = session.load_data()  # with the data options the session's assembly validated
    family = task_family(session.host, cfg.task.name)
    if family != TASK_KINDS["node_classification"] or not isinstance(graph, RelationalGraph) or isinstance(graph, NodeGraph):
        return graph
    return _as_node_graph(graph)


def _as_node_graph(graph: Any) -> Any:
    """A relational graph with features and labels as a :class:`~graphveil.data.NodeGraph` (each
    relation in both directions); a clear error if it lacks either, or a node has no label."""
    import torch

    from graphveil.contract.errors import DataError
    from graphveil.data import NodeGraph

    if graph.features is None or graph.labels is None or graph.label_names is None:
        raise DataError(f"graph {graph.name!r}: node classification needs features and labels of every node")
    if bool((graph.labels < 0).any()):
        raise DataError(f"graph {graph.name!r}: {int((graph.labels < 0).sum())} node(s) have no label")
    e = graph.edges.t()
    return NodeGraph(name=graph.name, x=graph.features, y=graph.labels, edge_index=torch.cat([e, e.flip(0)], dim=1),
                     node_ids=list(graph.entity_ids), class_names=list(graph.label_names), notes=dict(graph.notes))


class _RoundCurve:
    """The session's accountant as the ledger's :meth:`~graphveil.ledger.PrivacyLedger.reserve`
    sees it for a round whose plan releases before training (GAP's encoder and aggregates): the
    ledger reserves ``steps × rdp_curve(σ)``, so the per-step curve here is the round's whole
    planned curve (:meth:`~graphveil.run.session.TrainingSession.planned_rdp`) over its steps.
    Everything else is the accountant's own (its orders, unit, profile, total after the round)."""

    def __init__(self, accountant: Any, curve: Any, steps: int) -> None:
        self._accountant, self._curve, self._steps = accountant, np.asarray(curve, dtype=float), steps

    def __getattr__(self, name: str) -> Any:
        return getattr(self._accountant, name)

    def rdp_curve(self, noise_multiplier: float) -> Any:
        return self._curve / self._steps

    def total_rdp(self) -> Any:
        return self._accountant.total_rdp()


class _Stage:
    """What the site is doing; the only detail of a failure the server learns. Also the
    round's timings (seconds; logged at the site only)."""

    now = "starting"

    def __init__(self) -> None:
        self.started, self.cpu, self._last = time.time(), time.process_time(), time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, part: str) -> None:
        """The seconds since the previous lap (or the start) are ``part``'s."""
        now = time.perf_counter()
        self.seconds[part] = self.seconds.get(part, 0.0) + now - self._last
        self._last = now


class _Refusal(Exception):
    def __init__(self, status: str, reason: str, metrics: dict[str, float] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.metrics = status, reason, metrics or {}

    def public(self, site: SiteSettings | None) -> tuple[str, dict[str, float]]:
        """Reason and metrics as sent: a budget refusal (one with spend metrics) states ε values
        only if the site set ``share-epsilon`` (ε depends on b/|Ē|); the site's log has them."""
        if not self.metrics or (site is not None and site.share_epsilon):
            return self.reason, self.metrics
        metrics = {k: v for k, v in self.metrics.items() if k not in records.SPEND_METRICS}
        spent = self.reason.startswith("budget spent")
        return ("budget spent: this site has released its privacy budget" if spent else
                "the round would take this site past its privacy budget"), metrics


def handle_train(content: RecordDict, context: Context, *,
                 session_factory: SessionFactory = _real_session) -> RecordDict:
    """One round at the site; returns the reply content (trained, or refused before any spend)."""
    site_name = str(context.node_config.get("site-name", "?"))
    stage = _Stage()
    site: SiteSettings | None = None
    head: WitnessHead | None = None  # every reply after the ledger is opened carries its head
    try:
        stage.now = "reading the node config"
        # a virtual node of `graphveil fed simulate` reads its site's node config (.simulation)
        node_config = site_node_config(context.node_config)
        site = SiteSettings.from_mapping(node_config, "SuperNode node config")
        site_name = site.site_name
        stage.now = "reading the run config"
        fed = FederationSettings.from_run_config(context.run_config)
        cfg = content[records.CONFIG]
        server_round = int(cfg[records.SERVER_ROUND])
        local_steps = int(cfg.get(records.LOCAL_STEPS, fed.local_steps))
        if server_round < 1:
            raise _Refusal(records.REFUSED, f"malformed train message: server-round {server_round} < 1")
        stage.now = "building the site's run config"
        config = site_run_config(fed, site, seed=round_seed(site, context.run_id, server_round))
        stage.now = "checking the task against the site's policy"
        try:
            check_site_policy(site, fed, config, local_steps=local_steps)
        except PolicyRefusal as exc:
            raise _Refusal(records.REFUSED, f"site policy: {exc}") from exc
        stage.now = "checking the server's arrays"
        incoming = _decoded_arrays(content, site.max_abs_weight)
        stage.now = "opening the privacy ledger"
        with PrivacyLedger(site.ledger, anchor=site.ledger_anchor) as ledger:
            try:
                return _round(incoming, context, site, config, ledger, server_round, local_steps,
                              session_factory, stage)
            finally:  # for a refusal or failure: the head after its refuse / withhold row
                head = ledger.witness_head()
    except _Refusal as refusal:
        log.warning("site %s refuses round: %s", site_name, refusal.reason)
        reason, metrics = refusal.public(site)
        return records.refused_content(site_name, refusal.status, reason, metrics, ledger_head=head)
    except Exception as exc:
        log.error("site %s failed while %s:\n%s", site_name, stage.now, traceback.format_exc())
        reason = f"{type(exc).__name__} while {stage.now}; details are in the site's log"
        return records.refused_content(site_name, records.FAILED, reason, {}, ledger_head=head)


def _round(incoming: dict[str, Any], context: Context, site: SiteSettings, config: RunConfig,
           ledger: PrivacyLedger, server_round: int, local_steps: int,
           session_factory: SessionFactory, stage: _Stage) -> RecordDict:
    _check_ledger_unit(ledger, site)
    spent = ledger.spent_epsilon()
    if spent >= site.epsilon_budget:
        delta = float(ledger.meta().get("delta", "nan"))
        raise _Refusal(records.REFUSED, (
            f"budget spent: site {site.site_name!r} has released ε={spent:.4g} of its budget "
            f"{site.epsilon_budget:.4g}"), _refusal_metrics(spent, delta, site.epsilon_budget, spent))

    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    stage.now = "assembling the task (no data read)"
    stage.lap("checks")  # configs, policy, arrays' values, ledger opened, budget left
    session = session_factory(config, records_store=ledger)
    if site.prepared_cache_dir is not None and hasattr(session, "prepared_cache"):
        from graphveil.run.prepared_cache import PreparedCache

        session.prepared_cache = PreparedCache.for_site(site.prepared_cache_dir, site.ledger)
    # Edge level with the site's public size floor: the accountant is bound from public numbers
    # and the spend reserved BEFORE the graph is read, so no reply depends on the data except
    # through the DP update. Node level: the coupled accountant needs |Ē| and n (sizes public there).
    public = session.bind_public_accounting()
    if not public:
        stage.now = "preparing the session (loading the site's graph)"
        session.prepare_accounting()
    releases = bool(session.plan.releases)  # the plan is known once the session is assembled
    if not public and not releases:  # nothing is released before training: prepare in full, as before
        session.prepare()
    stage.lap("setup")
    stage.now = "checking the server's arrays against the task's parameters"
    if incoming and (expected := _public_state(session)) is not None and (
            problem := _shape_problem(incoming, expected)):
        raise _Refusal(records.REFUSED, f"malformed arrays from the server: {problem}")
    sigma, delta = float(session.noise_multiplier), float(session.delta)
    if sigma < site.min_noise_multiplier or delta != site.delta:  # checked on the task already
        raise _Refusal(records.REFUSED, (
            f"site policy: the session's σ={sigma:.4g}, δ={delta:.3g} differ from this site's "
            f"min-noise-multiplier {site.min_noise_multiplier:.4g} / delta {site.delta:.3g}"))
    stage.now = "reserving the round's privacy spend"
    # A plan that releases before training (GAP: encoder, aggregates; recomputed every round)
    # reserves the round's whole planned curve, before any of those releases runs.
    accountant = (_RoundCurve(session.accountant, session.planned_rdp(local_steps), local_steps)
                  if releases else session.accountant)
    reservation = _reserve(ledger, accountant, site, sigma=sigma, delta=delta, steps=local_steps,
                           run=str(context.run_id), server_round=server_round)

    # Charged from here on: the reply is a trained one whatever the data does (RUNBOOK §5).
    metrics: dict[str, float] = {  # records.PUBLIC_METRICS: parameters, not data
        "num-steps": local_steps, "delta": delta, "epsilon-budget": site.epsilon_budget,
        "noise-multiplier": sigma,
    }
    try:
        stage.now = "handing the releases their weights to start from"
        # GAP's encoder starts from the server's (none in round 1: the task's seeded initialisation)
        model_state = session.start_releases_from(incoming)
        stage.now = "preparing the session (loading the site's graph, the releases before training)"
        session.prepare()
        stage.now = "checking the server's arrays against the task's parameters"
        if incoming:  # none: the server holds no model yet (round 1 of a node task); the task's own start
            if problem := _shape_problem(incoming, session.trainable_state()):
                raise ValueError(f"server arrays: {problem}")
            session.load_trainable_state(model_state)
        stage.lap("reserve")  # arrays checked and loaded, spend reserved in the ledger
        stage.now = "training"
        # one learning-rate schedule over the federation (training.steps = rounds × local steps):
        # round r's steps take positions (r-1)·local_steps onwards, whatever this site did before
        session.train(local_steps, schedule_start=(server_round - 1) * local_steps)
        stage.lap("train")
        stage.now = "releasing the round's spend"
        entry = ledger.release(reservation, session.accountant)
        stage.lap("release")
    except Exception:
        # Charged in full and answered like a trained round with the server's own arrays: a
        # different status would tell the server something the data did (RUNBOOK §5).
        log.error("site %s round %d failed while %s (the reserved spend counts; the server's arrays "
                  "are sent back unchanged):\n%s", site.site_name, server_round, stage.now,
                  traceback.format_exc())
        _withhold(ledger, reservation)
        if site.share_epsilon:
            metrics["epsilon"] = ledger.spent_epsilon()
        if site.share_utility_metrics:
            metrics.update({"mrr": math.nan, "prec1": math.nan})
        return records.trained_content(site.site_name, incoming, metrics,
                                       ledger_head=ledger.witness_head())  # after the withhold
    log.info("site %s round %d: %d steps, ε=%.4g of %.4g", site.site_name, server_round,
             local_steps, entry.epsilon, site.epsilon_budget)
    if site.share_epsilon:  # opted in (public anyway when accounted from the size floor)
        metrics["epsilon"] = entry.epsilon
    scores: dict[str, float] = {}
    if site.share_utility_metrics:  # opted in: held-out scores, not privatized
        stage.now = "evaluating on the held-out entities"
        scores = _scores(session, site)
        stage.lap("evaluate")
        metrics.update({"mrr": scores["mrr"], "prec1": scores["prec1"]})
    stage.now = "reporting the round to lifecycle plugins"
    try:
        _report_round_end(session, site, config, server_round=server_round, steps=local_steps,
                          epsilon=entry.epsilon, sigma=sigma, delta=delta, scores=scores)
    except Exception:  # a plugin's failure stays in the site's log; the round was released
        log.error("site %s: a lifecycle plugin failed at round end:\n%s", site.site_name, traceback.format_exc())
    stage.lap("report")
    cache = getattr(session, "prepared_cache", None)
    log.info("site %s round %d timings: started %.3f ended %.3f (unix s); %s; cpu %.3f s; prepared cache %s",
             site.site_name, server_round, stage.started, time.time(),
             ", ".join(f"{k} {v:.3f} s" for k, v in stage.seconds.items()), time.process_time() - stage.cpu,
             "off" if cache is None else f"{cache.hits} hit(s), {cache.misses} miss(es)")
    return records.trained_content(site.site_name, session.trainable_state(), metrics,
                                   ledger_head=ledger.witness_head())  # after the release


def _check_ledger_unit(ledger: PrivacyLedger, site: SiteSettings) -> None:
    """A node-classification site's ledger is bound to the unit its policy states now (level, D,
    k and ``release-scope``): refused before a session is built (nothing of the graph read) if
    the policy changed since the ledger's first spend. Spend under a weights-only unit (DP-GCN:
    its predictions are not covered) must never be composed into a claim covering predictions,
    nor the reverse; the ledger's own binding (:meth:`PrivacyLedger.reserve`) refuses it too,
    but only after the graph's sizes were read. Both values are public (policy and binding)."""
    if not site.node_task:
        return
    bound, mine = ledger.meta().get("unit"), site.gdp_unit.value
    if bound is not None and bound != mine:
        raise _Refusal(records.REFUSED, (
            f"site policy: this site's ledger is bound to the privacy unit {bound!r} but its policy states "
            f"{mine!r} (privacy-unit, degree-bound, k-neighbors or release-scope changed since its first "
            "spend); RDP spend composes under one unit: keep the ledger's unit, or give the new policy "
            "its own ledger"))


def _reserve(ledger: PrivacyLedger, accountant: Any, site: SiteSettings, *, sigma: float, delta: float,
             steps: int, run: str, server_round: int) -> Any:
    """Write the round's spend ahead of training, or refuse the round (nothing spent)."""
    try:
        return ledger.reserve(accountant, noise_multiplier=sigma, steps=steps, delta=delta,
                              budget=site.epsilon_budget, site=site.site_name, run=run, round=server_round)
    except BudgetExhaustedError as exc:
        raise _Refusal(records.REFUSED, str(exc), _refusal_metrics(
            exc.spent, delta, exc.budget, exc.projected_epsilon)) from exc
    except PrivacyError as exc:  # the ledger holds spend this run cannot continue
        log.error("site %s: the ledger refuses this run: %s", site.site_name, exc)
        key = {"unit": "privacy unit", "delta": "δ", "orders": "RDP order grid (use the default grid)",
               "site": "site name"}.get(str(getattr(exc, "key", "")))
        raise _Refusal(records.REFUSED, (
            f"the site's ledger is bound to another {key} than this run's; run the task with the "
            "ledger's setting (details in the site's log)" if key else
            "the site's ledger cannot compose this run's accountant (it needs an RDP accountant "
            "on the ledger's privacy unit and δ; details in the site's log)")) from exc


def _withhold(ledger: PrivacyLedger, reservation: Any) -> None:
    """Mark a reservation withheld (it counts in full), unless the release already settled it."""
    try:
        ledger.withhold(reservation, "the round failed at the site; nothing of its training was released")
    except Exception:  # already released or withheld (e.g. release raised after its own rows)
        log.warning("the reservation was already settled by the ledger:\n%s", traceback.format_exc())


def _scores(session: Any, site: SiteSettings) -> dict[str, float]:
    """Held-out scores (opt-in), NaN if the evaluation fails: the same reply fields either way.
    A node-classification site sends NaN without evaluating: the reply's scores are the
    relational ones, and an evaluation would run the plan's releases after training (DP-SAGE's
    output perturbation), which no round reserves."""
    if site.node_task:
        return {"mrr": math.nan, "prec1": math.nan}
    try:
        scores = session.evaluate()
        return {"mrr": float(scores["mrr"]), "prec1": float(scores["prec1"])}
    except Exception:
        log.error("site %s: evaluation failed (scores sent as NaN):\n%s", site.site_name, traceback.format_exc())
        return {"mrr": math.nan, "prec1": math.nan}


def _report_round_end(session: Any, site: SiteSettings, config: RunConfig, *, server_round: int,
                      steps: int, epsilon: float, sigma: float, delta: float,
                      scores: dict[str, float]) -> None:
    """``graphveil_run_end`` for the round's session, with ``run_dir=None`` (a site writes no run
    directory): the site's name and round, and its privacy numbers, ε being the ledger's total
    for the site. Lifecycle plugins (MLflow tracking) run at the site; nothing here is sent."""
    from graphveil.contract.host import default_host, read_only

    report = {"private": True, "site": site.site_name, "server_round": server_round, "steps": steps,
              "epsilon": epsilon, "epsilon_budget": site.epsilon_budget, "delta": delta,
              "noise_multiplier": sigma,
              "unit": site.gdp_unit.value if site.node_task else site.privacy_unit, "sampler": config.sampler.name,
              "clipper": config.clipper.name, "accountant": config.accountant.name, **scores}
    host = getattr(session, "host", None) or default_host()  # the host the session's steps reported to
    host.hook.graphveil_run_end(run_dir=None, report=read_only(report))


def _decoded_arrays(content: RecordDict, max_abs: float) -> dict[str, Any]:
    """The server's arrays as tensors, checked on their values alone before any data is read:
    decodable, floating point, finite and within the site's ``max-abs-weight``; else a refusal
    naming the first bad key (nothing reserved)."""
    import torch

    arrays = content.array_records.get(records.ARRAYS)
    if arrays is None:
        raise _Refusal(records.REFUSED, "malformed train message: no arrays")
    out: dict[str, Any] = {}
    for key in sorted(arrays):
        try:
            value = torch.from_numpy(np.array(arrays[key].numpy(), copy=True))
        except Exception as exc:  # undecodable bytes, object dtype, ...
            raise _Refusal(records.REFUSED, f"malformed arrays from the server: key {key!r} cannot be "
                           f"decoded ({type(exc).__name__})") from exc
        if not value.dtype.is_floating_point:
            raise _Refusal(records.REFUSED, f"malformed arrays from the server: key {key!r} is {value.dtype}, "
                           "not a floating-point parameter")
        if not bool(torch.isfinite(value).all()):
            raise _Refusal(records.REFUSED, f"malformed arrays from the server: key {key!r} has "
                           "non-finite values (NaN or Inf)")
        if value.numel() and float(value.abs().max()) > max_abs:
            raise _Refusal(records.REFUSED, f"site policy: max-abs-weight: key {key!r} has a value of "
                           f"magnitude {float(value.abs().max()):.4g} > {max_abs:.4g}")
        out[key] = value
    return out


def _shape_problem(incoming: dict[str, Any], expected: dict[str, Any]) -> str | None:
    """What is wrong with the keys, shapes or dtypes of ``incoming`` against the session's
    trainable state, or ``None``."""
    from graphveil.contract.model import state_problem

    return state_problem(incoming, expected)


def _public_state(session: Any) -> dict[str, Any] | None:
    """The trainable state's keys and shapes if the model has them before the graph is read (a
    LoRA adapter; not a head sized by the graph's features), else ``None``."""
    try:
        state = session.trainable_state()
    except Exception:  # the model is sized by the data: checked after prepare()
        return None
    return state or None


def _refusal_metrics(spent: float, delta: float, budget: float, projected: float) -> dict[str, float]:
    return {"num-steps": 0, "epsilon": spent, "delta": delta, "epsilon-budget": budget,
            "projected-epsilon": projected}


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Flower entry point: one round of local DP training at this site."""
    return Message(handle_train(msg.content, context), reply_to=msg)
