"""The per-site privacy ledger: RDP-curve composition, write-ahead spend, refusal past the budget,
durability, hash chain, anchor against rollback, v1 migration, record-set storage."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from _fed_support import ORDERS, PoissonGaussianRdp, dp_accounting_epsilon, opacus_epsilon
from _ledger_rounds import DELTA, RATE, edge, site_round
from _paths import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from graphveil.contract.errors import PrivacyError
from graphveil.contract.profiles import (
    PrivacyUnit,
    SamplingKind,
    SamplingProfile,
    SensitivityKind,
    SensitivityProfile,
)
from graphveil.ledger import (
    SCHEMA_VERSION,
    BudgetExhaustedError,
    LedgerBindingError,
    LedgerError,
    PrivacyLedger,
    WitnessHead,
    init_ledger,
)
from graphveil.ledger.site_key import key_path_for
from graphveil.plugins.entity_dp.accountant import CoupledRdpAccountant
from graphveil.privacy import DEFAULT_ORDERS, RdpParams, rdp_to_epsilon


def node(rate: float = 0.01) -> CoupledRdpAccountant:
    acc = CoupledRdpAccountant(RdpParams(orders=ORDERS))
    acc.bind(SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, rate, num_records=500, num_nodes=200,
                             degree_cap=3, k_neg=1),
             SensitivityProfile(SensitivityKind.FREQ_CLIP_NODE, PrivacyUnit.NODE, 1.0))
    return acc


def _sql(path: Path, stmt: str, *args) -> None:
    with sqlite3.connect(path) as db:
        db.execute(stmt, args)


def test_fresh_ledger_is_empty(tmp_path: Path) -> None:
    with init_ledger(tmp_path / "sub" / "ledger.sqlite") as ledger:
        assert ledger.spent_epsilon() == 0.0
        assert ledger.total_rdp() is None
        assert ledger.total_steps() == 0
        assert ledger.entries() == []
        count, head = ledger.head()
        assert count == 0 and head == ledger.genesis() and len(head) == 64
        assert ledger.verify().ok
        assert ledger.meta()["schema_version"] == str(SCHEMA_VERSION) == "3"
        assert ledger.witness_head() == WitnessHead(0, ledger.genesis(), None)
    key = key_path_for(tmp_path / "sub" / "ledger.sqlite")
    assert key.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["ledger.sqlite", "ledger.sqlite.key"]


def test_spend_composes_across_rounds_and_runs_like_dp_accounting_and_opacus(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    history = [(1.2, RATE, 10), (1.2, RATE, 10), (0.8, RATE, 5)]
    with init_ledger(path) as ledger:
        for sigma, _, steps in history[:2]:
            site_round(ledger, steps, sigma, budget=50.0, site="a", run="run-1")
    # A new run (new process would do the same) reopens the file and keeps counting; its own
    # accountant knows only its own steps.
    with PrivacyLedger(path) as ledger:
        eps = site_round(ledger, 5, 0.8, budget=50.0, site="a", run="run-2")
        assert ledger.total_steps() == 25
        assert [e.status for e in ledger.entries()] == ["released"] * 3
        assert ledger.verify().ok and ledger.verify().count == 7  # bind + 3 × (reserve, release)
    expected = dp_accounting_epsilon(history, DELTA)
    assert eps == pytest.approx(expected, rel=1e-9)
    assert eps == pytest.approx(opacus_epsilon(history, DELTA), rel=1e-4)
    assert eps > max(dp_accounting_epsilon(history[:2], DELTA), dp_accounting_epsilon(history[2:], DELTA)) + 0.01


def test_runs_with_different_gamma_and_sigma_compose_their_rdp_curves(tmp_path: Path) -> None:
    """A change of batch size (γ) and σ is another increment on the same ledger, never a refusal."""
    runs = [(0.02, 1.1, 30), (0.05, 0.9, 12), (0.01, 2.0, 50)]
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        for rate, sigma, steps in runs:
            eps = site_round(ledger, steps, sigma, budget=50.0, rate=rate, site="a")
        total = sum(steps * edge(rate).rdp_curve(sigma) for rate, sigma, steps in runs)
        assert eps == rdp_to_epsilon(ORDERS, total, DELTA)[0]
        assert ledger.spent_epsilon() == eps
        orders, curve = ledger.total_rdp()
        np.testing.assert_allclose(curve, total, rtol=1e-12)
    # independent cross-check: dp-accounting composing the PoissonSampledDpEvents of both rates
    acc = dp_accounting.rdp.RdpAccountant(orders=ORDERS)
    for rate, sigma, steps in runs:
        acc.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(sigma)), steps)
    assert eps == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    assert eps == pytest.approx(dp_accounting_epsilon([(s, r, n) for r, s, n in runs], DELTA), rel=1e-9)


def test_mechanisms_of_one_unit_compose(tmp_path: Path) -> None:
    from graphveil.plugins.entity_dp.accountant import CoupledRdpFreqAccountant

    freq = CoupledRdpFreqAccountant(RdpParams(orders=ORDERS))
    freq.bind(SamplingProfile(SamplingKind.COUPLED_POISSON_WOR, 0.03, num_records=400, num_nodes=200,
                              degree_cap=2, k_neg=1),
              SensitivityProfile(SensitivityKind.FREQ_CLIP_NODE, PrivacyUnit.NODE, 1.0))
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        for acc, sigma, steps in ((node(), 1.5, 6), (freq, 2.0, 4)):
            res = ledger.reserve(acc, noise_multiplier=sigma, steps=steps, delta=DELTA, budget=500.0)
            acc.step(noise_multiplier=sigma, num_steps=steps)  # reserve read only its per-step curve
            ledger.release(res, acc)
        total = 6 * node().rdp_curve(1.5) + 4 * freq.rdp_curve(2.0)
        assert ledger.spent_epsilon() == rdp_to_epsilon(ORDERS, total, DELTA)[0]
        assert ledger.summary()["mechanism"] == "coupled_rdp, coupled_rdp_freq"


def test_node_level_spend_is_refused_on_an_edge_ledger_naming_the_unit(tmp_path: Path) -> None:
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        site_round(ledger, 4, 1.0, budget=50.0, site="a")
        with pytest.raises(LedgerBindingError, match="privacy unit 'edge'") as info:
            ledger.reserve(node(), noise_multiplier=1.0, steps=3, delta=DELTA, budget=50.0)
        assert info.value.key == "unit" and "separate ledger" not in str(info.value)
        events = ledger.events()
        assert events[1]["profile"]["mechanism"] == "edge_rdp"
        assert events[1]["profile"]["profile"]["gamma"] == RATE
        assert events[1]["profile"]["noise_multiplier"] == 1.0 and events[1]["profile"]["steps"] == 4


@pytest.mark.parametrize(("first", "then"), [
    ("node/replacement/D=168/predictions", "node/replacement/D=168"),
    ("node/replacement/D=168", "node/replacement/D=168/predictions")])
def test_a_ledger_is_bound_to_its_release_scope(tmp_path: Path, first: str, then: str) -> None:
    """Spend on DP-GCN's weights (a weights-only unit: its predictions are not covered) never
    composes with spend whose claim covers predictions, in either order: the scope is part of
    the bound unit."""
    from graphveil.plugins.dp_gcn.accountant import SplitRdpAccountant

    def split(label: str) -> SplitRdpAccountant:
        acc = SplitRdpAccountant(RdpParams(orders=ORDERS))
        acc.unit = PrivacyUnit.parse(label)
        acc.bind(SamplingProfile(SamplingKind.UNIFORM_WOR, 0.2, num_records=10, batch_size=2),
                 SensitivityProfile(SensitivityKind.PER_EXAMPLE, acc.unit, 1.0))
        return acc

    with init_ledger(tmp_path / "l.sqlite") as ledger:
        ledger.reserve(split(first), noise_multiplier=1.0, steps=2, delta=DELTA, budget=50.0)
        with pytest.raises(LedgerBindingError, match=f"privacy unit {first!r}") as info:
            ledger.reserve(split(then), noise_multiplier=1.0, steps=2, delta=DELTA, budget=50.0)
        assert info.value.key == "unit" and ledger.meta()["unit"] == first


def test_refuses_past_budget_and_records_the_refusal(tmp_path: Path) -> None:
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        spent = site_round(ledger, 20, 1.0, budget=3.0, site="a")
        one_more = dp_accounting_epsilon([(1.0, RATE, 40)], DELTA)
        with pytest.raises(BudgetExhaustedError, match="past its budget") as info:
            ledger.reserve(edge(), noise_multiplier=1.0, steps=20, delta=DELTA, budget=one_more * 0.999, site="a")
        assert info.value.projected_epsilon == pytest.approx(one_more, rel=1e-9)
        assert info.value.spent == pytest.approx(spent)
        assert ledger.spent_epsilon() == pytest.approx(spent)
        assert ledger.total_steps() == 20
        assert [e.status for e in ledger.entries()] == ["released", "refused"]
        site_round(ledger, 20, 1.0, budget=one_more * (1 + 1e-9), site="a")
        assert ledger.spent_epsilon() == pytest.approx(one_more, rel=1e-9)
        assert ledger.verify().ok


@given(
    requests=st.lists(
        st.tuples(st.integers(0, 30), st.sampled_from([0.7, 1.0, 1.5, 3.0]), st.sampled_from([0.01, 0.02])),
        min_size=1, max_size=5,
    ),
    budget=st.floats(0.2, 6.0),
)
@settings(max_examples=20, deadline=None)
def test_odometer_never_exceeds_budget_and_refuses_exactly_when_it_would(tmp_path_factory, requests, budget) -> None:
    path = tmp_path_factory.mktemp("prop") / "l.sqlite"
    accepted: list[tuple[float, float, int]] = []
    with init_ledger(path) as ledger:
        for steps, sigma, rate in requests:
            trial = [*accepted, (sigma, rate, steps)] if steps else accepted
            would = dp_accounting_epsilon(trial, DELTA) if trial else 0.0
            if would > budget * (1 + 1e-9):
                with pytest.raises(BudgetExhaustedError):
                    site_round(ledger, steps, sigma, budget, rate=rate)
            elif would < budget * (1 - 1e-9):
                site_round(ledger, steps, sigma, budget, rate=rate)
                if steps:
                    accepted.append((sigma, rate, steps))
            else:
                continue  # within rounding of the budget: either answer is right
            assert ledger.spent_epsilon() <= budget
        expected = dp_accounting_epsilon(accepted, DELTA) if accepted else 0.0
        assert ledger.spent_epsilon() == pytest.approx(expected, rel=1e-9, abs=1e-12)
        assert ledger.verify().ok


_CRASH = """
import os, sys
sys.path[:0] = {paths!r}
from _ledger_rounds import edge
from graphveil.ledger import PrivacyLedger
ledger = PrivacyLedger({path!r})
ledger.reserve(edge(), noise_multiplier=1.0, steps=15, delta=1e-5, budget=10.0, site="a")
os._exit(9)   # killed mid-round: after the reservation, before the release
"""


def test_site_killed_mid_round_never_undercounts(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    with init_ledger(path) as ledger:
        site_round(ledger, 10, 1.0, budget=10.0, site="a")
    code = _CRASH.format(paths=[str(Path(__file__).parent), str(REPO / "tests")], path=str(path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    with PrivacyLedger(path) as ledger:
        assert [e.status for e in ledger.entries()] == ["released", "reserved"]
        assert ledger.spent_epsilon() == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 25)], DELTA))
        eps = site_round(ledger, 5, 1.0, budget=10.0, site="a")
        assert ledger.verify().ok
    assert eps == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 30)], DELTA), rel=1e-9)


def _reserve_many(path: str, n: int) -> None:
    with PrivacyLedger(path) as ledger:
        for _ in range(n):
            site_round(ledger, 3, 1.0, budget=100.0, site="a")


def test_concurrent_rounds_at_one_site_all_count(tmp_path: Path) -> None:
    path = str(tmp_path / "l.sqlite")
    init_ledger(path).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_reserve_many, args=(path, 4)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    with PrivacyLedger(path) as ledger:
        assert ledger.total_steps() == 24
        assert ledger.spent_epsilon() == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 24)], DELTA), rel=1e-9)
        assert ledger.verify().ok


def test_release_records_a_larger_curve_and_withholds_past_budget(tmp_path: Path) -> None:
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        res = ledger.reserve(edge(), noise_multiplier=1.0, steps=5, delta=DELTA, budget=2.0)
        ran_more = edge()
        ran_more.step(noise_multiplier=1.0, num_steps=8)  # the session did more than it reserved
        entry = ledger.release(res, ran_more)
        assert entry.status == "released"
        assert entry.epsilon == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 8)], DELTA), rel=1e-9)
        assert "recorded the larger" in entry.note

        res = ledger.reserve(edge(), noise_multiplier=1.0, steps=1, delta=DELTA, budget=2.0)
        way_more = edge()
        way_more.step(noise_multiplier=0.5, num_steps=200)
        with pytest.raises(BudgetExhaustedError, match="withheld"):
            ledger.release(res, way_more)
        assert ledger.entries()[-1].status == "withheld"
        expected = rdp_to_epsilon(ORDERS, 8 * edge().rdp_curve(1.0) + np.maximum(edge().rdp_curve(1.0),
                                  way_more.total_rdp()), DELTA)[0]
        assert ledger.spent_epsilon() == pytest.approx(expected, rel=1e-9)
        with pytest.raises(LedgerError, match="not reserved"):
            ledger.release(res, way_more)
        assert ledger.verify().ok


def test_release_checks_the_curve_of_the_run_not_its_epsilon(tmp_path: Path) -> None:
    """A run at another γ whose curve exceeds the reserved one at some order is caught."""
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        res = ledger.reserve(edge(0.02), noise_multiplier=1.0, steps=10, delta=DELTA, budget=50.0)
        other = edge(0.04)  # the batch grew after reserving
        other.step(noise_multiplier=1.0, num_steps=10)
        entry = ledger.release(res, other)
        assert "recorded the larger" in entry.note
        assert ledger.spent_epsilon() == pytest.approx(rdp_to_epsilon(ORDERS, other.total_rdp(), DELTA)[0], rel=1e-9)


def test_a_larger_spend_behind_a_newer_reservation_is_withheld(tmp_path: Path) -> None:
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        first = ledger.reserve(edge(), noise_multiplier=1.0, steps=5, delta=DELTA, budget=9.0)
        second = ledger.reserve(edge(), noise_multiplier=1.0, steps=5, delta=DELTA, budget=9.0)
        ran_more = edge()
        ran_more.step(noise_multiplier=1.0, num_steps=7)
        with pytest.raises(BudgetExhaustedError, match="withheld"):
            ledger.release(first, ran_more)
        assert ledger.withhold(first, "again").status == "withheld"  # idempotent
        running = edge()
        running.step(noise_multiplier=1.0, num_steps=5)
        assert ledger.release(second, running).status == "released"
        assert ledger.spent_epsilon() == pytest.approx(dp_accounting_epsilon([(1.0, RATE, 10)], DELTA), rel=1e-9)
        with pytest.raises(LedgerError, match="released, not reserved"):
            ledger.withhold(second, "too late")
        assert ledger.verify().ok


def test_mismatched_delta_site_or_grid_is_refused_without_advising_a_separate_ledger(tmp_path: Path) -> None:
    with init_ledger(tmp_path / "l.sqlite") as ledger:
        site_round(ledger, 2, 1.0, budget=5.0, site="a")
        cases = [
            ("delta", dict(accountant=edge(), delta=2e-5)),
            ("site", dict(accountant=edge(), site="b")),
            ("orders", dict(accountant=edge(orders=DEFAULT_ORDERS))),
        ]
        for key, kw in cases:
            kw = {"noise_multiplier": 1.0, "steps": 1, "delta": DELTA, "budget": 5.0, **kw}
            with pytest.raises(LedgerBindingError) as info:
                ledger.reserve(kw.pop("accountant"), **kw)
            assert info.value.key == key
            assert "separate ledger" not in str(info.value)
            if key == "orders":
                assert "default grid" in str(info.value)
        with pytest.raises(PrivacyError, match="no RDP curve"):
            ledger.reserve(PoissonGaussianRdp(RATE), noise_multiplier=1.0, steps=1, delta=DELTA, budget=5.0)
        for bad in (0.0, -1.0, float("inf"), float("nan")):
            with pytest.raises(PrivacyError, match="budget"):
                ledger.reserve(edge(), noise_multiplier=1.0, steps=1, delta=DELTA, budget=bad)
        with pytest.raises(PrivacyError, match="noise multiplier"):
            ledger.reserve(edge(), noise_multiplier=0.0, steps=1, delta=DELTA, budget=5.0)
        assert ledger.total_steps() == 2
        assert ledger.verify().ok


def test_not_a_ledger_and_missing_file_are_clear_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match="not a GraphVeil privacy ledger"):
        PrivacyLedger(junk)
    with pytest.raises(LedgerError, match="no such ledger file; .*graphveil budget init"):
        PrivacyLedger(tmp_path / "missing.sqlite")
    assert not (tmp_path / "missing.sqlite").exists()
    newer = tmp_path / "newer.sqlite"
    init_ledger(newer).close()
    _sql(newer, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="schema version 99"):
        PrivacyLedger(newer)


# ------------------------------------------------------------------------------ tampering


def _spent_ledger(path: Path) -> float:
    with init_ledger(path) as ledger:
        site_round(ledger, 10, 1.0, budget=20.0, site="a", run="1")
        site_round(ledger, 10, 1.0, budget=20.0, site="a", run="2")
        return site_round(ledger, 10, 1.0, budget=20.0, site="a", run="3")


@pytest.mark.parametrize("edit", [
    "UPDATE entries SET epsilon = 0.001 WHERE kind = 'reserve'",
    "UPDATE entries SET increment = (SELECT increment FROM entries WHERE id = 1) WHERE id = 4",
    "UPDATE entries SET increment = '[' || substr(increment, 2) WHERE id = 4",
    "UPDATE entries SET steps = 1 WHERE id = 2",
    "DELETE FROM entries WHERE id = 4",
    "DELETE FROM entries WHERE id = (SELECT MAX(id) FROM entries)",
    "DELETE FROM entries WHERE kind IN ('reserve', 'release') AND run = '3'",
    "UPDATE meta SET value = '0.001' WHERE key = 'delta'",
    "UPDATE meta SET value = 'ffff' WHERE key = 'ledger_id'",
])
def test_raw_sql_edits_fail_verification_and_block_reservations(tmp_path: Path, edit: str) -> None:
    path = tmp_path / "l.sqlite"
    spent = _spent_ledger(path)
    if "increment = '['" in edit:
        # rewrite the curve of reservation 4 to all zeros
        with PrivacyLedger(path) as ledger:
            n = len(ledger.total_rdp()[0])
        edit = f"UPDATE entries SET increment = '{json.dumps([0.0] * n)}' WHERE kind = 'reserve'"
    _sql(path, edit)
    with PrivacyLedger(path) as ledger:
        report = ledger.verify()
        assert not report.ok and report.error
        if "DELETE FROM entries WHERE id = 4" in edit or "epsilon" in edit:
            assert report.first_bad is not None and f"row {report.first_bad}" in report.error
        with pytest.raises(LedgerError, match="fails verification"):
            ledger.reserve(edge(), noise_multiplier=1.0, steps=1, delta=DELTA, budget=20.0, site="a")
        assert ledger.summary()["chain"]["verified"] is False
    assert spent > 0


def test_an_epsilon_edit_names_the_first_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    _spent_ledger(path)
    _sql(path, "UPDATE entries SET epsilon = 0.001 WHERE id = 4")
    with PrivacyLedger(path) as ledger:
        report = ledger.verify()
        assert report.first_bad == 4 and "row 4" in report.error and "modified" in report.error
        with pytest.raises(LedgerError, match="at row 4"):
            ledger.reserve(edge(), noise_multiplier=1.0, steps=1, delta=DELTA, budget=20.0, site="a")


def test_an_anchor_catches_a_restored_backup(tmp_path: Path) -> None:
    path, anchor = tmp_path / "site" / "l.sqlite", tmp_path / "elsewhere" / "anchor.json"
    with init_ledger(path, anchor=anchor) as ledger:  # init writes the first anchor
        assert json.loads(anchor.read_text()) == {"count": 0, "hash": ledger.genesis()}
        site_round(ledger, 10, 1.0, budget=20.0, site="a")
        assert json.loads(anchor.read_text()) == dict(zip(("count", "hash"), ledger.head(), strict=True))
    backup = tmp_path / "backup.sqlite"
    shutil.copy(path, backup)
    with PrivacyLedger(path, anchor=anchor) as ledger:
        spent = site_round(ledger, 20, 1.0, budget=20.0, site="a")
        head = ledger.head()
    assert json.loads(anchor.read_text()) == {"count": head[0], "hash": head[1]}
    shutil.copy(backup, path)  # the operator restores last week's backup: spend rolls back
    with PrivacyLedger(path) as ledger:  # the chain alone cannot tell
        assert ledger.verify().ok and ledger.spent_epsilon() < spent
        assert not ledger.verify(anchor=anchor).ok
        assert not ledger.verify(expect_head=head[1]).ok
    with pytest.raises(LedgerError, match=f"rolled back or replaced: anchor says {head[0]} entries"):
        PrivacyLedger(path, anchor=anchor)
    assert json.loads(anchor.read_text()) == {"count": head[0], "hash": head[1]}  # evidence kept
    # replacing the file by a fresh one is refused: no ledger is made on open, and init neither
    # overwrites the anchor nor replaces the key
    path.unlink()
    with pytest.raises(LedgerError, match="no such ledger file"):
        PrivacyLedger(path, anchor=anchor)
    with pytest.raises(LedgerError, match="anchor file already exists"):
        init_ledger(path, site="a", anchor=anchor)
    with pytest.raises(LedgerError, match="site key already exists"):
        init_ledger(path, site="a")
    assert not path.exists()


def test_an_anchor_is_made_only_by_init_and_a_lost_one_only_by_reanchor(tmp_path: Path) -> None:
    """The second attack of issue 25: restore a backup, delete the anchor. Opening used to
    re-anchor silently at the restored head; now it is refused, and the anchor stays absent."""
    path, anchor = tmp_path / "l.sqlite", tmp_path / "anchor" / "head.json"
    with init_ledger(path, anchor=anchor) as ledger:
        site_round(ledger, 5, 1.0, budget=20.0, site="a")
    backup = tmp_path / "backup.sqlite"
    shutil.copy(path, backup)
    with PrivacyLedger(path, anchor=anchor) as ledger:
        site_round(ledger, 5, 1.0, budget=20.0, site="a")
    shutil.copy(backup, path)
    anchor.unlink()
    for _ in range(2):  # refused every time: the failed open wrote nothing
        with pytest.raises(LedgerError, match="anchor .* does not exist.*--reanchor"):
            PrivacyLedger(path, anchor=anchor)
        assert not anchor.exists()
    with pytest.raises(LedgerError, match="already initialised"):
        init_ledger(path, anchor=anchor)
    # only the explicit re-anchor writes it, at the current (restored) head
    with init_ledger(path, anchor=anchor, reanchor=True) as ledger:
        assert json.loads(anchor.read_text()) == dict(zip(("count", "hash"), ledger.head(), strict=True))
    with pytest.raises(LedgerError, match="the anchor exists"):
        init_ledger(path, anchor=anchor, reanchor=True)


def test_an_anchor_that_is_behind_is_fine_and_catches_up(tmp_path: Path) -> None:
    path, anchor = tmp_path / "l.sqlite", tmp_path / "anchor.json"
    with init_ledger(path, anchor=anchor) as ledger:
        site_round(ledger, 5, 1.0, budget=20.0, site="a")
    with PrivacyLedger(path) as ledger:  # a write without the anchor (crash before the anchor write)
        site_round(ledger, 5, 1.0, budget=20.0, site="a")
    assert json.loads(anchor.read_text())["count"] < 5
    with PrivacyLedger(path, anchor=anchor) as ledger:
        assert ledger.verify().ok
        site_round(ledger, 5, 1.0, budget=20.0, site="a")
        assert json.loads(anchor.read_text()) == {"count": ledger.head()[0], "hash": ledger.head()[1]}


# ------------------------------------------------------------------------------ v1 migration

_V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, created TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('reserved', 'released', 'withheld', 'refused')),
    site TEXT NOT NULL, run TEXT NOT NULL, round INTEGER NOT NULL, steps INTEGER NOT NULL,
    noise_multiplier REAL NOT NULL, delta REAL NOT NULL, epsilon REAL NOT NULL, budget REAL NOT NULL,
    mechanism TEXT NOT NULL, state TEXT, note TEXT NOT NULL DEFAULT ''
);
"""


