"""Whether the devices a waiting job could use may have changed since the sweeper's last
admission pass: the pass runs when they may have, not every sweep.

Why: with 10,000 jobs queued behind busy devices, 1,000 nodes and 4,000 devices,
one pass costs 120 to 140 ms of CPU inside a write transaction (``device_slots``
reads every device), and the sweeper ran one every half second. Sampled under
``hetero-bench load --queued 10000``, the SQLite write lock was held all the
time, 15 of the 16 database threads queued on it behind the interval reports,
and the coordinator's one core of Python was saturated: heartbeats went
unanswered for seconds. Yet between two sweeps nothing had changed that could
let a waiting job fit.

What can: a node registered, back up, undrained or re-registered with other
devices; a rank or a job that changed state (devices and ports freed, a restart
that no longer holds its devices); a job added or removed. Each of these is an
ORM change to ``NodeRow``, ``DeviceRow``, ``JobRow.state`` or ``RankRow.state``,
so a flush listener on the coordinator's sessions sees every path, today's and
those added later, without a hook in each. The sweeper compares a counter that
committed changes advance. Writers outside this process (a second process on the
same database) are not seen: those of hetero's worker processes tell the coordinator
what they changed (``changed``); for any other, and to refresh the reasons of the jobs
still waiting, a pass also runs every :data:`REFRESH_S`.

The passes run by a submission, a cancel or a job's end in their own transactions
are unchanged: this decides only the sweeper's. Where a report worker runs
(``reportworker``), the sweeper's pass runs there, off the coordinator's interpreter:
the refresh every ``REFRESH_S`` with 10,000 jobs queued was a 0.1 s stall of the event
loop answering heartbeats twice a minute (a second of heartbeats at p99 60 to 100 ms
on the 2-core box, in every run of ``hetero-bench load --queued 10000``).
"""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator.models import DeviceRow, JobRow, NodeRow, RankRow

#: Seconds between the sweeper's passes when nothing it can see has changed.
REFRESH_S = 30.0

#: The attributes whose change may free or add room, per table; None: any change.
_WATCHED: dict[type, tuple[str, ...] | None] = {
    NodeRow: ("down", "draining", "address"),
    DeviceRow: None,
    JobRow: ("state",),
    RankRow: ("state", "node_id", "device_index"),
}
_KEY = "hetero.capacity_changed"


def _touches_capacity(obj: Any) -> bool:
    watched = _WATCHED.get(type(obj), ())
    if watched is None:
        return True
    attrs = inspect(obj).attrs
    return any(attrs[name].history.has_changes() for name in watched)


class CapacityWatch:
    """Counts committed changes that may let a waiting job fit, on ``sessions``."""

    def __init__(self, sessions: sessionmaker[Session], refresh_s: float = REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._sessions = sessions
        self._lock = threading.Lock()
        self._epoch = 0
        self._passed: tuple[int, float] | None = None  # epoch and time of the last pass
        event.listen(sessions, "before_flush", self._before_flush)
        event.listen(sessions, "after_commit", self._after_commit)
        event.listen(sessions, "after_rollback", self._after_rollback)

    def due(self, now: float) -> int | None:
        """The counter to pass to :meth:`passed` if a pass is due at ``now``, else None."""
        with self._lock:
            epoch, last = self._epoch, self._passed
        if last is None or epoch != last[0] or now - last[1] >= self.refresh_s:
            return epoch
        return None

    def passed(self, epoch: int, now: float) -> None:
        """A pass that saw every change up to ``epoch`` (from :meth:`due`) committed."""
        with self._lock:
            self._passed = (epoch, now)

    @property
    def epoch(self) -> int:
        """The counter committed changes advance (a worker process compares it before and
        after a write of its own, ``heartbeatworker``)."""
        with self._lock:
            return self._epoch

    def changed(self) -> None:
        """A change this process's sessions did not make (the report worker's restart of
        a job without a rank): the next sweep runs a pass."""
        with self._lock:
            self._epoch += 1

    def close(self) -> None:
        event.remove(self._sessions, "before_flush", self._before_flush)
        event.remove(self._sessions, "after_commit", self._after_commit)
        event.remove(self._sessions, "after_rollback", self._after_rollback)

    def _before_flush(self, session: Session, _context: Any, _instances: Any) -> None:
        if session.info.get(_KEY):
            return
        added = any(type(o) in _WATCHED for o in (*session.new, *session.deleted))
        if added or any(_touches_capacity(o) for o in session.dirty):
            session.info[_KEY] = True

    def _after_commit(self, session: Session) -> None:
        if session.info.pop(_KEY, False):
            with self._lock:
                self._epoch += 1

    def _after_rollback(self, session: Session) -> None:
        session.info.pop(_KEY, None)
