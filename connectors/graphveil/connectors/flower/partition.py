"""Split one graph into per-site graphs and write each as an edge list + entity table.

For demos, tests and benchmarks of a federation: each site gets a disjoint random share of the
entities and the relations among them (relations crossing two sites are dropped, as they would
belong to no single owner). The files are what a site's ``data-source = "edge_list"`` reads.

``python -m graphveil.connectors.flower.partition --sites 3 --out sites/`` writes
``sites/site-1/{edges.tsv,entities.jsonl}`` ... from the bundled CiteSeer graph.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from graphveil.contract.errors import ConfigError, DataError, GraphVeilError
from graphveil.data import RelationalGraph, load_bundled_citeseer, load_citeseer_tape

EDGES_FILE = "edges.tsv"
ENTITIES_FILE = "entities.jsonl"


def partition_graph(graph: RelationalGraph, num_sites: int, seed: int = 0) -> list[RelationalGraph]:
    """``num_sites`` induced subgraphs on a seeded random, near-equal split of the entities."""
    if num_sites < 1 or num_sites > graph.num_nodes:
        raise ConfigError(f"number of sites must be in 1..{graph.num_nodes}, got {num_sites}")
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(seed))
    return [graph.subgraph(part, name=f"{graph.name}/site-{i + 1}")
            for i, part in enumerate(torch.tensor_split(perm, num_sites))]


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


def write_partition(graph: RelationalGraph, num_sites: int, out: Path, seed: int = 0) -> list[tuple[Path, Path]]:
    """Partition ``graph`` and write ``out/site-<i>/`` for each site."""
    return [write_site_files(part, out / f"site-{i + 1}")
            for i, part in enumerate(partition_graph(graph, num_sites, seed))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graphveil.connectors.flower.partition",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, required=True, help="number of sites")
    parser.add_argument("--out", required=True, help="folder receiving site-<i>/ folders")
    parser.add_argument("--citeseer-tape", help="a TAPE CiteSeer folder (default: the bundled CiteSeer)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the entity split (default: 0)")
    args = parser.parse_args(argv)
    try:
        graph = load_citeseer_tape(args.citeseer_tape) if args.citeseer_tape else load_bundled_citeseer()
        for edges, entities in write_partition(graph, args.sites, Path(args.out), args.seed):
            print(f"{edges}\t{entities}")
    except GraphVeilError as exc:
        print(f"partition: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
