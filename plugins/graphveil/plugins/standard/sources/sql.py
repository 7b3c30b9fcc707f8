"""The ``sql`` source: entities and relations from database tables or read-only queries.

Any database SQLAlchemy 2 reaches through a URL: PostgreSQL (``postgresql+psycopg://``, psycopg 3),
SQLite (``sqlite:///graph.db``), DuckDB (``duckdb:///graph.duckdb``, with duckdb-engine). The graph
is the one ``edge_list`` and ``parquet`` build from the same rows, through the same validation
(:func:`~graphveil.data.validate.build_graph`): ids are strings or integers (written out in
decimal), stripped; an empty or null label means unlabelled. Messages name the table (or
"entities query" / "relations query"), the row in the order read and the row's key: the entity
id, or a relation's two ids (``table relations, row 7 (src 'c', dst 'x'): unknown entity id 'x'``).

Row order: an entity table is read ``ORDER BY`` its id column, so the same rows always give the
same graph (a heap scan's order can change between two reads); a query is read in its own order
(give it an ``ORDER BY``). Relations need no order: the graph stores them sorted.

Reads are streamed: each result is fetched ``chunk_rows`` rows at a time (``fetchmany`` of the
DB-API cursor; a named, server-side cursor on PostgreSQL), and each chunk of relations becomes
int64 index pairs before the next is fetched, as the Parquet source does by record batch. A relation
table whose rows would not fit in memory as Python strings therefore still loads.

Read-only: a query must be one ``SELECT`` (or ``WITH … SELECT``) statement, checked before
anything connects by parsing it (sqlglot) in the database's own dialect, so that quotes, escapes
and comments split statements as the server splits them; and everything runs in a read-only
transaction where the database has one (PostgreSQL: SQLAlchemy's ``postgresql_readonly`` option,
so each transaction begins ``READ ONLY``; SQLite's ``PRAGMA query_only``; DuckDB's ``read_only``
connection). DuckDB is opened with external access, extension auto-install and auto-load off and
its configuration locked (:data:`DUCKDB_CONFIG`): a query cannot read files or URLs
(``read_text``, ``read_csv``) or install an extension. The database's own permissions stay the
real guard: give GraphVeil a role that may only read.

Credentials never sit in the run config: a URL holding a password is refused; the password comes
from an environment variable (``password_env``), a file (``password_file``) or, for PostgreSQL,
libpq's own ``PGPASSWORD`` / ``PGPASSFILE`` / ``~/.pgpass``. URLs in messages are rendered with
the password hidden, and a message that would still hold the password has it replaced.

Node graphs: with node features named (``features_col``: an array column, PostgreSQL
``real[]``/``float8[]`` or a DuckDB list; ``feature_cols``; ``features_table`` / ``features_query``:
a sparse long table) and ``label_col``, the entity rows give a node graph for node
classification (:mod:`graphveil.data.node_table`): DuckDB hands its result over as Arrow record
batches; on other databases each fetched chunk becomes Arrow columns (an array cell a list value)
before the next is fetched; the features become one float32 matrix.

SQLAlchemy and sqlglot are imported only here, when a database is read or a query checked
(``pip install graphveil[sql]``).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, Field, model_validator

from graphveil.contract.data_source import DataSource
from graphveil.contract.errors import ConfigError, DataError
from graphveil.data.graph import RelationalGraph
from graphveil.data.node_graph import NodeGraph
from graphveil.data.node_table import (
    FEATURE,
    VALUE,
    NodeColumns,
    arrow_table,
    build_node_graph,
    node_rows,
    sparse_features,
)
from graphveil.data.tables import edge_columns
from graphveil.data.validate import EdgeRecords, EntityRecords, OnUnknown, build_graph
from graphveil.plugins.standard.sources._options import NodeFeatureOptions, check_columns
from graphveil.redaction import is_secret_key, mask_secrets

if TYPE_CHECKING:
    from sqlalchemy.engine import URL, Connection, Engine

log = logging.getLogger(__name__)

#: Rows fetched at a time: bounds the rows held as Python objects at once.
CHUNK_ROWS = 65_536
INSTALL_HINT = "pip install graphveil[sql]"
#: SQLAlchemy backend name -> sqlglot dialect, where they differ (others: the same name, if
#: sqlglot knows it, else sqlglot's generic SQL).
_DIALECTS = {"postgresql": "postgres", "mssql": "tsql"}
#: DuckDB reads files, URLs and extensions from inside a SELECT (``read_text('/etc/passwd')``,
#: ``read_csv('https://…')`` auto-installing httpfs): a connection may read the database's own
#: tables only, and the locked configuration keeps a query from turning any of this back on.
DUCKDB_CONFIG = {"enable_external_access": False, "autoinstall_known_extensions": False,
                 "autoload_known_extensions": False, "lock_configuration": True}
#: sqlglot expressions that write, lock or change the session, anywhere in a query
#: (``WITH d AS (DELETE …) SELECT``, ``SELECT … INTO new_table``, ``SELECT … FOR UPDATE``).
_WRITE_NODES = ("DML", "DDL", "Into", "Drop", "Alter", "TruncateTable", "Command", "Lock", "Set",
                "Pragma", "Attach", "Detach", "Grant", "Revoke", "Transaction", "Commit", "Rollback",
                "Use", "Install", "Export", "LoadData", "Kill")



class SqlOptions(NodeFeatureOptions):
    """Options of the ``sql`` source; never a password (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)  # a refused URL is not echoed

    url: str = Field(description=(
        "SQLAlchemy database URL without a password, e.g. postgresql+psycopg://alice@db:5432/graph, "
        "sqlite:///graph.db, duckdb:///graph.duckdb. A URL holding a password is refused."))
    password_env: str | None = Field(None, min_length=1, description=(
        "Name of the environment variable holding the password (default: none; PostgreSQL then "
        "uses libpq's PGPASSWORD / PGPASSFILE / ~/.pgpass)."))
    password_file: Path | None = Field(None, description="File holding only the password (trailing newline ignored).")
    entities_table: str | None = Field(None, min_length=1, description=(
        "Entity table (schema.table allowed), read ORDER BY id_col; or give entities_query."))
    entities_query: str | None = Field(None, min_length=1, description=(
        "One SELECT giving the entity rows, read in its own order (add an ORDER BY); or give entities_table."))
    relations_table: str | None = Field(None, min_length=1, description=(
        "Relation table: one relation per row, two entity-id columns; or give relations_query."))
    relations_query: str | None = Field(None, min_length=1, description=(
        "One SELECT giving the relation rows; or give relations_table."))
    source_col: str | None = Field(None, min_length=1, description=(
        "Column of the relations holding the first entity id of each relation (set with "
        "target_col). Default: the recognised pair of column names edge_list's header detection "
        "uses (source/target, src/dst, from/to, ...), case-insensitive."))
    target_col: str | None = Field(None, min_length=1, description=(
        "Column of the relations holding the second entity id (set with source_col)."))
    id_col: str = Field("id", min_length=1, description="Column of the entities holding the entity id (strings or integers).")
    text_col: str = Field("text", min_length=1, description="Column of the entities holding the entity text.")
    label_col: str | None = Field(None, min_length=1, description=(
        "Column of the entities holding a class label (empty or null: unlabelled). Default: no labels."))
    features_table: str | None = Field(None, min_length=1, description=(
        "Node graph: a sparse long table of features (schema.table allowed) with the columns "
        "<id_col>, feature (integer index from 0, or names) and value (optional, default 1); or "
        "give features_query."))
    features_query: str | None = Field(None, min_length=1, description=(
        "Node graph: one SELECT giving the sparse feature rows (<id_col>, feature, value); or "
        "give features_table."))
    chunk_rows: int = Field(CHUNK_ROWS, ge=1, description=(
        "Rows fetched at a time (a server-side cursor on PostgreSQL): bounds the rows held in memory."))

    @model_validator(mode="after")
    def _sql(self) -> SqlOptions:
        if self.password_env is not None and self.password_file is not None:
            raise ValueError("give one of data.password_env and data.password_file, not both")
        try:
            check_url(self.url)
            for what in ("entities", "relations"):
                table, query = getattr(self, f"{what}_table"), getattr(self, f"{what}_query")
                if (table is None) == (query is None):
                    raise ValueError(f"give one of data.{what}_table and data.{what}_query")
                if query is not None:
                    check_select(query, f"data.{what}_query", sql_dialect(self.url))
            if self.features_query is not None:
                check_select(self.features_query, "data.features_query", sql_dialect(self.url))
        except ConfigError as exc:  # pydantic reports ValueErrors only
            raise ValueError(str(exc)) from None
        return check_columns(self)


