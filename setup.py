"""Three source roots, one import namespace: in each, a file's path is its module path
(``framework/graphveil/run/session.py`` is ``graphveil.run.session``; ``plugins/graphveil/plugins/gdp`` is
``graphveil.plugins.gdp``; DESIGN.md, Layout).

Every folder of a root is listed as a package, those holding only data too (the bundled datasets,
the plugin templates, the Flower app project): setuptools ships the files of listed packages only,
and ``tests/apps/test_wheel.py`` checks that the wheel holds every file of the three roots.
"""

import platform
import sys

from setuptools import Extension, find_namespace_packages, setup

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


def _extensions() -> list[Extension]:
    """The fused CPU noise transform (graphveil.engine.noise_kernel), plain C vectorised for AVX-512
    and AVX2 on x86-64 Linux. Optional: where it does not build (no C compiler) the install goes on
    and the noise keeps its torch transform, the same values to a few ulp, slower."""
    if not (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")):
        return []
    return [Extension("graphveil.engine._noise_kernel", ["framework/graphveil/engine/_noise_kernel.c"],
                      # no FMA contraction: the torch transform's roundings, in its order
                      extra_compile_args=["-O3", "-ffp-contract=off", "-fno-math-errno"],
                      libraries=["m"], optional=True)]


setup(packages=_packages(), package_dir=LAYERS, ext_modules=_extensions())
