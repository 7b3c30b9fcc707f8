"""The per-site privacy ledger: write-ahead spend, refusal past the budget, durability, odometer."""

from __future__ import annotations

import json
import multiprocessing
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fed_support import (
    OtherMechanism,
    PoissonGaussianRdp,
    dp_accounting_epsilon,
    opacus_epsilon,
)

from graphveil.errors import PrivacyError
from graphveil.ledger import BudgetExhaustedError, LedgerError, PrivacyLedger

DELTA = 1e-5
RATE = 0.02


def _round(ledger: PrivacyLedger, steps: int, sigma: float, budget: float, **kw) -> float:
    """One site round: reserve, run the steps on an accountant continuing the history, release."""
    template = PoissonGaussianRdp(RATE)
    res = ledger.reserve(template, noise_multiplier=sigma, steps=steps, delta=DELTA, budget=budget, **kw)
    running = PoissonGaussianRdp(RATE)
    res.apply_prior(running)
    for _ in range(steps):
        running.step(noise_multiplier=sigma)
    return ledger.release(res, running).epsilon


def test_fresh_ledger_is_empty(tmp_path: Path) -> None:
    with PrivacyLedger(tmp_path / "sub" / "ledger.sqlite") as ledger:
        assert ledger.spent_epsilon() == 0.0
        assert ledger.accountant_state() is None
        assert ledger.total_steps() == 0
        assert ledger.entries() == []


def test_spend_composes_across_rounds_and_runs_like_dp_accounting_and_opacus(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    history = [(1.2, RATE, 10), (1.2, RATE, 10), (0.8, RATE, 5)]
    with PrivacyLedger(path) as ledger:
        for sigma, _, steps in history[:2]:
            _round(ledger, steps, sigma, budget=50.0, site="a", run="run-1")
    # A new run (new process would do the same) reopens the file and keeps counting.
    with PrivacyLedger(path) as ledger:
        eps = _round(ledger, 5, 0.8, budget=50.0, site="a", run="run-2")
        assert ledger.total_steps() == 25
        assert [e.status for e in ledger.entries()] == ["released"] * 3
    expected = dp_accounting_epsilon(history, DELTA)
    assert eps == pytest.approx(expected, rel=1e-12)
    assert eps == pytest.approx(opacus_epsilon(history, DELTA), rel=1e-4)
    # and it is more than either run would report on its own
    assert eps > max(dp_accounting_epsilon(history[:2], DELTA), dp_accounting_epsilon(history[2:], DELTA)) + 0.01


def test_refuses_past_budget_and_records_the_refusal(tmp_path: Path) -> None:
    with PrivacyLedger(tmp_path / "l.sqlite") as ledger:
        spent = _round(ledger, 20, 1.0, budget=3.0, site="a")
        one_more = dp_accounting_epsilon([(1.0, RATE, 40)], DELTA)
        with pytest.raises(BudgetExhaustedError, match="past its budget") as info:
            ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=20, delta=DELTA,
                           budget=one_more * 0.999, site="a")
        assert info.value.projected_epsilon == pytest.approx(one_more, rel=1e-12)
        assert info.value.spent == pytest.approx(spent)
        # nothing counted; the refusal is on record
        assert ledger.spent_epsilon() == pytest.approx(spent)
        assert ledger.total_steps() == 20
        assert [e.status for e in ledger.entries()] == ["released", "refused"]
        # exactly at the budget is allowed
        _round(ledger, 20, 1.0, budget=one_more, site="a")
        assert ledger.spent_epsilon() == pytest.approx(one_more, rel=1e-12)


@given(
    requests=st.lists(
        st.tuples(st.integers(0, 30), st.sampled_from([0.7, 1.0, 1.5, 3.0])), min_size=1, max_size=6
    ),
    budget=st.floats(0.2, 6.0),
)
@settings(max_examples=25, deadline=None)
def test_odometer_never_exceeds_budget_and_refuses_exactly_when_it_would(tmp_path_factory, requests, budget) -> None:
    path = tmp_path_factory.mktemp("prop") / "l.sqlite"
    accepted: list[tuple[float, float, int]] = []
    with PrivacyLedger(path) as ledger:
        for steps, sigma in requests:
            trial = [*accepted, (sigma, RATE, steps)] if steps else accepted
            would = dp_accounting_epsilon(trial, DELTA) if trial else 0.0
            if would > budget:
                with pytest.raises(BudgetExhaustedError):
                    _round(ledger, steps, sigma, budget)
            else:
                _round(ledger, steps, sigma, budget)
                if steps:
                    accepted.append((sigma, RATE, steps))
            assert ledger.spent_epsilon() <= budget
        expected = dp_accounting_epsilon(accepted, DELTA) if accepted else 0.0
        assert ledger.spent_epsilon() == pytest.approx(expected, rel=1e-9, abs=1e-12)


_CRASH = """
import os, sys
sys.path.insert(0, {tests!r})
from graphveil.ledger import PrivacyLedger
from test_fed_support import PoissonGaussianRdp
ledger = PrivacyLedger({path!r})
ledger.reserve(PoissonGaussianRdp(0.02), noise_multiplier=1.0, steps=15, delta=1e-5, budget=10.0, site="a")
os._exit(9)   # killed mid-round: after the reservation, before the release
"""


def test_site_killed_mid_round_never_undercounts(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with PrivacyLedger(path) as ledger:
        _round(ledger, 10, 1.0, budget=10.0, site="a")
    code = _CRASH.format(tests=str(Path(__file__).parent), path=str(path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    with PrivacyLedger(path) as ledger:
        assert [e.status for e in ledger.entries()] == ["released", "reserved"]
        assert ledger.spent_epsilon() == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 25)], DELTA))
        # the restarted site continues from the unconfirmed reservation
        eps = _round(ledger, 5, 1.0, budget=10.0, site="a")
    assert eps == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 30)], DELTA), rel=1e-12)


