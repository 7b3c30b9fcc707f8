"""The site: a Flower ClientApp that trains on the site's own graph under the site's own budget.

One train message = one round at the site (:func:`handle_train`):

1. read the node config (graph, budget, ledger) and the run's task; refuse at once if the
   ledger already shows the budget spent (no data is touched);
2. build the site's :class:`~graphveil.session.TrainingSession` on its own graph only;
3. write the round's spend to the ledger *before* training (:meth:`PrivacyLedger.reserve`),
   or refuse the round if it would pass the budget, telling the server why;
4. load the global adapter, run the local DP steps (the accountant continues the site's
   history), confirm the spend (:meth:`PrivacyLedger.release`);
5. reply with the updated adapter and scalars (:mod:`.records`) — nothing else leaves.

Errors are logged at the site in full; the server only learns which stage failed, because an
exception text may quote the data (a malformed record, an entity id).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from graphveil.cli_fed import SiteSettings
from graphveil.config import RunConfig
from graphveil.connectors.flower import records
from graphveil.connectors.flower.settings import FederationSettings, round_seed, site_run_config
from graphveil.errors import PrivacyError
from graphveil.ledger import BudgetExhaustedError, PrivacyLedger

log = logging.getLogger(__name__)

SessionFactory = Callable[[RunConfig], Any]


def _real_session(config: RunConfig) -> Any:
    from graphveil.session import TrainingSession

    return TrainingSession(config)


class _Stage:
    """What the site is doing; the only detail of a failure the server learns."""

    now = "starting"


class _Refusal(Exception):
    def __init__(self, status: str, reason: str, metrics: dict[str, float] | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.metrics = status, reason, metrics or {}


def handle_train(content: RecordDict, context: Context, *,
                 session_factory: SessionFactory = _real_session) -> RecordDict:
    """One round at the site; returns the reply content (trained, refused or failed)."""
    site_name = str(context.node_config.get("site-name", "?"))
    stage = _Stage()
    try:
        stage.now = "reading the node config"
        site = SiteSettings.from_mapping(context.node_config, "SuperNode node config")
        site_name = site.site_name
        stage.now = "reading the run config"
        fed = FederationSettings.from_run_config(context.run_config)
        cfg = content[records.CONFIG]
        server_round = int(cfg[records.SERVER_ROUND])
        local_steps = int(cfg.get(records.LOCAL_STEPS, fed.local_steps))
        stage.now = "opening the privacy ledger"
        with PrivacyLedger(site.ledger) as ledger:
            return _round(content, context, site, fed, ledger, server_round, local_steps,
                          session_factory, stage)
    except _Refusal as refusal:
        log.warning("site %s refuses round: %s", site_name, refusal.reason)
        return records.refused_content(site_name, refusal.status, refusal.reason, refusal.metrics)
    except Exception as exc:
        log.error("site %s failed while %s:\n%s", site_name, stage.now, traceback.format_exc())
        reason = f"{type(exc).__name__} while {stage.now}; details are in the site's log"
        return records.refused_content(site_name, records.FAILED, reason, {})


def _round(content: RecordDict, context: Context, site: SiteSettings, fed: FederationSettings,
           ledger: PrivacyLedger, server_round: int, local_steps: int,
           session_factory: SessionFactory, stage: _Stage) -> RecordDict:
    spent = ledger.spent_epsilon()
    if spent >= site.epsilon_budget:
        delta = float(ledger.meta().get("delta", "nan"))
        raise _Refusal(records.REFUSED, (
            f"budget spent: site {site.site_name!r} has released ε={spent:.4g} of its budget "
            f"{site.epsilon_budget:.4g}"), _refusal_metrics(spent, delta, site.epsilon_budget, spent))

    stage.now = "building the site's run config"
    config = site_run_config(fed, site, seed=round_seed(site, context.run_id, server_round))
    if not config.privacy.enabled:
        raise _Refusal(records.REFUSED, "the task disables privacy; this site releases only DP updates")
    if config.privacy.delta is None:
        # The default δ = 1/|Ē| would tell the server the size of the site's graph.
        raise _Refusal(records.REFUSED, "no δ set: put delta in the site's node config (the default "
                       "1/|Ē| is data-dependent and would be reported to the server)")
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    stage.now = "preparing the session (loading the site's graph)"
    session = session_factory(config)
    session.prepare()
    sigma, delta = float(session.noise_multiplier), float(session.delta)
    if site.min_noise_multiplier is not None and sigma < site.min_noise_multiplier:
        raise _Refusal(records.REFUSED, (
            f"noise multiplier σ={sigma:.4g} is below this site's minimum {site.min_noise_multiplier:.4g}"),
            _refusal_metrics(spent, delta, site.epsilon_budget, spent))
    stage.now = "reserving the round's privacy spend"
    try:
        reservation = ledger.reserve(
            session.accountant, noise_multiplier=sigma, steps=local_steps, delta=delta,
            budget=site.epsilon_budget, site=site.site_name, run=str(context.run_id), round=server_round,
        )
    except BudgetExhaustedError as exc:
        raise _Refusal(records.REFUSED, str(exc), _refusal_metrics(
            exc.spent, delta, exc.budget, exc.projected_epsilon)) from exc
    except PrivacyError as exc:  # the ledger holds spend this run cannot continue
        log.error("site %s: the ledger refuses this run: %s", site.site_name, exc)
        raise _Refusal(records.REFUSED, (
            "the site's ledger holds spend under another privacy unit, accountant, δ or sampling "
            "profile than this run's; the site needs the same task settings or a separate ledger "
            "(details in the site's log)")) from exc

    stage.now = "training"
    try:
        reservation.apply_prior(session.accountant)
        session.load_trainable_state(records.state_from_arrays(content[records.ARRAYS]))
        out = session.train(local_steps)
        entry = ledger.release(reservation, session.accountant)
    except BudgetExhaustedError as exc:  # the steps that ran cost more than reserved
        raise _Refusal(records.REFUSED, str(exc), _refusal_metrics(
            exc.spent, delta, exc.budget, exc.projected_epsilon)) from exc
    except BaseException:
        ledger.withhold(reservation, "training failed; nothing was released")
        raise
    log.info("site %s round %d: %d steps, ε=%.4g of %.4g", site.site_name, server_round,
             local_steps, entry.epsilon, site.epsilon_budget)
    metrics: dict[str, float] = {
        "num-steps": local_steps, "epsilon": entry.epsilon, "delta": delta,
        "epsilon-budget": site.epsilon_budget, "noise-multiplier": sigma,
    }
    if site.share_utility_metrics:
        stage.now = "evaluating on the held-out entities"
        scores = session.evaluate()
        metrics.update({"tuples-used": int(out["tuples_used"]), "mrr": float(scores["mrr"]),
                        "prec1": float(scores["prec1"])})
    return records.trained_content(site.site_name, session.trainable_state(), metrics)


def _refusal_metrics(spent: float, delta: float, budget: float, projected: float) -> dict[str, float]:
    return {"num-steps": 0, "epsilon": spent, "delta": delta, "epsilon-budget": budget,
            "projected-epsilon": projected}


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Flower entry point: one round of local DP training at this site."""
    return Message(handle_train(msg.content, context), reply_to=msg)
