"""The ledger survives its own operator (issue 25, point 6).

Two attacks on a site's ledger by whoever writes its file, and what now catches them:

* a *consistent rewrite* of the whole chain (every increment × 0.01, every ε and hash
  recomputed) — fails verification without the site key (plain SHA-256, or HMAC under another
  key); with the key it verifies, and the server's witness and ``budget verify --witness`` catch
  it;
* *restore a backup, delete the anchor* — opening no longer re-anchors silently, and the witness
  sees the sequence number go backwards.

Plus the witness's own rules (backwards, fork, equal and forward accepted, persistence, a
corrupt file) on :class:`graphveil.ledger.witness.Witness`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from _ledger_rounds import DELTA, edge, site_round

from graphveil.ledger import LedgerError, PrivacyLedger, WitnessHead, init_ledger
from graphveil.ledger.chain import _canonical, _genesis, _normalize, _row_hash
from graphveil.ledger.site_key import key_path_for, load_site_key
from graphveil.ledger.spend import _epsilon
from graphveil.ledger.witness import Witness, WitnessError

_FIELDS = ("id", "created", "kind", "ref", "site", "run", "round", "steps", "noise_multiplier", "delta",
           "epsilon", "budget", "mechanism", "profile", "increment", "note", "prev_hash")


def _reply(witness: Witness, ledger: PrivacyLedger, site: str = "a") -> str | None:
    """What the server does with a reply's ledger head."""
    head = ledger.witness_head()
    return witness.observe(site, head.seq, head.head, head.previous)


def _rewrite(path: Path, digest, first_prev: str, scale: float = 0.01) -> None:
    """The operator's consistent rewrite: every RDP increment × ``scale``, every recorded ε
    recomputed from the new totals (so each row folds), every hash recomputed with ``digest``."""
    with sqlite3.connect(path) as db:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        orders = np.asarray(json.loads(meta["orders"]), dtype=float)
        total = np.zeros_like(orders)
        cur = db.execute(f"SELECT {', '.join(_FIELDS)} FROM entries ORDER BY id")
        rows = [dict(zip(_FIELDS, r, strict=True)) for r in cur.fetchall()]
        prev = first_prev
        for row in rows:
            if row["kind"] in ("reserve", "refuse"):
                inc = np.asarray(json.loads(row["increment"]), dtype=float) * scale
                row["increment"] = _canonical([float(v) for v in inc])
                if row["kind"] == "reserve":
                    total = total + inc
                row["epsilon"] = _epsilon(orders, total if row["kind"] == "reserve" else total + inc, DELTA)
            assert row["kind"] in ("bind", "reserve", "refuse", "release"), row["kind"]
            row["prev_hash"] = prev
            prev = digest(row)
            db.execute("UPDATE entries SET increment = ?, epsilon = ?, prev_hash = ?, hash = ? WHERE id = ?",
                       (row["increment"], row["epsilon"], row["prev_hash"], prev, row["id"]))


def _plain(row) -> str:
    """Schema 2's unkeyed row hash: what anyone who can read the file can compute."""
    return hashlib.sha256(_canonical(_normalize(row)).encode()).hexdigest()


def _spent_ledger(path: Path, witness: Witness, rounds: int = 3) -> float:
    with init_ledger(path, site="a") as ledger:
        for r in range(1, rounds + 1):
            spent = site_round(ledger, 10, 1.0, budget=20.0, site="a", round=r)
            assert _reply(witness, ledger) is None
    return spent


