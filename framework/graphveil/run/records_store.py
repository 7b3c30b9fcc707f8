"""Persisting a sampler's preprocessed record set (e.g. the degree-capped edge set Ē) per graph.

Degree capping (paper 1, Alg. 3 "Initialize") drops edges at random. If every run — or every
federated round — redid it with fresh randomness, Ē (hence |Ē| and γ = b/|Ē|) would change
between runs on the same data, the guarantee of each run would be about a different record set,
and a site's ledger would refuse the next round. So Ē is computed ONCE per (training graph,
sampler, preprocessing options) and reused: the session asks a :class:`RecordsStore` for it
under :func:`records_key` and saves it after computing it the first time.

Stored records are an ``(m, 2)`` int64 tensor of entity indices *of the training graph* (the
order of ``graph.entity_ids``, which is part of the key). A sampler that takes stored records
validates them against the graph (every record an edge of the graph, no duplicates, degree
≤ K) and raises :class:`~graphveil.contract.errors.PrivacyError` otherwise.

Implementations: :class:`MemoryRecordsStore` (tests, one process), :class:`FileRecordsStore`
(a folder of ``.pt`` files for local runs); the site's SQLite privacy ledger implements the
same two methods.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from graphveil.contract.profiles import SamplingProfile
    from graphveil.data.graph import RelationalGraph


@runtime_checkable
class RecordsStore(Protocol):
    """Where a session keeps the preprocessed record set of a (graph, sampler, options) key."""

    def load_records(self, key: str) -> torch.Tensor | None:
        """The ``(m, 2)`` int64 records saved under ``key``, or ``None`` if there are none."""
        ...

    def save_records(self, key: str, records: torch.Tensor) -> None:
        """Save ``records`` under ``key`` (a key is written once; later runs load it)."""
        ...


@runtime_checkable
class PreprocessingSampler(Protocol):
    """A sampler whose one-time preprocessing is randomized and must be persisted.

    ``preprocessing_params()`` returns the options that determine the preprocessing (e.g.
    ``{"degree_cap": 5}``), or ``None`` if its records are a deterministic function of the
    graph (nothing to persist). ``prepare(..., records=...)`` uses stored records instead of
    computing them, after validating them against the graph. After ``prepare`` the sampler's
    ``records`` attribute holds the ``(m, 2)`` record set the session saves.
    """

    def preprocessing_params(self) -> Mapping[str, Any] | None: ...

    def prepare(self, graph: RelationalGraph, generator: torch.Generator, records: torch.Tensor | None = None
                ) -> SamplingProfile: ...


def graph_fingerprint(graph: RelationalGraph) -> str:
    """SHA-256 of the graph's entity ids (in index order) and its relations as sorted id pairs."""
    h = hashlib.sha256()
    ids = graph.entity_ids
    h.update(json.dumps(["graphveil-graph-v1", list(map(str, ids))], ensure_ascii=False).encode("utf-8"))
    pairs = sorted(tuple(sorted((str(ids[u]), str(ids[v])))) for u, v in graph.edges.tolist())
    h.update(json.dumps(pairs, ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


def records_key(graph: RelationalGraph, sampler_name: str, params: Mapping[str, Any]) -> str:
    """Store key: SHA-256 of the graph fingerprint, the sampler's name and its preprocessing options."""
    payload = json.dumps({"graph": graph_fingerprint(graph), "sampler": sampler_name,
                          "params": dict(params)}, sort_keys=True, default=str)
    return "records-v1:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()


class MemoryRecordsStore:
    """A dict-backed :class:`RecordsStore` (one process; tests)."""

    def __init__(self) -> None:
        self.data: dict[str, torch.Tensor] = {}

    def load_records(self, key: str) -> torch.Tensor | None:
        value = self.data.get(key)
        return None if value is None else value.clone()

    def save_records(self, key: str, records: torch.Tensor) -> None:
        self.data[key] = records.detach().to(torch.long).clone()


class FileRecordsStore:
    """A folder of ``<key>.pt`` files (local runs). Writes are atomic (temp file + rename)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / (hashlib.sha256(key.encode("utf-8")).hexdigest() + ".pt")

    def load_records(self, key: str) -> torch.Tensor | None:
        path = self._path(key)
        if not path.is_file():
            return None
        saved = torch.load(path, weights_only=True)
        if not isinstance(saved, dict) or saved.get("key") != key:
            return None
        return saved["records"]

    def save_records(self, key: str, records: torch.Tensor) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(key)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save({"key": key, "records": records.detach().to(torch.long).clone()}, tmp)
        tmp.replace(path)
