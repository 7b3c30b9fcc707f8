"""GraphVeil: differentially private learning on relational data.

The core knows methods only through hooks (see :mod:`graphveil.contract.hookspecs`); the built-in
methods live in :mod:`graphveil.plugins` and register through the ``graphveil`` entry-point
group exactly as third-party plugins do.
"""

from graphveil.contract.errors import GraphVeilError

__version__ = "0.1.0"
__all__ = ["GraphVeilError", "__version__"]
