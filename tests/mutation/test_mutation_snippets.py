"""Every mutant of tests/mutation/run_mutants.py still applies: each snippet occurs exactly once.

A refactor that rewrites a guarded line silently retires its mutant; ``--list`` flags it as
STALE and exits 2, and this test makes that a failure of the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUNNER = Path(__file__).resolve().parent / "run_mutants.py"


def test_every_mutant_snippet_occurs_once() -> None:
    out = subprocess.run([sys.executable, str(RUNNER), "--list"], capture_output=True, text=True, timeout=120)
    stale = [line for line in out.stdout.splitlines() if "STALE" in line]
    assert out.returncode == 0 and not stale, "\n".join(stale) or out.stderr
    assert len(out.stdout.splitlines()) > 30  # the mutants were listed
