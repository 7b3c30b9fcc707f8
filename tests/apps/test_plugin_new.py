"""``graphveil plugin new``: the package it writes installs, passes its own test, and is listed.

The end-to-end test builds and installs the generated package with pip (no dependencies, no
build isolation: nothing is downloaded) into a folder of its own (``pip install --target``), then
runs the package's test with ``python -m pytest`` and ``graphveil plugins`` in subprocesses that
see that folder on ``PYTHONPATH``, so entry-point discovery finds it exactly as in a user's
environment. The running environment is never changed: other processes sharing it (a parallel
test run, a mutation run) never see a half-installed plugin.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from graphveil.apps.cli import main
from graphveil.apps.cli_plugin import SCAFFOLDS, new_plugin
from graphveil.contract.errors import ConfigError
from graphveil.contract.host import FAMILIES

GRAPHVEIL_CLI = Path(sys.executable).parent / "graphveil"
#: family → (probe name, tests its package has)
PROBES = {"clipper": ("scaffold_probe_clip", 6), "accountant": ("scaffold_probe_acc", 7)}


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=600, check=False)


@pytest.fixture(params=sorted(PROBES))
def installed_probe(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path, list[str], dict[str, str]]:
    """A generated package per family, the files it was generated with, installed into
    ``tmp_path/site`` (the build leaves ``build/`` and ``*.egg-info`` beside them); the
    environment that sees it."""
    family = request.param
    probe = PROBES[family][0]
    assert main(["plugin", "new", probe, "--family", family, "--dir", str(tmp_path)]) == 0
    target, site = tmp_path / probe, tmp_path / "site"
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    done = _pip("install", "--no-deps", "--no-build-isolation", "-q", "--target", str(site), str(target))
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    env.pop("GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD", None)
    return family, target, files, env


@pytest.mark.slow
def test_the_generated_package_installs_passes_its_test_and_is_listed(
        installed_probe: tuple[str, Path, list[str], dict[str, str]]) -> None:
    family, target, files, env = installed_probe
    probe, tests_in_package = PROBES[family]
    assert files == [
        "README.md", "pyproject.toml", f"src/{probe}.py", f"tests/test_{probe}.py"]
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=target,
                           env=env, capture_output=True, text=True, timeout=600, check=False)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert f"{tests_in_package} passed" in tests.stdout

    listing = subprocess.run([str(GRAPHVEIL_CLI), "plugins"], env=env, capture_output=True, text=True,
                             timeout=300, check=False)
    assert listing.returncode == 0, listing.stderr[-2000:]
    families = list(FAMILIES)
    section = listing.stdout.split(f"{family}s:")[1].split(f"{families[families.index(family) + 1]}s:")[0]
    assert [line.split()[:2] for line in section.splitlines() if probe in line] == [[probe, f"[{probe}]"]]


@pytest.mark.parametrize(("name", "message"), [
    ("Half-Clip", "lowercase letters, digits and underscores"),
    ("2clip", "starting with a letter"),
    ("class", "is a Python keyword"),
    ("torch", "already importable"),
])
def test_a_bad_name_is_refused_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      name: str, message: str) -> None:
    assert main(["plugin", "new", name, "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "my_clip").mkdir()
    (tmp_path / "my_clip" / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="already exists"):
        new_plugin("my_clip", "clipper", tmp_path)
    assert [p.name for p in (tmp_path / "my_clip").iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my_clip"]


def test_every_template_is_a_family_of_the_host() -> None:
    assert set(SCAFFOLDS) <= set(FAMILIES)
