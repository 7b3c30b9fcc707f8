"""``graphveil plugin new NAME``: write a ready plugin package to start from.

The package (folder ``NAME/``) holds a ``pyproject.toml`` declaring the ``graphveil`` entry
point, the module ``src/NAME.py`` with one component of the chosen family (every family a user
extends: sampler, clipper, accountant, encoder, model, task, mechanism, method, data source; its
pydantic ``Params`` and what the invariant check reads), a README, and ``tests/test_NAME.py``,
which loads the component through :class:`~graphveil.contract.host.PluginHost`, checks what it
promises and, for most families, runs it in a short run on bundled Cora. As written it
installs (``pip install -e NAME``) and passes its own test. The templates are the files of
``graphveil/apps/plugin_template/`` (package data), filled in with :class:`string.Template`.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any

from graphveil.contract.errors import ConfigError

TEMPLATES = Path(__file__).with_name("plugin_template")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # a module, an entry point and a component name at once


@dataclass(frozen=True)
class Family:
    """What one family's template needs besides the module and its test."""

    class_suffix: str
    usage: str
    notes: str


# The run-config lines a node-level template's component runs with (paper 4's DP-MLP on Cora).
_CORA_NODES = "data: {source: planetoid, name: cora, split: {kind: random_node, seed: 0}}\n"
_NODE_LEVEL = ("sampler: {name: node_uniform_wor, batch_size: 64}\nclipper: {name: per_node_clip, clip_norm: 1.0}\n"
               "accountant: {name: node_rdp}\n")
_NODE_TASK = "task: {name: node_classification}\nmodel: {name: mlp}\n"

#: the families with a template (each one of the host's :data:`~graphveil.contract.host.FAMILIES`)
SCAFFOLDS: dict[str, Family] = {
    "sampler": Family(
        "Sampler",
        _CORA_NODES + "sampler: {name: ${name}, batch_size: 64}\nclipper: {name: per_node_clip, clip_norm: 1.0}\n"
        "accountant: {name: node_rdp}\n" + _NODE_TASK,
        "The sampler declares fixed-size batches drawn uniformly without replacement under node-level "
        "DP, the pair the built-in `per_node_clip` and `node_rdp` analyse; its test checks that the "
        "batches are drawn from that distribution and that a run uses it."),
    "clipper": Family(
        "Clipper",
        "sampler: {name: edge_poisson_decoupled, batch_size: 32, k_neg: 4}\n"
        "clipper: {name: ${name}, clip_norm: 1.0}\naccountant: {name: edge_rdp}",
        "The clipper declares per-tuple clipping at C under edge-level DP, so it runs with the "
        "edge-level sampler and accountants; a run with any other pair is refused before data is read."),
    "accountant": Family(
        "Accountant",
        "sampler: {name: edge_poisson_decoupled, batch_size: 32, k_neg: 4}\n"
        "clipper: {name: per_tuple_clip, clip_norm: 1.0}\naccountant: {name: ${name}}",
        "The accountant analyses the (Poisson, per-tuple edge clipping) pair of the built-in "
        "edge-level sampler and clipper; its test checks its ε against the built-in `edge_rdp`."),
    "encoder": Family(
        "Encoder",
        "data: {source: planetoid, name: cora, split: {train_fraction: 0.7, seed: 0}}\n"
        "sampler: {name: edge_poisson_decoupled, batch_size: 256, k_neg: 4}\n"
        "clipper: {name: per_tuple_clip, clip_norm: 1.0}\naccountant: {name: edge_rdp}\n"
        "encoder: {name: ${name}, dim: 64}",
        "The encoder embeds each entity from its own feature vector, so per-tuple gradients are exact; "
        "its test checks them against one entity at a time and trains it in an edge-level run."),
    "model": Family(
        "Model",
        _CORA_NODES + _NODE_LEVEL + "task: {name: node_classification}\nmodel: {name: ${name}, hidden: 64}",
        "The model declares that row i of its output reads node i alone (structure `rows`), which the "
        "node-level accountant requires; its test checks the per-node gradients and trains it in a run."),
    "task": Family(
        "Task",
        _CORA_NODES + _NODE_LEVEL + "task: {name: ${name}, label_smoothing: 0.1}\nmodel: {name: mlp}",
        "The task gives one loss per node and reports test accuracy and macro-F1; its test checks both "
        "and runs it with the built-in node-level components."),
    "mechanism": Family(
        "Mechanism",
        _CORA_NODES + _NODE_LEVEL + _NODE_TASK + "mechanisms:\n  - {name: ${name}, noise_std: 10.0}",
        "The mechanism releases the noisy mean of the training nodes' clipped features once; its test "
        "checks the sensitivity it states on random graphs, the noise it adds, and that the run's ε "
        "includes the release."),
    "method": Family(
        "Method",
        _CORA_NODES + _NODE_LEVEL + _NODE_TASK + "method: {name: ${name}}",
        "The method runs the config's releases, trains, then post-processes the released model; its "
        "test checks the stages and that post-processing adds nothing to ε."),
    "data_source": Family(
        "Source",
        "data: {source: ${name}, nodes: nodes.csv, edges: edges.csv, split: {kind: random_node, seed: 0}}\n"
        + _NODE_LEVEL + _NODE_TASK,
        "The data source reads a node CSV (id, label, features) and an edge CSV (source, target); a "
        "bad row is an error naming the file and line. Its test checks what it reads and trains on it."),
}


