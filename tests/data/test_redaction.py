"""The one rule for what names a secret (graphveil.redaction), used by the SQL source's URL
checks and by the MLflow plugin's config redaction, and the masking of secrets inside text:
URL passwords (parsed, also when they hold '@' or '/'), secret query parameters, libpq strings."""

from __future__ import annotations

import pytest

from graphveil.redaction import REDACTED, is_secret_key, mask_secrets, mask_url


@pytest.mark.parametrize("key", ["password", "db_password", "sslpassword", "PGPASSWORD", "pass", "pwd",
                                 "accessToken", "authtoken", "API-KEY", "private_key", "client.secret",
                                 "aws_secret_access_key", "credentials", "passphrase",
                                 # not secret before issue 25
                                 "passwordfile", "passfile", "PGPASSFILE", "pgpass", "db_pw", "pw",
                                 "authorization", "Proxy-Authorization", "cookie", "Set-Cookie", "token",
                                 "secret", "api_key", "apiKey", "private_key", "privateKey", "credential",
                                 "bearer", "session_key", "tokenfile"])
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["tokenizer", "tokenizer_name", "max_tokens", "num_tokens", "passes", "sslmode",
                                 "profile", "file", "keys", "host", "user", "max_length", "bypass_cache",
                                 "key_column", "compass", "cookbook", "author", "power"])
def test_other_keys(key: str) -> None:
    assert not is_secret_key(key)


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://alice:s3cr3t@db:5432/bank", "postgresql+psycopg://alice:***@db:5432/bank"),
    # a password holding '@' and '/': a parser ends the host at the first '/', the mask does not
    ("postgresql://bob:p@ss/w0rd@db/graph", "postgresql://bob:***@db/graph"),
    ("postgresql://bob:pa/ss@db/graph", "postgresql://bob:***@db/graph"),
    ("mysql://bob:p@ss@h/x", "mysql://bob:***@h/x"),
    ("postgresql://alice@db/g?password=s3cr3t&sslmode=require", "postgresql://alice@db/g?password=***&sslmode=require"),
    ("postgresql://alice@db/g?sslmode=require&sslpassword=s3cr3t", "postgresql://alice@db/g?sslmode=require&sslpassword=***"),
    ("https://tracking.example.org/api?token=s3cr3t#top", "https://tracking.example.org/api?token=***#top"),
    ("https://h/x?Pass%77ord=s3cr3t", "https://h/x?Pass%77ord=***"),  # the key is decoded before the rule
    # nothing to hide
    ("https://example.org/a:b@c", "https://example.org/a:b@c"),
    ("postgresql://db:5432/g?application_name=a@b", "postgresql://db:5432/g?application_name=a@b"),
    ("postgresql://alice@db/graph", "postgresql://alice@db/graph"),
    ("sqlite:///graph.db", "sqlite:///graph.db"),
    ("http://[::1]:8080/x", "http://[::1]:8080/x"),
])
def test_urls_are_parsed_and_their_secrets_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown == mask_secrets(url)
    assert "s3cr3t" not in shown and "w0rd" not in shown and "ss/" not in shown.replace("https://", "")


@pytest.mark.parametrize("text, shown", [
    ("host=db password=s3cr3t user=x", f"host=db password={REDACTED} user=x"),
    ("host=db password='s3 cr3t' user=x", f"host=db password={REDACTED} user=x"),
    (r"dbname=g password = 'it\'s s3cr3t' port=5432", f"dbname=g password = {REDACTED} port=5432"),
    ("connection failed: host=db sslpassword=s3cr3t sslmode=require",
     f"connection failed: host=db sslpassword={REDACTED} sslmode=require"),
    ("dsn 'postgresql://u:s3cr3t@h/d' and token=s3cr3t", f"dsn 'postgresql://u:{REDACTED}@h/d' and token={REDACTED}"),
    ("tokenizer=bert max_tokens=8", "tokenizer=bert max_tokens=8"),
])
def test_libpq_strings_and_text_are_masked(text: str, shown: str) -> None:
    assert mask_secrets(text) == shown
