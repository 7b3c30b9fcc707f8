"""The ``citeseer`` source: CiteSeer with titles and abstracts, shipped with GraphVeil (its reader,
:mod:`graphveil.data.citeseer`, is bundled data of the core)."""

from __future__ import annotations

from graphveil.contract.data_source import DataSource
from graphveil.contract.options import NoParams
from graphveil.data.graph import RelationalGraph


class CiteSeerSource(DataSource):
    """CiteSeer with titles and abstracts, shipped with GraphVeil (3186 papers, 4225 relations, 6 classes)."""

    Params = NoParams

    def load(self) -> RelationalGraph:
        from graphveil.data.citeseer import load_bundled_citeseer

        return load_bundled_citeseer()
