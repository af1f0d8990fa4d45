"""Opening the coordinator's database: URL, connection set-up, read-only sessions.

SQLite (the default, one file under the state dir) and PostgreSQL are supported (any
other SQLAlchemy URL is tried as is). The coordinator writes it from one thread, its
writer's (``writer``): no lock between writers is needed, and none is taken. SQLite
runs in WAL mode, so the reads of history pages (``read_session_factory``: a
transaction that cannot write; SQLite: ``PRAGMA query_only``, PostgreSQL:
``SET TRANSACTION READ ONLY``) never wait for the writer.

The schema is Alembic's (``schema.upgrade_to_head``): a new database is created, an
older one upgraded, on open. Every message shows the URL with its password masked, and
a URL whose driver is not installed is one line naming the package (``dburl``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import SAWarning, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator.dburl import masked, missing_driver, scrubbed
from hetero.core.errors import HeteroError

#: How long SQLite waits for its file's lock when another process holds it (an
#: operator's ``sqlite3`` shell, ``hetero-coord db``), in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 10_000
#: Execution option marking a read-only engine (see ``read_session_factory``).
_READ_ONLY = "hetero_read_only"
#: Pooled connections: the writer's, the reading threads' and a few more.
POOL_SIZE = 8
#: SQLite's result codes for a damaged file: SQLITE_CORRUPT, SQLITE_NOTADB.
_DAMAGED = (11, 26)


class DatabaseError(HeteroError):
    """The database cannot be opened, or was written by another schema version."""

    grpc_code = "FAILED_PRECONDITION"
    exit_code = 3


def sqlite_url(state_dir: Path) -> str:
    return f"sqlite:///{state_dir / 'coordinator.db'}"


def open_database(url: str) -> Engine:
    """Engine for ``url``, its schema created or upgraded to this version's
    (``prepare``); raises ``DatabaseError`` (one line) for a database it cannot open or
    upgrade. Tests and tools use it; a coordinator connects, takes the database's lock
    (``standby.Leadership``) and only then prepares, so that it never upgrades a schema
    under another coordinator serving it."""
    engine = connect(url)
    try:
        prepare(engine)
    except DatabaseError:
        engine.dispose()
        raise
    return engine


def prepare(engine: Engine) -> None:
    """Check ``engine``'s database (SQLite: ``_check_integrity``) and create or upgrade its
    schema to this version's (``schema.upgrade_to_head``); ``DatabaseError`` (one line)
    if it cannot."""
    from hetero.coordinator.schema import upgrade_to_head

    url = engine.url.render_as_string(hide_password=False)
    try:
        _check_integrity(engine, url)
        upgrade_to_head(engine)
    except SQLAlchemyError as exc:
        first = scrubbed(str(exc).splitlines()[0], url)
        raise DatabaseError(f"cannot open database {masked(url)}: {first}") from None


def _check_integrity(engine: Engine, url: str) -> None:
    """Raise ``DatabaseError`` if SQLite's ``quick_check`` finds the file damaged (its
    first finding in the message). A damaged file answers reads and fails writes, so a
    coordinator started on it would look healthy and lose every change; it reads every
    page once (a second or so for hundreds of MB). PostgreSQL checks its own pages."""
    if sqlite_file(engine) is None:
        return
    try:
        with engine.connect() as connection:
            found = connection.exec_driver_sql("PRAGMA quick_check(1)").scalar()
    except SQLAlchemyError as exc:  # damage the check itself trips over
        orig = getattr(exc, "orig", None)
        if getattr(orig, "sqlite_errorcode", None) not in _DAMAGED:
            raise
        found = str(orig)
    if found != "ok":
        raise DatabaseError(
            f"database {masked(url)} is damaged (SQLite's quick_check: {found}); restore it "
            "from a backup, or move it aside to start with an empty one"
        )


def connect(url: str) -> Engine:
    """Engine for ``url`` with the connection set-up of this module, its schema untouched."""
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
    _read_only_transactions(engine)
    return engine


def sqlite_file(engine: Engine) -> str | None:
    """The path of a SQLite engine's database file; None for another database, an
    in-memory one (or a URI filename, ``file:``, which SQLite resolves)."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or database in (None, "", ":memory:"):
        return None
    return None if database.startswith("file:") else database


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # Rows are turned into messages after commit; keep their loaded values.
    return sessionmaker(engine, expire_on_commit=False)


def read_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions for reads only: a transaction that cannot write (SQLite: ``PRAGMA
    query_only``; PostgreSQL: ``READ ONLY``)."""
    return sessionmaker(engine.execution_options(**{_READ_ONLY: True}), expire_on_commit=False)


def _sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL syncs at checkpoints, not at every commit: a killed
        # coordinator loses nothing (committed pages are in the WAL file); only an
        # OS crash or power loss can drop the last commits. That keeps a batch's
        # commit, which its callers wait on, off the disk's fsync latency.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.close()


def _read_only_transactions(engine: Engine) -> None:
    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        read_only = bool(connection.get_execution_options().get(_READ_ONLY))
        if connection.dialect.name == "sqlite":
            # Connections are pooled and shared by both kinds of session: set it every time.
            connection.exec_driver_sql(f"PRAGMA query_only={int(read_only)}")
        elif read_only and connection.dialect.name == "postgresql":
            connection.exec_driver_sql("SET TRANSACTION READ ONLY")
