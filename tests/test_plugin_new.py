"""``graphveil plugin new``: the package it writes installs, passes its own test, and is listed.

The end-to-end test installs the generated package into the running environment exactly as a
user would (``pip install -e``, no dependencies, no build isolation: nothing is downloaded),
runs its test with ``python -m pytest`` in a subprocess, checks ``graphveil plugins`` lists the
component, and uninstalls it whatever happens, so the environment is left as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest

from graphveil.apps.cli import main
from graphveil.apps.cli_plugin import SCAFFOLDS, new_plugin
from graphveil.errors import ConfigError
from graphveil.host import FAMILIES

GRAPHVEIL_CLI = Path(sys.executable).parent / "graphveil"
#: family → (probe name, tests its package has)
PROBES = {"clipper": ("scaffold_probe_clip", 6), "accountant": ("scaffold_probe_acc", 7)}


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=600, check=False)


def _installed(name: str) -> bool:
    try:
        distribution(name)
    except PackageNotFoundError:
        return False
    return True


@pytest.fixture(params=sorted(PROBES))
def installed_probe(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    """A generated package per family, pip-installed for the test and uninstalled after it, even on failure."""
    family = request.param
    probe = PROBES[family][0]
    assert not _installed(probe), f"{probe} is installed already (a previous run was killed?): pip uninstall {probe}"
    assert main(["plugin", "new", probe, "--family", family, "--dir", str(tmp_path)]) == 0
    target = tmp_path / probe
    try:
        done = _pip("install", "--no-deps", "--no-build-isolation", "-q", "-e", str(target))
        assert done.returncode == 0, done.stderr[-3000:]
        yield family, target
    finally:
        if _installed(probe):
            done = _pip("uninstall", "-y", "-q", probe)
            assert done.returncode == 0, done.stderr[-3000:]
    assert not _installed(probe)


@pytest.mark.slow
def test_the_generated_package_installs_passes_its_test_and_is_listed(installed_probe: tuple[str, Path]) -> None:
    family, target = installed_probe
    probe, tests_in_package = PROBES[family]
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()) == [
        "README.md", "pyproject.toml", f"src/{probe}.py", f"tests/test_{probe}.py"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD", None)
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