def add_plugin_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``plugin new`` to a ``graphveil`` sub-parser set."""
    plugin = subparsers.add_parser("plugin", help="start a plugin package")
    psub = plugin.add_subparsers(dest="plugin_command", required=True)
    p = psub.add_parser("new", help="write a ready plugin package NAME/ (entry point, component, README, test)")
    p.add_argument("name", help="plugin, module and component name: lowercase letters, digits, underscores")
    p.add_argument("--family", choices=sorted(SCAFFOLDS), default="clipper",
                   help="the component family of the plugin's one component (default: clipper)")
    p.add_argument("--dir", default=".", help="folder to create NAME/ in (default: the current folder)")
    p.set_defaults(func=cmd_plugin_new)
    return plugin


def cmd_plugin_new(args: argparse.Namespace) -> int:
    target = new_plugin(args.name, args.family, Path(args.dir))
    print(f"wrote {target}/ ({args.family} {args.name!r}); next:\n"
          f"  pip install -e '{target}[test]'\n  graphveil plugins\n  python -m pytest {target}")
    return 0


def new_plugin(name: str, family: str, parent: Path) -> Path:
    """Write the package ``parent/name`` and return its path; refuses a bad name or an existing folder.

    :raises ConfigError: naming the problem; nothing is written then.
    """
    check_name(name)
    if family not in SCAFFOLDS:
        raise ConfigError(f"--family {family!r}: a template exists for {', '.join(sorted(SCAFFOLDS))}")
    target = Path(parent) / name
    if target.exists():
        raise ConfigError(f"{target} already exists; choose another name or folder")
    scaffold = SCAFFOLDS[family]
    words = {"name": name, "family": family,
             "cls": "".join(part.capitalize() for part in name.split("_")) + scaffold.class_suffix}
    words["usage"] = Template(scaffold.usage).substitute(words).rstrip()
    words["notes"] = scaffold.notes
    files = {
        "pyproject.toml": "pyproject.toml.tmpl",
        "README.md": "README.md.tmpl",
        f"src/{name}.py": f"{family}.py.tmpl",
        f"tests/test_{name}.py": f"test_{family}.py.tmpl",
    }
    partial = target.with_name(f".{name}.partial")  # renamed when complete: no half-written package
    shutil.rmtree(partial, ignore_errors=True)
    try:
        for out, template in files.items():
            text = Template((TEMPLATES / template).read_text(encoding="utf-8")).substitute(words)
            (partial / out).parent.mkdir(parents=True, exist_ok=True)
            (partial / out).write_text(text, encoding="utf-8")
        partial.rename(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target


def check_name(name: str) -> None:
    """A plugin name is a new module name, an entry point name and a component name."""
    if not _NAME.match(name):
        raise ConfigError(f"plugin name {name!r}: use lowercase letters, digits and underscores, "
                          "starting with a letter (it is the module, entry point and component name)")
    if keyword.iskeyword(name):
        raise ConfigError(f"plugin name {name!r} is a Python keyword; no module can have it")
    if importlib.util.find_spec(name) is not None:
        raise ConfigError(f"plugin name {name!r}: a module of that name is already importable; choose another")

