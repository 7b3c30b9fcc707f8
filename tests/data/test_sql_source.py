"""The sql data source: edge_list's graph from PostgreSQL (a real server on loopback), SQLite and
DuckDB tables or read-only queries, streamed, same validation, credentials never written."""

from __future__ import annotations

import csv
import json
import logging
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from _postgres import PostgresServer, ServerUnavailable, start_server
from _tables import (
    EDGES,
    ENTITIES,
    IDS,
    LABELS,
    RELATIONS,
    X,
    check_graph,
    data_options,
    same_graph,
    write_csv,
)

from graphveil.contract.errors import ConfigError, DataError
from graphveil.data import RelationalGraph, load_bundled_citeseer, load_data
from graphveil.plugins.standard.sources import sql as sql_module
from graphveil.run.config import DataConfig, load_config
from graphveil.run.session import TrainingSession

#: one PostgreSQL server (the session fixture ``pg``) for the module: its tests run on one xdist worker
pytestmark = pytest.mark.xdist_group("postgres")

PASSWORD_ENV = "GRAPHVEIL_TEST_PG_PASSWORD"
#: Extra tables of the test database: each breaks one validation rule.
BAD_TABLES = {
    "dup_entities": [("a", "x", None), ("b", "y", None), ("a", "z", None)],
    "blank_entities": [("a", "x", None), ("b", "   ", None), ("c", "z", None)],
    "null_text_entities": [("a", "x", None), ("b", None, None)],
    "null_id_entities": [("a", "x", None), (None, "y", None)],
}


# ------------------------------------------------------------------------------ databases


def _fill(execute, placeholder: str, ints: bool = False) -> None:
    """The test tables, through a DB-API ``execute(sql, rows)`` of any of the three databases."""
    id_type = "BIGINT" if ints else "TEXT"
    execute(f"CREATE TABLE entities (id {id_type}, text TEXT, label TEXT, pos INTEGER)", None)
    execute(f"CREATE TABLE relations (src {id_type}, weight REAL, dst {id_type})", None)
    ph = ", ".join([placeholder] * 4)
    execute(f"INSERT INTO entities VALUES ({ph})", [(*e, i) for i, e in enumerate(ENTITIES)])
    execute(f"INSERT INTO relations VALUES ({placeholder}, 1.0, {placeholder})", RELATIONS)
    for name, rows in BAD_TABLES.items():
        execute(f"CREATE TABLE {name} (id TEXT, text TEXT, label TEXT)", None)
        execute(f"INSERT INTO {name} VALUES ({placeholder}, {placeholder}, {placeholder})", rows)
    execute("CREATE TABLE unknown_relations (src TEXT, dst TEXT)", None)
    execute(f"INSERT INTO unknown_relations VALUES ({placeholder}, {placeholder})", [("a", "b"), ("c", "zz")])
    execute("CREATE TABLE empty_relations (src TEXT, dst TEXT)", None)


def _fill_nodes(execute, placeholder: str, array: str) -> None:
    """The node graph of ``_tables`` (IDS, LABELS, X, EDGES): an array column, one column per
    feature, a sparse long table; and tables breaking one rule each."""
    ph = ", ".join([placeholder] * 6)
    execute(f"CREATE TABLE nodes (id TEXT, label TEXT, vec {array}, f_0 REAL, f_1 REAL, f_2 REAL)", None)
    execute(f"INSERT INTO nodes VALUES ({ph})",
            [(i, lab, [float(v) for v in row], *map(float, row)) for i, lab, row in zip(IDS, LABELS, X, strict=True)])
    execute("CREATE TABLE node_edges (src TEXT, dst TEXT)", None)
    execute(f"INSERT INTO node_edges VALUES ({placeholder}, {placeholder})", EDGES)
    execute("CREATE TABLE node_features (id TEXT, feature INTEGER, value REAL)", None)
    execute(f"INSERT INTO node_features VALUES ({placeholder}, {placeholder}, {placeholder})",
            [(i, j, float(X[r, j])) for r, i in enumerate(IDS) for j in range(3)])
    for name, vectors in (("ragged_nodes", [[1.0, 2.0], [1.0], [1.0, 2.0]]),
                          ("nan_nodes", [[1.0, 2.0], [1.0, 2.0], [float("nan"), 2.0]])):
        execute(f"CREATE TABLE {name} (id TEXT, label TEXT, vec {array})", None)
        execute(f"INSERT INTO {name} VALUES ({placeholder}, {placeholder}, {placeholder})",
                list(zip(IDS[:3], ["a", "b", "a"], vectors, strict=True)))


def _runner(cursor):
    def execute(sql: str, rows) -> None:
        if rows is None:
            cursor.execute(sql)
        else:
            cursor.executemany(sql, rows)
    return execute


