"""A rank's log file on its node: capped in size, rotated, never unbounded.

A chatty rank printed 287 MB in 20 s into one ``rank<r>.log``. Each rank's
file is now capped: past ``max_bytes`` it is renamed ``rank<r>.log.1`` (older
ones shift up to ``.<keep>``, the oldest is deleted) and a new file starts, so
a rank holds at most ``max_bytes * (keep + 1)`` bytes of disk.

The rotation is the standard library's ``logging.handlers.RotatingFileHandler``
(size check, renames, reopen), fed one record per output line; it is not
attached to any logger, so nothing else reaches these files.
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
from dataclasses import dataclass
from pathlib import Path

from hetero.core.errors import ConfigError

#: Default size of one rank log file before it rotates, in bytes.
MAX_BYTES = 64 * 1024 * 1024
#: Default rotated files kept per rank (``rank<r>.log.1`` .. ``.3``).
KEEP = 3


@dataclass(frozen=True)
class RankLogLimits:
    """``max_bytes``: size of one file before it rotates (bytes, >= 4096);
    ``keep``: rotated files kept (>= 1)."""

    max_bytes: int = MAX_BYTES
    keep: int = KEEP

    def __post_init__(self) -> None:
        if self.max_bytes < 4096:
            raise ConfigError(f"rank_log_max_bytes must be >= 4096, got {self.max_bytes}")
        if self.keep < 1:
            raise ConfigError(f"rank_log_keep must be >= 1, got {self.keep}")


class _Rotating(logging.handlers.RotatingFileHandler):
    """Counts write failures (a full disk) instead of printing a traceback per line. Its
    files are 0640 at most whatever the umask (ranks under a ``rank_user`` pass through
    the job's directory) and never a link's target."""

    failures = 0

    def _open(self) -> io.TextIOWrapper:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        return open(os.open(self.baseFilename, flags, 0o640), "a", encoding=self.encoding)

    def handleError(self, record: logging.LogRecord) -> None:
        self.failures += 1


class RankLog:
    """Append-only text lines of one rank, rotated by size. Thread-safe (the handler's lock:
    the stdout and stderr readers of a rank write to one file)."""

    def __init__(self, path: Path, limits: RankLogLimits) -> None:
        self.path = path
        self._handler = _Rotating(
            path, maxBytes=limits.max_bytes, backupCount=limits.keep, encoding="utf-8"
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def write(self, text: str) -> None:
        """One line, without its newline; rotates first when it would pass the cap."""
        self._handler.handle(logging.makeLogRecord({"msg": text, "levelno": logging.INFO}))

    @property
    def failures(self) -> int:
        """Lines that could not be written (full disk, removed directory)."""
        return self._handler.failures

    def close(self) -> None:
        self._handler.close()
