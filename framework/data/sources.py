"""The data-source family: loaders as plugins (``data.source`` names one).

A data source reads one dataset (a relational graph with entity texts, or a node-feature graph)
from its options and returns it validated; the task then splits it. Options sit next to
``source`` in the run config's ``data`` section and are validated against the source's
``Params`` model before anything is read.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel

from graphveil.components import NoParams


class DataSource(ABC):
    """Loads one dataset. Subclasses implement :meth:`load` and declare ``Params``."""

    Params: ClassVar[type[BaseModel]] = NoParams

    @abstractmethod
    def load(self) -> Any:
        """Read and validate the dataset (a :class:`~graphveil.data.RelationalGraph` or
        :class:`~graphveil.data.node_graph.NodeGraph`); raise :class:`~graphveil.errors.DataError`
        naming the file and the problem."""
