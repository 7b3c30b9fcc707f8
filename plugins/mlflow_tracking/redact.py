"""What of a run config may leave for a tracking server: secrets out, the rest flattened.

A key that names a secret (password, token, secret, credential, API or private key, auth) has
its value replaced; a password inside a URL (``scheme://user:password@host``) is masked wherever
it appears. The SQL data source keeps credentials out of the run config, but a user can still
write one into a config by hand, and a tracking server is not the place for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"
SECRET_WORDS = frozenset({"password", "passwd", "pwd", "pass", "passphrase", "secret", "token", "credential",
                          "credentials", "secrets", "auth", "apikey"})
SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key")})
URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^:/@\s]*:)[^@/\s]+@", re.IGNORECASE)


def is_secret_key(key: str) -> bool:
    """``key`` names a secret: one of its words (split at ``_-.`` and camelCase) is one.

    >>> [is_secret_key(k) for k in ("db_password", "accessToken", "API-KEY", "tokenizer", "passes")]
    [True, True, True, False, False]
    """
    words = [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", key)]
    return bool(SECRET_WORDS.intersection(words)) or any(pair in SECRET_PAIRS for pair in zip(words, words[1:], strict=False))


def mask_urls(text: str) -> str:
    """``text`` with every URL password replaced by ``***``.

    >>> mask_urls("postgresql+psycopg://alice:s3cr3t@db:5432/bank and https://example.org/x")
    'postgresql+psycopg://alice:***@db:5432/bank and https://example.org/x'
    """
    return URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", text)


def redact(value: Any, key: str = "") -> Any:
    """A copy of ``value`` (nested mappings and sequences) with secrets replaced.

    >>> redact({"data": {"url": "postgresql://bob:pw@h/db", "password_file": "/run/pw",
    ...                  "api_token": "t0k"}, "name": "x"})
    {'data': {'url': 'postgresql://bob:***@h/db', 'password_file': '***', 'api_token': '***'}, 'name': 'x'}
    """
    if key and value is not None and is_secret_key(key):
        return REDACTED
    if isinstance(value, Mapping):
        return {str(k): redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return mask_urls(value) if isinstance(value, str) else value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted keys to leaf values; list items are numbered (``mechanisms.0.name``).

    >>> flatten({"sampler": {"name": "s", "k": 2}, "mechanisms": [{"name": "m"}], "tags": []})
    {'sampler.name': 's', 'sampler.k': 2, 'mechanisms.0.name': 'm', 'tags': '[]'}
    """
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{dotted}."))
        elif isinstance(value, list | tuple) and any(isinstance(v, Mapping) for v in value):
            flat.update(flatten({str(i): v for i, v in enumerate(value)}, f"{dotted}."))
        else:
            flat[dotted] = str(list(value)) if isinstance(value, list | tuple) else (
                "{}" if isinstance(value, Mapping) else value)
    return flat