def test_a_consistent_rewrite_fails_without_the_key(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite"
    _spent_ledger(path, Witness(tmp_path / "witness.jsonl"))
    backup = tmp_path / "backup.sqlite"
    shutil.copy(path, backup)
    with sqlite3.connect(path) as db:
        (stored_prev,) = db.execute("SELECT prev_hash FROM entries WHERE id = 1").fetchone()
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
    wrong = b"w" * 32
    unkeyed_genesis = hashlib.sha256(_canonical({"ledger": "graphveil-privacy-ledger", "ledger_id": meta["ledger_id"],
                                                 "created": meta["created"]}).encode()).hexdigest()
    attacks = {
        "plain SHA-256, the stored genesis kept": (_plain, stored_prev),
        "plain SHA-256 throughout (schema 2)": (_plain, unkeyed_genesis),
        "HMAC under another key, the stored genesis kept": (lambda row: _row_hash(wrong, row), stored_prev),
        "HMAC under another key throughout": (lambda row: _row_hash(wrong, row), _genesis(wrong, meta)),
    }
    for name, (digest, first_prev) in attacks.items():
        shutil.copy(backup, path)
        _rewrite(path, digest, first_prev)
        with PrivacyLedger(path) as ledger:
            report = ledger.verify()
            assert not report.ok and report.first_bad == 1, (name, report)
            with pytest.raises(LedgerError, match="fails verification at row 1"):
                ledger.reserve(edge(), noise_multiplier=1.0, steps=1, delta=DELTA, budget=20.0, site="a")


def test_a_rewrite_signed_with_the_key_verifies_but_the_witness_catches_it(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main

    path, witness = tmp_path / "l.sqlite", Witness(tmp_path / "server" / "ledger-witness.jsonl")
    spent = _spent_ledger(path, witness)
    with PrivacyLedger(path) as ledger:
        _, curve = ledger.total_rdp()
    key = load_site_key(key_path_for(path))
    with sqlite3.connect(path) as db:
        (stored_prev,) = db.execute("SELECT prev_hash FROM entries WHERE id = 1").fetchone()
    _rewrite(path, lambda row: _row_hash(key, row), stored_prev)
    with PrivacyLedger(path) as ledger:
        # the site's operator holds the key: the chain alone cannot stop them
        assert ledger.verify().ok and ledger.spent_epsilon() < spent
        np.testing.assert_allclose(ledger.total_rdp()[1], 0.01 * np.asarray(curve), rtol=1e-12)
        rewritten = ledger.witness_head()
        assert rewritten.seq == 3 and rewritten.head != witness.observations("a")[-1].head
        # `budget verify --witness` (at the site, with the key) names the first head it lacks
        report = ledger.verify(witnessed=[(o.seq, o.head) for o in witness.observations("a")])
        assert not report.ok and "history was rewritten" in report.error and "checkpoint 1 " in report.error
        # the server's witness: a reply at the same sequence number (a round refused before any
        # spend, e.g. on malformed arrays) is a fork ...
        assert "forked: checkpoint 3" in Witness(witness.path).check("a", rewritten.seq, rewritten.head)
        # ... and so is the next round's: its previous head is the rewritten checkpoint 3
        site_round(ledger, 1, 1.0, budget=20.0, site="a", round=4)
        problem = _reply(witness, ledger)
    assert problem is not None and "forked: checkpoint 3" in problem
    assert main(["budget", "verify", "--ledger", str(path), "--witness", str(witness.path)]) == 1
    err = capsys.readouterr().err
    assert "FAILS verification" in err and "checkpoint 1 " in err
    # the unmodified ledger holds every witnessed head
    other = Witness(tmp_path / "w2.jsonl")
    _spent_ledger(tmp_path / "site2" / "l.sqlite", other)
    assert main(["budget", "verify", "--ledger", str(tmp_path / "site2" / "l.sqlite"), "--witness",
                 str(other.path)]) == 0
    assert "holds all 3 witnessed heads" in capsys.readouterr().out


def test_a_restored_backup_without_its_anchor_is_refused_and_the_witness_flags_it(tmp_path: Path) -> None:
    path, anchor = tmp_path / "site" / "l.sqlite", tmp_path / "anchor-volume" / "l.head"
    witness = Witness(tmp_path / "server" / "ledger-witness.jsonl")
    with init_ledger(path, site="a", anchor=anchor) as ledger:
        site_round(ledger, 10, 1.0, budget=20.0, site="a", round=1)
        assert _reply(witness, ledger) is None
    backup = tmp_path / "backup.sqlite"
    shutil.copy(path, backup)
    with PrivacyLedger(path, anchor=anchor) as ledger:
        for r in (2, 3):
            site_round(ledger, 10, 1.0, budget=20.0, site="a", round=r)
            assert _reply(witness, ledger) is None
    shutil.copy(backup, path)  # the operator restores the backup ...
    anchor.unlink()  # ... and deletes the anchor that would give it away
    with pytest.raises(LedgerError, match="anchor .* does not exist"):
        PrivacyLedger(path, anchor=anchor)  # used to re-anchor silently at the restored head
    assert not anchor.exists()
    # an explicit re-anchor (or a site with no anchor at all) still faces the witness
    with init_ledger(path, anchor=anchor, reanchor=True) as ledger:
        assert ledger.witness_head().seq == 1
        assert "went backwards: checkpoint 1 after 3" in _reply(witness, ledger)
        report = ledger.verify(witnessed=[(o.seq, o.head) for o in witness.observations("a")])
        assert not report.ok and "rolled back" in report.error and "checkpoint 2" in report.error
        # closing rounds elsewhere until the count is past the witnessed one does not help: the
        # site stays flagged until the server's operator clears it
        for r in (2, 3, 4):
            site_round(ledger, 1, 1.0, budget=20.0, site="a", round=r)
        assert "is flagged by the ledger witness" in _reply(witness, ledger)
    assert "is flagged" in Witness(witness.path).check("a", 9, "0" * 64)  # the flag is in the file


# ------------------------------------------------------------------------------ the witness's rules


def _h(n: int, tag: str = "") -> str:
    return hashlib.sha256(f"{tag}{n}".encode()).hexdigest()


def test_witness_accepts_the_same_head_again_and_larger_sequence_numbers(tmp_path: Path) -> None:
    w = Witness(tmp_path / "w" / "witness.jsonl")
    assert w.observe("a", 0, _h(0)) is None
    assert w.observe("a", 1, _h(1), _h(0)) is None
    assert w.observe("a", 1, _h(1), _h(0)) is None  # a round refused before any spend: same head
    assert w.observe("a", 5, _h(5), _h(4)) is None  # rounds closed elsewhere: cannot be checked here
    assert w.observe("b", 2, _h(2, "b"), _h(1, "b"), round=7) is None
    lines = [json.loads(x) for x in w.path.read_text().splitlines()]
    assert [(x["site"], x["seq"]) for x in lines] == [("a", 0), ("a", 1), ("a", 5), ("b", 2)]  # no repeats
    assert lines[-1]["round"] == 7
    again = Witness(w.path)  # persistent: a new server run reads what the last one saw
    assert [(o.site, o.seq, o.head) for o in again.observations()] == [(o.site, o.seq, o.head) for o in w.observations()]
    assert again.sites()["a"] == {"seq": 5, "head": _h(5), "flagged": None}
    assert "went backwards" in again.check("a", 4, _h(4))


def test_witness_flags_a_sequence_number_that_goes_backwards(tmp_path: Path) -> None:
    w = Witness(tmp_path / "witness.jsonl")
    assert w.observe("a", 3, _h(3)) is None
    assert w.observe("a", 7, _h(7)) is None
    for seq in (5, 3, 0):  # unwitnessed, witnessed with its own head, the genesis
        problem = Witness(w.path).check("a", seq, _h(seq))
        assert problem is not None and f"went backwards: checkpoint {seq} after 7" in problem
    assert "went backwards" in w.observe("a", 5, _h(5))


def test_witness_flags_a_fork_at_a_witnessed_sequence_number(tmp_path: Path) -> None:
    w = Witness(tmp_path / "witness.jsonl")
    assert w.observe("a", 4, _h(4)) is None
    problem = w.observe("a", 4, _h(4, "rewritten"))
    assert problem is not None and "forked: checkpoint 4" in problem
    # the head before a reply's own is held to what was witnessed there
    w2 = Witness(tmp_path / "w2.jsonl")
    assert w2.observe("a", 4, _h(4)) is None
    assert "forked: checkpoint 4" in w2.check("a", 5, _h(5), _h(4, "rewritten"))
    assert w2.check("a", 5, _h(5), _h(4)) is None
    assert w2.check("a", 6, _h(6), _h(5, "anything")) is None  # checkpoint 5 never witnessed


def test_a_violation_sticks_until_the_operator_clears_it(tmp_path: Path, capsys) -> None:
    from graphveil.apps.cli import main

    w = Witness(tmp_path / "witness.jsonl")
    w.observe("a", 2, _h(2))
    w.observe("b", 1, _h(1, "b"))
    assert "went backwards" in w.observe("a", 1, _h(1))
    for seq in (3, 10):  # later, larger sequence numbers stay refused
        assert "is flagged by the ledger witness" in Witness(w.path).observe("a", seq, _h(seq))
    assert Witness(w.path).observe("b", 2, _h(2, "b")) is None  # other sites are not affected
    assert main(["budget", "witness", "--witness", str(w.path)]) == 1
    out = capsys.readouterr().out
    assert "a  checkpoint 2" in out and "FLAGGED: the ledger of site 'a' went backwards" in out
    with pytest.raises(WitnessError, match="needs a note"):
        Witness(w.path).clear("a", " ")
    assert main(["budget", "witness", "--witness", str(w.path), "--clear", "a", "--note", "restored; re-entered"]) == 0
    capsys.readouterr()
    cleared = Witness(w.path)
    assert cleared.sites()["a"]["flagged"] is None
    assert "went backwards" in cleared.check("a", 1, _h(1))  # the witnessed heads stay
    assert cleared.observe("a", 3, _h(3)) is None


@pytest.mark.parametrize(("text", "message"), [
    ('{"site": "a", "seq": 1, "head": "xyz", "time": 1}\n', "line 1: ledger head 'xyz'"),
    ('{"site": "a", "seq": -1, "head": "' + "0" * 64 + '", "time": 1}\n', "line 1: ledger sequence number -1"),
    ('not json\n', "line 1: not JSON"),
    ('[1, 2]\n', "line 1: not a JSON object"),
    ('{"seq": 1, "head": "' + "0" * 64 + '", "time": 1}\n', "line 1: no site name"),
    ('{"site": "a", "seq": 1, "head": "' + "0" * 64 + '", "time": 1}\n{"site": "a", "seq": 2', "line 2: the last line is incomplete"),
    ('{"site": "a", "seq": 3, "head": "' + "0" * 64 + '", "time": 1}\n'
     '{"site": "a", "seq": 2, "head": "' + "1" * 64 + '", "time": 2}\n', "line 2: an accepted observation breaks"),
])
def test_a_corrupt_witness_file_is_a_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "witness.jsonl"
    path.write_text(text)
    with pytest.raises(WitnessError, match=message) as info:
        Witness(path)
    assert str(path) in str(info.value)


def test_two_witness_objects_share_one_file(tmp_path: Path) -> None:
    """Two server processes (runs) appending to the same witness see each other's heads."""
    first, second = Witness(tmp_path / "w.jsonl"), Witness(tmp_path / "w.jsonl")
    assert first.observe("a", 4, _h(4)) is None
    assert "went backwards" in second.observe("a", 3, _h(3))  # read what `first` wrote, under the lock
    assert [(o.seq, o.head) for o in Witness(tmp_path / "w.jsonl").observations("a")] == [(4, _h(4))]


def test_witness_head_moves_only_on_checkpoint_rows(tmp_path: Path) -> None:
    """The sequence number counts rounds closed (release, withhold, refuse), never the rows whose
    presence could depend on the data (raise, records) or set-up rows (bind)."""
    import torch

    with init_ledger(tmp_path / "l.sqlite", site="a") as ledger:
        genesis = ledger.genesis()
        assert ledger.witness_head() == WitnessHead(0, genesis, None)
        ledger.save_records("train", torch.tensor([[0, 1]]))  # a records row
        assert ledger.witness_head().seq == 0
        res = ledger.reserve(edge(), noise_multiplier=1.0, steps=2, delta=DELTA, budget=5.0, site="a")
        assert ledger.witness_head().seq == 0  # a reservation is not a checkpoint (bind + reserve rows)
        ran_more = edge()
        ran_more.step(noise_multiplier=1.0, num_steps=3)
        ledger.release(res, ran_more)  # raise + release rows: one checkpoint
        first = ledger.witness_head()
        assert [e["kind"] for e in ledger.events()][-2:] == ["raise", "release"]
        assert first.seq == 1 and first.previous == genesis and first.head == ledger.head()[1]
        with pytest.raises(Exception, match="past its budget"):
            ledger.reserve(edge(), noise_multiplier=0.5, steps=5000, delta=DELTA, budget=5.0, site="a")
        second = ledger.witness_head()
        assert second.seq == 2 and second.previous == first.head
