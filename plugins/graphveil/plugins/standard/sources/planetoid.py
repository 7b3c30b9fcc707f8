"""The ``planetoid`` source: citation graphs (Cora, CiteSeer) from their raw files, never downloaded.

Cora's 8 raw files ship inside the package, xz-compressed (``graphveil/data/bundled/planetoid/
Cora``, see its ``SOURCE.md``); a user may point ``path`` at their own raw folder (Cora or
CiteSeer). The files are decompressed or copied into a temporary folder and parsed by PyG's own
reader, :func:`torch_geometric.io.read_planetoid_data`, which reads local files only (it is the
``Planetoid`` dataset class that downloads when a file is missing; it is never used here).

Six of the files are Python pickles, and unpickling runs code: every file is checked against
the sha256 of the upstream file (kimiyoung/planetoid) before it is parsed, unless the caller
turns the check off for files they trust.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import tempfile
import warnings
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import DataError
from graphveil.data.node_graph import NodeGraph, PublicSplit, node_graph_from_pyg
from graphveil.data.preprocess import dp_gnn_preprocess
from graphveil.plugins.standard.sources._options import SourceOptions

PlanetoidName = Literal["cora", "citeseer"]
Preprocess = Literal["dp_gnn", "none"]

#: PyG's folder name (``Planetoid.raw_dir`` is ``<root>/<Name>/raw``) of each dataset.
FOLDER = {"cora": "Cora", "citeseer": "CiteSeer"}
SUFFIXES = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")

#: sha256 of the upstream files (github.com/kimiyoung/planetoid, data/, commit af6abf4).
SHA256 = {
    "cora": {
        "x": "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab",
        "tx": "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a",
        "allx": "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543",
        "y": "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1",
        "ty": "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad",
        "ally": "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71",
        "graph": "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d",
        "test.index": "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875",
    },
    "citeseer": {
        "x": "d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6",
        "tx": "539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21",
        "allx": "2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668",
        "y": "8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924",
        "ty": "55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce",
        "ally": "f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95",
        "graph": "d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7",
        "test.index": "2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4",
    },
}
#: Datasets whose raw files ship inside the package.
BUNDLED = ("cora",)


def raw_file_names(name: str) -> list[str]:
    """``ind.<name>.x`` … ``ind.<name>.test.index``: the 8 files PyG's reader needs."""
    return [f"ind.{name}.{suffix}" for suffix in SUFFIXES]


def _check(name: str, suffix: str, data: bytes, source: str) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256[name][suffix]:
        raise DataError(
            f"{source}: sha256 {digest} differs from the upstream Planetoid file ({SHA256[name][suffix]}); "
            f"Planetoid files are Python pickles, which can run code when read, so only the upstream "
            f"files are parsed unless data.check_sha256 is false (do that only for files you trust)"
        )


def bundled_raw_files(name: str = "cora") -> dict[str, bytes]:
    """The raw files shipped in the package, decompressed and checked against upstream sha256."""
    if name not in BUNDLED:
        raise DataError(f"Planetoid {name!r} is not bundled (bundled: {', '.join(BUNDLED)}); set data.path "
                        f"to a folder holding its raw files ({', '.join(raw_file_names(name))})")
    folder = resources.files("graphveil.data").joinpath("bundled", "planetoid", FOLDER[name])
    out = {}
    for suffix, fname in zip(SUFFIXES, raw_file_names(name), strict=True):
        source = f"graphveil/data/bundled/planetoid/{FOLDER[name]}/{fname}.xz"
        try:
            data = lzma.decompress(folder.joinpath(f"{fname}.xz").read_bytes())
        except FileNotFoundError as exc:
            raise DataError(f"{source}: missing from the installed package") from exc
        except lzma.LZMAError as exc:
            raise DataError(f"{source}: corrupt ({exc})") from exc
        _check(name, suffix, data, source)  # always: a bundled file must be the upstream one
        out[fname] = data
    return out


def _raw_folder(path: Path, name: str) -> Path:
    """``path`` itself, or PyG's ``path/raw`` or ``path/<Name>/raw`` if only that holds the files."""
    if not path.is_dir():
        raise DataError(f"{path}: no such folder (expected the Planetoid raw files "
                        f"{', '.join(raw_file_names(name))})")
    for folder in (path, path / "raw", path / FOLDER[name] / "raw"):
        if any((folder / f).is_file() for f in raw_file_names(name)):
            return folder
    return path


