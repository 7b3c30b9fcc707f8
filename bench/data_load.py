"""Load-time benchmark: the same graph as CSV (source edge_list), as Parquet (source parquet)
and from PostgreSQL tables (source sql); and a node-feature graph from Parquet.

Generates a text graph (default: 100,000 entities with short texts, 1,000,000 relations drawn
at random, so a few self-loops and duplicates for the validation to drop) into a temporary
folder, writes it as CSV and as Parquet, copies it into a throwaway PostgreSQL server on
loopback (tests/data/_postgres.py, the SQL tests' server; the row is left out when no server binaries
are found), and loads each through the plugin host's data source in a fresh process, so every
row's peak RSS is its own. Prints a small table; not a test.

Node-feature rows (``--features 500``, 0 to leave them out): the same entities as nodes with
``--features`` float32 features drawn at random and one of 5 labels, over the same relations, as
a Parquet entity table with one ``list<float>`` column (``data.features_col``) and with one
column per feature (``data.feature_cols``); both must give the same graph (a digest of the
edges, features and labels). ``--no-text`` leaves out the text-graph rows.

    python bench/data_load.py [--entities 100000] [--relations 1000000] [--repeat 2] [--no-postgres]
                              [--features 500] [--no-text]

"RSS before" is the process's peak after importing GraphVeil, before reading; "peak RSS" its
peak once loaded (Linux ``VmHWM``). Both loads must give the same graph (an edge digest is compared).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import hashlib, json, sys, time
from graphveil.run.config import DataConfig
from graphveil.data import load_data
from graphveil.contract.host import default_host


def status_mb(key):  # VmHWM, unlike ru_maxrss, starts afresh at exec (not the parent's peak)
    line = next(l for l in open("/proc/self/status") if l.startswith(key + ":"))
    return int(line.split()[1]) / 1024


default_host()
before = status_mb("VmHWM")
cfg = DataConfig.model_validate(json.loads(sys.argv[1]))
start = time.perf_counter()
graph = load_data(cfg)
seconds = time.perf_counter() - start
peak = status_mb("VmHWM")
if hasattr(graph, "texts"):
    payload, features, edges = graph.edges.numpy().tobytes() + "\0".join(graph.texts).encode(), 0, graph.num_edges
else:  # a node graph: every edge twice in edge_index
    payload = graph.edge_index.numpy().tobytes() + graph.x.numpy().tobytes() + graph.y.numpy().tobytes()
    features, edges = graph.num_features, graph.num_undirected_edges
digest = hashlib.sha256(payload).hexdigest()[:16]
print(json.dumps({"seconds": seconds, "before_mb": before, "peak_mb": peak, "nodes": graph.num_nodes,
                  "features": features, "edges": edges, "digest": digest}))
"""


def generate(folder: Path, n_entities: int, n_relations: int, seed: int) -> dict[str, dict]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    words = np.array(["graph", "privacy", "noise", "model", "entity", "relation", "budget", "paper"])
    ids = pa.array([f"e{i}" for i in range(n_entities)])
    texts = pa.array([f"entity {i} on {words[i % 8]} and {words[(i * 3) % 8]}" for i in range(n_entities)])
    ends = rng.integers(0, n_entities, size=(n_relations, 2))
    src = pa.array(np.char.add("e", ends[:, 0].astype(str)))
    dst = pa.array(np.char.add("e", ends[:, 1].astype(str)))
    entities, relations = pa.table({"id": ids, "text": texts}), pa.table({"source": src, "target": dst})
    pacsv.write_csv(entities, folder / "entities.csv")
    pacsv.write_csv(relations, folder / "relations.csv")
    pq.write_table(entities, folder / "entities.parquet")
    pq.write_table(relations, folder / "relations.parquet", row_group_size=128 * 1024)
    return {
        "csv (edge_list)": {"source": "edge_list", "path": str(folder / "relations.csv"),
                            "entities": str(folder / "entities.csv")},
        "parquet": {"source": "parquet", "path": str(folder / "relations.parquet"),
                    "entities": str(folder / "entities.parquet")},
    }


