"""The write lock hetero's processes share on a SQLite file: an exclusive ``flock`` on
a file beside the database, held by each write transaction from just before its
``BEGIN IMMEDIATE`` to just after its COMMIT or ROLLBACK (``database._one_writer``).

Why (issue 17): two processes write the coordinator's file, the coordinator and
its report worker (``reportworker``), and left to SQLite the one that finds the
file's write lock taken waits in SQLite's busy handler, which polls in sleeps
growing to 100 ms: under load the worker waited p99 34 ms, max 106 ms, for
locks held a few ms. A blocked ``flock`` sleeps in the kernel, which wakes the
waiter the moment the holder unlocks (or closes the file, or dies), and Python
lets go of its interpreter lock for the call. So SQLite's handler is left only
the waits this lock does not cover.

Correctness never depends on it: ``BEGIN IMMEDIATE`` still takes SQLite's own
lock. A process that does not take this one (an older hetero, the ``sqlite3``
shell), or that cannot open the lock file (a read-only directory: one log line,
then its writers go without), is arbitrated by SQLite's busy handler as before;
only how soon a waiter wakes depends on the ``flock``. Read-only transactions
never take it (they take no write lock of SQLite's either).

The wait is not bounded by hetero, and cannot hang for ever:

- Linux offers no ``flock`` or ``fcntl`` lock with a timeout. A bounded wait
  would need a second thread to block in the kernel and hand the lock over:
  a thread handoff per contended write, each of which in the coordinator waits
  for the interpreter lock (its switch interval is 5 ms, and the coordinator's
  is busy) — the latency this lock exists to remove — and a wait given up on
  would leave that thread blocked all the same. Polling ``LOCK_NB`` is SQLite's
  busy handler again.
- The holders are hetero's own write transactions, which hold SQLite's write
  lock for the same span and are short (a report's, a flush's, a sweep's).
  Every process takes the locks in one order (the process's thread lock, this
  file's, SQLite's) and none waits for this one while holding SQLite's, so no
  wait closes a cycle (hetero writes a file through one engine a process: a
  thread that began a write on one engine and, inside it, another on a second
  engine of the same file would wait for itself). The kernel lets go of a dead
  holder's lock at once.
- A holder stuck inside a transaction (a stopped process) keeps it, and so
  keeps SQLite's write lock: every other writer of the file is stuck without
  this lock too. Here one writer a process waits with it; that process's other
  writers fail on its thread lock after ``SQLITE_BUSY_TIMEOUT_MS`` ("database
  is locked"), as they did, and a report worker stuck so long is replaced by the
  coordinator (``reportworker.TIMEOUT_S``), which frees its wait.

The lock file is ``<database>.writelock``, empty, created 0600. Each engine opens
it at its first write and keeps it open (close-on-exec, as Python opens every
file). A forked child opens its own: the descriptor it inherited shares the
parent's lock, and unlocking it would let go of the parent's. One descriptor
per engine, so two engines of one process on one file exclude each other as
two processes do.
"""

from __future__ import annotations

import fcntl
import logging
import os
from pathlib import Path

log = logging.getLogger("hetero.coordinator")

#: Appended to the database file's path to name its lock file.
SUFFIX = ".writelock"


class FileWriteLock:
    """The ``flock`` of one engine on ``path``. Not thread-safe: the engine's writers
    call it while they hold the process's write lock, one at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid: int | None = None  # the process ``_fd`` belongs to
        self._held = False

    def acquire(self) -> None:
        """Wait until this engine holds the lock; where the file cannot be opened or
        locked, return at once (logged once) and let SQLite's busy handler wait."""
        fd = self._descriptor()
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # ENOLCK: a file system without locks
            self._give_up(exc)
            return
        self._held = True

    def release(self) -> None:
        """Let go of the lock, if ``acquire`` took it."""
        if self._held and self._fd is not None:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _descriptor(self) -> int | None:
        if self._pid == os.getpid():
            return self._fd
        # First write of this process (an inherited descriptor is left alone, open).
        self._pid, self._fd, self._held = os.getpid(), None, False
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            self._give_up(exc)
        return self._fd

    def _give_up(self, exc: OSError) -> None:
        """No lock file for this process: its writers wait in SQLite's busy handler."""
        log.warning(
            "cannot lock %s (%s): writes to this database wait for other processes' "
            "in SQLite's busy handler",
            self.path,
            exc.strerror or exc,
        )
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