def _v1_ledger(path: Path, history: list[tuple[float, int]], mechanism: str = "edge_rdp") -> float:
    """A schema-1 ledger as the old code wrote it: cumulative edge_rdp states per entry."""
    acc = edge(RATE, orders=DEFAULT_ORDERS)
    with sqlite3.connect(path) as db:
        db.executescript(_V1_SCHEMA)
        for key, value in (("schema_version", "1"), ("created", "2025-01-01T00:00:00Z"), ("site", "a"),
                           ("mechanism", mechanism), ("unit", "edge"), ("delta", repr(DELTA))):
            db.execute("INSERT INTO meta VALUES (?, ?)", (key, value))
        for sigma, steps in history:
            acc.step(noise_multiplier=sigma, num_steps=steps)
            state = {**acc.state_dict(), "mechanism": mechanism}
            db.execute(
                "INSERT INTO entries (created, status, site, run, round, steps, noise_multiplier, delta, "
                "epsilon, budget, mechanism, state) VALUES ('2025-01-01T00:00:00Z', 'released', 'a', '1', 1, "
                "?, ?, ?, ?, 10.0, ?, ?)",
                (steps, sigma, DELTA, acc.get_epsilon(DELTA), mechanism, json.dumps(state)))
        db.execute("INSERT INTO entries (created, status, site, run, round, steps, noise_multiplier, delta, "
                   "epsilon, budget, mechanism, state) VALUES ('x', 'refused', 'a', '1', 2, 999, 0.5, ?, 99.0, "
                   "10.0, ?, NULL)", (DELTA, mechanism))
    return acc.get_epsilon(DELTA)


