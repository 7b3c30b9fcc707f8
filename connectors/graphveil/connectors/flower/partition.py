"""Split one graph into per-site graphs and write each as the files a site's node config names.

For demos, tests and benchmarks of a federation. The split itself is
:mod:`graphveil.data.partition` (random nodes, label skew by Dirichlet α, or connected
communities); relations crossing two sites are dropped, as they would belong to no single
owner, and the CLI prints how many (cut edges, count and fraction).

* A relational graph (bundled CiteSeer, or ``--citeseer-tape``): ``site-<i>/edges.tsv`` and
  ``site-<i>/entities.jsonl``, what ``data-source = "edge_list"`` reads.
* A node-classification graph (``--graph cora``, bundled Planetoid Cora): ``site-<i>/graph.pt``,
  a ``torch.save``'d ``torch_geometric.data.Data`` with ``x``, ``y``, ``edge_index``,
  ``label_names`` (every class of the whole graph, so all sites agree on the classes) and
  ``node_ids`` (the whole graph's ids of the part's nodes), what ``data-source = "pyg"`` reads.

``python -m graphveil.connectors.flower.partition --sites 3 --out sites/ [--graph cora]
[--by random|labels|communities] [--alpha 0.5] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from graphveil.contract.errors import DataError, GraphVeilError
from graphveil.data import RelationalGraph, load_bundled_citeseer, load_citeseer_tape
from graphveil.data.partition import KINDS, Partition
from graphveil.data.partition import partition_graph as split_nodes

EDGES_FILE = "edges.tsv"
ENTITIES_FILE = "entities.jsonl"
NODE_GRAPH_FILE = "graph.pt"


def load_source(**data: Any) -> Any:
    """The graph a run's ``data`` section names (e.g. ``source="planetoid", name="cora"``), read
    through the installed data sources as a run reads it."""
    from graphveil.data import load_data
    from graphveil.run.config import DataConfig

    return load_data(DataConfig.model_validate(data))


def partition_graph(graph: Any, num_sites: int, seed: int = 0, *, kind: str = "random",
                    alpha: float = 0.5) -> list[Any]:
    """``num_sites`` induced subgraphs of ``graph`` (:func:`graphveil.data.partition.partition_graph`)."""
    return split_nodes(graph, num_sites, kind=kind, seed=seed, alpha=alpha).parts(graph)


def write_site_files(graph: RelationalGraph, folder: Path) -> tuple[Path, Path]:
    """Write ``edges.tsv`` (header ``source<TAB>target``, entity ids) and ``entities.jsonl``
    (``id``, ``text`` and, if labelled, ``label``); returns their paths."""
    if graph.texts is None:
        raise DataError(f"graph {graph.name!r} has no entity texts to write")
    for eid in graph.entity_ids:
        if any(c in eid for c in "\t\r\n"):
            raise DataError(f"graph {graph.name!r}: entity id {eid!r} contains a tab or newline")
    folder.mkdir(parents=True, exist_ok=True)
    edges, entities = folder / EDGES_FILE, folder / ENTITIES_FILE
    ids = graph.entity_ids
    lines = ["source\ttarget", *(f"{ids[u]}\t{ids[v]}" for u, v in graph.edges.tolist())]
    edges.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with entities.open("w", encoding="utf-8") as fh:
        for i, (eid, text) in enumerate(zip(ids, graph.texts, strict=True)):
            row = {"id": eid, "text": text}
            if graph.labels is not None and graph.label_names is not None and int(graph.labels[i]) >= 0:
                row["label"] = graph.label_names[int(graph.labels[i])]
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    return edges, entities


def write_node_graph(graph: Any, folder: Path) -> Path:
    """Write a :class:`~graphveil.data.node_graph.NodeGraph` as ``graph.pt`` (a plain PyG ``Data``
    that ``torch.load(..., weights_only=True)`` reads); returns its path."""
    folder.mkdir(parents=True, exist_ok=True)
    data = graph.to_pyg()
    data.label_names = list(graph.class_names)
    data.node_ids = list(graph.node_ids)  # the whole graph's ids (a keyed node split can follow them)
    path = folder / NODE_GRAPH_FILE
    partial = path.with_name(path.name + ".partial")
    torch.save(data, partial)
    partial.replace(path)
    return path


def write_partition(graph: RelationalGraph, num_sites: int, out: Path, seed: int = 0, *,
                    kind: str = "random", alpha: float = 0.5) -> list[tuple[Path, Path]]:
    """Partition a relational ``graph`` and write ``out/site-<i>/{edges.tsv,entities.jsonl}``."""
    return [write_site_files(part, out / f"site-{i + 1}")
            for i, part in enumerate(partition_graph(graph, num_sites, seed, kind=kind, alpha=alpha))]


def write_node_partition(graph: Any, num_sites: int, out: Path, seed: int = 0, *, kind: str = "random",
                         alpha: float = 0.5) -> tuple[list[Path], Partition]:
    """Partition a node-classification ``graph`` and write ``out/site-<i>/graph.pt``; returns the
    paths and the :class:`~graphveil.data.partition.Partition` (sizes, cut edges)."""
    split = split_nodes(graph, num_sites, kind=kind, seed=seed, alpha=alpha)
    return [write_node_graph(part, out / f"site-{i + 1}") for i, part in enumerate(split.parts(graph))], split


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphveil.connectors.flower.partition",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, required=True, help="number of sites")
    parser.add_argument("--out", required=True, help="folder receiving site-<i>/ folders")
    parser.add_argument("--graph", choices=("citeseer", "cora"), default="citeseer",
                        help="citeseer: the bundled relational CiteSeer (edge_list files); cora: the "
                             "bundled Planetoid Cora node-classification graph (graph.pt files)")
    parser.add_argument("--citeseer-tape", help="a TAPE CiteSeer folder (default: the bundled CiteSeer)")
    parser.add_argument("--by", choices=KINDS, default="random",
                        help="random nodes, label skew (Dirichlet --alpha) or connected communities")
    parser.add_argument("--alpha", type=float, default=0.5, help="Dirichlet α of --by labels (default 0.5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split (default: 0)")
    args = parser.parse_args(argv)
    try:
        if args.graph == "cora":
            graph = load_source(source="planetoid", name="cora")
            split = split_nodes(graph, args.sites, kind=args.by, seed=args.seed, alpha=args.alpha)
            for i, part in enumerate(split.parts(graph)):
                print(write_node_graph(part, Path(args.out) / f"site-{i + 1}"))
        else:
            graph = load_citeseer_tape(args.citeseer_tape) if args.citeseer_tape else load_bundled_citeseer()
            split = split_nodes(graph, args.sites, kind=args.by, seed=args.seed, alpha=args.alpha)
            for i, part in enumerate(split.parts(graph)):
                edges, entities = write_site_files(part, Path(args.out) / f"site-{i + 1}")
                print(f"{edges}\t{entities}")
        print(json.dumps(split.summary()), file=sys.stderr)
    except GraphVeilError as exc:
        print(f"partition: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
