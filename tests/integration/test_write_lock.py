"""The write lock hetero's processes share on a database (``coordinator.writelock``,
``database``): a write waits for another process's write transaction on the
lock file, woken by the kernel, not in SQLite's busy handler, and then sees that
write committed; a lock file that cannot be made leaves the waiting to SQLite and
fails no write. On PostgreSQL the writers of two processes take turns on an
advisory lock. The other process is a real one (``workers/db_writer.py``)
writing through hetero's engine."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pgserver import PgServer  # beside this file (conftest puts it on sys.path)
from sqlalchemy import event, text
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator.database import (
    WRITERS_LOCK_KEY,
    connect,
    read_session_factory,
    session_factory,
)

WORKER = Path(__file__).parent / "workers" / "db_writer.py"
#: Seconds to wait for an event the test needs before failing (never an assertion on time).
DEADLINE_S = 60.0


@dataclass
class Holder:
    """A ``db_writer.py hold`` process inside its write transaction."""

    proc: subprocess.Popen[str]
    #: Its PostgreSQL backend's pid (0 on SQLite).
    backend: int

    def commit(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "committed\n"


@contextmanager
def _holding(url: str) -> Iterator[Holder]:
    """Another process, holding a write transaction on ``url`` that added one to the
    counter, until ``commit``; it exits at the end."""
    proc = subprocess.Popen(
        [sys.executable, str(WORKER), "hold", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line.startswith("holding "), f"the holder did not start: {line!r}"
        yield Holder(proc, int(line.split()[1]))
        proc.stdin.close()
        assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _make_counter(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        s.execute(text("CREATE TABLE counter (n INTEGER)"))
        s.execute(text("INSERT INTO counter VALUES (0)"))


def _count(sessions: sessionmaker[Session]) -> int:
    with sessions.begin() as s:
        return int(s.execute(text("SELECT n FROM counter")).scalar_one())


class _Bump(threading.Thread):
    """One write through ``sessions`` that adds one to the counter (read, then write)."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        super().__init__(daemon=True)
        self.sessions = sessions
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.sessions.begin() as s:
                n = s.execute(text("SELECT n FROM counter")).scalar_one()
                s.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
        except BaseException as exc:
            self.error = exc


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _flock_waiters(holder: int) -> set[int]:
    """Processes blocked on a ``flock`` that process ``holder`` holds (``/proc/locks``:
    ``1: FLOCK ADVISORY WRITE PID DEV:INODE 0 EOF``, a waiter's with ``->`` after the
    number)."""
    lines = [line.split() for line in Path("/proc/locks").read_text().splitlines()]
    held = {f[5] for f in lines if f[1] == "FLOCK" and f[4] == str(holder)}
    return {int(f[5]) for f in lines if f[1:3] == ["->", "FLOCK"] and f[6] in held}


def test_a_write_waits_for_another_processes_on_the_lock_file_not_in_sqlites_handler(
    tmp_path: Path,
) -> None:
    """SQLite's busy handler is off here (``busy_timeout=0``: a ``BEGIN IMMEDIATE`` that
    finds the write lock taken fails at once), yet the write made while the other
    process holds the lock waits, blocked on the lock file, and completes after the
    other's commit, counting on top of it."""
    path = tmp_path / "coordinator.db"
    url = f"sqlite:///{path}"
    engine = connect(url)

    @event.listens_for(engine, "connect")
    def _no_busy_wait(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout=0")  # after hetero's own set-up

    sessions = session_factory(engine)
    _make_counter(sessions)
    with _holding(url) as holder:
        # It holds SQLite's write lock: a writer that takes no lock file fails at once.
        control = sqlite3.connect(path, timeout=0, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="database is locked"):
            control.execute("BEGIN IMMEDIATE")
        control.close()
        bump = _Bump(sessions)
        bump.start()
        _wait_for(
            lambda: os.getpid() in _flock_waiters(holder.proc.pid) or not bump.is_alive(),
            "the write neither waited on the other process's lock file nor ended",
        )
        assert bump.is_alive(), f"the write ended while the other held the lock: {bump.error}"
        holder.commit()
        bump.join(DEADLINE_S)
        assert not bump.is_alive()
    assert bump.error is None, f"the write did not wait on the lock file: {bump.error}"
    assert _count(sessions) == 2
    engine.dispose()


def _without_dac_override() -> list[str]:
    """A command prefix under which a read-only directory is read-only to this user: none
    for a user; for root, ``setpriv`` dropping the capability that ignores it."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root ignores a read-only directory, and setpriv is not installed")
    caps = "-dac_override,-dac_read_search"
    return ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}"]


def test_a_read_only_directory_leaves_the_waiting_to_sqlite_with_one_log_line(
    tmp_path: Path,
) -> None:
    """A process that cannot create the lock file (the database's directory is
    read-only; the database, its WAL and shared-memory files are writable) still
    writes, waiting in SQLite's busy handler, and says so once."""
    state = tmp_path / "state"
    state.mkdir()
    path = state / "coordinator.db"
    url = f"sqlite:///{path}"
    engine = connect(url)
    sessions = session_factory(engine)
    _make_counter(sessions)  # its pooled connection keeps the WAL files while the other writes
    lock_file = Path(f"{path}.writelock")
    lock_file.unlink()
    prefix = _without_dac_override()
    state.chmod(0o555)
    try:
        done = subprocess.run(
            [*prefix, sys.executable, str(WORKER), "bump", url, "2"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
        )
    finally:
        state.chmod(0o755)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stderr.count("cannot lock") == 1, done.stderr
    assert f"cannot lock {lock_file} (Permission denied)" in done.stderr
    assert not lock_file.exists()
    assert _count(sessions) == 2
    engine.dispose()


def _advisory_waiters(readers: sessionmaker[Session], holder: int) -> list[int]:
    """Backends waiting for hetero's writers' advisory lock while backend ``holder`` holds
    it (``pg_locks``: a bigint key is ``classid`` its high 32 bits, ``objid`` its low)."""
    key = {"hi": WRITERS_LOCK_KEY >> 32, "lo": WRITERS_LOCK_KEY & 0xFFFFFFFF, "holder": holder}
    query = text(
        "SELECT w.pid FROM pg_locks w JOIN pg_locks h"
        " ON h.locktype = 'advisory' AND h.granted AND h.pid = :holder"
        " AND (h.classid, h.objid, h.objsubid) = (w.classid, w.objid, w.objsubid)"
        " WHERE w.locktype = 'advisory' AND NOT w.granted"
        " AND w.classid = :hi AND w.objid = :lo AND w.objsubid = 1"
    )
    with readers() as s:
        return list(s.execute(query, key).scalars())


@pytest.mark.postgres
def test_writes_of_two_processes_take_turns_on_postgresql(pg_server: PgServer) -> None:
    """A write made while another process's write transaction is open waits for it on
    hetero's advisory lock, then reads what it committed. Without the lock, READ
    COMMITTED would let it read the counter before the other's commit and store 1."""
    url = pg_server.new_database()
    engine = connect(url)
    sessions, readers = session_factory(engine), read_session_factory(engine)
    _make_counter(sessions)
    with _holding(url) as holder:
        bump = _Bump(sessions)
        bump.start()
        _wait_for(
            lambda: bool(_advisory_waiters(readers, holder.backend)) or not bump.is_alive(),
            "the write neither waited on the advisory lock nor ended",
        )
        assert bump.is_alive(), f"the write ended while the other held the lock: {bump.error}"
        holder.commit()
        bump.join(DEADLINE_S)
        assert not bump.is_alive()
    assert bump.error is None
    assert _count(sessions) == 2
    engine.dispose()
