"""The ``citeseer_tape`` source: CiteSeer with titles and abstracts from a TAPE ``CiteSeer-Orig``
folder (the reader is the bundled copy's, :func:`graphveil.data.citeseer.load_citeseer_tape`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from graphveil.contract.data_source import DataSource
from graphveil.data.graph import RelationalGraph
from graphveil.plugins.standard.sources._options import SourceOptions


class FolderOptions(SourceOptions):
    path: Path = Field(description="A TAPE dataset/CiteSeer-Orig folder (citeseer_texts.txt, citeseer.cites).")


class CiteSeerTapeSource(DataSource):
    """CiteSeer with titles and abstracts from a TAPE CiteSeer-Orig folder (data.path)."""

    Params = FolderOptions

    def load(self) -> RelationalGraph:
        from graphveil.data.citeseer import load_citeseer_tape

        return load_citeseer_tape(self.params.path)
