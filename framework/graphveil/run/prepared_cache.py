"""An on-disk cache of prepared, data-derived pieces of a session (a federated site's rounds).

A federated site builds a new :class:`~graphveil.run.session.TrainingSession` in a new process for
every round. Most of that set-up is the same every round: the frozen lower layers of a LoRA
encoder run over every entity text of the site's graph (~17 s for MiniLM on a third of
CiteSeer, against ~22 s of DP steps; ``frozen_head``'s text embeddings likewise).
:class:`PreparedCache` keeps such pieces in files under a
folder of the site (``prepared-cache`` in its node config; default ``<ledger>.prepared/`` next
to its ledger), so a round loads them instead of recomputing them.

What may go in it, and why it leaks nothing new:

* only *deterministic* functions of what the site already holds — its own data and the public
  model weights — that do not depend on anything a run, a round or the server chooses beyond
  the task options that are part of the key: no sampling, no noise, no trained weights, no
  privacy accounting. A file holds the frozen layers' outputs for the site's entity texts,
  which the site can recompute from its texts at any time: it reveals nothing the site's data
  folder does not, it is written by and read by the site only (files ``0600``), and nothing
  of it is sent. The server cannot name the folder (it is in the node config, not the task).
* keys are digests of everything the piece is a function of (the encoder computes them: the
  texts and the tokenizer's whole pipeline — so a hit needs no tokenizing — the frozen weights,
  the layer split, dtype, library versions), so a changed graph, tokenizer, model or option is a
  miss, never a stale hit; the key is in the file's HMAC (and, for the reader, in the file).

Timing is the one thing it changes that the server can observe: a miss makes that round slower
(the frozen states are computed), so the duration of a run's first round tells the server
whether the site's texts, its model or the task's encoder options changed since its previous
run — as the duration of any round already tells it roughly how large the site's graph is.
Round durations are outside the DP guarantee either way; a site for which this matters sets
``prepared-cache = "off"`` (every round then computes the states).

The privacy ledger is untouched by it: the budget check, the reservation and the release of
every round's spend happen on the ledger exactly as without a cache (a round that loads its
frozen states from here still reads the ledger first). Restoring an old copy of this folder
(or deleting it) can only cause misses or hits of identical content; it cannot change any ε.

Files are written atomically (a temporary file in the same folder, fsync, rename) with an
HMAC-SHA256 of the key and payload in a header, under the site's secret key
(:mod:`graphveil.ledger.site_key`, ``<ledger>.key`` beside the ledger, never in the cache folder); a
file that is truncated, corrupt, of another format, for another key, or written by anyone
without the site key (tensors rewritten in place, the header recomputed as a plain SHA-256 or
under another key) is refused before it is unpickled (logged, removed) and the piece is
recomputed: a planted file changes nothing that is loaded. At most :attr:`PreparedCache.keep`
files are kept (least recently used go first), so a server that varies the task's encoder
options cannot fill the site's disk.

Who uses it: only a federated site (:meth:`PreparedCache.for_site`, from its node config).
There is no unkeyed cache: a local ``graphveil run`` is one process, keeps its prepared pieces
in memory and uses no cache folder; a site without a key yet (``graphveil budget init`` creates
it) runs without the cache (logged), computing its states every round.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from graphveil.ledger.site_key import (
    KEY_BYTES,
    SiteKeyError,
    key_path_for,
    keyed_digest,
    load_site_key,
)

log = logging.getLogger(__name__)

#: First line of every cache file (format and version); the HMAC of key and payload follows it.
#: v1 files (a plain SHA-256, which anyone can recompute) are refused as of another version.
MAGIC = b"graphveil-prepared-v2\n"
SUFFIX = ".prepared"
#: Files kept per folder by default (one per distinct key; each can be tens of MB).
DEFAULT_KEEP = 4


class PreparedCache:
    """A folder of ``<sha256(key)>.prepared`` files, each a mapping of named tensors.

    :param directory: the folder (created on the first save, mode ``0700``).
    :param key: the site's secret key (:func:`graphveil.ledger.site_key.load_site_key`): files are
        signed with it and a file not signed with it is refused.
    :param keep: at most this many files are kept; the least recently used are removed.
    """

    def __init__(self, directory: str | os.PathLike[str], *, key: bytes, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        if len(key) < KEY_BYTES:
            raise ValueError(f"the cache key must have at least {KEY_BYTES} bytes, got {len(key)}")
        self.directory = Path(directory)
        self._site_key = key
        self.keep = keep
        self.hits = self.misses = 0

    @classmethod
    def for_site(cls, directory: str | os.PathLike[str], ledger: str | os.PathLike[str]) -> PreparedCache | None:
        """The site's cache in ``directory``, keyed with the site key beside ``ledger``; ``None``
        (no cache this round, logged with the reason) when that key is missing or unusable."""
        try:
            return cls(directory, key=load_site_key(key_path_for(ledger)))
        except SiteKeyError as exc:
            log.warning("prepared cache off: %s", exc)
            return None

    def _digest(self, key: str, payload: bytes) -> str:
        """The file's HMAC: the key it is saved under (another key's file, renamed, is refused)
        and the payload."""
        return keyed_digest(self._site_key, key.encode("utf-8"), payload)

    def path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode("utf-8")).hexdigest() + SUFFIX)

    def load(self, key: str, check: Callable[[Mapping[str, torch.Tensor]], None] | None = None
             ) -> dict[str, torch.Tensor] | None:
        """The tensors saved under ``key``, or ``None`` (no file, or a file that is refused).

        ``check(tensors)`` may raise ``ValueError`` to refuse a file whose tensors do not fit
        (shapes, dtypes, values); a refused file is removed so that the next save replaces it.
        """
        path = self.path(key)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            self.misses += 1
            return None
        except OSError as exc:  # an unreadable folder: recompute (and the save will say why)
            log.warning("prepared cache: cannot read %s (%s); recomputing", path, exc)
            self.misses += 1
            return None
        try:
            tensors = self._decode(raw, key)
            if check is not None:
                check(tensors)
        except ValueError as exc:
            log.warning("prepared cache: refusing %s (%s); recomputing", path, exc)
            path.unlink(missing_ok=True)
            self.misses += 1
            return None
        os.utime(path)  # most recently used: evicted last
        self.hits += 1
        return tensors

    def save(self, key: str, tensors: Mapping[str, torch.Tensor]) -> Path:
        """Write ``tensors`` under ``key`` atomically, then remove the oldest files beyond :attr:`keep`."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save({"key": key, "tensors": {k: v.detach().cpu().contiguous() for k, v in tensors.items()}},
                   buffer)
        payload = buffer.getvalue()
        path = self.path(key)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=SUFFIX)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(MAGIC + self._digest(key, payload).encode("ascii") + b"\n" + payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._evict(path)
        return path

    def load_or_compute(self, key: str, compute: Callable[[], Mapping[str, torch.Tensor]],
                        check: Callable[[Mapping[str, torch.Tensor]], None] | None = None
                        ) -> Mapping[str, torch.Tensor]:
        """The tensors saved under ``key`` (refused as :meth:`load` refuses), else ``compute()``,
        saved for the next time; a folder that cannot be written costs the next call time, not
        this one (logged)."""
        saved = self.load(key, check)
        if saved is not None:
            return saved
        tensors = compute()
        try:
            self.save(key, tensors)
        except OSError as exc:
            log.warning("prepared cache: cannot save in %s (%s)", self.directory, exc)
        return tensors

    def _evict(self, newest: Path) -> None:
        files = [p for p in self.directory.glob(f"*{SUFFIX}") if p != newest and not p.name.startswith(".")]
        files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for old in files[self.keep - 1:]:
            old.unlink(missing_ok=True)

    def _decode(self, raw: bytes, key: str) -> dict[str, torch.Tensor]:
        """The tensors of a cache file's bytes; ``ValueError`` naming what is wrong. The HMAC
        is checked before anything is unpickled: no file the site did not write reaches torch."""
        if not raw.startswith(MAGIC):
            raise ValueError("not a GraphVeil prepared-cache file of this version")
        header_end = raw.find(b"\n", len(MAGIC))
        if header_end < 0:
            raise ValueError("truncated header")
        digest, payload = raw[len(MAGIC):header_end], raw[header_end + 1:]
        if not hmac.compare_digest(self._digest(key, payload).encode("ascii"), digest):
            raise ValueError("not signed with this site's key (truncated, corrupt, rewritten or planted)")
        try:
            saved = torch.load(io.BytesIO(payload), weights_only=True)
        except Exception as exc:  # a payload torch cannot read despite its HMAC (a bug, not an attack)
            raise ValueError(f"unreadable payload ({type(exc).__name__})") from exc
        tensors = saved.get("tensors") if isinstance(saved, dict) else None  # saved["key"] is in the HMAC
        if not isinstance(tensors, dict) or not all(isinstance(v, torch.Tensor) for v in tensors.values()):
            raise ValueError("no tensors")
        return tensors
