"""Three source roots, one import namespace: in each, a file's path is its module path
(``framework/graphveil/run/session.py`` is ``graphveil.run.session``; ``plugins/graphveil/plugins/gdp`` is
``graphveil.plugins.gdp``; DESIGN.md, Layout)."""

from setuptools import find_packages, setup

LAYERS = {
    "graphveil": "framework/graphveil",
    "graphveil.plugins": "plugins/graphveil/plugins",
    "graphveil.connectors": "connectors/graphveil/connectors",
}


def _packages() -> list[str]:
    names = []
    for package, folder in LAYERS.items():
        names.append(package)
        names.extend(f"{package}.{sub}" for sub in find_packages(folder))
    return names


setup(packages=_packages(), package_dir=LAYERS)
