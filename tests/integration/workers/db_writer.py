"""A second process writing the coordinator's database through hetero's engine
(``database.connect``), for the tests of the write lock hetero's processes share.

Usage: db_writer.py hold URL | db_writer.py bump URL N

Both add one to ``counter.n`` in a write transaction that reads it first (a lost
update shows as a count below the number of writes). ``hold`` prints ``holding
PID`` inside its transaction (PID: its PostgreSQL backend's, 0 on SQLite), waits
for a line on stdin, commits, prints ``committed``, and keeps its connection open
until the next line (so SQLite's last connection does not close, and checkpoint,
under the test's write). ``bump`` makes N such writes and exits. Log lines go to
stderr.
"""

from __future__ import annotations

import logging
import sys

from sqlalchemy import text

from hetero.coordinator.database import connect, session_factory


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    mode, url = argv[0], argv[1]
    engine = connect(url)
    sessions = session_factory(engine)
    if mode == "bump":
        for _ in range(int(argv[2])):
            with sessions.begin() as s:
                n = s.execute(text("SELECT n FROM counter")).scalar_one()
                s.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
    else:
        with sessions.begin() as s:
            n = s.execute(text("SELECT n FROM counter")).scalar_one()
            s.execute(text("UPDATE counter SET n = :n"), {"n": n + 1})
            backend = 0
            if engine.dialect.name == "postgresql":
                backend = s.execute(text("SELECT pg_backend_pid()")).scalar_one()
            print(f"holding {backend}", flush=True)
            sys.stdin.readline()
        print("committed", flush=True)
        sys.stdin.readline()
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1:])
