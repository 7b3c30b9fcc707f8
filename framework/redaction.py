"""What names a secret, and URL passwords masked: one rule for every place that hides one
(database URLs in messages and logs, run configs sent to a tracking server)."""

from __future__ import annotations

import re

REDACTED = "***"
SECRET_WORDS = frozenset({"password", "passwd", "pwd", "pass", "passphrase", "secret", "token", "credential",
                          "credentials", "secrets", "auth", "apikey"})
SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
#: A word ending in one of these is a secret too (libpq's ``sslpassword``, ``authtoken``).
SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token")
URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """``key`` names a secret: one of its words (split at ``_-.`` and camelCase) is one, or ends
    in one.

    >>> [is_secret_key(k) for k in ("db_password", "accessToken", "API-KEY", "sslpassword", "pass")]
    [True, True, True, True, True]
    >>> [is_secret_key(k) for k in ("tokenizer", "passes", "sslmode", "passfile_mode", "keys")]
    [False, False, False, False, False]
    """
    words = [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", key)]
    return (bool(SECRET_WORDS.intersection(words))
            or any(w.endswith(SECRET_SUFFIXES) for w in words)
            or any(pair in SECRET_PAIRS for pair in zip(words, words[1:], strict=False)))


def mask_urls(text: str) -> str:
    """``text`` with every URL password replaced by ``***``.

    >>> mask_urls("postgresql+psycopg://alice:s3cr3t@db:5432/bank and https://example.org/x")
    'postgresql+psycopg://alice:***@db:5432/bank and https://example.org/x'
    """
    return URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", text)
