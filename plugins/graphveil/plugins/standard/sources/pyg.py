"""The ``pyg`` source: a ``torch.save``'d ``torch_geometric.data.Data``, loaded with ``weights_only``.

``data: {source: pyg, path: my_graph.pt}``. A ``Data`` with ``x`` and ``y`` (and no texts) is a
node graph for node classification (:func:`load_pyg_nodes`: its masks give the public split a
``data.split.kind: planetoid_full`` uses, its ``label_names`` the class names); any other
``Data`` a relational graph (:func:`load_pyg`).
"""

from __future__ import annotations

import os
import pickle
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph, PublicSplit, node_graph_from_pyg
from graphveil.data.validate import (
    assemble,
    check_features,
    check_index_range,
    check_texts,
    index_entities,
)
from graphveil.plugins.standard.sources._options import SourceOptions


class PygOptions(SourceOptions):
    path: Path = Field(description="A torch.save'd torch_geometric Data (loaded with weights_only: no code runs).")


class PygSource(DataSource):
    """A torch.save'd torch_geometric Data (data.path): a node graph if it has x and y and no
    texts, else a relational graph."""

    Params = PygOptions

    def load(self) -> RelationalGraph | NodeGraph:
        source, data, name = _pyg_data(self.params.path)
        if is_node_data(data):
            return load_pyg_nodes(data, name=name, source=source)
        return load_pyg(data, name=name, source=source)


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


def _pyg_data(data_or_path: Any) -> tuple[str, Any, str]:
    """``(source for messages, the Data, default graph name)`` of a Data or a file holding one."""
    from torch_geometric.data import Data

    if isinstance(data_or_path, str | os.PathLike):
        path = Path(data_or_path)
        source, data, name = str(path), _load_data_file(path), path.stem
    else:
        source, data, name = "<torch_geometric Data>", data_or_path, "pyg"
    if not isinstance(data, Data):
        raise DataError(f"{source}: expected a torch_geometric.data.Data, got {type(data).__name__}")
    if data.edge_index is None:
        raise DataError(f"{source}: the Data object has no edge_index")
    if not data.num_nodes:
        raise DataError(f"{source}: the Data object has no nodes")
    return source, data, name


def is_node_data(data: Any) -> bool:
    """A node-classification graph: features and labels, and no texts to fine-tune on."""
    return data.x is not None and data.y is not None and getattr(data, "raw_texts", None) is None


def _mask(data: Any, key: str, n: int, source: str) -> torch.Tensor | None:
    mask = getattr(data, key, None)
    if mask is None:
        return None
    mask = torch.as_tensor(mask)
    if mask.dtype != torch.bool or mask.shape != (n,):
        raise DataError(f"{source}: {key} must be a bool tensor of shape ({n},), got {mask.dtype} "
                        f"{tuple(mask.shape)}")
    return mask


def _public_split(data: Any, ids: list[str], source: str) -> PublicSplit | None:
    """The Data's train / val / test masks as a public split (val and test both needed)."""
    n = len(ids)
    train, val, test = (_mask(data, f"{k}_mask", n, source) for k in ("train", "val", "test"))
    if val is None or test is None:
        return None
    both = (val & test).nonzero().flatten()
    if both.numel():
        raise DataError(f"{source}: node {int(both[0])} is in both val_mask and test_mask")
    side = [tuple(ids[i] for i in m.nonzero().flatten().tolist()) if m is not None else ()
            for m in (train, val, test)]
    return PublicSplit(*side)


def _pyg_node_ids(values: Any, n: int, source: str) -> list[str] | None:
    """The ``node_ids`` attribute as n distinct non-empty strings, or None if absent."""
    if values is None:
        return None
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    if isinstance(values, str | bytes) or not hasattr(values, "__len__"):
        raise DataError(f"{source}: node_ids must be a list of {n} ids, got {type(values).__name__}")
    ids = [str(v) for v in values]
    if len(ids) != n:
        raise DataError(f"{source}: node_ids holds {len(ids)} ids for {n} nodes")
    index_entities(ids, f"{source}: node_ids", list(range(n)), "row")  # empty or repeated ids
    return ids


def load_pyg_nodes(data_or_path: Any, *, name: str | None = None, source: str | None = None) -> NodeGraph:
    """A ``torch_geometric.data.Data`` with ``x``, ``y`` and ``edge_index`` (or the path of a
    ``torch.save``'d one) as a node graph: ``x`` finite, ``y`` one class index per node
    (negative: unlabelled), at least two classes, names from ``label_names`` if present;
    ``train_mask`` / ``val_mask`` / ``test_mask`` (bool) kept as the public split. Node ids come
    from a ``node_ids`` attribute (n distinct ids, e.g. a site's part of a larger graph, so the
    keyed node split follows the whole graph's), else ``"0".."n-1"``; self-loops and repeated
    edges dropped, reverse edges added (``notes``)."""
    from torch_geometric.data import Data

    where, data, default = _pyg_data(data_or_path)
    source = source or where
    for key in ("x", "y"):
        if getattr(data, key, None) is None:
            raise DataError(f"{source}: the Data object has no {key} (a node graph needs x and y)")
    n = int(data.num_nodes)
    x = check_features(data.x, n, source)
    y, names = _pyg_labels(data.y, n, getattr(data, "label_names", None), source)
    classes = torch.unique(y[y >= 0])
    if classes.numel() < 2:
        found = f"one class ({names[int(classes[0])]!r})" if classes.numel() else "no label"
        raise DataError(f"{source}: y holds {found}; node classification needs at least two classes")
    graph = node_graph_from_pyg(Data(x=x, y=y, edge_index=data.edge_index, num_nodes=n),
                                name=name or default, source=source, class_names=names)
    ids = _pyg_node_ids(getattr(data, "node_ids", None), n, source)
    if ids is not None:
        graph = replace(graph, node_ids=ids)
    split = _public_split(data, graph.node_ids, source)
    return graph if split is None else replace(graph, public_split=split)


def load_pyg(data_or_path: Any, texts: list[str] | None = None, *, name: str | None = None,
             source: str | None = None) -> RelationalGraph:
    """A homogeneous ``torch_geometric.data.Data`` (or the path of a ``torch.save``'d one).

    ``edge_index`` → undirected unique relations (both directions of an edge count as one: the
    reverse copy is reported as a duplicate); ``x`` → features (must be finite); ``y`` → labels
    (negative = unlabelled; names from a ``label_names`` attribute if present); texts from the
    ``texts`` argument, else a ``raw_texts`` attribute. Entity ids are ``"0".."n-1"``.
    """
    where, data, default_name = _pyg_data(data_or_path)
    source = source or where
    n = data.num_nodes
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
