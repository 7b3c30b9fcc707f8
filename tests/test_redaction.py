"""The one rule for what names a secret (graphveil.redaction), used by the SQL source's URL
checks and by the MLflow plugin's config redaction."""

from __future__ import annotations

import pytest

from graphveil.redaction import is_secret_key, mask_urls


@pytest.mark.parametrize("key", ["password", "db_password", "sslpassword", "PGPASSWORD", "pass", "pwd",
                                 "accessToken", "authtoken", "API-KEY", "private_key", "client.secret",
                                 "aws_secret_access_key", "credentials", "passphrase"])
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["tokenizer", "passes", "sslmode", "passfile", "keys", "host", "user",
                                 "max_length", "bypass_cache", "key_column"])
def test_other_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_url_passwords_are_masked() -> None:
    text = "postgresql+psycopg://alice:s3cr3t@db:5432/bank; mysql://bob:p@ss@h/x; https://example.org/a:b@c"
    assert "s3cr3t" not in mask_urls(text) and "alice:***@db" in mask_urls(text)
