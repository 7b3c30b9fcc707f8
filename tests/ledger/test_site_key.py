"""The site key: created once, 0600, refused when missing, corrupt or readable by others."""

from __future__ import annotations

import doctest
import os

import pytest

from graphveil.ledger import site_key
from graphveil.ledger.site_key import (
    SiteKeyError,
    create_site_key,
    key_path_for,
    keyed_digest,
    load_site_key,
)


def test_created_key_loads_back_and_is_private(tmp_path):
    path = key_path_for(tmp_path / "ledger.sqlite")
    assert path.name == "ledger.sqlite.key"
    key = create_site_key(path)
    assert len(key) == 32 and load_site_key(path) == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_an_existing_key_is_never_replaced(tmp_path):
    path = tmp_path / "site.key"
    key = create_site_key(path)
    with pytest.raises(SiteKeyError, match="already exists"):
        create_site_key(path)
    assert load_site_key(path) == key


@pytest.mark.parametrize("content, problem", [
    (None, "no site key"),
    (b"hello\n", "not a GraphVeil site key"),
    (b"graphveil-site-key-v1\nzz\n", "corrupt"),
    (b"graphveil-site-key-v1\nabcd\n", "2 bytes"),
])
def test_bad_key_files_are_refused_with_the_problem(tmp_path, content, problem):
    path = tmp_path / "site.key"
    if content is not None:
        path.write_bytes(content)
        path.chmod(0o600)
    with pytest.raises(SiteKeyError, match=problem):
        load_site_key(path)


@pytest.mark.skipif(os.name != "posix", reason="file modes")
def test_a_key_readable_by_others_is_refused(tmp_path):
    path = tmp_path / "site.key"
    create_site_key(path)
    path.chmod(0o644)
    with pytest.raises(SiteKeyError, match="readable by others"):
        load_site_key(path)


def test_keyed_digest_depends_on_the_key_and_the_split():
    a, b = b"a" * 32, b"b" * 32
    assert keyed_digest(a, b"x") == keyed_digest(a, b"x")
    assert keyed_digest(a, b"x") != keyed_digest(b, b"x")
    assert keyed_digest(a, b"ab", b"c") != keyed_digest(a, b"a", b"bc")


def test_doctests():
    assert doctest.testmod(site_key).failed == 0