def user_raw_files(path: str | os.PathLike[str], name: str, *, check_sha256: bool = True) -> dict[str, bytes]:
    """The 8 raw files of Planetoid ``name`` from a local folder; a missing one is an error
    naming it (PyG's dataset class would try to download them all)."""
    folder = _raw_folder(Path(path), name)
    out = {}
    for suffix, fname in zip(SUFFIXES, raw_file_names(name), strict=True):
        file = folder / fname
        if not file.is_file():
            raise DataError(f"{file}: missing Planetoid raw file; all 8 are needed "
                            f"({', '.join(raw_file_names(name))}) and GraphVeil never downloads them")
        data = file.read_bytes()
        if check_sha256:
            _check(name, suffix, data, str(file))
        out[fname] = data
    return out


def read_planetoid(files: dict[str, bytes], name: str, source: str) -> NodeGraph:
    """Parse the raw files with :func:`torch_geometric.io.read_planetoid_data` (PyG's graph:
    self-loops removed, duplicates merged; CiteSeer's 15 missing test rows padded with zero
    features and class 0). Node ids are the Planetoid node indices ``"0".."n-1"``. The public
    split PyG's reader derives (train: the ``y`` file's nodes; val: the 500 after them; test:
    the ``test.index`` file's) is kept as :attr:`NodeGraph.public_split`."""
    from torch_geometric.io import read_planetoid_data

    with tempfile.TemporaryDirectory(prefix="graphveil-planetoid-") as tmp:
        for fname, data in files.items():
            Path(tmp, fname).write_bytes(data)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # scipy.sparse.csr pickles
                pyg = read_planetoid_data(tmp, name)
        except Exception as exc:  # unpickling and parsing errors of any kind: name the data
            raise DataError(f"{source}: cannot parse the Planetoid {name} raw files "
                            f"({type(exc).__name__}: {exc})") from exc
    graph = node_graph_from_pyg(pyg, name=name, source=source)
    ids = graph.node_ids
    train, val, test = (tuple(ids[i] for i in mask.nonzero().flatten().tolist())
                        for mask in (pyg.train_mask, pyg.val_mask, pyg.test_mask))
    return replace(graph, public_split=PublicSplit(train, val, test))


def load_planetoid(
    name: PlanetoidName = "cora",
    path: str | os.PathLike[str] | None = None,
    *,
    preprocess: Preprocess = "dp_gnn",
    check_sha256: bool = True,
) -> NodeGraph:
    """Planetoid Cora or CiteSeer as a :class:`NodeGraph`.

    :param path: folder holding the raw files (or PyG's root above ``<Name>/raw``); default:
        the Cora files bundled with GraphVeil.
    :param preprocess: ``"dp_gnn"`` (:func:`~graphveil.data.preprocess.dp_gnn_preprocess`) or
        ``"none"`` (PyG's graph as read).
    :param check_sha256: refuse files that differ from upstream (always on for bundled files).
    """
    if name not in FOLDER:
        raise DataError(f"unknown Planetoid dataset {name!r} (known: {', '.join(FOLDER)})")
    if path is None:
        files, source = bundled_raw_files(name), f"graphveil/data/bundled/planetoid/{FOLDER[name]}"
    else:
        files, source = user_raw_files(path, name, check_sha256=check_sha256), str(path)
    graph = read_planetoid(files, name, source)
    if preprocess == "dp_gnn":
        return dp_gnn_preprocess(graph)
    if preprocess != "none":
        raise DataError(f"unknown preprocessing {preprocess!r} (known: dp_gnn, none)")
    return graph


class PlanetoidOptions(SourceOptions):
    name: PlanetoidName = Field("cora", description="Which Planetoid citation graph.")
    path: Path | None = Field(None, description=(
        "Folder holding the 8 Planetoid raw files ind.<name>.* (or PyG's root above <Name>/raw). "
        "Default: the Cora files shipped with GraphVeil. Nothing is ever downloaded."))
    preprocess: Preprocess = Field("dp_gnn", description=(
        "dp_gnn: paper 4's protocol (classes with < 50 nodes dropped with their nodes, self-loops "
        "and then isolated nodes removed); none: PyG's graph as read."))
    check_sha256: bool = Field(True, description=(
        "Refuse raw files that differ from upstream kimiyoung/planetoid: they are Python pickles, "
        "which can run code when read. Set false only for files you trust (bundled files are "
        "always checked)."))

    @model_validator(mode="after")
    def _bundled(self) -> PlanetoidOptions:
        if self.path is None and self.name not in BUNDLED:
            raise ValueError(f"data.path is required for Planetoid {self.name!r}: only "
                             f"{', '.join(BUNDLED)} is bundled (the folder must hold "
                             f"{', '.join(raw_file_names(self.name))})")
        return self


class PlanetoidSource(DataSource):
    """Planetoid Cora (bundled) or CiteSeer as a node-classification graph, dp-gnn preprocessing by default."""

    Params = PlanetoidOptions

    def load(self) -> NodeGraph:
        p = self.params
        return load_planetoid(p.name, p.path, preprocess=p.preprocess, check_sha256=p.check_sha256)