def test_a_v1_ledger_is_migrated_to_its_exact_rdp_curve(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    v1_eps = _v1_ledger(path, [(1.0, 10), (0.8, 5)])
    with pytest.raises(LedgerError, match="without a site key; `graphveil budget init"):  # needs the key
        PrivacyLedger(path)
    with init_ledger(path, site="a") as ledger:  # makes the key, then migrates under it
        assert ledger.meta()["schema_version"] == "3"
        assert ledger.spent_epsilon() == pytest.approx(v1_eps, rel=1e-12)
        (migrated,) = ledger.entries()
        assert migrated.status == "migrated" and migrated.steps == 15 and "schema v1" in migrated.note
        assert ledger.verify().ok
        # spend continues on top of the migrated curve, at another γ
        res = ledger.reserve(edge(0.05, orders=DEFAULT_ORDERS), noise_multiplier=1.0, steps=4, delta=DELTA,
                             budget=10.0, site="a")
        run = edge(0.05, orders=DEFAULT_ORDERS)
        run.step(noise_multiplier=1.0, num_steps=4)
        eps = ledger.release(res, run).epsilon
    total = edge(RATE, DEFAULT_ORDERS).rdp_curve(1.0) * 10 + edge(RATE, DEFAULT_ORDERS).rdp_curve(0.8) * 5 \
        + edge(0.05, DEFAULT_ORDERS).rdp_curve(1.0) * 4
    assert eps == pytest.approx(rdp_to_epsilon(DEFAULT_ORDERS, total, DELTA)[0], rel=1e-9)
    with sqlite3.connect(path) as db:  # the v1 rows are kept for audit
        assert db.execute("SELECT COUNT(*) FROM entries_v1").fetchone()[0] == 3


def test_a_v1_ledger_that_cannot_be_rebuilt_is_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "v1.sqlite"
    _v1_ledger(path, [(1.0, 10)], mechanism="no_such_accountant")
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="graphveil budget init") as info:
        init_ledger(path)
    assert "no_such_accountant" in str(info.value) and "separate ledger" not in str(info.value)
    assert path.read_bytes() == before
    assert not key_path_for(path).exists()  # a failed init leaves no key behind


