"""A throwaway PostgreSQL server on loopback, for the SQL source's tests and bench/data_load.py.

Standard library only (no GraphVeil): it finds the server binaries (``initdb`` on PATH, else
Debian's /usr/lib/postgresql/<version>/bin, newest first), creates a cluster in a fresh
temporary folder with password (SCRAM) authentication, starts it on a free 127.0.0.1 port (its
unix socket in that folder), creates one database and removes everything on :meth:`stop`.

PostgreSQL refuses to run as root: as root, ``initdb``/``pg_ctl`` run as the unprivileged user
``nobody`` through ``runuser`` and the folder is handed to it.

    with running_server() as pg:
        url = pg.url()            # postgresql+psycopg://graphveil@127.0.0.1:<port>/graph (no password)
        pg.password               # give it through the environment, never in the URL
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

INSTALL_ADVICE = ("install postgresql (Debian: apt-get install postgresql; its binaries land in "
                  "/usr/lib/postgresql/<version>/bin) or put initdb and pg_ctl on PATH")
UNPRIVILEGED_USER = "nobody"


class ServerUnavailable(RuntimeError):
    """No server could be started here; the message says why."""


def find_binaries() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: PATH first, else Debian's newest version."""
    found = shutil.which("initdb")
    candidates = [Path(found).resolve().parent] if found else []

    def version(folder: str) -> tuple[int, ...]:
        part = Path(folder).parent.name
        return tuple(int(x) for x in part.split(".") if x.isdigit()) or (0,)

    candidates += [Path(d) for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)]
    return next((d for d in candidates if (d / "initdb").is_file() and (d / "pg_ctl").is_file()), None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PostgresServer:
    """A running server; :meth:`stop` ends it and deletes its folder."""

    bin_dir: Path
    root: Path
    port: int
    user: str = "graphveil"
    database: str = "graph"
    password: str = field(default_factory=lambda: secrets.token_urlsafe(16), repr=False)
    host: str = "127.0.0.1"
    _as_user: list[str] = field(default_factory=list, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def url(self, driver: str = "psycopg") -> str:
        """SQLAlchemy URL without the password."""
        return f"postgresql+{driver}://{self.user}@{self.host}:{self.port}/{self.database}"

    def conninfo(self) -> str:
        """libpq connection string with the password (for the test's own setup connections)."""
        return (f"host={self.host} port={self.port} user={self.user} dbname={self.database} "
                f"password={self.password}")

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self._as_user, *args], capture_output=True, text=True, timeout=timeout,
                              cwd=self.root, check=False)

    def start(self) -> None:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        self._chown(pwfile)
        init = self._run(str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", self.user,
                         "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C",
                         "--no-sync")
        pwfile.unlink()
        if init.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {(init.stderr or init.stdout).strip()[-800:]}")
        options = (f"-h {self.host} -p {self.port} -k {self.root} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        started = self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l",
                            str(self.root / "server.log"), "-w", "-t", "60", "-o", options, "start")
        if started.returncode != 0:
            log = (self.root / "server.log")
            tail = log.read_text(errors="replace")[-800:] if log.exists() else started.stderr
            raise ServerUnavailable(f"pg_ctl start failed: {tail.strip()}")
        atexit.register(self.stop)
        created = subprocess.run(
            [str(self.bin_dir / "createdb"), "-h", self.host, "-p", str(self.port), "-U", self.user,
             self.database], capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "PGPASSWORD": self.password})
        if created.returncode != 0:
            self.stop()
            raise ServerUnavailable(f"createdb failed: {created.stderr.strip()}")

    def _chown(self, path: Path) -> None:
        if self._as_user:
            entry = pwd.getpwnam(UNPRIVILEGED_USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def stop(self) -> None:
        if not self.root.exists():
            return
        if (self.data_dir / "postmaster.pid").exists():
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate",
                      "-w", "stop", timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)
        atexit.unregister(self.stop)


def start_server(database: str = "graph") -> PostgresServer:
    """Start a server in a fresh temporary folder (the caller stops it).

    :raises ServerUnavailable: binaries not found, or the server did not start (the message
        holds the end of initdb's or the server's log).
    """
    bin_dir = find_binaries()
    if bin_dir is None:
        raise ServerUnavailable(f"PostgreSQL server binaries not found: {INSTALL_ADVICE}")
    as_user: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
        if runuser is None:
            raise ServerUnavailable("running as root and runuser (util-linux) not found: PostgreSQL "
                                    f"must run as an unprivileged user such as {UNPRIVILEGED_USER!r}")
        as_user = [runuser, "-u", UNPRIVILEGED_USER, "--"]
    last: ServerUnavailable | None = None
    for _ in range(3):  # the free port can be taken between finding and binding it
        root = Path(tempfile.mkdtemp(prefix="graphveil-pg-"))
        server = PostgresServer(bin_dir, root, _free_port(), database=database, _as_user=as_user)
        server._chown(root)
        try:
            server.start()
            return server
        except (ServerUnavailable, subprocess.TimeoutExpired) as exc:
            server.stop()
            last = exc if isinstance(exc, ServerUnavailable) else ServerUnavailable(f"timed out: {exc}")
    assert last is not None
    raise last


@contextlib.contextmanager
def running_server(database: str = "graph") -> Iterator[PostgresServer]:
    server = start_server(database)
    try:
        yield server
    finally:
        server.stop()