@pytest.fixture(scope="session")
def pg() -> PostgresServer:
    """A PostgreSQL server on 127.0.0.1 holding the test tables; skipped without the server
    binaries, except under CI (CI=true), where a server that cannot start fails the tests."""
    try:
        server = start_server()
    except ServerUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the PostgreSQL tests: {exc}")
        pytest.skip(str(exc))
    import psycopg

    with psycopg.connect(server.conninfo()) as conn, conn.cursor() as cur:
        _fill(_runner(cur), "%s")
        _fill_nodes(_runner(cur), "%s", "REAL[]")
    yield server
    server.stop()


@pytest.fixture
def pg_env(pg: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> PostgresServer:
    monkeypatch.setenv(PASSWORD_ENV, pg.password)
    return pg


@pytest.fixture(scope="session")
def sqlite_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("sqlite") / "graph.db"
    with sqlite3.connect(path) as conn:
        _fill(_runner(conn.cursor()), "?")
    return f"sqlite:///{path}"


@pytest.fixture(scope="session")
def duckdb_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    import duckdb

    path = tmp_path_factory.mktemp("duckdb") / "graph.duckdb"
    conn = duckdb.connect(str(path))
    _fill(_runner(conn), "?")
    _fill_nodes(_runner(conn), "?", "DOUBLE[]")
    conn.close()
    return f"duckdb:///{path}"


def sql(url: str, **options) -> RelationalGraph:
    tables = {"entities_table": "entities", "relations_table": "relations"}
    for what in ("entities", "relations"):
        if f"{what}_query" in options:
            tables.pop(f"{what}_table")
    return load_data(DataConfig(source="sql", url=url, **{**tables, **options}))


def csv_graph(tmp_path: Path, **options) -> RelationalGraph:
    rel, ent = write_csv(tmp_path)
    return load_data(DataConfig(source="edge_list", path=rel, entities=ent, **options))


# ------------------------------------------------------------------------------ the same graph


@pytest.mark.parametrize("chunk_rows", [2, 65_536])  # chunks smaller than the tables, or one chunk
def test_postgres_gives_the_csv_graph(pg_env: PostgresServer, tmp_path: Path, chunk_rows: int) -> None:
    expected = csv_graph(tmp_path, label_col="label")
    graph = sql(pg_env.url(), password_env=PASSWORD_ENV, label_col="label", chunk_rows=chunk_rows)
    same_graph(expected, graph)
    assert graph.num_edges == 6 and graph.notes == {"dropped_self_loops": 1, "dropped_duplicate_edges": 2}
    # queries read the same rows, in their own order (the entity order is the CSV's)
    queried = sql(pg_env.url(), password_env=PASSWORD_ENV, label_col="label", chunk_rows=chunk_rows,
                  entities_query="SELECT id, text, label FROM entities ORDER BY pos",
                  relations_query="SELECT src::text, dst AS dst FROM relations -- the :colon is no parameter\n;",
                  source_col="src", target_col="dst")
    assert queried.entity_ids == expected.entity_ids and torch.equal(queried.edges, expected.edges)
    assert queried.name == "graph"  # a query's graph is named after the database


def test_chunks_are_streamed_through_a_server_side_cursor(pg_env: PostgresServer) -> None:
    engine = sql_module._engine(pg_env.url(), pg_env.password)
    with sql_module.read_only(engine) as conn:
        rows = sql_module._Rows(conn, "relations", "relations", None)
        chunks = sql_module.read_sql_edges(rows, source_col=None, target_col=None, chunk_rows=2)
        first = next(chunks)
        # while the first chunk is in hand, the rest waits in a cursor on the server
        open_cursors = conn.exec_driver_sql("SELECT count(*) FROM pg_cursors").scalar()
        rest = list(chunks)
        # the rows are read in the read-only transaction
        probe = sql_module._Rows(conn, "entities", None, "SELECT current_setting('transaction_read_only') AS ro")
        assert list(probe.stream(["ro"], 10)) == [(1, [("on",)])]
    assert open_cursors == 1
    assert [len(c.pairs) for c in [first, *rest]] == [2, 2, 2, 2, 1]
    assert [c.lines[0] for c in [first, *rest]] == [1, 3, 5, 7, 9]
    pairs = [p for c in [first, *rest] for p in c.pairs]
    assert sorted(pairs) == sorted((a.strip(), b.strip()) for a, b in RELATIONS)


@pytest.mark.parametrize("database", ["sqlite", "duckdb"])
def test_sqlite_and_duckdb_through_the_same_source(database: str, tmp_path: Path, request) -> None:
    url = request.getfixturevalue(f"{database}_url")
    expected = csv_graph(tmp_path, label_col="label")
    for chunk_rows in (2, 65_536):
        same_graph(expected, sql(url, label_col="label", chunk_rows=chunk_rows))
    queried = sql(url, entities_query="SELECT text, id FROM entities ORDER BY pos DESC",
                  relations_query="SELECT dst, src FROM relations WHERE src <> 'x:y'")
    assert queried.entity_ids == [e[0] for e in reversed(ENTITIES)] and queried.num_edges == 6


def test_integer_ids_are_read_as_decimal_strings(tmp_path: Path) -> None:
    path = tmp_path / "ints.db"
    entities = [(10 + i, f"text {i}", "x") for i in range(6)]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE e (node INTEGER, body TEXT, label TEXT)")
        conn.executemany("INSERT INTO e VALUES (?, ?, ?)", list(reversed(entities)))
        conn.execute("CREATE TABLE r (id_1 INTEGER, id_2 INTEGER)")
        conn.executemany("INSERT INTO r VALUES (?, ?)", [(10 + i, 10 + (i + 1) % 6) for i in range(6)])
    graph = load_data(DataConfig(source="sql", url=f"sqlite:///{path}", entities_table="e", relations_table="r",
                                 id_col="node", text_col="body", source_col="id_1", target_col="id_2"))
    assert graph.entity_ids == [str(10 + i) for i in range(6)]  # a table is read in id order
    assert graph.edges.tolist() == [[0, 1], [0, 5], [1, 2], [2, 3], [3, 4], [4, 5]]


# ------------------------------------------------------------------------------ a run


def _citeseer_slice(tmp_path: Path, n: int = 250) -> tuple[Path, Path, list[tuple], list[tuple]]:
    """The papers of n bundled CiteSeer citations and the citations among them, in id order, as
    CSV files and as rows."""
    full = load_bundled_citeseer()
    sub = full.subgraph(torch.unique(full.edges[:n].flatten()), name="slice")
    entities = sorted((eid, text, sub.label_names[int(y)])
                      for eid, text, y in zip(sub.entity_ids, sub.texts, sub.labels, strict=True))
    relations = [(sub.entity_ids[u], sub.entity_ids[v]) for u, v in sub.edges.tolist()]
    ent, rel = tmp_path / "entities.csv", tmp_path / "relations.csv"
    with ent.open("w", newline="") as fh:
        csv.writer(fh).writerows([("id", "text", "label"), *entities])
    with rel.open("w", newline="") as fh:
        csv.writer(fh).writerows([("source", "target"), *relations])
    return rel, ent, entities, relations


def _run(tmp_path: Path, name: str, data: dict) -> Path:
    from _toy import TINY

    from graphveil.apps.cli import main

    raw = {**TINY, "name": "tiny", "seed": 3, "data": {**data, "split": {"train_fraction": 0.6}},
           "privacy": {"target_epsilon": 8.0, "research_noise_seed": 5}}
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / name
    assert main(["run", str(cfg), "--output", str(out), "--no-progress"]) == 0
    return out


def _results(out: Path) -> tuple[dict, list[dict], dict]:
    steps = [{k: v for k, v in json.loads(line).items() if "time" not in k and "second" not in k}
             for line in (out / "metrics.jsonl").read_text().splitlines()]
    privacy = json.loads((out / "privacy.json").read_text())
    return json.loads((out / "evaluation.json").read_text()), steps, privacy


@pytest.mark.slow
def test_graphveil_run_on_postgres_equals_the_run_on_csv(pg_env: PostgresServer, tmp_path: Path, caplog) -> None:
    import psycopg

    rel, ent, entities, relations = _citeseer_slice(tmp_path)
    with psycopg.connect(pg_env.conninfo()) as conn, conn.cursor() as cur:
        cur.execute("CREATE SCHEMA citeseer")
        cur.execute("CREATE TABLE citeseer.papers (id TEXT PRIMARY KEY, text TEXT, label TEXT)")
        cur.execute("CREATE TABLE citeseer.relations (source TEXT, target TEXT)")
        with cur.copy("COPY citeseer.papers FROM STDIN") as copy:
            for row in entities:
                copy.write_row(row)
        with cur.copy("COPY citeseer.relations FROM STDIN") as copy:
            for row in relations:
                copy.write_row(row)
    csv_out = _run(tmp_path, "csv", {"source": "edge_list", "path": str(rel), "entities": str(ent), "label_col": "label"})
    caplog.set_level(logging.DEBUG)
    pg_out = _run(tmp_path, "pg", {
        "source": "sql", "url": pg_env.url(), "password_env": PASSWORD_ENV, "label_col": "label",
        "entities_query": "SELECT id, text, label FROM citeseer.papers ORDER BY id",
        "relations_table": "citeseer.relations", "chunk_rows": 100})
    csv_eval, csv_steps, csv_privacy = _results(csv_out)
    pg_eval, pg_steps, pg_privacy = _results(pg_out)
    assert len(pg_steps) >= 4 and pg_steps == csv_steps
    assert pg_eval == csv_eval and pg_privacy == csv_privacy
    resolved = (pg_out / "config.resolved.yaml").read_text()
    assert yaml.safe_load(resolved)["data"]["url"] == pg_env.url()
    # the password is in no file of the run, and in no log record
    for path in pg_out.rglob("*"):
        if path.is_file():
            assert pg_env.password.encode() not in path.read_bytes(), path
    assert pg_env.password not in caplog.text and "reading the graph from postgresql+psycopg://graphveil@" in caplog.text


# ------------------------------------------------------------------------------ validation


def test_validation_errors_name_the_table_or_query_and_the_row_key(pg_env: PostgresServer) -> None:
    url, pw = pg_env.url(), {"password_env": PASSWORD_ENV}
    with pytest.raises(DataError, match=r"^table dup_entities, row 2: duplicate entity id 'a' \(first at row 1\)$"):
        sql(url, entities_table="dup_entities", **pw)  # read in id order
    with pytest.raises(DataError, match=r"^table blank_entities, row 2: entity 'b' has empty text$"):
        sql(url, entities_table="blank_entities", **pw)
    with pytest.raises(DataError, match=r"^table null_text_entities, row 2: entity 'b' has no text$"):
        sql(url, entities_table="null_text_entities", **pw)
    with pytest.raises(DataError, match=r"^table null_id_entities, row 2: column 'id' is null$"):
        sql(url, entities_table="null_id_entities", **pw)  # nulls sort last
    with pytest.raises(DataError, match=r"^table unknown_relations, row \d \(src 'c', dst 'zz'\): unknown entity id 'zz'$"):
        sql(url, relations_table="unknown_relations", **pw)
    with pytest.raises(DataError, match=r"^relations query, row 1 \(src 'c', dst 'zz'\): unknown entity id 'zz'$"):
        sql(url, relations_query="SELECT * FROM unknown_relations WHERE src = 'c'", **pw)
    with pytest.raises(DataError, match=r"^entities query, row 3: duplicate entity id 'a' \(first at row 1\)$"):
        sql(url, entities_query="SELECT id, text FROM dup_entities ORDER BY text", **pw)
    with pytest.raises(DataError, match=r"^table entities: no column 'body' \(columns: id, text, label, pos\); "
                                        r"set data\.text_col to the right one$"):
        sql(url, text_col="body", **pw)
    with pytest.raises(DataError, match=r"^relations query: no recognised source/target column pair among "
                                        r"a, weight, b .*; set data\.source_col and data\.target_col"):
        sql(url, relations_query="SELECT src AS a, weight, dst AS b FROM relations", **pw)
    with pytest.raises(DataError, match=r"^table empty_relations: no edges$"):
        sql(url, relations_table="empty_relations", **pw)
    with pytest.raises(DataError, match=r"postgresql\+psycopg://graphveil@127\.0\.0\.1:\d+/graph: .*nope"):
        sql(url, entities_table="nope", **pw)


def test_errors_name_the_file_free_database_problems(sqlite_url: str, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"^table null_id_entities, row 1: column 'id' is null$"):
        sql(sqlite_url, entities_table="null_id_entities")  # SQLite sorts nulls first
    with pytest.raises(DataError, match=r"^entities query, row 2: column 'id' holds float, not a string or an "
                                        r"integer \(cast it in a query, e.g\. CAST\(id AS TEXT\)\)$"):
        sql(sqlite_url, entities_query="SELECT id, text FROM entities WHERE id = 'a' UNION ALL SELECT 1.5, 'x'")
    with pytest.raises(DataError, match=r"sqlite:///.*: .*no such table: nope"):
        sql(sqlite_url, relations_table="nope")


# ------------------------------------------------------------------------------ read-only


#: Quotes that a lexical check splits otherwise than the server: PostgreSQL's escape string
#: E'\'' is one quote, a standard string '\' one backslash; each hides a second statement.
SMUGGLED = [r"SELECT E'\'' AS a; DELETE FROM entities; --'", r"SELECT '\' AS a; DELETE FROM entities; --'"]


@pytest.mark.parametrize("query, problem", [
    ("DELETE FROM entities", "only a SELECT query is run (read-only); got a DELETE statement"),
    ("SELECT 1; DROP TABLE entities", "only one SELECT statement is run; found 2 (SELECT, DROP)"),
    ("SELECT 1; SELECT 2", "only one SELECT statement is run; found 2 (SELECT, SELECT)"),
    (SMUGGLED[0], "only one SELECT statement is run; found 2 (SELECT, DELETE)"),
    (SMUGGLED[1], "only one SELECT statement is run; found 2 (SELECT, DELETE)"),
    ("WITH d AS (DELETE FROM entities RETURNING *) SELECT * FROM d",
     "only a read-only SELECT query is run; DELETE would write"),
    ("SELECT * INTO copied FROM entities", "only a read-only SELECT query is run; INTO would write"),
    ("SELECT * FROM entities FOR UPDATE", "only a read-only SELECT query is run; FOR UPDATE would lock rows"),
    ("EXPLAIN ANALYZE DELETE FROM entities", "only a SELECT query is run (read-only); got an EXPLAIN statement"),
    ("  -- nothing\n", "empty query"),
    ("SELECT 'unterminated", "not a query GraphVeil can read (Error tokenizing"),
])
def test_a_query_that_is_not_one_select_is_refused_before_connecting(query: str, problem: str) -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # never reached
    with pytest.raises(ConfigError, match=rf"data\.entities_query: {re.escape(problem)}"):
        data_options(source="sql", url=url, entities_query=query, relations_table="r")


def test_quoted_words_comments_and_casts_are_no_writes() -> None:
    ok = ("SELECT \"delete\", 'drop; insert', $$update$$, x::text FROM t /* into */ -- set\n WHERE a = ';'",
          "with recursive r as (select 1) select * from r;  ",
          "SELECT id, replace(body, 'a', 'b') AS text, comment, load FROM posts",  # function and column names
          "SELECT id, text FROM a UNION ALL SELECT id, text FROM b ORDER BY id")
    for query in ok:
        assert sql_module.check_select(query, "q", "postgres") == query
    # each database's own quoting: in SQLite, E'\'' is the identifier E and one string to the last '
    assert sql_module.check_select(SMUGGLED[0], "q", "sqlite") == SMUGGLED[0]
    with pytest.raises(ConfigError, match="found 2"):
        sql_module.check_select(SMUGGLED[1], "q", "sqlite")


@pytest.mark.parametrize("query", SMUGGLED)
def test_a_smuggled_second_statement_is_refused_as_the_server_would_split_it(
        pg_env: PostgresServer, duckdb_url: str, query: str) -> None:
    """The server itself reads these as two statements (its read-only transaction stops the
    DELETE); the check, parsing in the server's dialect, refuses them before connecting."""
    import psycopg

    with psycopg.connect(pg_env.conninfo()) as conn:
        conn.read_only = True  # psycopg begins each transaction READ ONLY
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction, match="DELETE"), conn.cursor() as cur:
            cur.execute(query.encode())  # the simple query protocol: the server splits the statements
    for url, options in ((pg_env.url(), {"password_env": PASSWORD_ENV}), (duckdb_url, {})):
        with pytest.raises(ConfigError, match=r"data\.entities_query: only one SELECT statement is run; "
                                             r"found 2 \(SELECT, DELETE\)"):
            sql(url, entities_query=query, **options)
        with pytest.raises(ConfigError, match=r"^entities_query: only one SELECT"):  # the loader checks too
            sql_module.load_sql(url, entities_query=query, relations_table="relations")
        assert sql(url, **options).entity_ids == [e[0] for e in ENTITIES]  # nothing deleted


