"""The Flower app shipped with GraphVeil: its folder and the SHA-256 of its FAB.

The hash is what a site approves (``approved-apps = "bundled"``, see :mod:`.guard`) and what
``graphveil fed app-hash`` prints, so both must compute it the same way: here, once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from graphveil.connectors.flower.control import FlowerError


def bundled_app_dir() -> Path:
    """Folder of the Flower app project (``pyproject.toml`` with ``[tool.flwr.app]``)."""
    app = Path(__file__).parent / "app"
    if not (app / "pyproject.toml").is_file():
        raise FlowerError("the GraphVeil Flower app folder is not installed (graphveil.connectors.flower/app)")
    return app


def app_hash(app: Path | None = None) -> str:
    """SHA-256 of the FAB ``flwr build`` / ``flwr run`` make from an app folder (Flower's fab_hash)."""
    from flwr.cli.build import build_fab_from_disk  # imports much of flwr: only when hashing

    return hashlib.sha256(build_fab_from_disk(app or bundled_app_dir())).hexdigest()