def _v2_ledger(path: Path) -> tuple[float, int, str]:
    """A schema-2 ledger as the old code wrote it (the same rows, an unkeyed SHA-256 chain, no
    key file): two released rounds. Returns (ε spent, rows, head)."""
    import hashlib

    from graphveil.ledger.chain import _canonical, _normalize

    with init_ledger(path) as ledger:
        site_round(ledger, 10, 1.0, budget=20.0, site="a")
        spent = site_round(ledger, 5, 1.0, budget=20.0, site="a")
        rows = ledger._rows()
        meta = ledger.meta()
    prev = hashlib.sha256(_canonical({"ledger": "graphveil-privacy-ledger", "ledger_id": meta["ledger_id"],
                                      "created": meta["created"]}).encode()).hexdigest()
    with sqlite3.connect(path) as db:
        for row in rows:
            row["prev_hash"] = prev
            prev = hashlib.sha256(_canonical(_normalize(row)).encode()).hexdigest()
            db.execute("UPDATE entries SET prev_hash = ?, hash = ? WHERE id = ?", (row["prev_hash"], prev, row["id"]))
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    key_path_for(path).unlink()
    return spent, len(rows), prev


def test_a_schema_2_ledger_is_rechained_under_a_new_key_by_init_only(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite"
    spent, count, old_head = _v2_ledger(path)
    with pytest.raises(LedgerError, match="schema-2 ledger .*`graphveil budget init --ledger"):
        PrivacyLedger(path)
    with pytest.raises(LedgerError, match="bound to site 'a', not 'b'"):
        init_ledger(path, site="b")
    assert not key_path_for(path).exists()
    with init_ledger(path, site="a") as ledger:
        assert ledger.verify().ok and ledger.spent_epsilon() == spent
        assert [e.status for e in ledger.entries()] == ["released", "released"]
        events = ledger.events()
        assert len(events) == count + 1 and events[-1]["kind"] == "rekey"
        assert json.loads(events[-1]["note"]) == {"from_schema": 2, "unkeyed_count": count, "unkeyed_head": old_head}
        assert ledger.witness_head().seq == 2  # the old rounds are checkpoints of the keyed chain
        site_round(ledger, 1, 1.0, budget=20.0, site="a")  # and spend goes on
    with sqlite3.connect(path) as db:  # the unkeyed rows are kept for audit
        assert db.execute("SELECT hash FROM entries_v2 ORDER BY id DESC LIMIT 1").fetchone()[0] == old_head
    with pytest.raises(LedgerError, match="already initialised"):
        init_ledger(path)


def test_a_schema_2_ledger_that_fails_verification_is_not_rechained(tmp_path: Path) -> None:
    path = tmp_path / "v2.sqlite"
    _v2_ledger(path)
    _sql(path, "UPDATE entries SET epsilon = 0.001 WHERE id = 3")
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="schema-2 chain fails verification at row 3.*nothing changed"):
        init_ledger(path, site="a")
    assert path.read_bytes() == before and not key_path_for(path).exists()


