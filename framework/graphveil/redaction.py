"""What names a secret, and secrets masked in text: one rule for every place that hides one
(database URLs in messages and logs, run configs sent to a tracking server).

:func:`is_secret_key` is the one rule for names (config keys, URL query parameters, libpq
keywords); :func:`mask_secrets` applies it inside free text: the password of a URL's userinfo,
secret query parameters of a URL (``?password=``, ``?sslpassword=``, ``?token=``) and secret
``key=value`` pairs of a libpq connection string (``host=db password='s e c' user=x``).
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus, urlsplit

REDACTED = "***"
SECRET_WORDS = frozenset({"password", "passwd", "pwd", "pw", "pass", "passphrase", "pgpass", "secret", "secrets",
                          "token", "credential", "credentials", "auth", "authorization", "apikey", "privatekey",
                          "cookie", "cookies", "bearer", "jwt"})
SECRET_PAIRS = frozenset({("api", "key"), ("private", "key"), ("access", "key"), ("session", "key")})
#: A word ending in one of these is a secret too (libpq's ``sslpassword``, ``authtoken``).
SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret", "token")
#: A secret word followed by ``file`` names where the secret is kept (``passwordfile``,
#: libpq's ``passfile``, ``PGPASSFILE``): masked as well.
FILE_SUFFIX = "file"
#: A URL in free text: a scheme, ``://`` and everything up to white space or a quote.
URL = re.compile(r"[a-z][a-z0-9+.-]*://[^\s'\"<>]+", re.IGNORECASE)
#: A ``key=value`` pair of a libpq connection string; the value bare or single-quoted (``\'``).
KEY_VALUE = re.compile(r"(?<![\w.-])(?P<key>[a-z_][\w.-]*)(?P<eq>\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|[^\s'\"]+)",
                       re.IGNORECASE)


def _secret_word(word: str) -> bool:
    if word.endswith(FILE_SUFFIX):
        word = word.removesuffix(FILE_SUFFIX)  # where a secret is kept: passwordfile, pgpassfile
    return word in SECRET_WORDS or word.endswith(SECRET_SUFFIXES)


def is_secret_key(key: str) -> bool:
    """``key`` names a secret: one of its words (split at ``_-.`` and camelCase) is one, ends in
    one or is one followed by ``file``, or two adjacent words are (``api_key``).

    >>> [is_secret_key(k) for k in ("db_password", "accessToken", "API-KEY", "sslpassword", "pass",
    ...                             "passwordfile", "PGPASSFILE", "db_pw", "Authorization", "cookie")]
    [True, True, True, True, True, True, True, True, True, True]
    >>> [is_secret_key(k) for k in ("tokenizer", "max_tokens", "passes", "sslmode", "profile", "keys")]
    [False, False, False, False, False, False]
    """
    words = [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", key)]
    return (any(_secret_word(w) for w in words)
            or any(pair in SECRET_PAIRS for pair in zip(words, words[1:], strict=False)))


def _userinfo_end(rest: str) -> int:
    """Index of the ``@`` ending the userinfo of ``rest`` (a URL after ``scheme://``) when that
    userinfo holds a password, else -1.

    A password may hold ``@``, ``/``, ``?`` or ``#`` unescaped (``bob:p@ss/w0rd@db``): a parser
    then ends the authority early, so the password runs to the URL's last ``@`` (masking a
    little too much beats showing the rest of a password).
    """
    netloc = urlsplit("//" + rest).netloc
    userinfo, at, hostport = netloc.rpartition("@")
    if at:
        has_password = ":" in userinfo
    else:  # no '@' before the first '/', '?' or '#': "user:pa/ss@host" leaves a "port" of letters
        _, colon, port = hostport.rpartition(":")
        has_password = bool(colon) and not port.isdigit() and not hostport.endswith("]") and "@" in rest
    return rest.rfind("@") if has_password else -1


def _mask_pair(piece: str) -> str:
    key, eq, _ = piece.partition("=")
    return f"{key}={REDACTED}" if eq and is_secret_key(unquote_plus(key)) else piece


def mask_url(url: str) -> str:
    """``url`` with the password of its userinfo and its secret query parameters masked.

    >>> mask_url("postgresql://bob:p@ss/w0rd@db/x?sslmode=require&sslpassword=k3y")
    'postgresql://bob:***@db/x?sslmode=require&sslpassword=***'
    """
    scheme, sep, rest = url.partition("://")
    end = _userinfo_end(rest)
    if end >= 0:
        user = rest[:end].partition(":")[0]
        rest = f"{user}:{REDACTED}{rest[end:]}"
    base, question, tail = rest.partition("?")
    if question:
        query, hash_, fragment = tail.partition("#")
        rest = f"{base}?{'&'.join(_mask_pair(p) for p in query.split('&'))}{hash_}{fragment}"
    return f"{scheme}{sep}{rest}"


def _mask_key_values(text: str) -> str:
    return KEY_VALUE.sub(lambda m: f"{m['key']}{m['eq']}{REDACTED}" if is_secret_key(m["key"]) else m[0], text)


def mask_secrets(text: str) -> str:
    """``text`` with every secret it shows masked: URLs (:func:`mask_url`) and, outside them,
    secret ``key=value`` pairs (a libpq connection string).

    >>> mask_secrets("postgresql+psycopg://alice:s3cr3t@db:5432/bank and https://example.org/x")
    'postgresql+psycopg://alice:***@db:5432/bank and https://example.org/x'
    >>> mask_secrets("host=db password='s e c\\\\'r' user=x sslmode=require")
    'host=db password=*** user=x sslmode=require'
    """
    out, last = [], 0
    for m in URL.finditer(text):
        out += [_mask_key_values(text[last:m.start()]), mask_url(m[0])]
        last = m.end()
    out.append(_mask_key_values(text[last:]))
    return "".join(out)
