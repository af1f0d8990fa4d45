"""The coordinator's background loops: one daemon thread per chore, on a period.

The heartbeat flusher, the sweeper and the interval pruner all call one function
every few seconds until the daemon stops, and none may die of an exception (the
next round tries again): ``Periodic`` is that loop, written once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger("hetero.coordinator")

#: Seconds ``stop`` waits for a round in progress to finish.
JOIN_TIMEOUT_S = 5.0


class Periodic:
    """Calls ``tick`` every ``period_s`` seconds on a daemon thread named ``name``
    from ``start`` until ``stop``; an exception is logged as ``failure`` and the loop
    goes on. ``last`` runs once on the thread after the loop ends (a final flush)."""

    def __init__(
        self,
        name: str,
        period_s: float,
        tick: Callable[[], object],
        *,
        failure: str,
        last: Callable[[], object] | None = None,
    ) -> None:
        self.period_s = period_s
        self.tick = tick
        self.failure = failure
        self.last = last
        #: Set by ``stop``: a long round can wait on it to end early.
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = JOIN_TIMEOUT_S) -> None:
        """End the loop and wait up to ``timeout_s`` (None: for ever) for the thread."""
        self.stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self.stopping.wait(self.period_s):
            try:
                self.tick()
            except Exception:  # the next round tries again; never let the thread die
                log.exception(self.failure)
        if self.last is not None:
            self.last()
