"""Where the tests find the repository's own files (examples, deploy, docs), from any test folder."""

from __future__ import annotations

from pathlib import Path

#: the checkout (or the mutation runner's copy of it): the folder holding ``tests/``
REPO = Path(__file__).resolve().parents[1]
