"""``graphveil plugin new``: for every family, the package it writes installs, passes its own
tests, and is listed.

The end-to-end tests generate one package per family, build and install them with pip (no
dependencies, no build isolation: nothing is downloaded) into one folder of their own
(``pip install --target``), then run all the packages' tests in one ``python -m pytest`` and
``graphveil plugins`` in subprocesses that see that folder on ``PYTHONPATH``, so entry-point
discovery finds them exactly as in a user's environment. The running environment is never
changed: other processes sharing it (a parallel test run, a mutation run) never see a
half-installed plugin. (``tests/apps/test_wheel.py`` generates one in the wheel's fresh virtualenv
and installs it there with ``pip install -e``, as the handbook tells a user to.)
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from graphveil.apps.cli import main
from graphveil.apps.cli_plugin import SCAFFOLDS, new_plugin
from graphveil.contract.errors import ConfigError
from graphveil.contract.host import FAMILIES

GRAPHVEIL_CLI = Path(sys.executable).parent / "graphveil"
#: family → tests its generated package has (every family a user extends has a template)
TESTS = {"sampler": 7, "clipper": 6, "accountant": 7, "encoder": 7, "model": 7, "task": 6, "mechanism": 7,
         "method": 3, "data_source": 8}


def probe(family: str) -> str:
    return f"scaffold_probe_{family}"


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True,
                          timeout=600, check=False)


@dataclass(frozen=True)
class Generated:
    root: Path  # one package per family: root / probe(family)
    files: dict[str, list[str]]  # family → the files it was generated with
    env: dict[str, str]  # an environment that sees the installed packages


# the module's generated packages are installed once, on one worker
pytestmark = pytest.mark.xdist_group("plugin-new")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    """A package per family, as generated, installed together into ``root/site`` (the build leaves
    ``build/`` and ``*.egg-info`` beside them)."""
    root = tmp_path_factory.mktemp("plugins")
    files = {}
    for family in TESTS:
        assert main(["plugin", "new", probe(family), "--family", family, "--dir", str(root)]) == 0
        target = root / probe(family)
        files[family] = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    done = _pip("install", "--no-deps", "--no-build-isolation", "-q", "--target", str(root / "site"),
                *(str(root / probe(family)) for family in TESTS))
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "site"), os.environ.get("PYTHONPATH")]))}
    env.pop("GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD", None)
    return Generated(root, files, env)


def test_every_family_a_user_extends_has_a_template() -> None:
    assert set(SCAFFOLDS) == set(FAMILIES) == set(TESTS)


@pytest.mark.parametrize("family", sorted(SCAFFOLDS))
def test_a_generated_package_is_complete_python_and_lints_clean(tmp_path: Path, family: str) -> None:
    target = new_plugin("lint_probe", family, tmp_path)
    sources = [target / "src" / "lint_probe.py", target / "tests" / "test_lint_probe.py"]
    for path in [*sources, target / "README.md", target / "pyproject.toml"]:
        assert "${" not in path.read_text(encoding="utf-8"), path  # every placeholder filled in
    for path in sources:
        ast.parse(path.read_text(encoding="utf-8"), str(path))
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--target-version", "py311",
                           "--select", "F,E,W,B,UP", "--ignore", "E501", *map(str, sources)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert lint.returncode == 0, lint.stdout[-3000:]
    assert tomllib.loads((target / "pyproject.toml").read_text())["project"]["entry-points"]["graphveil"] == {
        "lint_probe": "lint_probe"}


@pytest.mark.slow
def test_every_generated_package_installs_and_passes_its_own_tests(generated: Generated) -> None:
    for family, files in generated.files.items():
        assert files == ["README.md", "pyproject.toml", f"src/{probe(family)}.py", f"tests/test_{probe(family)}.py"]
    # one pytest process for all packages: their test modules have distinct names
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
         *(str(generated.root / probe(family) / "tests") for family in TESTS)],
        cwd=generated.root, env=generated.env, capture_output=True, text=True, timeout=1800, check=False)
    assert tests.returncode == 0, tests.stdout[-5000:] + tests.stderr[-2000:]
    passed = [line for line in tests.stdout.splitlines() if line.startswith("PASSED ")]
    for family, count in TESTS.items():
        assert sum(f"test_{probe(family)}.py::" in line for line in passed) == count, family
    assert f"{sum(TESTS.values())} passed" in tests.stdout


@pytest.mark.slow
def test_graphveil_plugins_lists_every_generated_component_under_its_family(generated: Generated) -> None:
    listing = subprocess.run([str(GRAPHVEIL_CLI), "plugins"], env=generated.env, capture_output=True, text=True,
                             timeout=300, check=False)
    assert listing.returncode == 0, listing.stderr[-2000:]
    families = list(FAMILIES)
    for family in TESTS:
        following = families[families.index(family) + 1:]
        section = listing.stdout.split(f"{family}s:\n")[1]
        section = section.split(f"{following[0]}s:\n")[0] if following else section
        assert [line.split()[:2] for line in section.splitlines() if probe(family) in line] == [
            [probe(family), f"[{probe(family)}]"]], family


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


