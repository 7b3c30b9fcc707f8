"""Map the three source folders onto one import namespace (see DESIGN.md, Layout)."""

from setuptools import find_packages, setup

LAYERS = {"graphveil": "framework", "graphveil.plugins": "plugins", "graphveil.connectors": "connectors"}


def _packages() -> list[str]:
    names = []
    for package, folder in LAYERS.items():
        names.append(package)
        names.extend(f"{package}.{sub}" for sub in find_packages(folder))
    return names


setup(packages=_packages(), package_dir=LAYERS)
