"""One coordinator serves a database at a time; on PostgreSQL a second one waits as its
standby.

A coordinator holds its state in memory and is its database's only writer, so two on
one database would each act on a state the other changes behind its back. Before it
loads its state a coordinator takes its database's lock and holds it while it runs:

- on a SQLite file, an exclusive ``flock`` on ``<database>.lock`` beside the file (the
  state directory's ``coordinator.db.lock`` by default). A second coordinator there
  refuses to start, in one line naming the process that holds it: a SQLite file is one
  host's, and a standby on the same host buys nothing a restart does not.
- on PostgreSQL, a session-level advisory lock (:data:`LOCK_KEY`) on a connection of its
  own. A second coordinator waits for it, serving the standard health service as
  NOT_SERVING and every call UNAVAILABLE, says so in one log line, and takes over (loads
  the state and serves) once the lock is free: the first stopped, died (the server ends
  its session), or lost its connection. A holder whose connection fails stops serving
  (``lost`` is called): another coordinator may hold the lock by then.

The kernel lets go of a ``flock`` when its process dies, the database server of an
advisory lock when its session ends: a killed coordinator never leaves a stale lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path
from typing import IO, Any

from sqlalchemy import Engine, text

from hetero.coordinator.database import DatabaseError, sqlite_file
from hetero.coordinator.dburl import masked

log = logging.getLogger("hetero.coordinator")

#: PostgreSQL: the advisory lock the serving coordinator holds, the bytes ``hetero.l``
#: read as a big-endian integer. Advisory locks are a database's own: two hetero
#: databases of one server never wait for each other.
LOCK_KEY = 0x68657465726F2E6C
#: Seconds between a standby's tries, and between the holder's checks of its connection.
POLL_S = 1.0


class Leadership:
    """The lock of ``engine``'s database (see the module doc). ``try_acquire`` takes it if
    it is free: True once held; on SQLite it raises ``DatabaseError`` (one line) when
    another coordinator holds it. ``held()`` says whether it is still held (PostgreSQL:
    the connection answers); ``release`` lets it go."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.url = masked(engine.url.render_as_string(hide_password=False))
        self._file: IO[str] | None = None
        self._connection: Any = None

    @property
    def waits(self) -> bool:
        """Whether a coordinator that finds the lock taken waits for it (PostgreSQL)."""
        return self.engine.dialect.name == "postgresql"

    def try_acquire(self) -> bool:
        if self.engine.dialect.name == "sqlite":
            return self._flock()
        if self.engine.dialect.name != "postgresql":
            return True  # another database: no lock of its own to take
        if self._connection is None:
            self._connection = self.engine.connect()
        got = self._connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": LOCK_KEY})
        held = bool(got.scalar_one())
        self._connection.commit()
        return held

    def _flock(self) -> bool:
        database = sqlite_file(self.engine)
        if database is None:
            return True  # in memory: no other process can open it
        path = Path(database + ".lock")
        handle = path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise DatabaseError(
                f"another coordinator (pid {holder}) serves {self.url}: stop it first, or "
                "give this one another --state-dir"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle
        return True

    def held(self) -> bool:
        """Whether the lock is still ours (PostgreSQL: our session answers)."""
        if self._connection is None:
            return True
        try:
            self._connection.execute(text("SELECT 1")).scalar_one()
            self._connection.commit()
        except Exception:  # the connection is gone, and the lock with it
            return False
        return True

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # lets go of the flock
            self._file = None
        if self._connection is not None:
            try:
                # Invalidated, not returned to the pool: the session ends, and the
                # server lets go of the lock with it.
                self._connection.invalidate()
                self._connection.close()
            except Exception:
                log.debug("closing the lock's connection failed", exc_info=True)
            self._connection = None
