"""Load-time benchmark: the same graph as CSV (source edge_list), as Parquet (source parquet)
and from PostgreSQL tables (source sql).

Generates a text graph (default: 100,000 entities with short texts, 1,000,000 relations drawn
at random, so a few self-loops and duplicates for the validation to drop) into a temporary
folder, writes it as CSV and as Parquet, copies it into a throwaway PostgreSQL server on
loopback (tests/data/_postgres.py, the SQL tests' server; the row is left out when no server binaries
are found), and loads each through the plugin host's data source in a fresh process, so every
row's peak RSS is its own. Prints a small table; not a test.

    python bench/data_load.py [--entities 100000] [--relations 1000000] [--repeat 2] [--no-postgres]

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
digest = hashlib.sha256(graph.edges.numpy().tobytes() + "\0".join(graph.texts).encode()).hexdigest()[:16]
print(json.dumps({"seconds": seconds, "before_mb": before, "peak_mb": peak,
                  "nodes": graph.num_nodes, "edges": graph.num_edges, "digest": digest}))
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
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "data"))
    from _postgres import ServerUnavailable, running_server

    with tempfile.TemporaryDirectory(prefix="graphveil-bench-") as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        started = time.perf_counter()
        formats = generate(folder, args.entities, args.relations, args.seed)
        print(f"generated {args.entities:,} entities / {args.relations:,} relations in "
              f"{time.perf_counter() - started:.1f} s")
        sizes = {label: sum(Path(data[k]).stat().st_size for k in ("path", "entities")) / 2**20
                 for label, data in formats.items()}
        env = dict(os.environ)
        if not args.no_postgres:
            try:
                server = stack.enter_context(running_server())
            except ServerUnavailable as exc:
                print(f"no PostgreSQL row: {exc}", file=sys.stderr)
            else:
                started = time.perf_counter()
                formats["postgresql (sql)"], sizes["postgresql (sql)"] = add_postgres(folder, server)
                env[PASSWORD_ENV] = server.password
                print(f"copied into PostgreSQL in {time.perf_counter() - started:.1f} s")
        rows = []
        for label, data in formats.items():
            runs = [load_in_child(data, env) for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["seconds"])
            rows.append({"format": label, "files_mb": sizes[label], **best})
    print("\n| format | files / tables (MB) | load (s) | RSS before (MB) | peak RSS (MB) | nodes | relations | digest |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['format']} | {r['files_mb']:.1f} | {r['seconds']:.2f} | {r['before_mb']:.0f} | "
              f"{r['peak_mb']:.0f} | {r['nodes']:,} | {r['edges']:,} | {r['digest']} |")
    if len({r["digest"] for r in rows}) != 1:
        print("the formats gave different graphs", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
