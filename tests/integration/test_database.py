"""Opening the store on SQLite and PostgreSQL: the schema created at Alembic's head,
a pre-Alembic database upgraded without losing a row, and one-line refusals for a
database this coordinator cannot use."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    BigInteger,
    Boolean,
    Engine,
    Float,
    Integer,
    String,
    Table,
    inspect,
    select,
    text,
)
from sqlalchemy import column as sa_column
from sqlalchemy import table as sa_table

from hetero.coordinator.database import (
    DatabaseError,
    connect,
    open_database,
    read_session_factory,
    session_factory,
)
from hetero.coordinator.models import SCHEMA_VERSION, Base
from hetero.coordinator.schema import (
    BASELINE_SCHEMA_VERSION,
    PRE_ALEMBIC,
    alembic_config,
    current_revision,
    head,
)

#: Rows written into each table before an upgrade.
ROWS = 3
GIB = 1 << 30


def _schema_version(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.scalars(text("SELECT version FROM schema_version")).all())


def _value(table: Table, column: str, i: int) -> Any:
    """A value of row ``i`` for ``table.column``, the same wherever it is referenced."""
    col = table.c[column]
    for fk in col.foreign_keys:
        return _value(fk.column.table, fk.column.name, i)
    kind = col.type
    if isinstance(kind, Boolean):
        return i % 2 == 1
    if isinstance(kind, Integer | BigInteger):
        return 1000 * i + len(column)
    if isinstance(kind, Float):
        return i + 0.25
    if isinstance(kind, String) and kind.length:
        return f"{column}{i}"[: kind.length]
    return f"{table.name}.{column} row {i}"


def _columns(engine: Engine) -> dict[str, list[str]]:
    """The columns each of the models' tables has in ``engine``'s database (an older
    schema has fewer)."""
    found = inspect(engine)
    return {
        t.name: [c["name"] for c in found.get_columns(t.name)]
        for t in Base.metadata.sorted_tables
        if t.name != "schema_version"
    }


def _fill(engine: Engine) -> None:
    """``ROWS`` rows in every table but ``schema_version``, every column the database
    has set except the tables' own autoincrement ids (left to the database, as the
    store leaves them)."""
    present = _columns(engine)
    with engine.begin() as conn:
        for table in Base.metadata.sorted_tables:
            if table.name == "schema_version":
                continue
            columns = [
                c.name
                for c in table.columns
                if c.name in present[table.name]
                and not (c.primary_key and c.autoincrement is True and not c.foreign_keys)
            ]
            rows = [{c: _value(table, c, i) for c in columns} for i in range(ROWS)]
            # Only these columns: the model's defaults would name the newer ones.
            conn.execute(sa_table(table.name, *(sa_column(c) for c in columns)).insert(), rows)


def _dump(engine: Engine, columns: dict[str, list[str]]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, ``columns`` of each, ordered by primary key."""
    with engine.connect() as conn:
        return {
            t.name: [
                tuple(r)
                for r in conn.execute(
                    select(*(t.c[c] for c in columns[t.name])).order_by(*t.primary_key.columns)
                )
            ]
            for t in Base.metadata.sorted_tables
            if t.name != "schema_version"
        }


def _pre_alembic(url: str, version: int) -> Engine:
    """A database as a coordinator of schema ``version`` (3 or 4, before Alembic) left
    it: the tables of revision ``PRE_ALEMBIC[version]``, that ``schema_version``, no
    ``alembic_version``."""
    engine = connect(url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), PRE_ALEMBIC[version])
        conn.execute(text("DROP TABLE alembic_version"))
    return engine


@pytest.fixture
def db_url(both_stores_url: str) -> str:
    return both_stores_url


def test_a_new_database_is_created_at_head_with_its_schema_version(db_url: str) -> None:
    engine = open_database(db_url)
    try:
        assert current_revision(engine) == head()
        assert _schema_version(engine) == [SCHEMA_VERSION]
    finally:
        engine.dispose()
    open_database(db_url).dispose()  # reopening a database at head works


def test_replaying_every_revision_gives_the_tables_of_the_models(db_url: str) -> None:
    """A new database is made with ``create_all`` and stamped at head: that is only
    right while the revisions build the same tables, indexes and types."""
    engine = connect(db_url)
    try:
        with engine.begin() as conn:
            command.upgrade(alembic_config(conn), "head")
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        assert _schema_version(engine) == [SCHEMA_VERSION]
    finally:
        engine.dispose()