class SqlSource(DataSource):
    """A text-attributed graph from database tables or read-only queries (data.url; SQLAlchemy, streamed)."""

    Params = SqlOptions

    def load(self) -> RelationalGraph | NodeGraph:
        p = self.params
        return load_sql(
            p.url, entities_table=p.entities_table, entities_query=p.entities_query,
            relations_table=p.relations_table, relations_query=p.relations_query,
            source_col=p.source_col, target_col=p.target_col, id_col=p.id_col, text_col=p.text_col,
            label_col=p.label_col, password_env=p.password_env, password_file=p.password_file,
            chunk_rows=p.chunk_rows, option_prefix="data.", nodes=p.node_columns(),
            features_query=p.features_query,
        )


# ------------------------------------------------------------------------------ database

def sqlalchemy() -> Any:
    """The ``sqlalchemy`` module, or a :class:`ConfigError` saying how to install it."""
    try:
        import sqlalchemy as sa
    except ImportError:  # pragma: no cover - the test extra installs it
        raise ConfigError(f"data.source 'sql' needs SQLAlchemy 2: {INSTALL_HINT}") from None
    return sa


# ------------------------------------------------------------------------------ checked before connecting


def redact(url: URL | str) -> str:
    """The URL as it may be printed: no password, secret query keys (``?password=``) hidden.

    A URL given as text is masked (:func:`~graphveil.redaction.mask_secrets`) before SQLAlchemy
    parses it: ``bob:p@ss/w0rd@db`` (a password holding ``@`` and ``/``) parses as the password
    ``p`` and the host ``ss``, and rendering that would show ``@ss/w0rd``."""
    from sqlalchemy.engine import make_url

    url = make_url(mask_secrets(url) if isinstance(url, str) else url)
    hidden = {k: "hidden" for k in url.query if is_secret_key(k)}
    return url._replace(password=None).update_query_dict(hidden).render_as_string()


