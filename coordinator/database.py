"""Opening the coordinator's database: URL, connection set-up, one writer at a time.

SQLite (the default, one file under the state dir) and PostgreSQL are supported
(any other SQLAlchemy URL is tried as is). The store's functions read and then
write in one transaction, and were written for writers that run one after
another: a process's writers queue on a lock of the process before their
transaction starts, on every database, and the writers of hetero's processes
(the coordinator and its report worker, ``hetero-bench load``'s writer,
``hetero-coord db``) on a lock of the database's. On PostgreSQL that is a
transaction-scoped advisory lock (:data:`WRITERS_LOCK_KEY`), the first statement
of every write transaction, let go by the server at its COMMIT or ROLLBACK: each
write transaction sees every earlier one committed (READ COMMITTED would
otherwise let two of them read the same row and both act on it) without
SERIALIZABLE's retries.

SQLite runs in WAL mode so readers never block the writer, and every write
transaction starts with ``BEGIN IMMEDIATE``: the gRPC server handles requests
on several threads, and a deferred transaction that reads and then writes can
fail at once with "database is locked" when another thread wrote in between; an
immediate one waits. The lock of the database's is an exclusive ``flock`` on a
file beside it (``writelock``), taken between the thread lock and ``BEGIN
IMMEDIATE``, whose waiter the kernel wakes when the holder commits; SQLite's own
busy handler (``busy_timeout``) is left the writers that do not take it. Read-only
handlers use
``read_session_factory`` instead: a transaction that never takes the write lock
and cannot write (SQLite: a deferred ``BEGIN`` on a ``query_only`` connection;
PostgreSQL: ``SET TRANSACTION READ ONLY``), so a read never queues behind the
writers (under load that queue, polled by SQLite's busy handler in sleeps of up
to 100 ms, made every read's p99 hundreds of ms), and a write attempted through
it fails loudly instead of racing for the lock.

The schema is Alembic's (``schema.upgrade_to_head``): a new database is created,
an older one upgraded, on open. Every message shows the URL with its password
masked, and a URL whose driver is not installed is one line naming the package
(``dburl``).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import SAWarning, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator.dburl import masked, missing_driver, scrubbed
from hetero.coordinator.writelock import SUFFIX, FileWriteLock
from hetero.core.errors import HeteroError

#: How long a write transaction waits for the process's write lock, and on SQLite for
#: the file's when a writer that takes no lock file holds it (``busy_timeout``), in
#: milliseconds. The wait for the lock file has no bound of its own (``writelock``).
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: PostgreSQL: the advisory lock every write transaction of hetero's takes first, so the
#: writers of several processes run one after another: the bytes ``hetero.w`` read as
#: a big-endian integer. Advisory locks are the database's own: two hetero databases
#: of one server never wait for each other.
WRITERS_LOCK_KEY = 0x68657465726F2E77
#: Execution option marking a read-only engine (see ``read_session_factory``).
_READ_ONLY = "hetero_read_only"
#: ``Connection.info`` key: this connection holds the process's write lock.
_WRITER = "hetero_writer"
#: Pooled connections (SQLite file or database server): more than the server's
#: database threads (``asyncserver.DB_THREADS``) plus the daemon's own (ingest,
#: sweeper, pruner, metrics), so no request waits for a connection.
POOL_SIZE = 40


class DatabaseError(HeteroError):
    """The database cannot be opened, or was written by another schema version."""

    grpc_code = "FAILED_PRECONDITION"
    exit_code = 3


def sqlite_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'coordinator.db'}"


def open_database(url: str) -> Engine:
    """Engine for ``url``, its schema created or upgraded to this version's
    (``schema.upgrade_to_head``); raises ``DatabaseError`` (one line) for a database
    it cannot open or upgrade."""
    from hetero.coordinator.schema import upgrade_to_head

    engine = connect(url)
    try:
        upgrade_to_head(engine)
    except SQLAlchemyError as exc:
        engine.dispose()
        first = scrubbed(str(exc).splitlines()[0], url)
        raise DatabaseError(f"cannot open database {masked(url)}: {first}") from None
    except DatabaseError:
        engine.dispose()
        raise
    return engine


def connect(url: str) -> Engine:
    """Engine for ``url`` with the connection set-up and writer lock of this module,
    its schema untouched."""
    try:
        parsed = make_url(url)
        if parsed.drivername in ("postgresql", "postgres"):
            # SQLAlchemy's default PostgreSQL driver is psycopg2; hetero's extra installs
            # psycopg (3), so a URL that names no driver gets that one.
            parsed = parsed.set(drivername="postgresql+psycopg")
        in_memory = url.startswith("sqlite") and (":memory:" in url or url.endswith("://"))
        pool: dict[str, Any] = {} if in_memory else {"pool_size": POOL_SIZE, "max_overflow": 8}
        if parsed.get_backend_name() != "sqlite":
            # A database server restarts, fails over or drops idle connections: a
            # connection is checked (a round trip) before each use, so after a restart
            # no request fails on a connection the pool still held.
            pool["pool_pre_ping"] = True
        with warnings.catch_warnings():
            # An argument the driver would ignore (``?password=`` for SQLite) is a mistake
            # to name in one line, not a warning to print beside it.
            warnings.simplefilter("error", SAWarning)
            engine = create_engine(parsed, **pool)
    except ImportError as exc:  # the dialect's DB-API module is not installed
        raise DatabaseError(missing_driver(url, exc)) from None
    except (SQLAlchemyError, SAWarning, ValueError) as exc:
        raise DatabaseError(
            f"bad database URL {masked(url)!r}: {scrubbed(str(exc), url)}"
        ) from None
    if engine.dialect.name == "sqlite":
        _sqlite_pragmas(engine)
        file = _sqlite_file(engine)
        lock = FileWriteLock(Path(file + SUFFIX)) if file is not None else None
        _one_writer(engine, _sqlite_begin, _sqlite_end, lock)
    elif engine.dialect.name == "postgresql":
        _one_writer(engine, _postgres_begin, _postgres_end)
    return engine


def writers_take_turns_across_processes(engine: Engine) -> bool:
    """Whether another process can open ``engine``'s database and write it one writer at
    a time with this one: a SQLite file (``BEGIN IMMEDIATE`` takes the file's lock, and
    hetero's writers queue on the lock file first) or PostgreSQL (hetero's writers take
    :data:`WRITERS_LOCK_KEY`). Not an in-memory SQLite database, which no other
    process can open."""
    if engine.dialect.name == "sqlite":
        return _sqlite_file(engine) is not None
    return engine.dialect.name == "postgresql"


def _sqlite_file(engine: Engine) -> str | None:
    """The path of a SQLite engine's database file; None for an in-memory database (or a
    URI filename, ``file:``, which SQLite resolves)."""
    database = engine.url.database
    if database in (None, "", ":memory:") or database.startswith("file:"):
        return None
    return database


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # Rows are turned into messages after commit; keep their loaded values.
    return sessionmaker(engine, expire_on_commit=False)


def read_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions for handlers that only read: a transaction that never takes the write
    lock and cannot write (SQLite: deferred, ``PRAGMA query_only``; PostgreSQL:
    ``READ ONLY``)."""
    return sessionmaker(engine.execution_options(**{_READ_ONLY: True}), expire_on_commit=False)


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook issue BEGIN itself (pysqlite would
        # otherwise start deferred transactions on its own).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL syncs at checkpoints, not at every commit: a killed
        # coordinator loses nothing (committed pages are in the WAL file); only an
        # OS crash or power loss can drop the last commits. That keeps a stats
        # report, which the trainers wait on, off the disk's fsync latency.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()


def _sqlite_begin(connection: Any, read_only: bool) -> None:
    # Connections are pooled and shared by both kinds of session: set query_only
    # every time (outside a transaction, where SQLite allows it).
    connection.exec_driver_sql(f"PRAGMA query_only={int(read_only)}")
    connection.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def _sqlite_end(connection: Any, commit: bool) -> None:
    # pysqlite's own commit()/rollback() that follows finds no transaction and does nothing.
    connection.connection.driver_connection.execute("COMMIT" if commit else "ROLLBACK")


def _postgres_begin(connection: Any, read_only: bool) -> None:
    # psycopg opens the transaction at the first statement: this one. A writer waits in
    # the server for the writers of other processes (no bound of its own, as for
    # SQLite's lock file, ``writelock``: the holders are hetero's short transactions,
    # and the server lets go of the lock when the holder's session ends).
    if read_only:
        connection.exec_driver_sql("SET TRANSACTION READ ONLY")
    else:
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({WRITERS_LOCK_KEY})")


def _postgres_end(connection: Any, commit: bool) -> None:
    # psycopg's commit()/rollback() that follows finds no transaction and does nothing.
    driver = connection.connection.driver_connection
    driver.commit() if commit else driver.rollback()


def _one_writer(
    engine: Engine,
    begin: Callable[[Any, bool], None],
    end: Callable[[Any, bool], None],
    file_lock: FileWriteLock | None = None,
) -> None:
    """Writers of this process queue on a lock before their transaction begins, and
    the next one starts the moment the last one's commit or rollback is done.
    ``begin(connection, read_only)`` starts a transaction; ``end(connection, commit)``
    ends a write transaction on the driver's connection, before the lock is let go.
    ``file_lock`` (a SQLite file) is taken after the process's lock and let go before
    it: the writers of hetero's other processes on that file queue on it too.

    On SQLite this also replaces its own waiting: left to SQLite, waiters poll the
    file lock in sleeps growing to 100 ms, and under load the lock sat idle between
    writers while writes (and the RPC threads waiting on them) piled up."""
    write_lock = threading.Lock()

    def _let_go() -> None:
        try:
            if file_lock is not None:
                file_lock.release()
        finally:
            write_lock.release()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        if connection.get_execution_options().get(_READ_ONLY):
            begin(connection, True)
            return
        if not write_lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
            raise DatabaseError("database is locked: another write took too long")
        try:
            if file_lock is not None:
                file_lock.acquire()
            begin(connection, False)
        except BaseException:
            _let_go()
            raise
        connection.info[_WRITER] = True

    def _end(connection: Any, commit: bool) -> None:
        if not connection.info.pop(_WRITER, False):
            return
        try:
            end(connection, commit)
        finally:
            _let_go()

    @event.listens_for(engine, "commit")
    def _on_commit(connection: Any) -> None:
        _end(connection, True)

    @event.listens_for(engine, "rollback")
    def _on_rollback(connection: Any) -> None:
        _end(connection, False)

    def _abandoned(_dbapi_connection: Any, record: Any, *_args: Any) -> None:
        # A connection invalidated, or returned to the pool, inside a write (the pool
        # rolls it back without the events above): never keep the lock for it.
        if record.info.pop(_WRITER, False):
            _let_go()

    event.listen(engine, "checkin", _abandoned)
    event.listen(engine, "invalidate", _abandoned)