def _reserve_many(path: str, n: int) -> None:
    with PrivacyLedger(path) as ledger:
        for _ in range(n):
            _round(ledger, 3, 1.0, budget=100.0, site="a")


def test_concurrent_rounds_at_one_site_all_count(tmp_path: Path) -> None:
    path = str(tmp_path / "l.sqlite")
    PrivacyLedger(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_reserve_many, args=(path, 4)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    with PrivacyLedger(path) as ledger:
        assert ledger.total_steps() == 24
        assert ledger.spent_epsilon() == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 24)], DELTA), rel=1e-12)


def test_release_records_a_larger_spend_and_withholds_past_budget(tmp_path: Path) -> None:
    with PrivacyLedger(tmp_path / "l.sqlite") as ledger:
        res = ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=5, delta=DELTA, budget=2.0)
        ran_more = PoissonGaussianRdp(RATE)
        ran_more.step(noise_multiplier=1.0, num_steps=8)  # the session did more than it reserved
        entry = ledger.release(res, ran_more)
        assert entry.status == "released"
        assert entry.epsilon == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 8)], DELTA))
        assert "recorded the larger" in entry.note

        res = ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=1, delta=DELTA, budget=2.0)
        way_more = PoissonGaussianRdp(RATE)
        way_more.step(noise_multiplier=0.5, num_steps=200)
        with pytest.raises(BudgetExhaustedError, match="withheld"):
            ledger.release(res, way_more)
        assert ledger.entries()[-1].status == "withheld"
        assert ledger.spent_epsilon() == pytest.approx(way_more.get_epsilon(DELTA))
        with pytest.raises(LedgerError, match="not reserved"):
            ledger.release(res, way_more)


def test_a_larger_spend_behind_a_newer_reservation_is_withheld(tmp_path: Path) -> None:
    with PrivacyLedger(tmp_path / "l.sqlite") as ledger:
        first = ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=5, delta=DELTA, budget=9.0)
        second = ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=5, delta=DELTA, budget=9.0)
        ran_more = PoissonGaussianRdp(RATE)
        ran_more.step(noise_multiplier=1.0, num_steps=7)
        with pytest.raises(BudgetExhaustedError, match="withheld"):
            ledger.release(first, ran_more)
        assert ledger.withhold(first, "again").status == "withheld"  # idempotent
        running = PoissonGaussianRdp(RATE)
        second.apply_prior(running)
        running.step(noise_multiplier=1.0, num_steps=5)
        assert ledger.release(second, running).status == "released"
        assert ledger.spent_epsilon() == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 10)], DELTA))
        with pytest.raises(LedgerError, match="released, not reserved"):
            ledger.withhold(second, "too late")


def test_mismatched_mechanism_delta_or_site_is_refused(tmp_path: Path) -> None:
    with PrivacyLedger(tmp_path / "l.sqlite") as ledger:
        _round(ledger, 2, 1.0, budget=5.0, site="a")
        with pytest.raises(PrivacyError, match="mechanism"):
            ledger.reserve(OtherMechanism(RATE), noise_multiplier=1.0, steps=1, delta=DELTA, budget=5.0)
        with pytest.raises(PrivacyError, match="delta"):
            ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=1, delta=2e-5, budget=5.0)
        with pytest.raises(PrivacyError, match="site"):
            ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=1, delta=DELTA, budget=5.0, site="b")
        for bad in (0.0, -1.0, float("inf"), float("nan")):
            with pytest.raises(PrivacyError, match="budget"):
                ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=1, delta=DELTA, budget=bad)
        with pytest.raises(PrivacyError, match="noise multiplier"):
            ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=0.0, steps=1, delta=DELTA, budget=5.0)
        assert ledger.total_steps() == 2


def test_not_a_ledger_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match="not a GraphVeil privacy ledger"):
        PrivacyLedger(junk)
    with pytest.raises(LedgerError, match="no such ledger"):
        PrivacyLedger(tmp_path / "missing.sqlite", create=False)
    newer = tmp_path / "newer.sqlite"
    PrivacyLedger(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="schema version 99"):
        PrivacyLedger(newer)


def test_budget_show_cli(tmp_path: Path, capsys) -> None:
    from graphveil.cli import main

    path = tmp_path / "l.sqlite"
    with PrivacyLedger(path) as ledger:
        eps = _round(ledger, 10, 1.0, budget=4.0, site="bank-a", run="7", round=1)
        with pytest.raises(BudgetExhaustedError):
            _round(ledger, 5000, 0.5, budget=4.0, site="bank-a", run="7", round=2)
    assert main(["budget", "show", "--ledger", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["summary"]["site"] == "bank-a"
    assert shown["summary"]["epsilon_spent"] == pytest.approx(eps)
    assert shown["summary"]["epsilon_remaining"] == pytest.approx(4.0 - eps)
    assert shown["summary"]["counts"] == {"reserved": 0, "released": 1, "withheld": 0, "refused": 1}
    assert [e["status"] for e in shown["entries"]] == ["released", "refused"]
    assert main(["budget", "show", "--ledger", str(path)]) == 0
    human = capsys.readouterr().out
    assert "bank-a" in human and f"{eps:.4g}" in human and "refused" in human
    assert main(["budget", "show", "--ledger", str(tmp_path / "nope.sqlite")]) == 2
    assert "no such ledger" in capsys.readouterr().err
    assert not (tmp_path / "nope.sqlite").exists()
    assert os.path.getsize(path) > 0
