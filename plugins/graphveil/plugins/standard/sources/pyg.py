"""The ``pyg`` source: a ``torch.save``'d ``torch_geometric.data.Data``, loaded with ``weights_only``.

``data: {source: pyg, path: my_graph.pt}``.
"""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.validate import assemble, check_features, check_index_range, check_texts
from graphveil.plugins.standard.sources._options import SourceOptions


class PygOptions(SourceOptions):
    path: Path = Field(description="A torch.save'd torch_geometric Data (loaded with weights_only: no code runs).")


class PygSource(DataSource):
    """A torch.save'd torch_geometric Data as a relational graph (data.path)."""

    Params = PygOptions

    def load(self) -> RelationalGraph:
        return load_pyg(self.params.path)


# ------------------------------------------------------------------------------------ reader


def _load_data_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True``: only PyG's data classes are allowed, no code runs."""
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    if not path.is_file():
        raise DataError(f"{path}: no such file")
    allowed = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
        if found is None:
            raise DataError(f"{path}: not a torch.save file of a torch_geometric Data (unpickling failed)") from exc
        raise DataError(
            f"{path}: refused to unpickle {found.group(1)}: only a plain torch_geometric Data is "
            f"loaded from a file (no code runs); load it yourself and pass the Data object to load_pyg"
        ) from exc
    except (RuntimeError, OSError, EOFError) as exc:
        raise DataError(f"{path}: not a torch.save file ({exc})") from exc


def _pyg_labels(y: Any, n: int, names: Any, source: str) -> tuple[torch.Tensor, list[str]]:
    y = torch.as_tensor(y)
    if y.dim() == 2 and y.shape[1] == 1:
        y = y.flatten()
    if y.dim() != 1 or y.shape[0] != n:
        raise DataError(f"{source}: y must hold one class index per node ({n},), got {tuple(y.shape)}")
    if y.is_floating_point():
        if not (torch.isfinite(y).all() and (y == y.round()).all()):
            raise DataError(f"{source}: y must hold integer class indices (found non-integer values)")
    y = y.to(torch.long).clamp(min=-1)
    num_classes = int(y.max()) + 1 if y.numel() else 0
    if names is None:
        names = [str(c) for c in range(num_classes)]
    names = [str(s) for s in names]
    if len(names) < num_classes:
        raise DataError(f"{source}: {len(names)} label_names for class indices up to {num_classes - 1}")
    return y, names


def load_pyg(data_or_path: Any, texts: list[str] | None = None, *, name: str | None = None) -> RelationalGraph:
    """A homogeneous ``torch_geometric.data.Data`` (or the path of a ``torch.save``'d one).

    ``edge_index`` → undirected unique relations (both directions of an edge count as one: the
    reverse copy is reported as a duplicate); ``x`` → features (must be finite); ``y`` → labels
    (negative = unlabelled; names from a ``label_names`` attribute if present); texts from the
    ``texts`` argument, else a ``raw_texts`` attribute. Entity ids are ``"0".."n-1"``.
    """
    from torch_geometric.data import Data

    if isinstance(data_or_path, str | os.PathLike):
        path = Path(data_or_path)
        source, data = str(path), _load_data_file(path)
        default_name = path.stem
    else:
        source, data, default_name = "<torch_geometric Data>", data_or_path, "pyg"
    if not isinstance(data, Data):
        raise DataError(f"{source}: expected a torch_geometric.data.Data, got {type(data).__name__}")
    if data.edge_index is None:
        raise DataError(f"{source}: the Data object has no edge_index")
    n = data.num_nodes
    if not n:
        raise DataError(f"{source}: the Data object has no nodes")
    ids = [str(i) for i in range(n)]
    pairs = check_index_range(data.edge_index, n, source)
    raw_texts = texts if texts is not None else getattr(data, "raw_texts", None)
    graph_texts = None if raw_texts is None else check_texts(ids, list(raw_texts), source)
    features = None if data.x is None else check_features(data.x, n, source)
    labels = label_names = None
    if data.y is not None:
        labels, label_names = _pyg_labels(data.y, n, getattr(data, "label_names", None), source)
    return assemble(
        name or default_name, ids, pairs, source=source, texts=graph_texts, features=features,
        labels=labels, label_names=label_names,
    )
