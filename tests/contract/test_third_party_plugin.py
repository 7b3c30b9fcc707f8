"""A third-party plugin, installed as a real distribution, runs end to end from YAML.

The plugin is the handbook's tutorial (``docs/how-to/write-a-plugin.md``, "Writing a plugin: a
mechanism, end to end"): this test reads the module, the ``pyproject.toml`` entry point and the
run config from that page's code blocks, so the tutorial cannot drift from what is tested. It writes them into ``tmp_path`` with
a ``<name>-<version>.dist-info`` folder (METADATA + entry_points.txt), exactly what pip leaves
behind, and then checks:

* discovery: ``importlib.metadata`` finds the entry point, a fresh autoloading host registers
  the three components under the plugin's name, ``graphveil plugins`` lists them, and with
  autoload off they are absent (the control);
* a run from the YAML (``load_config`` → ``run_training``) on the bundled Cora uses them:
  the third-party model's forward is called and its weights are what is saved, the task's
  ``prior_accuracy`` is the majority class of the noisy counts, and ε in ``privacy.json``
  equals the DP-SGD steps and the release composed by hand with dp-accounting (more than the
  steps alone);
* the same YAML through ``graphveil run`` in a subprocess (``PYTHONPATH`` = the install folder).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import dp_accounting
import pytest
import torch
from _paths import REPO

import graphveil.contract.host
from graphveil.contract.host import AUTOLOAD_OFF_ENV, ENTRY_POINT_GROUP, PluginHost
from graphveil.privacy.conversion import DEFAULT_ORDERS
from graphveil.run.config import load_config
from graphveil.run.runner import run_training

TUTORIAL = REPO / "docs" / "how-to" / "write-a-plugin.md"
GRAPHVEIL_CLI = Path(sys.executable).parent / "graphveil"
PLUGIN = "label_prior"
COMPONENTS = {("mechanism", "noisy_class_counts"), ("task", "node_classification_with_prior"),
              ("model", "linear_probe")}
NeighborRel = dp_accounting.privacy_accountant.NeighboringRelation


def tutorial_block(lang: str, starts_with: str) -> str:
    """The one fenced ``lang`` block of the tutorial page that starts with ``starts_with``."""
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", TUTORIAL.read_text(encoding="utf-8"), flags=re.M | re.S)
    found = [body for kind, body in blocks if kind == lang and body.startswith(starts_with)]
    assert len(found) == 1, f"{TUTORIAL.name}: expected one {lang} block starting {starts_with!r}, found {len(found)}"
    return found[0]


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """The tutorial plugin installed into ``tmp_path`` as a distribution, plus a fresh host."""
    project = tomllib.loads(tutorial_block("toml", "[project]"))
    name, version = project["project"]["name"], project["project"]["version"]
    declared = project["project"]["entry-points"][ENTRY_POINT_GROUP]
    assert declared == {PLUGIN: PLUGIN}
    (tmp_path / f"{PLUGIN}.py").write_text(tutorial_block("python", f"# {PLUGIN}.py"), encoding="utf-8")
    dist_info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    (dist_info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items()), encoding="utf-8")
    config = tmp_path / "prior.yaml"
    config.write_text(tutorial_block("yaml", "# prior.yaml"), encoding="utf-8")

    monkeypatch.delenv(AUTOLOAD_OFF_ENV, raising=False)
    monkeypatch.delitem(sys.modules, PLUGIN, raising=False)  # imported afresh from this tmp_path, dropped after
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()  # also drops importlib.metadata's cached path lookups
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == PLUGIN]
    assert [(ep.value, ep.dist.name, ep.dist.version) for ep in found] == [(PLUGIN, name, version)]

    host = PluginHost()  # autoload: the one entry-point scan, as `graphveil` does
    # The process-wide host (used by config validation and `graphveil plugins`) is this one for
    # the test only, so the plugin does not leak into other tests.
    monkeypatch.setattr(graphveil.contract.host, "_default", host)
    return SimpleNamespace(root=tmp_path, host=host, config=config, module=importlib.import_module(PLUGIN))


def test_the_entry_point_registers_the_three_components_and_graphveil_plugins_lists_them(
        installed: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from graphveil.apps.cli import main

    mine = {(c.family, c.name) for c in installed.host.components() if c.plugin == PLUGIN}
    assert mine == COMPONENTS
    assert installed.host.get("mechanism", "noisy_class_counts").factory is installed.module.NoisyClassCounts

    assert main(["plugins"]) == 0
    sections: dict[str, list[str]] = {}
    for line in capsys.readouterr().out.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            current = sections.setdefault(line[:-1], [])
        else:
            current.append(line.split())
    for family, name in COMPONENTS:
        rows = [row for row in sections[f"{family}s"] if row[0] == name]
        assert len(rows) == 1 and rows[0][1] == f"[{PLUGIN}]", (family, name, sections[f"{family}s"])

    monkeypatch.setenv(AUTOLOAD_OFF_ENV, "1")  # the control: without the entry point, nothing
    assert not {c.name for c in PluginHost().components()} & {name for _, name in COMPONENTS}


def by_hand_epsilon(privacy: dict, batch_size: int, noise_std: float | None) -> float:
    """dp-accounting, replace-one: the run's steps (sampled-WOR Gaussian, sensitivity 2C) and,
    if ``noise_std`` is given, the release (Gaussian, sensitivity √2)."""
    accountant = dp_accounting.rdp.RdpAccountant(orders=list(DEFAULT_ORDERS), neighboring_relation=NeighborRel.REPLACE_ONE)
    step = dp_accounting.SampledWithoutReplacementDpEvent(
        privacy["num_units"], batch_size, dp_accounting.GaussianDpEvent(privacy["noise_multiplier"] / 2))
    accountant.compose(step, privacy["steps"])
    if noise_std is not None:
        accountant.compose(dp_accounting.GaussianDpEvent(noise_std / math.sqrt(2)))
    return accountant.get_epsilon(privacy["delta"])


@pytest.mark.slow
def test_the_tutorial_yaml_runs_end_to_end_with_the_plugin_components(
        installed: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"forward": 0}
    forward = installed.module.LinearProbe.forward

    def counted(self, x):  # noqa: ANN001, ANN202 - same signature as the plugin's forward
        calls["forward"] += 1
        return forward(self, x)

    monkeypatch.setattr(installed.module.LinearProbe, "forward", counted)
    out = installed.root / "run"
    config = load_config(installed.config, ["training.steps=4", "output.progress=false", f"output.dir={out}"])
    assert (config.task.name, config.network.name, [m.name for m in config.mechanisms]) == (
        "node_classification_with_prior", "linear_probe", ["noisy_class_counts"])

    result = run_training(config, host=installed.host)
    session = result["session"]
    assert result["run_dir"] == out and calls["forward"] >= 4 + 1  # every step and the evaluation
    assert isinstance(session.encoder, installed.module.LinearProbe)
    assert set(torch.load(out / "model" / "model.pt")) == {"linear.weight", "linear.bias"}

    counts = session.released["noisy_class_counts"]
    y, train = session.graph.y, session.task.split.train
    exact = torch.bincount(y[train], minlength=session.graph.num_classes).double()
    assert counts.shape == exact.shape and not torch.equal(counts, exact)  # noise was added
    assert float((counts - exact).abs().max()) < 20.0 * 8  # ... at the configured scale (s = 20)

    evaluation = json.loads((out / "evaluation.json").read_text())
    majority = int(counts.argmax())
    test_labels = y[session.task.split.test]
    assert evaluation["prior_accuracy"] == pytest.approx(float((test_labels == majority).float().mean()))
    assert 0 <= evaluation["test_accuracy"] <= 1
    assert "prior acc" in result["table"] and "label-prior" in result["table"]

    privacy = json.loads((out / "privacy.json").read_text())
    assert privacy["private"] and privacy["steps"] == 4 and 0 < privacy["epsilon"] <= 4.0
    assert session.accountant.report(privacy["delta"])["releases"] == ["noisy_class_counts"]
    assert privacy["epsilon"] == pytest.approx(by_hand_epsilon(privacy, 64, 20.0), rel=1e-9)
    assert privacy["epsilon"] > by_hand_epsilon(privacy, 64, None) * (1 + 1e-6)  # the release counts


@pytest.mark.slow
def test_the_tutorial_yaml_runs_through_graphveil_run(installed: SimpleNamespace) -> None:
    assert GRAPHVEIL_CLI.is_file(), f"console script missing: {GRAPHVEIL_CLI}"
    out = installed.root / "cli-run"
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD_OFF_ENV}
    env.update(PYTHONPATH=str(installed.root), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [str(GRAPHVEIL_CLI), "run", str(installed.config), "--set", "training.steps=3", "--output", str(out),
         "--no-progress"],
        cwd=installed.root, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = proc.stdout.splitlines()[0].split()
    assert header[:2] == ["run", "test"] and "prior" in header and "ε" in header
    assert re.search(r"^label-prior\s+\d\.\d{4}\s+\d\.\d{4}\s+\d\.\d{4}\s", proc.stdout, flags=re.M)
    assert f"run directory: {out}" in proc.stdout
    assert set(torch.load(out / "model" / "model.pt")) == {"linear.weight", "linear.bias"}
    assert "prior_accuracy" in json.loads((out / "evaluation.json").read_text())
    assert json.loads((out / "privacy.json").read_text())["steps"] == 3