@pytest.fixture
def outside_csv(tmp_path: Path) -> Path:
    path = tmp_path / "outside.csv"
    path.write_text("id,text\nz,a row outside the database\n")
    return path


@pytest.mark.parametrize("source", ["read_text('/etc/passwd')", "read_csv('{csv}')", "'{csv}'",
                                    "read_csv('https://example.invalid/graph.csv')"])
def test_duckdb_reads_no_file_url_or_extension(duckdb_url: str, outside_csv: Path, source: str) -> None:
    """A DuckDB query reads the database's own tables only: no file beside it (entity texts from
    /etc/passwd), no URL (which would auto-install and load the httpfs extension)."""
    columns = "filename AS id, content AS text" if "read_text" in source else "id, text"
    query = f"SELECT {columns} FROM {source.format(csv=outside_csv)}"
    with pytest.raises(DataError, match=r"^duckdb:///.*: Permission Error: .*disabled by configuration "
                                        r"\(GraphVeil opens DuckDB with external access") as info:
        sql(duckdb_url, entities_query=query)
    assert "root:" not in str(info.value) and "a row outside" not in str(info.value)


def test_duckdb_external_access_extensions_and_their_lock(duckdb_url: str) -> None:
    engine = sql_module._engine(duckdb_url, None)
    names = ("enable_external_access", "autoinstall_known_extensions", "autoload_known_extensions",
             "lock_configuration")
    with sql_module.read_only(engine) as conn:
        values = conn.exec_driver_sql(f"SELECT {', '.join(f'current_setting({n!r})' for n in names)}").one()
    assert dict(zip(names, values, strict=True)) == {
        "enable_external_access": False, "autoinstall_known_extensions": False,
        "autoload_known_extensions": False, "lock_configuration": True}
    for statement in ("SET enable_external_access = true", "SET autoinstall_known_extensions = true",
                      "SET autoload_known_extensions = true", "SET lock_configuration = false"):
        with pytest.raises(DataError, match="the configuration has been locked"), \
                sql_module.read_only(sql_module._engine(duckdb_url, None)) as conn:
            conn.exec_driver_sql(statement)