def check_url(url: str, key: str = "data.url") -> str:
    """Refuse a database URL that is not one, or that holds a password (``key`` names the
    option in messages). The message shows the URL redacted, never the password."""
    sqlalchemy()
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ConfigError(f"{key}: not a database URL (expected e.g. postgresql+psycopg://user@host:5432/db, "
                          f"sqlite:///graph.db or duckdb:///graph.duckdb)") from None
    secrets = [k for k in parsed.query if is_secret_key(k)]
    if parsed.password is not None or secrets:
        where = "a password" if parsed.password is not None else f"the secret parameter {secrets[0]!r}"
        raise ConfigError(
            f"{key} holds {where} ({redact(url)}): credentials never go in the run config; remove it "
            f"and give the password with data.password_env (the name of an environment variable "
            f"holding it) or data.password_file (a file holding only the password), or for PostgreSQL "
            f"with libpq's PGPASSWORD / PGPASSFILE"
        )
    return url


def sql_dialect(url: str) -> str | None:
    """sqlglot's dialect for the database at ``url`` (``None``: sqlglot's generic SQL)."""
    from sqlalchemy.engine import make_url

    backend = make_url(url).get_backend_name()
    return _DIALECTS.get(backend, backend if backend in _sqlglot().Dialect.classes else None)


def _sqlglot() -> Any:
    try:
        import sqlglot
    except ImportError:  # pragma: no cover - the sql and test extras install it
        raise ConfigError(f"data.source 'sql' needs sqlglot to check queries: {INSTALL_HINT}") from None
    return sqlglot