@pytest.mark.parametrize("version", sorted(PRE_ALEMBIC))
def test_a_pre_alembic_database_is_upgraded_on_open_and_loses_no_row(
    db_url: str, version: int
) -> None:
    old = _pre_alembic(db_url, version)
    try:
        assert _schema_version(old) == [version]
        _fill(old)
        columns = _columns(old)
        before = _dump(old, columns)
    finally:
        old.dispose()
    assert all(len(rows) == ROWS for rows in before.values()), before
    engine = open_database(db_url)
    try:
        assert current_revision(engine) == head()
        assert _schema_version(engine) == [SCHEMA_VERSION]
        assert _dump(engine, columns) == before
        added = {(t, c) for t, now in _columns(engine).items() for c in now if c not in columns[t]}
        # Revisions 0004's and 0005's columns, with the values of a job submitted before
        # the queue and before exclusions...
        revised = {("jobs", "priority"), ("jobs", "owner")}
        revised |= {("jobs", "excluded"), ("jobs", "exclusion_restarts")}
        with engine.connect() as conn:
            got = conn.execute(
                text("SELECT priority, owner, excluded, exclusion_restarts FROM jobs")
            ).all()
        assert [tuple(r) for r in got] == [(0, "", "", 0)] * ROWS
        # Revisions 0006's and 0009's, none measured in an interval stored before.
        measured = ("switch_s", "busy_cv", "input_s", "input_cv")
        revised |= {("interval_stats", c) for c in measured}
        with engine.connect() as conn:
            got = conn.execute(text(f"SELECT {', '.join(measured)} FROM interval_stats")).all()
        assert [tuple(r) for r in got] == [(None, None, None, None)] * ROWS
        # Revision 0007's: no host profile kept for a node registered before.
        revised |= {("nodes", "host_profile")}
        with engine.connect() as conn:
            got = conn.execute(text("SELECT host_profile FROM nodes")).all()
        assert [tuple(r) for r in got] == [("",)] * len(got)
        # Revision 0008's: lines stored before the log caps weigh nothing against them.
        revised |= {("jobs", "log_bytes"), ("log_lines", "cost_bytes")}
        with engine.connect() as conn:
            got = conn.execute(text("SELECT log_bytes FROM jobs")).all()
        assert [tuple(r) for r in got] == [(0,)] * ROWS
        if version == 3:  # revision 0002's columns, with the values of a device without them
            assert added == revised | {
                ("devices", "suspect"),
                ("devices", "shared_while_profiled"),
                ("devices", "foreign_utilization_percent"),
            }
            with engine.connect() as conn:
                got = conn.execute(
                    text(
                        "SELECT suspect, shared_while_profiled, foreign_utilization_percent "
                        "FROM devices"
                    )
                ).all()
            assert [tuple(r) for r in got] == [("", False, None)] * ROWS
        else:
            assert added == revised
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        # 64-bit now on every store: an 80 GiB device, and ids past 2^31.
        with engine.begin() as conn:
            conn.execute(text("UPDATE devices SET memory_bytes = :b"), {"b": 80 * GIB})
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT setval('events_id_seq', 3000000000)"))
            conn.execute(
                text("INSERT INTO events (time_unix_s, kind, message) VALUES (1, 'k', 'm')")
            )
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT min(memory_bytes) FROM devices")) == 80 * GIB
    finally:
        engine.dispose()


def test_a_database_of_an_unknown_revision_is_refused_in_one_line(db_url: str) -> None:
    open_database(db_url).dispose()
    engine = connect(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00d'"))
    engine.dispose()
    with pytest.raises(DatabaseError) as info:
        open_database(db_url)
    message = str(info.value)
    assert f"schema revision f00d, which this coordinator (head {head()}) does not know" in message
    assert "\n" not in message


def test_a_pre_alembic_database_of_an_older_version_is_refused_in_one_line(db_url: str) -> None:
    engine = _pre_alembic(db_url, BASELINE_SCHEMA_VERSION)
    with engine.begin() as conn:
        conn.execute(text("UPDATE schema_version SET version = 2"))
    engine.dispose()
    with pytest.raises(DatabaseError) as info:
        open_database(db_url)
    assert "has schema version 2, which this coordinator cannot upgrade" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_foreign_database_is_refused(db_url: str) -> None:
    engine = connect(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE users (id INTEGER)"))
    engine.dispose()
    with pytest.raises(DatabaseError, match="not a hetero coordinator database"):
        open_database(db_url)


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    open_database(f"sqlite:///{db}").dispose()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_unreachable_postgresql_server_is_one_line() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(DatabaseError) as info:
        open_database("postgresql+psycopg://hetero@/hetero?host=/nonexistent")
    message = str(info.value)
    assert message.startswith("cannot open database postgresql+psycopg://hetero@/hetero")
    assert "\n" not in message


def test_hetero_coord_db_upgrade_upgrades_without_serving(db_url: str) -> None:
    _pre_alembic(db_url, BASELINE_SCHEMA_VERSION).dispose()

    def db(action: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "hetero.coordinator.cli", "db", action, "--db", db_url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    before = db("current")
    assert before.returncode == 0, before.stderr
    assert "schema revision none (this hetero's head is" in before.stdout
    done = db("upgrade")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"schema revision {head()} (head)")
    engine = connect(db_url)
    try:
        assert current_revision(engine) == head()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_postgresql_url_without_a_driver_uses_psycopg(pg_server) -> None:  # type: ignore[no-untyped-def]
    url = pg_server.new_database().replace("postgresql+psycopg://", "postgresql://")
    engine = open_database(url)
    try:
        assert engine.dialect.driver == "psycopg"
        assert current_revision(engine) == head()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_postgresql_restart_fails_no_request_after_it(pg_server) -> None:  # type: ignore[no-untyped-def]
    engine = open_database(pg_server.new_database())
    sessions, readers = session_factory(engine), read_session_factory(engine)
    try:
        for factory in (sessions, readers, sessions):  # connections in the pool
            with factory.begin() as s:
                s.execute(text("SELECT 1"))
        pg_server.restart()
        with sessions.begin() as s:
            s.execute(text("INSERT INTO events (time_unix_s, kind, message) VALUES (1, 'k', 'm')"))
        with readers() as s:
            assert s.execute(text("SELECT count(*) FROM events")).scalar_one() == 1
    finally:
        engine.dispose()
