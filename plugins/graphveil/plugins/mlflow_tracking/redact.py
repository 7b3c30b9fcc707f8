"""What of a run config may leave for a tracking server: secrets out, the rest flattened.

A key that names a secret (password, pw, token, secret, credential, cookie, authorization, API
or private key, a password file: :func:`graphveil.redaction.is_secret_key`) has its value
replaced; inside every other string, a URL's password and secret query parameters and the
secret pairs of a libpq connection string (``host=db password=…``) are masked
(:func:`graphveil.redaction.mask_secrets`). The SQL data source keeps credentials out of the run
config, but a user can still write one into a config by hand, and a tracking server is not the
place for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from graphveil.redaction import REDACTED, is_secret_key, mask_secrets

__all__ = ["REDACTED", "flatten", "is_secret_key", "mask_secrets", "redact"]


def redact(value: Any, key: str = "") -> Any:
    """A copy of ``value`` (nested mappings and sequences) with secrets replaced.

    >>> redact({"data": {"url": "postgresql://bob:p@ss/w0rd@h/db", "password_file": "/run/pw",
    ...                  "dsn": "host=h password=pw", "api_token": "t0k"}, "name": "x"})
    {'data': {'url': 'postgresql://bob:***@h/db', 'password_file': '***', 'dsn': 'host=h password=***', \
'api_token': '***'}, 'name': 'x'}
    """
    if key and value is not None and is_secret_key(key):
        return REDACTED
    if isinstance(value, Mapping):
        return {str(k): redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return mask_secrets(value) if isinstance(value, str) else value


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