def _label(node: Any) -> str:
    """How a statement or clause is named in messages (``DELETE``, ``EXPLAIN``, ``FOR UPDATE``)."""
    from sqlglot import exp

    if isinstance(node, exp.Command):
        return str(node.this).upper()
    if isinstance(node, exp.Lock):
        return "FOR UPDATE" if node.args.get("update") else "FOR SHARE"
    return {"truncatetable": "TRUNCATE", "setoperation": "SELECT"}.get(node.key, node.key.upper())


def _a(word: str) -> str:
    return f"{'an' if word[:1] in 'AEIOU' else 'a'} {word}"


def check_select(sql: str, key: str, dialect: str | None = None) -> str:
    """Refuse anything but one read-only ``SELECT`` (or ``WITH … SELECT``, ``UNION`` …) statement.

    The query is parsed by sqlglot in the database's own ``dialect`` (:func:`sql_dialect`), so
    string literals, escapes (PostgreSQL's ``E'\\''``), dollar quoting and comments split
    statements as the server splits them: exactly one statement, a query, and no clause of it
    that writes or locks (``WITH d AS (DELETE …)``, ``SELECT … INTO``, ``FOR UPDATE``). The
    read-only transaction of :func:`read_only` stays behind it.
    """
    sqlglot = _sqlglot()
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    quiet = logging.getLogger("sqlglot")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # not "falling back to parsing as a Command": refused below
    try:
        parsed = sqlglot.parse(sql, dialect=dialect)
    except SqlglotError as exc:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{key}: not a query GraphVeil can read ({detail})") from None
    finally:
        quiet.setLevel(level)
    statements = [s for s in parsed if s is not None and not isinstance(s, exp.Semicolon)]
    if not statements:
        raise ConfigError(f"{key}: empty query")
    if len(statements) > 1:
        raise ConfigError(f"{key}: only one SELECT statement is run; found {len(statements)} "
                          f"({', '.join(_label(s) for s in statements)})")
    (statement,) = statements
    if not isinstance(statement, exp.Query):
        raise ConfigError(f"{key}: only a SELECT query is run (read-only); got {_a(_label(statement))} statement")
    kinds = tuple(getattr(exp, name) for name in _WRITE_NODES)
    writes = [node for node in statement.walk() if isinstance(node, kinds)]
    if writes:
        what = "would lock rows" if isinstance(writes[0], exp.Lock) else "would write"
        raise ConfigError(f"{key}: only a read-only SELECT query is run; {_label(writes[0])} {what}")
    return sql


# ------------------------------------------------------------------------------ connecting


def read_password(password_env: str | None, password_file: Path | None) -> str | None:
    """The password from the environment variable or the file named (``None``: neither, so
    the driver's own sources apply, e.g. libpq's PGPASSWORD / PGPASSFILE)."""
    if password_env is not None:
        value = os.environ.get(password_env)
        if not value:
            raise DataError(f"data.password_env: the environment variable {password_env!r} is "
                            f"{'empty' if value == '' else 'not set'}")
        return value
    if password_file is not None:
        path = Path(password_file)
        try:
            value = path.read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataError(f"data.password_file: cannot read {path} ({type(exc).__name__})") from None
        if not value:
            raise DataError(f"data.password_file: {path} is empty")
        if os.name == "posix" and path.stat().st_mode & 0o077:
            log.warning("data.password_file: %s can be read by other users (chmod 600 it)", path)
        return value
    return None


def _scrub(message: str, password: str | None) -> str:
    message = message.strip().splitlines()[0] if message.strip() else message
    return message.replace(password, "***") if password else message


def _driver_hint(url: URL) -> str:
    hints = {"postgresql": INSTALL_HINT, "duckdb": "pip install duckdb-engine"}
    return hints.get(url.get_backend_name(), "install the database's SQLAlchemy driver")


