"""A witness of the sites' ledger heads: what stops a site from rolling its own ledger back.

A site's ledger (:mod:`graphveil.ledger`) is written by the site. Its hash chain is keyed, so
nobody *without* the site key can rewrite it, but the site's operator holds the key, and a
restored backup verifies as well as the real file. So every reply a site sends after opening
its ledger carries the ledger's witness head (:meth:`~graphveil.ledger.PrivacyLedger.witness_head`):
``ledger-seq``, the number of rounds the ledger has closed (checkpoint rows), ``ledger-head``,
the keyed hash of the last of them, and ``ledger-previous``, the one before. The server keeps
them here, per site, in an append-only JSON-lines file, and applies two rules to every new
observation:

* **backwards**: a site's sequence number never decreases (a smaller one is a rolled-back or
  replaced ledger — a backup restored, the ledger deleted and re-created);
* **fork**: at a sequence number already witnessed, the head must be the same, and so must the
  previous head at the sequence number before (another head is a rewritten history, or a
  rolled-back ledger advanced to the witnessed count).

A larger sequence number whose previous head was never witnessed is accepted: without the key
the server cannot tell whether the new chain extends the old one. The site can: ``graphveil
budget verify --ledger FILE --witness FILE`` checks, with the key, that the ledger's chain holds
every witnessed (seq, head) — a rewrite of history the server saw fails it even when re-signed
with the key.

A violation is recorded in the file too, and **sticks**: every later reply of that site is
refused with the first violation's reason until the server's operator clears the site
(:meth:`Witness.clear`, ``graphveil budget witness --clear SITE``), after looking into it. A site
caught undercounting once has undercounted; its next larger sequence number does not undo that.

The file's lines (each one fsync'd JSON object, appended under an exclusive lock, so two
processes may share it)::

    {"site": "bank-a", "seq": 4, "head": "<64 hex>", "time": 1718000000.0, ...context}
    {"site": "bank-a", "seq": 2, "head": "<64 hex>", "time": ..., "violation": "ledger went backwards: ..."}
    {"site": "bank-a", "clear": "restored from backup, spend re-entered", "time": ...}

A line that is not such an object, a head that is not 64 hex digits, or accepted lines that
break the rules themselves (the file was edited) make the file unreadable: :class:`WitnessError`
names the file and the line.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from graphveil.contract.errors import GraphVeilError

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class WitnessError(GraphVeilError):
    """The witness file is unreadable, malformed or inconsistent (names the file and line)."""


@dataclass(frozen=True)
class Observation:
    """One accepted (seq, head) of a site, as the witness file holds it."""

    site: str
    seq: int
    head: str
    time: float


@dataclass
class _Site:
    heads: dict[int, str] = field(default_factory=dict)
    last: int = -1
    #: The first violation since the site was last cleared; later replies are refused with it.
    flagged: str | None = None


class Witness:
    """The witness file ``path`` (created on the first observation; its folder too)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._sites: dict[str, _Site] = {}
        self._observations: list[Observation] = []
        self._offset = 0
        self._line = 0
        if self.path.exists():
            if not self.path.is_file():
                raise WitnessError(f"{self.path}: the ledger witness is not a file")
            with self.path.open("rb") as fh:
                self._read_new(fh)

    # ------------------------------------------------------------------------------ reading
    def _read_new(self, fh: IO[bytes]) -> None:
        """Fold the lines appended since the last read (another process may share the file)."""
        fh.seek(self._offset)
        data = fh.read()
        if data and not data.endswith(b"\n"):
            torn = self._line + data.count(b"\n") + 1
            raise WitnessError(f"{self.path}, line {torn}: the last line is incomplete (a write was cut "
                               "off); repair the file before the next round")
        for raw in data.splitlines():
            self._line += 1
            self._fold(self._parse(raw))
        self._offset += len(data)

    def _parse(self, raw: bytes) -> dict[str, Any]:
        where = f"{self.path}, line {self._line}"
        try:
            line = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise WitnessError(f"{where}: not JSON ({exc})") from None
        if not isinstance(line, dict):
            raise WitnessError(f"{where}: not a JSON object")
        site = line.get("site")
        if not isinstance(site, str) or not site:
            raise WitnessError(f"{where}: no site name")
        stamp = line.get("time")
        if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not math.isfinite(stamp):
            raise WitnessError(f"{where}: no time")
        if "clear" in line:
            if not isinstance(line["clear"], str):
                raise WitnessError(f"{where}: 'clear' must be a note (text)")
            return line
        _check_head(line.get("seq"), line.get("head"), where)
        if "violation" in line and not isinstance(line["violation"], str):
            raise WitnessError(f"{where}: 'violation' must be text")
        return line

    def _fold(self, line: dict[str, Any]) -> None:
        state = self._sites.setdefault(line["site"], _Site())
        if "clear" in line:
            state.flagged = None
            return
        if "violation" in line:
            state.flagged = state.flagged or line["violation"]
            return
        seq, head = int(line["seq"]), str(line["head"])
        problem = _rule_problem(line["site"], state, seq, head)
        if problem is not None:
            raise WitnessError(f"{self.path}, line {self._line}: an accepted observation breaks the witness's "
                               f"rules ({problem}); the file was edited")
        if seq > state.last:
            state.heads[seq], state.last = head, seq
            self._observations.append(Observation(line["site"], seq, head, float(line["time"])))

    def observations(self, site: str | None = None) -> list[Observation]:
        """Accepted observations, in the order they were made (of ``site`` only, if given)."""
        return [o for o in self._observations if site is None or o.site == site]

    def sites(self) -> dict[str, dict[str, Any]]:
        """Per site: the last witnessed seq and head, and the violation it is flagged with."""
        out: dict[str, dict[str, Any]] = {}
        for name, state in sorted(self._sites.items()):
            out[name] = {"seq": state.last if state.last >= 0 else None,
                         "head": state.heads.get(state.last), "flagged": state.flagged}
        return out

    # ------------------------------------------------------------------------------ checking
    def check(self, site: str, seq: int, head: str, previous: str | None = None) -> str | None:
        """Why ``(seq, head)`` from ``site`` is refused (``None``: accepted); nothing is written.

        ``previous`` (the hash of checkpoint ``seq - 1``, which the reply also carries) is held
        to the head witnessed there, if any: a site that rewrote its history (or restored a
        backup and closed rounds elsewhere up to the witnessed count) is caught on its next
        round at this server, not only by ``graphveil budget verify --witness``."""
        _check_head(seq, head, f"site {site!r}'s reply")
        if previous is not None:
            _check_head(max(seq - 1, 0), previous, f"site {site!r}'s reply (previous head)")
        state = self._sites.get(site, _Site())
        if state.flagged is not None:
            return (f"site {site!r} is flagged by the ledger witness ({state.flagged}); its replies are "
                    "refused until the server operator clears it")
        problem = _rule_problem(site, state, seq, head)
        if problem is None and previous is not None and seq >= 1:
            problem = _fork(site, state, seq - 1, previous)
        return problem

    def observe(self, site: str, seq: int, head: str, previous: str | None = None,
                **context: Any) -> str | None:
        """Check ``(seq, head, previous)`` from ``site`` and record it; return the violation, if any.

        An accepted observation with a new sequence number is appended (the same one again is
        not: the file grows with the site's rounds, not with the server's); a violation is
        appended with its reason and flags the site. ``context`` (run, round, node id) is kept
        on the line for the audit.
        """
        with self._locked() as fh:
            self._read_new(fh)
            problem = self.check(site, seq, head, previous)
            state = self._sites.get(site, _Site())
            if problem is None and seq == state.last:
                return None
            line: dict[str, Any] = {"site": site, "seq": int(seq), "head": head, "time": time.time(), **context}
            if problem is not None:
                line["violation"] = problem
            self._append(fh, line)
        return problem

    def clear(self, site: str, note: str) -> None:
        """Lift ``site``'s flag (the server operator's decision, with the reason in ``note``).

        The witnessed heads stay: the site's sequence number must still not go below them."""
        if not note.strip():
            raise WitnessError("clearing a site needs a note saying why")
        with self._locked() as fh:
            self._read_new(fh)
            if site not in self._sites:
                raise WitnessError(f"{self.path}: no site {site!r} in the witness")
            self._append(fh, {"site": site, "clear": note, "time": time.time()})

    # ------------------------------------------------------------------------------ writing
    @contextmanager
    def _locked(self) -> Iterator[IO[bytes]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        with os.fdopen(fd, "r+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield fh
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _append(self, fh: IO[bytes], line: dict[str, Any]) -> None:
        data = (json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n").encode()
        fh.seek(0, os.SEEK_END)
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        self._line += 1
        self._offset += len(data)
        self._fold(line)


def _check_head(seq: Any, head: Any, where: str) -> None:
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
        raise WitnessError(f"{where}: ledger sequence number {seq!r} is not an integer >= 0")
    if not isinstance(head, str) or not _HEX64.match(head):
        raise WitnessError(f"{where}: ledger head {head!r} is not 64 lower-case hex digits")


def _rule_problem(site: str, state: _Site, seq: int, head: str) -> str | None:
    """The two rules: the sequence number never decreases; one head per sequence number."""
    if seq < state.last:
        return (f"the ledger of site {site!r} went backwards: checkpoint {seq} after {state.last} was "
                "witnessed (a ledger rolled back, restored from a backup or replaced)")
    return _fork(site, state, seq, head)


def _fork(site: str, state: _Site, seq: int, head: str) -> str | None:
    known = state.heads.get(seq)
    if known is not None and known != head:
        return (f"the ledger of site {site!r} forked: checkpoint {seq} has head {head[:16]}…, the witness saw "
                f"{known[:16]}… (its history was rewritten or replaced)")
    return None
