"""Opening the SQLite store: WAL mode, and a clear error for another schema version."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hetero.coordinator.database import DatabaseError, open_database
from hetero.coordinator.models import SCHEMA_VERSION


def test_a_new_database_is_created_in_wal_mode_with_its_schema_version(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    open_database(f"sqlite:///{db}").dispose()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    open_database(f"sqlite:///{db}").dispose()  # reopening a matching database works


def test_a_database_of_another_schema_version_is_refused_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    open_database(f"sqlite:///{db}").dispose()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 41,))
    with pytest.raises(DatabaseError) as info:
        open_database(f"sqlite:///{db}")
    message = str(info.value)
    assert (
        f"schema version {SCHEMA_VERSION + 41}, this coordinator needs {SCHEMA_VERSION}" in message
    )
    assert "\n" not in message


def test_a_foreign_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (id INTEGER)")
    with pytest.raises(DatabaseError, match="not a hetero coordinator database"):
        open_database(f"sqlite:///{db}")
