"""Three source roots, one import namespace: in each, a file's path is its module path
(``framework/graphveil/run/session.py`` is ``graphveil.run.session``; ``plugins/graphveil/plugins/gdp`` is
``graphveil.plugins.gdp``; DESIGN.md, Layout).

Every folder of a root is listed as a package, those holding only data too (the bundled datasets,
the plugin templates, the Flower app project): setuptools ships the files of listed packages only,
and ``tests/apps/test_wheel.py`` checks that the wheel holds every file of the three roots.
"""

from setuptools import find_namespace_packages, setup

LAYERS = {
    "graphveil": "framework/graphveil",
    "graphveil.plugins": "plugins/graphveil/plugins",
    "graphveil.connectors": "connectors/graphveil/connectors",
}


def _packages() -> list[str]:
    names = []
    for package, folder in LAYERS.items():
        names.append(package)
        names.extend(f"{package}.{sub}"
                     for sub in find_namespace_packages(folder, exclude=["__pycache__", "*.__pycache__"]))
    return names


setup(packages=_packages(), package_dir=LAYERS)
