"""The database a ``hetero-bench load`` run writes, read from the side while it runs: its
size, its rows per table, and the bytes each table takes with its indexes.

A SQLite file (the default, under the run's state directory) is read through the
``sqlite3`` module on a read-only connection (WAL: the coordinator is never
blocked), its size being the file with its WAL; a database server (``--db``, e.g.
PostgreSQL) through SQLAlchemy, its size being what the server reports
(``pg_database_size``, ``pg_total_relation_size``).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from hetero.bench.loadconfig import LoadError


class LoadDatabase:
    """The run's database: ``url`` None = the SQLite file ``state/coordinator.db``."""

    def __init__(self, state: Path, url: str | None) -> None:
        self.file = state / "coordinator.db" if url is None else None
        self.url = url
        self._engine: Any = None
        if url is not None:
            from sqlalchemy import create_engine

            self._engine = create_engine(url, pool_size=1, max_overflow=0)
            if self._engine.dialect.name != "postgresql":
                raise LoadError(
                    f"--db: the load figures are read from PostgreSQL or the default SQLite "
                    f"file, not {self._engine.dialect.name}"
                )

    @property
    def kind(self) -> str:
        """The store, for reports: ``sqlite`` or the server's dialect name."""
        return "sqlite" if self._engine is None else str(self._engine.dialect.name)

    def check_empty(self) -> None:
        """``LoadError`` unless a server database holds no tables (figures of a run
        are its own only on a fresh database; the SQLite file is always new)."""
        if self._engine is None:
            return
        from sqlalchemy import inspect
        from sqlalchemy.exc import SQLAlchemyError

        try:
            tables = inspect(self._engine).get_table_names()
        except SQLAlchemyError as exc:
            raise LoadError(f"--db {self.shown_url()}: {str(exc).splitlines()[0]}") from None
        if tables:
            raise LoadError(f"--db {self.shown_url()} must be an empty database, it has tables")

    def shown_url(self) -> str | None:
        """The ``--db`` URL with its password masked; None for the SQLite file."""
        if self._engine is None:
            return None
        return str(self._engine.url.render_as_string(hide_password=True))

    def size_bytes(self) -> int:
        if self.file is not None:
            files = [self.file.with_name(self.file.name + s) for s in ("", "-wal", "-shm")]
            return sum(p.stat().st_size for p in files if p.exists())
        return int(self._scalar("SELECT pg_database_size(current_database())"))

    def rows(self) -> dict[str, int]:
        """Row counts per table."""
        if self.file is not None:
            con = sqlite3.connect(f"file:{self.file}?mode=ro", uri=True, timeout=10.0)
            try:
                found = con.execute("SELECT name FROM sqlite_master WHERE type='table'")
                names = [r[0] for r in found]
                return {
                    t: int(con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0]) for t in names
                }
            finally:
                con.close()
        from sqlalchemy import inspect

        names = inspect(self._engine).get_table_names()
        return {t: int(self._scalar(f'SELECT count(*) FROM "{t}"')) for t in names}

    def table_bytes(self) -> dict[str, int]:
        """Bytes per table including its indexes; {} where the store cannot tell
        (SQLite built without dbstat)."""
        if self.file is not None:
            con = sqlite3.connect(f"file:{self.file}?mode=ro", uri=True)
            try:
                found = con.execute(
                    "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat d "
                    "LEFT JOIN sqlite_master m ON m.name = d.name GROUP BY 1"
                ).fetchall()
            except sqlite3.OperationalError:
                return {}
            finally:
                con.close()
            return {str(name): int(size) for name, size in found}
        from sqlalchemy import inspect

        names = inspect(self._engine).get_table_names()
        return {t: int(self._scalar(f"SELECT pg_total_relation_size('\"{t}\"')")) for t in names}

    def _scalar(self, sql: str) -> Any:
        from sqlalchemy import text

        with self._engine.connect() as conn:
            return conn.execute(text(sql)).scalar_one()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