def _engine(url_text: str, password: str | None) -> Engine:
    sa = sqlalchemy()
    from sqlalchemy.exc import NoSuchModuleError
    from sqlalchemy.pool import NullPool

    url = sa.make_url(url_text)
    if password is not None:
        url = url.set(password=password)
    connect_args: dict[str, Any] = {}
    if url.get_backend_name() == "duckdb":
        connect_args["config"] = dict(DUCKDB_CONFIG)
        if url.database not in (None, "", ":memory:"):
            connect_args["read_only"] = True
    try:
        engine = sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)
    except (NoSuchModuleError, ImportError) as exc:
        raise DataError(f"{redact(url)}: no SQLAlchemy driver for it ({_scrub(str(exc), password)}); "
                        f"{_driver_hint(url)}") from None
    if engine.dialect.name == "sqlite":
        # SQLite has no read-only transaction; query_only makes the connection refuse writes.
        sa.event.listen(engine, "connect", lambda dbapi, _: dbapi.execute("PRAGMA query_only = ON"))
    return engine


@contextmanager
def read_only(engine: Engine, password: str | None = None) -> Iterator[Connection]:
    """A connection in a read-only transaction where the dialect has one; database errors
    become :class:`DataError` naming the redacted URL (the password scrubbed from the message)."""
    from sqlalchemy.exc import SQLAlchemyError

    where = redact(engine.url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":  # every transaction begins READ ONLY
                conn = conn.execution_options(postgresql_readonly=True)
            with conn.begin():
                yield conn
    except (SQLAlchemyError, engine.dialect.loaded_dbapi.Error) as exc:  # rows come from the DB-API cursor
        detail = _scrub(str(getattr(exc, "orig", None) or exc), password)
        if engine.dialect.name == "duckdb" and "disabled by configuration" in detail:
            detail += (" (GraphVeil opens DuckDB with external access, extension install and load off: "
                       "a query reads the database's own tables only)")
        raise DataError(f"{where}: {detail}") from None
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ reading


class _Rows:
    """One table or query of the database: its name in messages, and how its rows are read."""

    def __init__(self, conn: Connection, label: str, table: str | None, query: str | None) -> None:
        self.conn, self.label, self.table, self.query = conn, label, table, query

    @property
    def source(self) -> str:
        return f"table {self.table}" if self.table else f"{self.label} query"

    def _from(self) -> Any:
        sa = sqlalchemy()
        if self.table:
            schema, _, name = self.table.rpartition(".")
            return sa.table(name, schema=schema or None)
        return sa.text(f"({_literal(self.query)}\n) AS graphveil_query")  # \n: ends a trailing -- comment

    def columns(self) -> list[str]:
        """The column names of the table or query (nothing is fetched)."""
        sa = sqlalchemy()
        with self.conn.execute(sa.select(sa.text("*")).select_from(self._from()).limit(0)) as result:
            return list(result.keys())

    def stream(self, wanted: list[str], chunk_rows: int, order_by: str | None = None) -> Iterator[tuple[int, list[Any]]]:
        """``(first row, rows of the wanted columns)``, rows counted from 1, ``chunk_rows`` at a
        time. A table is read with only these columns (ordered by ``order_by``); a query as written.

        The rows come straight from the DB-API cursor of the connection's read-only transaction
        (plain tuples: a SQLAlchemy Row per row would cost more than the rest of the load), a
        named, server-side cursor on PostgreSQL so that only one chunk is ever on the client."""
        cursor = self._cursor()
        try:
            cursor.execute(self._select(wanted, order_by))
            keys = [d[0] for d in cursor.description]
            pick = None if keys == wanted else [keys.index(c) for c in wanted]
            row = 1
            while part := cursor.fetchmany(chunk_rows):
                yield row, part if pick is None else [tuple(r[i] for i in pick) for r in part]
                row += len(part)
        finally:
            cursor.close()

    def _select(self, wanted: list[str], order_by: str | None) -> str:
        if not self.table:
            return self.query
        sa = sqlalchemy()
        stmt = sa.select(*[sa.column(c) for c in wanted]).select_from(self._from())
        if order_by is not None:
            stmt = stmt.order_by(sa.column(order_by))
        return str(stmt.compile(dialect=self.conn.dialect))

    def _cursor(self) -> Any:
        raw = self.conn.connection.dbapi_connection
        return raw.cursor(name="graphveil_rows") if self.conn.dialect.name == "postgresql" else raw.cursor()

    def arrow(self, wanted: list[str], chunk_rows: int, order_by: str | None = None) -> Any:
        """The wanted columns as one Arrow table, read as :meth:`stream` reads them. DuckDB hands
        its result over as Arrow record batches (no Python object per value); other databases'
        fetched chunks become Arrow columns as they arrive (:func:`~graphveil.data.node_table.arrow_table`)."""
        if self.conn.dialect.name != "duckdb":
            return arrow_table((part for _, part in self.stream(wanted, chunk_rows, order_by)), wanted, self.source)
        import pyarrow as pa

        cursor = self._cursor()
        try:
            cursor.execute(self._select(wanted, order_by))
            with warnings.catch_warnings():  # "an extra copy of the rows": one batch at a time
                warnings.simplefilter("ignore", UserWarning)
                reader = cursor.to_arrow_reader(chunk_rows)
            return pa.Table.from_batches(list(reader), schema=reader.schema).select(wanted)
        finally:
            cursor.close()


def _literal(query: str) -> str:
    """A query for ``sqlalchemy.text``: single colons escaped (no bind parameters; ``::`` casts
    stay), a final ``;`` dropped (the query also runs as a subquery)."""
    return re.sub(r"(?<!:):(?!:)", r"\\:", re.sub(r";\s*$", "", query.strip()))


def _column(names: list[str], name: str, source: str, option: str, prefix: str) -> str:
    if name not in names:
        raise DataError(f"{source}: no column {name!r} (columns: {', '.join(names)}); "
                        f"set {prefix}{option} to the right one")
    return name


def _id(value: Any, name: str, source: str, row: int, *, nulls: bool = False) -> str | None:
    """An id (or label) cell as a stripped string: strings, integers in decimal."""
    if type(value) is str:
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if value is None:
        if nulls:
            return None
        raise DataError(f"{source}, row {row}: column {name!r} is null")
    raise DataError(f"{source}, row {row}: column {name!r} holds {type(value).__name__}, not a string "
                    f"or an integer (cast it in a query, e.g. CAST({name} AS TEXT))")


def _ids(values: Sequence[Any], name: str, source: str, first_row: int) -> list[str]:
    try:  # the common case: every cell a string
        return [v.strip() for v in values]
    except (AttributeError, TypeError):
        return [_id(v, name, source, first_row + k) for k, v in enumerate(values)]


def read_sql_entities(rows: _Rows, *, id_col: str, text_col: str, label_col: str | None,
                      chunk_rows: int, option_prefix: str = "") -> EntityRecords:
    """The entity rows: ids, texts (a null or non-string is refused by the validation as "no
    text") and optional labels; a table is read in id order."""
    p, source = option_prefix, rows.source
    names = rows.columns()
    wanted = [_column(names, id_col, source, "id_col", p), _column(names, text_col, source, "text_col", p)]
    if label_col:
        wanted.append(_column(names, label_col, source, "label_col", p))
    ids: list[str] = []
    texts: list[Any] = []
    labels: list[str | None] = []
    for first, part in rows.stream(wanted, chunk_rows, order_by=id_col):
        columns = list(zip(*part, strict=True))
        ids.extend(_ids(columns[0], id_col, source, first))
        texts.extend(columns[1])
        if label_col:
            labels.extend(_id(v, label_col, source, first + k, nulls=True) or None
                          for k, v in enumerate(columns[2]))
    if not ids:
        raise DataError(f"{source}: no entities")
    return EntityRecords(source, ids, range(1, len(ids) + 1), texts, labels if label_col else None, "row")


def read_sql_edges(rows: _Rows, *, source_col: str | None, target_col: str | None, chunk_rows: int,
                   option_prefix: str = "") -> Iterator[EdgeRecords]:
    """The relation rows as chunks of :class:`EdgeRecords` (rows numbered across the result, a
    relation named by its two ids in messages). The columns are checked before the first chunk."""
    p, source = option_prefix, rows.source
    names = rows.columns()
    s, t = edge_columns(names, source, source_col, target_col, p)
    _column(names, s, source, "source_col", p)
    _column(names, t, source, "target_col", p)

    def chunks() -> Iterator[EdgeRecords]:
        empty = True
        for first, part in rows.stream([s, t], chunk_rows):
            empty = False
            a, b = zip(*part, strict=True)
            pairs = list(zip(_ids(a, s, source, first), _ids(b, t, source, first), strict=True))
            yield EdgeRecords(source, pairs, range(first, first + len(part)), "row", columns=(s, t))
        if empty:
            raise DataError(f"{source}: no edges")

    return chunks()


def load_sql(
    url: str,
    *,
    entities_table: str | None = None,
    entities_query: str | None = None,
    relations_table: str | None = None,
    relations_query: str | None = None,
    source_col: str | None = None,
    target_col: str | None = None,
    id_col: str = "id",
    text_col: str = "text",
    label_col: str | None = None,
    password_env: str | None = None,
    password_file: str | os.PathLike[str] | None = None,
    chunk_rows: int = CHUNK_ROWS,
    on_unknown: OnUnknown = "error",
    name: str | None = None,
    option_prefix: str = "",
    nodes: NodeColumns | None = None,
    features_query: str | None = None,
) -> RelationalGraph | NodeGraph:
    """A text-attributed graph from an entity table (or query) and a relation table (or query)
    of the database at ``url`` (the ``sql`` source); columns and result as
    :func:`~graphveil.plugins.standard.sources.edge_list.load_edge_list`. Give exactly one of ``entities_table`` /
    ``entities_query`` and one of ``relations_table`` / ``relations_query``.

    With ``nodes`` (node features and labels; a sparse table named by ``nodes.features_table``
    or given by ``features_query``) the result is a node graph (:func:`read_sql_nodes`).

    :raises ConfigError: a URL holding a password, a query that is not one SELECT.
    :raises DataError: the database cannot be reached or read, or the rows fail the validation.
    """
    check_url(url)
    for what, table, query in (("entities", entities_table, entities_query),
                               ("relations", relations_table, relations_query)):
        if (table is None) == (query is None):
            raise ConfigError(f"give one of {option_prefix}{what}_table and {option_prefix}{what}_query")
        if query is not None:
            check_select(query, f"{option_prefix}{what}_query", sql_dialect(url))
    password = read_password(password_env, None if password_file is None else Path(password_file))
    engine = _engine(url, password)
    log.info("reading the graph from %s", redact(engine.url))
    if features_query is not None:
        check_select(features_query, f"{option_prefix}features_query", sql_dialect(url))
    with read_only(engine, password) as conn:
        relations = _Rows(conn, "relations", relations_table, relations_query)
        chunks = read_sql_edges(relations, source_col=source_col, target_col=target_col,
                                chunk_rows=chunk_rows, option_prefix=option_prefix)
        default = relations_table.rpartition(".")[2] if relations_table else _database_name(engine.url)
        entity_rows = _Rows(conn, "entities", entities_table, entities_query)
        if nodes is not None:
            sparse = None
            if nodes.features_table is not None or features_query is not None:
                table = None if features_query is not None else nodes.features_table
                sparse = _Rows(conn, "features", table, features_query)
            return build_node_graph(name or default, read_sql_nodes(entity_rows, nodes, chunk_rows, sparse),
                                    chunks)
        entities = read_sql_entities(
            entity_rows, id_col=id_col, text_col=text_col,
            label_col=label_col, chunk_rows=chunk_rows, option_prefix=option_prefix)
        return build_graph(name or default, entities, chunks, on_unknown=on_unknown,
                           edge_source=relations.source)


def read_sql_nodes(rows: _Rows, columns: NodeColumns, chunk_rows: int, sparse: _Rows | None = None) -> Any:
    """The node rows (ids, labels, features; a table in id order) as :class:`NodeRows`, the
    features from the ``sparse`` long table or query when given."""
    wanted = columns.entity_columns(rows.columns(), rows.source)
    nodes = node_rows(rows.arrow(wanted, chunk_rows, order_by=columns.id_col), columns, rows.source)
    if sparse is not None:
        names = sparse.columns()
        wanted = [c for c in (columns.id_col, FEATURE, VALUE) if c in names]
        nodes.x = sparse_features(sparse.arrow(wanted, chunk_rows), columns, nodes.ids, sparse.source)
    return nodes


def _database_name(url: URL) -> str:
    return Path(url.database).stem if url.database else url.get_backend_name()