def generate_nodes(folder: Path, n_nodes: int, n_features: int, seed: int) -> dict[str, dict]:
    """Node tables over :func:`generate`'s ids (its relations.parquet is the relation table)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n_nodes, n_features), dtype=np.float32)
    ids = pa.array([f"e{i}" for i in range(n_nodes)])
    labels = pa.array(np.char.add("class", rng.integers(0, 5, n_nodes).astype(str)))
    vec = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), n_features).cast(pa.list_(pa.float32()))
    pq.write_table(pa.table({"id": ids, "label": labels, "x": vec}), folder / "nodes_list.parquet")
    columns = {"id": ids, "label": labels, **{f"f{j}": x[:, j] for j in range(n_features)}}
    pq.write_table(pa.table(columns), folder / "nodes_columns.parquet")
    edges = str(folder / "relations.parquet")
    return {
        "parquet list<float> (features_col)": {"source": "parquet", "path": edges, "label_col": "label",
                                               "entities": str(folder / "nodes_list.parquet"), "features_col": "x"},
        "parquet columns (feature_cols)": {"source": "parquet", "path": edges, "label_col": "label",
                                           "entities": str(folder / "nodes_columns.parquet"), "feature_cols": "f"},
    }


PASSWORD_ENV = "GRAPHVEIL_BENCH_PG_PASSWORD"


def load_in_child(data: dict, env: dict[str, str]) -> dict:
    """One load in a fresh process; its error output is shown if it fails."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(data)], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"loading {data['source']} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def add_postgres(folder: Path, server) -> tuple[dict, float]:
    """The generated CSV files copied into the server's tables: the sql source's options (the
    entities in the CSV's order, by a serial column) and the tables' size on disk (MB)."""
    import psycopg

    with psycopg.connect(server.conninfo()) as conn, conn.cursor() as cur:
        cur.execute("CREATE TABLE entities (pos BIGSERIAL, id TEXT NOT NULL, text TEXT)")
        cur.execute("CREATE TABLE relations (source TEXT, target TEXT)")
        for table, columns in (("entities", "id, text"), ("relations", "source, target")):
            with (folder / f"{table}.csv").open("rb") as fh, \
                    cur.copy(f"COPY {table} ({columns}) FROM STDIN WITH (FORMAT csv, HEADER true)") as copy:
                while chunk := fh.read(1 << 20):
                    copy.write(chunk)
        size = cur.execute("SELECT pg_total_relation_size('entities') + pg_total_relation_size('relations')").fetchone()[0]
    return {"source": "sql", "url": server.url(), "password_env": PASSWORD_ENV,
            "entities_query": "SELECT id, text FROM entities ORDER BY pos", "relations_table": "relations"}, size / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entities", type=int, default=100_000)
    ap.add_argument("--relations", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2, help="loads per format (the fastest is shown)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-postgres", action="store_true", help="leave out the PostgreSQL row")
    ap.add_argument("--features", type=int, default=500, help="node-feature rows: features per node (0: none)")
    ap.add_argument("--no-text", action="store_true", help="leave out the text-graph rows")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
    from _postgres import ServerUnavailable, running_server

    with tempfile.TemporaryDirectory(prefix="graphveil-bench-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        started = time.perf_counter()
        formats = generate(folder, args.entities, args.relations, args.seed)
        print(f"generated {args.entities:,} entities / {args.relations:,} relations in "
              f"{time.perf_counter() - started:.1f} s")
        node_formats = {}
        if args.features:
            started = time.perf_counter()
            node_formats = generate_nodes(folder, args.entities, args.features, args.seed)
            print(f"generated {args.entities:,} nodes x {args.features} features in "
                  f"{time.perf_counter() - started:.1f} s")
        if args.no_text:
            formats = {}
        sizes = {label: sum(Path(data[k]).stat().st_size for k in ("path", "entities")) / 2**20
                 for label, data in {**formats, **node_formats}.items()}
        env = dict(os.environ)
        if not args.no_postgres and not args.no_text:
            try:
                server = stack.enter_context(running_server())
            except ServerUnavailable as exc:
                print(f"no PostgreSQL row: {exc}", file=sys.stderr)
            else:
                started = time.perf_counter()
                formats["postgresql (sql)"], sizes["postgresql (sql)"] = add_postgres(folder, server)
                env[PASSWORD_ENV] = server.password
                print(f"copied into PostgreSQL in {time.perf_counter() - started:.1f} s")
        rows = [_best(label, data, sizes[label], env, args.repeat) for label, data in formats.items()]
        node_rows = [_best(label, data, sizes[label], env, args.repeat) for label, data in node_formats.items()]
    status = 0
    for title, group in (("text graph", rows), ("node graph", node_rows)):
        if not group:
            continue
        print(f"\n{title}\n\n| format | files / tables (MB) | load (s) | RSS before (MB) | peak RSS (MB) | "
              f"nodes | features | relations | digest |\n|---|---|---|---|---|---|---|---|---|")
        for r in group:
            print(f"| {r['format']} | {r['files_mb']:.1f} | {r['seconds']:.2f} | {r['before_mb']:.0f} | "
                  f"{r['peak_mb']:.0f} | {r['nodes']:,} | {r['features']} | {r['edges']:,} | {r['digest']} |")
        if len({r["digest"] for r in group}) != 1:
            print(f"the formats gave different {title}s", file=sys.stderr)
            status = 1
    return status


def _best(label: str, data: dict, size: float, env: dict[str, str], repeat: int) -> dict:
    """The fastest of ``repeat`` loads, each in a fresh process."""
    runs = [load_in_child(data, env) for _ in range(repeat)]
    return {"format": label, "files_mb": size, **min(runs, key=lambda r: r["seconds"])}


if __name__ == "__main__":
    sys.exit(main())
