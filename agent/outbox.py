"""What an agent keeps while the coordinator is unreachable, to deliver afterwards.

Two bounded queues, each dropping its oldest entry when full and counting what
it dropped (``dropped``), so an outage of any length costs bounded memory and
says how much it lost:

- interval reports (rank 0's statistics, one report per rebalance interval,
  every rank's row in it): ``MAX_REPORTS``;
- telemetry: one sample per ``TELEMETRY_PERIOD_S`` (the coordinator keeps one
  row per 10-s bucket anyway), ``MAX_TELEMETRY`` samples, i.e. one hour.

Rank output lines have their own bound (``supervisor.MAX_PENDING_LINES``) and
rank state changes are never dropped (a few per rank).
"""

from __future__ import annotations

import collections
import threading
from typing import Generic, TypeVar

from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import types_pb2 as tpb

#: Interval reports kept per agent during an outage (about 2.8 h at one report per second).
MAX_REPORTS = 10_000
#: Telemetry samples kept per agent during an outage, one per TELEMETRY_PERIOD_S (1 h).
MAX_TELEMETRY = 360
TELEMETRY_PERIOD_S = 10.0

T = TypeVar("T")


class Bounded(Generic[T]):
    """A thread-safe FIFO of at most ``capacity`` items that drops its oldest when full."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: collections.deque[T] = collections.deque()
        self._lock = threading.Lock()
        self.dropped = 0
        self.delivered = 0

    def put(self, item: T) -> None:
        with self._lock:
            if len(self._items) >= self.capacity:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)

    def peek(self) -> T | None:
        with self._lock:
            return self._items[0] if self._items else None

    def pop(self) -> None:
        """Remove the oldest item (after delivering it)."""
        with self._lock:
            if self._items:
                self._items.popleft()
                self.delivered += 1

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class Outbox:
    """The agent's outage buffers; see the module docstring for their bounds."""

    def __init__(self, max_reports: int = MAX_REPORTS, max_telemetry: int = MAX_TELEMETRY) -> None:
        self.reports: Bounded[tpb.IntervalReport] = Bounded(max_reports)
        self.telemetry: Bounded[pb.HeartbeatRequest] = Bounded(max_telemetry)
        #: Reports the coordinator refused on delivery (e.g. of a job since restarted).
        self.rejected = 0
        self._last_sample_s = float("-inf")

    @property
    def pending(self) -> int:
        return len(self.reports) + len(self.telemetry)

    def keep_report(self, report: tpb.IntervalReport) -> None:
        copy = tpb.IntervalReport()
        copy.CopyFrom(report)
        self.reports.put(copy)

    def keep_telemetry(self, heartbeat: pb.HeartbeatRequest, sampled_at: float) -> None:
        """Keep one sample per ``TELEMETRY_PERIOD_S``, dated ``sampled_at`` (Unix s)."""
        if sampled_at - self._last_sample_s < TELEMETRY_PERIOD_S:
            return
        self._last_sample_s = sampled_at
        heartbeat.sampled_at_unix_s = sampled_at
        self.telemetry.put(heartbeat)

    def summary(self) -> str:
        return (
            f"{self.reports.delivered} reports and {self.telemetry.delivered} telemetry samples "
            f"delivered late; dropped {self.reports.dropped} reports, "
            f"{self.telemetry.dropped} samples (buffer full); {self.rejected} reports refused"
        )
