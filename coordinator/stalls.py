"""How long the coordinator's event loop went without running: a stall is not a node loss.

A coordinator that did not run (SIGSTOP, a suspended VM, a host starved of CPU) heard no
heartbeat meanwhile, through no fault of its nodes; the sweep then counts every node's
silence from the end of the stall instead of declaring the cluster down. A task wakes
every :data:`PULSE_S`; a wake-up later than that is a stall of the loop. Waiting for the
database is not one: the loop runs meanwhile and hears heartbeats. (The sweep once
measured its own lateness, which counted the wait for its previous commit as a pause: a
database slower than a heartbeat interval then delayed every node's loss by a timeout.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: Seconds between the pulse's wake-ups; a stall shorter than this goes unseen, which the
#: sweep does not mind (it acts on stalls of a heartbeat interval or more).
PULSE_S = 0.25


class StallWatch:
    """The loop's longest stall (seconds beyond :data:`PULSE_S`) since the last ``take``.
    ``run`` is the pulse task; ``clock`` is monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._seen = clock()
        self._longest = 0.0

    def beat(self) -> None:
        """Note that the loop runs now."""
        now = self._clock()
        self._longest = max(self._longest, now - self._seen - PULSE_S)
        self._seen = now

    def take(self) -> float:
        """The longest stall since the last ``take``, including one that only ends now
        (the sweep's timer may fire before the pulse's once the loop runs again)."""
        self.beat()
        longest, self._longest = self._longest, 0.0
        return longest

    async def run(self) -> None:
        while True:
            await asyncio.sleep(PULSE_S)
            self.beat()
