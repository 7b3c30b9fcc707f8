"""A site's secret key: 32 random bytes in a file beside its ledger, never sent anywhere.

What the key protects is anything the site writes that someone outside the site (the server,
a witness) sees a digest of, or that a party with write access to the site's disk could plant:

* the ledger's hash chain is an HMAC under this key, so a chain head sent to the server cannot
  be recomputed from guessed entry values (the values depend on private sizes);
* the prepared cache's checksums are HMACs under it, so a file rewritten on disk by someone
  without the key does not load as a hit.

The key is created once, explicitly (``graphveil budget init``), with mode ``0600``, written
atomically (a temporary file, fsync, a hard link that fails if the key exists: two sites
starting at once never get two keys). It is read, never silently replaced: a missing key for an
existing ledger is an error, since a new key would re-sign (and so hide) any rewrite.
"""

from __future__ import annotations

import hmac
import os
import secrets
import tempfile
from pathlib import Path

from graphveil.contract.errors import GraphVeilError

KEY_BYTES = 32
_MAGIC = b"graphveil-site-key-v1\n"


class SiteKeyError(GraphVeilError):
    """The site's key file is missing, unreadable, of another format, or readable by others."""


def key_path_for(ledger: str | os.PathLike[str]) -> Path:
    """Where a ledger's site key lives: ``<ledger>.key`` beside it."""
    ledger = Path(ledger)
    return ledger.with_name(ledger.name + ".key")


def create_site_key(path: str | os.PathLike[str]) -> bytes:
    """Create a new key at ``path`` (mode 0600); :class:`SiteKeyError` if one already exists."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(KEY_BYTES)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_MAGIC + key.hex().encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # fails if the key exists: never two keys for one site
        except FileExistsError:
            raise SiteKeyError(f"{path}: a site key already exists; refusing to replace it") from None
    finally:
        os.unlink(tmp)
    return key


def load_site_key(path: str | os.PathLike[str]) -> bytes:
    """The key stored at ``path``; :class:`SiteKeyError` naming the file and the problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SiteKeyError(f"{path}: no site key (create one with `graphveil budget init`)") from None
    except OSError as exc:
        raise SiteKeyError(f"{path}: cannot read the site key ({exc.strerror})") from None
    if not raw.startswith(_MAGIC):
        raise SiteKeyError(f"{path}: not a GraphVeil site key")
    try:
        key = bytes.fromhex(raw[len(_MAGIC):].decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise SiteKeyError(f"{path}: the site key is corrupt") from None
    if len(key) != KEY_BYTES:
        raise SiteKeyError(f"{path}: the site key has {len(key)} bytes, expected {KEY_BYTES}")
    if os.name == "posix" and path.stat().st_mode & 0o077:
        raise SiteKeyError(f"{path}: the site key is readable by others (chmod 600 {path})")
    return key


def keyed_digest(key: bytes, *parts: bytes) -> str:
    """HMAC-SHA256 of the length-prefixed ``parts`` under ``key``, hex.

    Length prefixes make the split unambiguous (``("ab", "c")`` and ``("a", "bc")`` differ).

    >>> keyed_digest(b"k" * 32, b"ab", b"c") != keyed_digest(b"k" * 32, b"a", b"bc")
    True
    """
    mac = hmac.new(key, digestmod="sha256")
    for part in parts:
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.hexdigest()