# ------------------------------------------------------------------------------ record sets


def test_records_round_trip_are_chained_and_cannot_be_replaced(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    records = torch.tensor([[0, 1], [1, 2], [5, 3]], dtype=torch.int64)
    with init_ledger(path) as ledger:
        assert ledger.load_records("train") is None
        ledger.save_records("train", records)
        ledger.save_records("train", records.clone())  # same content: a no-op
        back = ledger.load_records("train")
        assert back.dtype == torch.int64 and torch.equal(back, records)
        with pytest.raises(LedgerError, match="different content"):
            ledger.save_records("train", records[:2])
        assert ledger.verify().ok
        head = ledger.head()
    with PrivacyLedger(path) as ledger:
        assert torch.equal(ledger.load_records("train"), records) and ledger.head() == head
    # a silent replacement of Ē is caught
    other = tmp_path / "o.sqlite"
    with init_ledger(other) as ledger:
        ledger.save_records("train", records[:2])
    with sqlite3.connect(other) as db:
        blob, sha = db.execute("SELECT data, sha256 FROM records").fetchone()
    _sql(path, "UPDATE records SET data = ?, sha256 = ?", blob, sha)
    with PrivacyLedger(path) as ledger:
        assert not ledger.verify().ok
        with pytest.raises(LedgerError, match="modified"):
            ledger.load_records("train")
        with pytest.raises(LedgerError, match="fails verification"):
            ledger.reserve(edge(), noise_multiplier=1.0, steps=1, delta=DELTA, budget=5.0)


# ------------------------------------------------------------------------------ CLI


def test_budget_show_cli(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main

    path = tmp_path / "l.sqlite"
    with init_ledger(path) as ledger:
        eps = site_round(ledger, 10, 1.0, budget=4.0, site="bank-a", run="7", round=1)
        with pytest.raises(BudgetExhaustedError):
            site_round(ledger, 5000, 0.5, budget=4.0, site="bank-a", run="7", round=2)
    assert main(["budget", "show", "--ledger", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["summary"]["site"] == "bank-a"
    assert shown["summary"]["epsilon_spent"] == pytest.approx(eps)
    assert shown["summary"]["epsilon_remaining"] == pytest.approx(4.0 - eps)
    assert shown["summary"]["counts"] == {"reserved": 0, "released": 1, "withheld": 0, "refused": 1}
    assert shown["summary"]["chain"]["verified"] is True
    assert [e["status"] for e in shown["entries"]] == ["released", "refused"]
    assert main(["budget", "show", "--ledger", str(path)]) == 0
    human = capsys.readouterr().out
    assert "bank-a" in human and f"{eps:.4g}" in human and "refused" in human and "WARNING" not in human
    assert main(["budget", "show", "--ledger", str(tmp_path / "nope.sqlite")]) == 2
    assert "no such ledger" in capsys.readouterr().err
    assert not (tmp_path / "nope.sqlite").exists()
    assert os.path.getsize(path) > 0
    _sql(path, "UPDATE entries SET epsilon = 0.001 WHERE kind = 'reserve'")
    assert main(["budget", "show", "--ledger", str(path)]) == 0
    out = capsys.readouterr()
    assert "FAILS VERIFICATION" in out.out and "FAILS verification" in out.err


def test_budget_verify_and_head_cli(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main

    path, anchor = tmp_path / "l.sqlite", tmp_path / "anchor.json"
    assert main(["budget", "init", "--ledger", str(path), "--anchor", str(anchor)]) == 2  # no --site
    assert "--site NAME is required" in capsys.readouterr().err and not path.exists()
    assert main(["budget", "init", "--ledger", str(path), "--site", "a", "--anchor", str(anchor)]) == 0
    out = capsys.readouterr().out
    assert "created" in out and str(key_path_for(path)) in out and anchor.is_file()
    assert main(["budget", "init", "--ledger", str(path), "--site", "a"]) == 2
    assert "already initialised" in capsys.readouterr().err
    with PrivacyLedger(path, anchor=anchor) as ledger:
        eps = site_round(ledger, 10, 1.0, budget=4.0, site="a")
        count, head = ledger.head()
    assert main(["budget", "head", "--ledger", str(path)]) == 0
    assert capsys.readouterr().out.split() == [str(count), head]
    assert main(["budget", "head", "--ledger", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"count": count, "hash": head}
    assert main(["budget", "verify", "--ledger", str(path), "--anchor", str(anchor), "--expect-head", head]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok:") and head in out and f"{eps:.6g}" in out
    assert main(["budget", "verify", "--ledger", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["count"] == count and report["epsilon"] == pytest.approx(eps)
    # an unknown head, a rolled-back anchor, a tampered row
    assert main(["budget", "verify", "--ledger", str(path), "--expect-head", "0" * 64]) == 1
    assert "rolled back or replaced" in capsys.readouterr().err
    anchor.write_text(json.dumps({"count": count + 3, "hash": "ab" * 32}))
    assert main(["budget", "verify", "--ledger", str(path), "--anchor", str(anchor)]) == 1
    assert f"anchor says {count + 3} entries" in capsys.readouterr().err
    _sql(path, "UPDATE entries SET epsilon = 0.001 WHERE id = 2")
    assert main(["budget", "verify", "--ledger", str(path)]) == 1
    err = capsys.readouterr().err
    assert "row 2" in err and len(err.strip().splitlines()) == 1
    assert main(["budget", "head", "--ledger", str(path)]) == 1
    capsys.readouterr()
    # bad input
    assert main(["budget", "verify", "--ledger", str(tmp_path / "nope.sqlite")]) == 2
    assert "no such ledger" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert main(["budget", "verify", "--ledger", str(path), "--anchor", str(tmp_path / "bad.json")]) in (1, 2)


def test_budget_migrate_cli(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main

    path = tmp_path / "v1.sqlite"
    v1_eps = _v1_ledger(path, [(1.0, 10)])
    assert main(["budget", "migrate", "--ledger", str(path)]) == 2  # no key yet: init makes it
    assert "graphveil budget init" in capsys.readouterr().err
    assert main(["budget", "init", "--ledger", str(path)]) == 0
    assert "upgraded from schema 1 to 3" in capsys.readouterr().out
    assert main(["budget", "migrate", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "already schema version 3" in out and f"{v1_eps:.6g}" in out
