"""Guards found missing by tests/mutation/run_mutants.py (each names the mutant it kills).

``site-delta-session``: the site re-checks the *prepared* session against its policy. The task
check (settings.check_site_policy) and ``site_run_config`` already put the site's δ into the
config, so only a session that does not honour ``privacy.delta`` (a plugin or a future default
such as 1/|Ē|, which is data-dependent) can reach the re-check — and then the round must be
refused before any spend is reserved and before training.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _fed_support import RUN_CONFIG, FakeSession, node_config, site_context, train_content

from graphveil.connectors.flower import records
from graphveil.connectors.flower.site import handle_train

pytestmark = pytest.mark.usefixtures("fresh_fake_sessions")


class _OwnDeltaSession(FakeSession):
    """A session that ignores ``privacy.delta`` and reports its own (data-dependent) δ."""

    trained = 0

    def bind_public_accounting(self) -> bool:
        super().bind_public_accounting()
        self.delta = 1.0 / 1234  # e.g. 1/|Ē|: reveals the size of the site's graph
        return True

    def train(self, num_steps=None, **kw):
        type(self).trained += 1
        return super().train(num_steps, **kw)


def test_site_refuses_a_session_whose_delta_is_not_the_sites(tmp_path: Path) -> None:
    cfg = node_config(tmp_path)
    _OwnDeltaSession.trained = 0
    reply = handle_train(train_content(), site_context(11, cfg, RUN_CONFIG), session_factory=_OwnDeltaSession)
    site = reply.config_records[records.SITE]
    assert site["status"] == records.REFUSED, dict(site)
    assert "δ" in site["reason"] or "delta" in site["reason"]
    assert records.ARRAYS not in reply  # nothing trained leaves
    assert _OwnDeltaSession.trained == 0
    from graphveil.ledger import PrivacyLedger

    if Path(cfg["ledger"]).exists():  # opened, but no spend reserved for this round
        with PrivacyLedger(cfg["ledger"], create=False) as ledger:
            assert ledger.spent_epsilon() == 0.0
            assert [e.status for e in ledger.entries()] == []
