"""Loaded only in the mutation runner's subprocesses (its folder is put on ``PYTHONPATH``).

The venv installs graphveil in editable mode: a ``.pth`` file installs a meta-path finder
whose ``MAPPING`` sends ``graphveil`` → ``<repo>/framework/graphveil``, ``graphveil.plugins`` →
``<repo>/plugins/graphveil/plugins`` and ``graphveil.connectors`` → ``<repo>/connectors/graphveil/connectors``. ``.pth`` files are
processed before ``sitecustomize`` is imported, so here the finder exists and no graphveil
module is imported yet: re-pointing its ``MAPPING`` at the mutated copy
(``GRAPHVEIL_MUTATION_ROOT``) makes every process that inherits the environment (pytest,
``sys.executable`` children, Flower's SuperNode/ClientApp processes) import the copy. Entry
points (``graphveil`` group) name modules, not files, so they resolve to the copy too.

Any problem is fatal: a runner that silently tested the original tree would report every
mutant as surviving — or worse, hide a real kill.
"""

from __future__ import annotations

import os
import sys

_ROOT = os.environ.get("GRAPHVEIL_MUTATION_ROOT")
if _ROOT:
    _finders = [m for name, m in list(sys.modules.items())
                if name.startswith("__editable__") and "graphveil" in name and hasattr(m, "MAPPING")]
    if len(_finders) != 1:
        sys.stderr.write(f"mutation sitecustomize: expected one graphveil editable finder, found {len(_finders)}\n")
        raise SystemExit(97)
    if any(name == "graphveil" or name.startswith("graphveil.") for name in sys.modules):
        sys.stderr.write("mutation sitecustomize: graphveil was imported before the remap\n")
        raise SystemExit(97)
    _mapping = _finders[0].MAPPING
    _layers = {"graphveil": "framework/graphveil", "graphveil.plugins": "plugins/graphveil/plugins",
               "graphveil.connectors": "connectors/graphveil/connectors"}
    if set(_mapping) != set(_layers):
        sys.stderr.write(f"mutation sitecustomize: unexpected editable mapping {_mapping}\n")
        raise SystemExit(97)
    for _package, _folder in _layers.items():
        _mapping[_package] = os.path.join(_ROOT, _folder)

# Chain to the sitecustomize this file shadows (Debian's apport hook), if any.
_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _candidate = os.path.join(_entry or ".", "sitecustomize.py")
    if os.path.abspath(_entry or ".") != _here and os.path.isfile(_candidate):
        with open(_candidate, encoding="utf-8") as _fh:
            exec(compile(_fh.read(), _candidate, "exec"), {"__name__": "sitecustomize_chained", "__file__": _candidate})
        break
