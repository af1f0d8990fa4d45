"""A throwaway PostgreSQL server for the ``postgres`` tests: Debian's server binaries,
a cluster made by ``initdb`` in a temporary directory, listening on a Unix socket
there only (no TCP port to collide with), stopped and deleted at the end.

PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres``
user the Debian package creates, and every server command runs through ``runuser``.
With ``HETERO_PG_INSTALL=1`` (``make test-postgres``) a root process installs the
``postgresql`` package with apt-get when no server binaries are found.

The cluster runs with ``fsync=off``: it holds test data only, and the tier shares a
2-core host with the rest of CI.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

#: Where Debian's postgresql-NN packages put initdb and pg_ctl.
BIN_GLOB = "/usr/lib/postgresql/*/bin"
#: Seconds allowed for apt-get (update and install) and for the server to start.
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 60
#: The Unix socket's port number (part of the socket's file name only).
PORT = 5432


class Unavailable(Exception):
    """No PostgreSQL server can run here; the message says why, in one line."""


def _bin_dir() -> Path | None:
    found = sorted(glob.glob(BIN_GLOB), key=lambda p: int(Path(p).parent.name))
    found = [d for d in found if Path(d, "initdb").exists() and Path(d, "pg_ctl").exists()]
    return Path(found[-1]) if found else None


def _install() -> None:
    if os.environ.get("HETERO_PG_INSTALL") != "1":
        raise Unavailable(
            "PostgreSQL server binaries not found under /usr/lib/postgresql "
            "(make test-postgres installs them)"
        )
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise Unavailable("PostgreSQL not installed, and apt-get needs root on a Debian host")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "postgresql"]):
        try:
            done = subprocess.run(
                cmd, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"{' '.join(cmd)} took over {INSTALL_TIMEOUT_S} s") from None
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"{' '.join(cmd)} failed: {last}")


class PgServer:
    """A running cluster; ``url(db)`` is a SQLAlchemy URL of one of its databases."""

    def __init__(self, *, durable: bool = False) -> None:
        """``durable``: PostgreSQL's own settings (fsync, synchronous commits), for
        figures; else fsync off, for tests."""
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise Unavailable("psycopg not installed (pip install 'hetero[postgres]')") from None
        bin_dir = _bin_dir()
        if bin_dir is None:
            _install()
            bin_dir = _bin_dir()
            if bin_dir is None:
                raise Unavailable("the postgresql package installed no server binaries")
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="hetero-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root
        self._as_postgres = os.geteuid() == 0
        self._names = itertools.count(1)
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        try:
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
            )
            options = (
                f"-c listen_addresses='' -c unix_socket_directories={self.socket_dir} "
                f"-c port={PORT} -c max_connections=300"
            )
            if not durable:
                options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            self._run(
                "pg_ctl",
                "-D",
                str(self.data),
                "-l",
                str(self.root / "server.log"),
                "-o",
                options,
                "-w",
                "-t",
                str(START_TIMEOUT_S),
                "start",
            )
        except Unavailable:
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin / tool), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=START_TIMEOUT_S * 2)
        if done.returncode != 0:
            log = self.root / "server.log"
            detail = log.read_text(errors="replace") if log.exists() else done.stderr
            last = (detail.strip().splitlines() or ["no output"])[-1]
            raise Unavailable(f"{tool} failed: {last}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@/{database}?host={self.socket_dir}&port={PORT}"

    def new_database(self) -> str:
        """URL of a new, empty database of its own."""
        import psycopg

        name = f"hetero_test_{next(self._names)}"
        dsn = f"host={self.socket_dir} port={PORT} user=postgres dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def restart(self) -> None:
        """Stop the server (clients' connections drop) and start it again. Not in
        "immediate" mode: with synchronous_commit off that would lose the last commits."""
        log = str(self.root / "server.log")  # else the server keeps pg_ctl's stdout open
        self._run("pg_ctl", "-D", str(self.data), "-l", log, "-m", "fast", "-w", "restart")

    def stop(self) -> None:
        with contextlib.suppress(Unavailable, subprocess.TimeoutExpired):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    # `python tests/integration/pgserver.py`: can a server run here? One line either way
    # (.ci/run asks before it runs the PostgreSQL tier).
    import sys

    try:
        server = PgServer()
    except Unavailable as exc:
        print(f"PostgreSQL unavailable: {exc}")
        sys.exit(1)
    server.stop()
    print(f"PostgreSQL server available ({server.bin.parent.name})")
