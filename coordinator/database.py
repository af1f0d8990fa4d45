"""Opening the coordinator's database: URL, SQLite pragmas, schema version check.

SQLite (the default, one file under the state dir) runs in WAL mode so readers
never block the writer, and every transaction of ``session_factory`` starts
with ``BEGIN IMMEDIATE``: the gRPC server handles requests on several threads,
and a deferred transaction that reads and then writes can fail at once with
"database is locked" when another thread wrote in between; an immediate one
waits (``busy_timeout``). Read-only handlers use ``read_session_factory``
instead: a deferred ``BEGIN`` on a ``query_only`` connection, so a read never
queues behind the write lock (under load that queue, polled by SQLite's busy
handler in sleeps of up to 100 ms, made every read's p99 hundreds of ms), and a
write attempted through it fails loudly instead of racing for the lock.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, select
from sqlalchemy.exc import SAWarning, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator.dburl import masked, missing_driver, scrubbed
from hetero.coordinator.models import SCHEMA_VERSION, Base, SchemaVersion
from hetero.core.errors import HeteroError

#: How long a transaction waits for another thread's write lock, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: Execution option marking a read-only engine (see ``read_session_factory``).
_READ_ONLY = "hetero_read_only"
#: ``Connection.info`` key: this connection holds the process's write lock.
_WRITER = "hetero_writer"
#: Pooled SQLite connections: more than the server's database threads
#: (``asyncserver.DB_THREADS``) plus the daemon's own (ingest, sweeper, pruner, metrics),
#: so no request waits for a connection.
SQLITE_POOL_SIZE = 40


class DatabaseError(HeteroError):
    """The database cannot be opened, or was written by another schema version."""

    grpc_code = "FAILED_PRECONDITION"
    exit_code = 3


def sqlite_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'coordinator.db'}"


def open_database(url: str) -> Engine:
    """Engine for ``url``; creates the schema in an empty database, and raises
    ``DatabaseError`` (one line) for a database of another schema version."""
    try:
        file_sqlite = url.startswith("sqlite:///") and ":memory:" not in url
        pool = {"pool_size": SQLITE_POOL_SIZE, "max_overflow": 8} if file_sqlite else {}
        with warnings.catch_warnings():
            # An argument the driver would ignore (``?password=`` for SQLite) is a mistake
            # to name in one line, not a warning to print beside it.
            warnings.simplefilter("error", SAWarning)
            engine = create_engine(url, **pool)
    except ImportError as exc:  # the dialect's DB-API module is not installed
        raise DatabaseError(missing_driver(url, exc)) from None
    except (SQLAlchemyError, SAWarning, ValueError) as exc:
        raise DatabaseError(
            f"bad database URL {masked(url)!r}: {scrubbed(str(exc), url)}"
        ) from None
    if engine.dialect.name == "sqlite":
        _sqlite_pragmas(engine)
    try:
        _check_or_create_schema(engine, url)
    except SQLAlchemyError as exc:
        engine.dispose()
        first = scrubbed(str(exc).splitlines()[0], url)
        raise DatabaseError(f"cannot open database {masked(url)}: {first}") from None
    except DatabaseError:
        engine.dispose()
        raise
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # Rows are turned into messages after commit; keep their loaded values.
    return sessionmaker(engine, expire_on_commit=False)


def read_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions for handlers that only read: on SQLite a deferred transaction that
    never takes the write lock and cannot write (``PRAGMA query_only``)."""
    return sessionmaker(engine.execution_options(**{_READ_ONLY: True}), expire_on_commit=False)


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook below issue BEGIN itself (pysqlite would
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

    # Writers of this process queue on a lock before BEGIN IMMEDIATE, so the next
    # one starts the moment the last one ends. Left to SQLite, waiters poll the
    # file lock in sleeps growing to 100 ms: under load the lock sat idle between
    # writers, and writes (and the RPC threads waiting on them) piled up.
    write_lock = threading.Lock()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # Connections are pooled and shared by both kinds of session: set query_only
        # every time (outside a transaction, where SQLite allows it).
        if connection.get_execution_options().get(_READ_ONLY):
            connection.exec_driver_sql("PRAGMA query_only=1")
            connection.exec_driver_sql("BEGIN")
            return
        if not write_lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
            raise DatabaseError("database is locked: another write took too long")
        try:
            connection.exec_driver_sql("PRAGMA query_only=0")
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        except BaseException:
            write_lock.release()
            raise
        connection.info[_WRITER] = True

    def _end(connection: Any, statement: str) -> None:
        # End the transaction here, then let the next writer in; pysqlite's own
        # commit()/rollback() that follows finds no transaction and does nothing.
        if not connection.info.pop(_WRITER, False):
            return
        try:
            connection.connection.driver_connection.execute(statement)
        finally:
            write_lock.release()

    @event.listens_for(engine, "commit")
    def _on_commit(connection: Any) -> None:
        _end(connection, "COMMIT")

    @event.listens_for(engine, "rollback")
    def _on_rollback(connection: Any) -> None:
        _end(connection, "ROLLBACK")

    def _abandoned(_dbapi_connection: Any, record: Any, *_args: Any) -> None:
        # A connection invalidated, or returned to the pool, inside a write (the pool
        # rolls it back without the events above): never keep the lock for it.
        if record.info.pop(_WRITER, False):
            write_lock.release()

    event.listen(engine, "checkin", _abandoned)
    event.listen(engine, "invalidate", _abandoned)


def _check_or_create_schema(engine: Engine, url: str) -> None:
    tables = set(inspect(engine).get_table_names())
    if not tables:
        Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            session.add(SchemaVersion(version=SCHEMA_VERSION))
        return
    if SchemaVersion.__tablename__ not in tables:
        raise DatabaseError(
            f"database {masked(url)} is not a hetero coordinator database (no schema_version table)"
        )
    with Session(engine) as session:
        found = session.scalars(select(SchemaVersion.version)).all()
    if list(found) != [SCHEMA_VERSION]:
        have = ", ".join(str(v) for v in found) or "none"
        raise DatabaseError(
            f"database {masked(url)} has schema version {have}, this coordinator needs "
            f"{SCHEMA_VERSION}: use a matching hetero version or a new --state-dir/--db"
        )