@pytest.mark.parametrize("database", ["pg_env", "sqlite_url", "duckdb_url"])
def test_the_connection_itself_refuses_writes(database: str, request) -> None:
    """Behind the statement check, the transaction (or connection) is read-only."""
    target = request.getfixturevalue(database)
    url, password = (target.url(), target.password) if database == "pg_env" else (target, None)
    engine = sql_module._engine(url, password)
    with pytest.raises(DataError, match=r"read-only|readonly|read only"), \
            sql_module.read_only(engine, password) as conn:
        conn.exec_driver_sql("INSERT INTO entities (id, text) VALUES ('new', 'row')")
    graph = sql(url, password_env=PASSWORD_ENV) if database == "pg_env" else sql(url)
    assert graph.entity_ids == [e[0] for e in ENTITIES]  # nothing was written


# ------------------------------------------------------------------------------ credentials


@pytest.mark.parametrize("url", ["postgresql+psycopg://alice:Sup3rSecret@db:5432/graph",
                                 "postgresql+psycopg://alice@db:5432/graph?password=Sup3rSecret"])
def test_a_url_holding_a_password_is_refused_without_echoing_it(url: str, tmp_path: Path, capsys) -> None:
    with pytest.raises(ConfigError) as info:
        data_options(source="sql", url=url, entities_table="e", relations_table="r")
    assert "holds" in str(info.value) and "data.password_env" in str(info.value)
    assert "Sup3rSecret" not in str(info.value) and "alice" in str(info.value)
    from graphveil.apps.cli import main

    cfg = tmp_path / "run.yaml"
    components = {"sampler": {"name": "edge_poisson_decoupled", "batch_size": 4}, "clipper": {"name": "per_tuple_clip"},
                  "accountant": {"name": "edge_rdp"}, "encoder": {"name": "hf_lora", "model": "tiny-bert"}}
    cfg.write_text(yaml.safe_dump({**components, "data": {"source": "sql", "url": url, "entities_table": "e",
                                                          "relations_table": "r"}}))
    assert main(["run", str(cfg), "--output", str(tmp_path / "out"), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert "credentials never go in the run config" in captured.err
    assert "Sup3rSecret" not in captured.err + captured.out and not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"run\.yaml: data: data\.url holds") as info:  # refused at assemble
        TrainingSession(load_config(cfg)).assemble()
    assert "Sup3rSecret" not in str(info.value) and "Sup3rSecret" not in repr(info.value.__cause__)


def test_passwords_from_the_environment_a_file_or_libpq(pg: PostgresServer, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    wrong = "Wr0ngPassw0rd"
    monkeypatch.setenv(PASSWORD_ENV, wrong)
    with pytest.raises(DataError, match=r"^postgresql\+psycopg://graphveil@127\.0\.0\.1:\d+/graph: .*password authentication failed") as info:
        sql(pg.url(), password_env=PASSWORD_ENV)
    assert wrong not in str(info.value) and info.value.__cause__ is None
    monkeypatch.delenv(PASSWORD_ENV)
    with pytest.raises(DataError, match=rf"^data\.password_env: the environment variable '{PASSWORD_ENV}' is not set$"):
        sql(pg.url(), password_env=PASSWORD_ENV)
    secret = tmp_path / "pg.secret"
    secret.write_text(pg.password + "\n")
    secret.chmod(0o600)
    assert sql(pg.url(), password_file=secret).num_edges == 6
    with pytest.raises(DataError, match=r"^data\.password_file: cannot read .*missing"):
        sql(pg.url(), password_file=tmp_path / "missing")
    monkeypatch.setenv("PGPASSWORD", pg.password)  # libpq's own variable: nothing in the config
    graph = sql(pg.url())
    assert graph.num_edges == 6
    assert pg.password not in caplog.text and wrong not in caplog.text
    with pytest.raises(ConfigError, match="give one of data.password_env and data.password_file, not both"):
        data_options(source="sql", url=pg.url(), entities_table="e", relations_table="r",
                     password_env="X", password_file=secret)


def test_redacted_urls_and_messages_hide_every_secret() -> None:
    shown = sql_module.redact("postgresql+psycopg://alice:pw1@db/graph?sslpassword=pw2&sslmode=require")
    assert shown == "postgresql+psycopg://alice@db/graph?sslmode=require&sslpassword=hidden"
    # a password holding '@' and '/': SQLAlchemy alone would parse the password 'p', the host 'ss'
    # and show "@ss/w0rd"; the URL is masked before it is parsed
    assert sql_module.redact("postgresql+psycopg://bob:p@ss/w0rd@db/graph") == "postgresql+psycopg://bob@db/graph"
    with pytest.raises(ConfigError, match=r"data\.url holds a password \(postgresql\+psycopg://bob@db/graph\)") as info:
        data_options(source="sql", url="postgresql+psycopg://bob:p@ss/w0rd@db/graph", entities_table="e",
                     relations_table="r")
    assert "w0rd" not in str(info.value)
    # a driver message quoting the password (as a DSN echoed back would) is scrubbed
    assert sql_module._scrub("bad dsn 'password=pw1 host=db'\ndetail", "pw1") == "bad dsn 'password=*** host=db'"


# ------------------------------------------------------------------------------ options, imports


def test_options_are_checked_before_connecting() -> None:
    url = "sqlite:///nowhere.db"
    with pytest.raises(ConfigError, match=r"give one of data\.entities_table and data\.entities_query"):
        data_options(source="sql", url=url, relations_table="r")
    with pytest.raises(ConfigError, match=r"give one of data\.relations_table and data\.relations_query"):
        data_options(source="sql", url=url, entities_table="e", relations_table="r", relations_query="SELECT 1")
    with pytest.raises(ConfigError, match=r"give both data\.source_col and data\.target_col"):
        data_options(source="sql", url=url, entities_table="e", relations_table="r", source_col="a")
    with pytest.raises(ConfigError, match=r"data\.url: not a database URL"):
        data_options(source="sql", url="graph.db", entities_table="e", relations_table="r")
    with pytest.raises(ConfigError, match=r"data\.chunk_rows"):
        data_options(source="sql", url=url, entities_table="e", relations_table="r", chunk_rows=0)
    options = data_options(source="sql", url=url, entities_table="e", relations_table="r")
    assert options.model_dump() == {"url": url, "password_env": None, "password_file": None, "entities_table": "e",
                          "entities_query": None, "relations_table": "r", "relations_query": None,
                          "source_col": None, "target_col": None, "id_col": "id", "text_col": "text",
                          "label_col": None, "chunk_rows": 65_536, "features_col": None, "feature_cols": None, "features_table": None, "num_features": None, "features_query": None}


@pytest.mark.slow  # two fresh interpreters importing GraphVeil
def test_sqlalchemy_is_imported_only_when_used_and_its_absence_is_explained() -> None:
    code = ("import sys; import graphveil.data; from graphveil.plugins.standard import sources; "
            "from graphveil.contract.host import default_host; default_host(); print('sqlalchemy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    code = ("import sys; sys.modules['sqlalchemy'] = None\n"
            "from graphveil.contract.host import default_host\n"
            "from graphveil.data.loaders import check_data_options\n"
            "from graphveil.run.config import DataConfig\n"
            "check_data_options(DataConfig(source='sql', url='sqlite:///g.db', entities_table='e', "
            "relations_table='r'), default_host())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "needs SQLAlchemy 2: pip install graphveil[sql]" in out.stderr


def test_missing_server_binaries_give_a_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import _postgres

    monkeypatch.setattr(_postgres, "find_binaries", lambda: None)
    with pytest.raises(ServerUnavailable, match=r"^PostgreSQL server binaries not found: install postgresql \(Debian"):
        start_server()


# ------------------------------------------------------------------------------ a federated site


def _site(**data):
    from graphveil.connectors.flower.settings import SiteSettings

    base = {"site-name": "bank-a", "epsilon-budget": 3.0, "ledger": "/ledger/l.sqlite", "delta": 1e-5,
            "privacy-unit": "edge", "min-records": 64, "data-source": "sql"}
    return SiteSettings.from_mapping({**base, **data})


def test_a_site_trains_from_its_database_and_its_credentials_stay_in_its_node_config(
        pg_env: PostgresServer, tmp_path: Path) -> None:
    from _fed_support import RUN_CONFIG

    from graphveil.connectors.flower.settings import FederationSettings, site_run_config
    from graphveil.data import load_graph

    site = _site(**{"data-url": pg_env.url(), "data-password-env": PASSWORD_ENV,
                    "data-entities-query": "SELECT id, text FROM entities ORDER BY pos",
                    "data-relations-table": "relations", "data-source-col": "src", "data-target-col": "dst"})
    assert site.data_section() == {
        "source": "sql", "url": pg_env.url(), "password_env": PASSWORD_ENV, "source_col": "src", "target_col": "dst",
        "entities_query": "SELECT id, text FROM entities ORDER BY pos", "relations_table": "relations"}
    cfg = site_run_config(FederationSettings.from_run_config(RUN_CONFIG), site, seed=1)
    assert pg_env.password not in json.dumps(cfg.model_dump(mode="json"))
    graph = load_graph(cfg.data)
    expected = csv_graph(tmp_path)
    assert graph.entity_ids == expected.entity_ids and torch.equal(graph.edges, expected.edges)


@pytest.mark.parametrize("data, message", [
    ({"data-url": "postgresql+psycopg://site:Sup3rSecret@db/graph"}, r"data-url holds a password \(postgresql\+psycopg://site@db/graph\)"),
    ({}, r"data-url is required for data-source 'sql'"),
    ({"data-url": "sqlite:///g.db", "data-path": "/data/e.tsv"}, r"data-path does not apply to data-source 'sql'"),
    ({"data-url": "sqlite:///g.db", "data-entities-table": None}, r"give one of data-entities-table and data-entities-query"),
    ({"data-url": "sqlite:///g.db", "data-relations-query": "DROP TABLE relations", "data-relations-table": None},
     r"data-relations-query: only a SELECT query is run \(read-only\); got a DROP statement"),
    ({"data-url": "sqlite:///g.db", "data-password-file": "secret.txt"}, r"data-password-file: must be an absolute path"),
])
def test_a_sites_sql_keys_are_checked_naming_the_node_config_key(data: dict, message: str) -> None:
    tables = {"data-entities-table": "entities", "data-relations-table": "relations"}
    values = {k: v for k, v in {**tables, **data}.items() if v is not None}
    with pytest.raises(ConfigError, match=message) as info:
        _site(**values)
    assert "Sup3rSecret" not in str(info.value)


def test_sql_keys_belong_to_the_sql_source_and_the_password_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"data-url applies only to data-source 'sql'"):
        _site(**{"data-source": "edge_list", "data-path": "/e.tsv", "data-entities": "/n.jsonl",
                 "data-url": "sqlite:///g.db"})
    site = _site(**{"data-url": "sqlite:///g.db", "data-entities-table": "e", "data-relations-table": "r",
                    "data-password-file": str(tmp_path / "missing"), "ledger": str(tmp_path / "l.sqlite")})
    with pytest.raises(ConfigError, match=r"data-password-file: .*missing does not exist"):
        site.check_files()


# ------------------------------------------------------------------------------ node graphs


def node_sql(url: str, **options) -> object:
    tables = {"entities_table": "nodes", "relations_table": "node_edges", "label_col": "label"}
    if "entities_query" in options:
        tables.pop("entities_table")
    return load_data(DataConfig(source="sql", url=url, **{**tables, **options}))


@pytest.mark.parametrize("chunk_rows", [2, 65_536])
@pytest.mark.parametrize("database", ["postgres", "duckdb"])
def test_a_database_gives_the_node_graph_from_arrays_columns_or_a_sparse_table(
        request: pytest.FixtureRequest, database: str, chunk_rows: int) -> None:
    if database == "postgres":
        url, extra = request.getfixturevalue("pg_env").url(), {"password_env": PASSWORD_ENV}
    else:
        url, extra = request.getfixturevalue("duckdb_url"), {}
    extra["chunk_rows"] = chunk_rows
    check_graph(node_sql(url, features_col="vec", **extra))  # PostgreSQL real[], DuckDB DOUBLE[]
    check_graph(node_sql(url, feature_cols="f_", **extra))
    check_graph(node_sql(url, features_table="node_features", num_features=3, **extra))
    graph = check_graph(node_sql(url, features_query="SELECT id, feature, value FROM node_features "
                                                     "WHERE feature < 2", **extra), X[:, :2])  # width inferred
    assert graph.name == "node_edges"
    queried = node_sql(url, entities_query="SELECT id, label, vec FROM nodes ORDER BY id DESC",
                       features_col="vec", **extra)
    assert queried.node_ids == sorted(IDS, reverse=True)  # a query's rows are read in its own order


@pytest.mark.parametrize("database", ["postgres", "duckdb"])
def test_a_bad_node_table_in_a_database_is_refused_naming_the_table_row_and_id(
        request: pytest.FixtureRequest, database: str) -> None:
    if database == "postgres":
        url, extra = request.getfixturevalue("pg_env").url(), {"password_env": PASSWORD_ENV}
    else:
        url, extra = request.getfixturevalue("duckdb_url"), {}
    with pytest.raises(DataError, match=r"table ragged_nodes, row 2 \(id 'n1'\): column 'vec' "
                                        r"\(data\.features_col\) holds 1 values, row 1 holds 2"):
        node_sql(url, entities_table="ragged_nodes", features_col="vec", **extra)
    with pytest.raises(DataError, match=r"table nan_nodes, row 3 \(id 'n2'\): feature 0 is nan"):
        node_sql(url, entities_table="nan_nodes", features_col="vec", **extra)
    with pytest.raises(DataError, match=r"features query, row 1: unknown node id 'zz'"):
        node_sql(url, features_query="SELECT 'zz' AS id, 0 AS feature, 1.0 AS value", **extra)
    with pytest.raises(DataError, match=r"table node_edges: .*no column 'vec'|table nodes: no column 'nope'"):
        node_sql(url, features_col="nope", **extra)


def test_a_features_query_must_be_one_select_before_anything_connects() -> None:
    with pytest.raises(ConfigError, match=r"data\.features_query"):
        data_options(source="sql", url="duckdb:///nowhere.duckdb", entities_table="nodes",
                     relations_table="node_edges", label_col="label",
                     features_query="DELETE FROM node_features")
