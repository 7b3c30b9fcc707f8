"""deploy/scripts/register-sites.sh against a fake ``flwr`` that answers like Flower 1.41.

A key the SuperLink already knows ("Public key already in use", the text of Flower's
``PUBLIC_KEY_ALREADY_IN_USE`` error) was not registered by this run: the script must fail
unless the operator passes ``--allow-existing``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from _paths import REPO

SCRIPT = REPO / "deploy" / "scripts" / "register-sites.sh"

# What `flwr supernode register ... --format json` prints (flwr.supercore.logger.print_json_error
# around the SuperLink's public message for ApiErrorCode.PUBLIC_KEY_ALREADY_IN_USE).
ALREADY = {"success": False, "error-message": "\nPublic key already in use."}
OK = {"success": True, "node-id": 1234}
OTHER = {"success": False, "error-message": "\nThe provided public key is not valid."}

FAKE_FLWR = """#!/bin/sh
# fake flwr: `flwr supernode register KEY CONN --name NAME --format json`
echo "$@" >> "$FAKE_FLWR_CALLS"
case $(basename "$3") in
    new.pub) cat "$FAKE_FLWR_DIR/ok.json" ;;
    known.pub) cat "$FAKE_FLWR_DIR/already.json"; exit 1 ;;
    *) cat "$FAKE_FLWR_DIR/other.json"; exit 1 ;;
esac
"""


@pytest.fixture
def fake(tmp_path: Path) -> dict[str, str]:
    from flwr.common.constant import PUBLIC_KEY_ALREADY_IN_USE_MESSAGE

    assert PUBLIC_KEY_ALREADY_IN_USE_MESSAGE in ALREADY["error-message"]  # Flower's own text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    flwr = bin_dir / "flwr"
    flwr.write_text(FAKE_FLWR)
    flwr.chmod(0o755)
    for name, payload in (("ok", OK), ("already", ALREADY), ("other", OTHER)):
        (tmp_path / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "FAKE_FLWR_DIR": str(tmp_path), "FAKE_FLWR_CALLS": str(tmp_path / "calls.txt")}


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=30)


def test_new_keys_are_registered_under_their_file_name(fake: dict[str, str]) -> None:
    proc = _run(fake, "fed", "keys/new.pub")
    assert proc.returncode == 0, proc.stderr
    assert "registered new (keys/new.pub)" in proc.stdout
    assert Path(fake["FAKE_FLWR_CALLS"]).read_text().split() == [
        "supernode", "register", "keys/new.pub", "fed", "--name", "new", "--format", "json"]


def test_an_already_registered_key_fails(fake: dict[str, str]) -> None:
    proc = _run(fake, "fed", "keys/new.pub", "keys/known.pub")
    assert proc.returncode == 1
    assert "registered new" in proc.stdout  # the other keys are still processed
    assert "ERROR: the key of known (keys/known.pub) is already registered" in proc.stderr
    assert "flwr supernode list fed" in proc.stderr


def test_allow_existing_accepts_it_with_a_warning(fake: dict[str, str]) -> None:
    proc = _run(fake, "--allow-existing", "fed", "keys/known.pub")
    assert proc.returncode == 0, proc.stderr
    assert "WARNING: known (keys/known.pub) was already registered" in proc.stderr


def test_other_errors_fail_even_with_allow_existing(fake: dict[str, str]) -> None:
    proc = _run(fake, "--allow-existing", "fed", "keys/bad.pub")
    assert proc.returncode == 1
    assert "failed to register bad" in proc.stderr and "not valid" in proc.stderr


def test_usage(fake: dict[str, str]) -> None:
    assert _run(fake, "fed").returncode == 2
    assert _run(fake, "--allow-existing", "fed").returncode == 2
