"""The progress file a rank touches as it trains, for its agent's watchdog.

An agent launches each rank with ``HETERO_PROGRESS_FILE`` (``RankEnv.progress_file``); the trainer touches
that file as it completes steps (at most once per ``PERIOD_S``, so the cost is
one ``utime`` a second). A rank whose file and output stay still for the
agent's ``watchdog_s`` is considered stuck and killed. Without the variable
(a run outside an agent) nothing is written.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

#: Seconds between touches at most.
PERIOD_S = 1.0


class ProgressFile:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._last = float("-inf")

    def beat(self) -> None:
        """Record progress now (cheap; rate-limited). Never raises."""
        if self.path is None:
            return
        now = time.monotonic()
        if now - self._last < PERIOD_S:
            return
        self._last = now
        with contextlib.suppress(OSError):
            self.path.touch()
