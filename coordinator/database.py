"""Opening the coordinator's database: URL, SQLite pragmas, schema version check.

SQLite (the default, one file under the state dir) runs in WAL mode so readers
never block the writer, and every transaction starts with ``BEGIN IMMEDIATE``:
the gRPC server handles requests on several threads, and a deferred transaction
that reads and then writes can fail at once with "database is locked" when
another thread wrote in between; an immediate one waits (``busy_timeout``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, inspect, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator.models import SCHEMA_VERSION, Base, SchemaVersion
from hetero.errors import HeteroError

#: How long a transaction waits for another thread's write lock, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 10_000


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
        engine = create_engine(url)
    except (SQLAlchemyError, ValueError) as exc:
        raise DatabaseError(f"bad database URL {url!r}: {exc}") from None
    if engine.dialect.name == "sqlite":
        _sqlite_pragmas(engine)
    try:
        _check_or_create_schema(engine, url)
    except SQLAlchemyError as exc:
        engine.dispose()
        first = str(exc).splitlines()[0]
        raise DatabaseError(f"cannot open database {url}: {first}") from None
    except DatabaseError:
        engine.dispose()
        raise
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # Rows are turned into messages after commit; keep their loaded values.
    return sessionmaker(engine, expire_on_commit=False)


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

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _check_or_create_schema(engine: Engine, url: str) -> None:
    tables = set(inspect(engine).get_table_names())
    if not tables:
        Base.metadata.create_all(engine)
        with Session(engine) as session, session.begin():
            session.add(SchemaVersion(version=SCHEMA_VERSION))
        return
    if SchemaVersion.__tablename__ not in tables:
        raise DatabaseError(
            f"database {url} is not a hetero coordinator database (no schema_version table)"
        )
    with Session(engine) as session:
        found = session.scalars(select(SchemaVersion.version)).all()
    if list(found) != [SCHEMA_VERSION]:
        have = ", ".join(str(v) for v in found) or "none"
        raise DatabaseError(
            f"database {url} has schema version {have}, this coordinator needs "
            f"{SCHEMA_VERSION}: use a matching hetero version or a new --state-dir/--db"
        )
