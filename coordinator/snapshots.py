"""The cluster snapshot every watcher and scraper shares, built off the coordinator's
interpreter lock where it can be.

A snapshot (every node with its newest telemetry, every placed job with its newest
interval) of 1,000 nodes and 1,000 jobs costs half a second to a second and a half
of Python. Built on a thread of the coordinator's process, it stalled the event
loop that answers heartbeats far longer than it ran: under ``hetero-bench load
--agents 1000 --ranks 256 --queued 10000 --scrapers 200`` on a 2-core box a build
of 1.6 s (0.6 s of CPU) and the writing of its Prometheus families (0.3 s) left the
heartbeats of those seconds with a median of 1.5 to 2 s, while a thread of the same
process that slept 2 ms at a time never waited more than 110 ms. A CPU-bound thread
hands the interpreter lock to the loop once per switch interval (5 ms) and takes it
back whenever the loop blocks in a system call, which gRPC's loop does several times
a call: the loop then answers a few dozen calls a second, and a thousand arrive.

So:

- ``Snapshots`` keeps one snapshot for everyone, built again at most once per
  ``ttl_s`` and at most ``share`` of the time (one builder at a time; the others
  wait for it and share it). ``WatchCluster`` streams and ``/metrics`` read it; before,
  every watcher built its own at its own period.
- ``SnapshotWorker`` builds it in a worker process with a database engine of its
  own (``workerprocess``): the coordinator hands over the telemetry still in
  memory (``HeartbeatIngest.live``, serialized requests, about 2 ms for 1,000 nodes) and
  gets the snapshot back serialized. The worker runs at a lower CPU priority
  (:data:`NICE`), and a coordinator serving ``/metrics`` starts it with itself
  (its import is a second of CPU, better spent before the first scrape than in
  it). Where there is no worker (an in-memory SQLite
  database no other process can open, a host that cannot start one, a worker that
  failed) it is built on the caller's thread, as before. A build asked for while
  the worker starts waits for it rather than building here: a first scrape is
  answered late, the heartbeats are not.

The Prometheus text of a snapshot is written in the ``/metrics`` process
(``metricsserver``), not here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import views
from hetero.coordinator.database import connect, read_session_factory
from hetero.coordinator.ingest import HeartbeatIngest, LiveTelemetry, live_values, telemetry_rows
from hetero.coordinator.models import TelemetryRow
from hetero.coordinator.workerprocess import WorkerProcess
from hetero.v1 import coordinator_pb2 as pb

#: Seconds a snapshot is served before it is built again, at least.
TTL_S = 1.0
#: Most of the time builds may take: a build that took B seconds is served for at least
#: B / SHARE. The worker's builds take a core of the host and read the database.
SHARE = 0.1
#: CPU niceness of the worker over the coordinator's: a build is a second of CPU nobody
#: waits on in a hurry, and on a 2-core box it took that second from the coordinator
#: and the agents' calls (the heartbeats of those seconds waited 0.5 to 1 s).
NICE = 10
#: Seconds a build may take in the worker before it is built here instead.
TIMEOUT_S = 30.0
#: Seconds a build waits for a worker that is starting (a spawn imports hetero: about a
#: second on a loaded 2-core box).
START_WAIT_S = 20.0


class Snapshots:
    """The snapshot ``build()`` returns (serialized), built again at most once per
    ``ttl_s`` and at most ``share`` of the time (a build that took B seconds is served
    for at least B / ``share``). ``builds`` counts them."""

    def __init__(
        self,
        build: Callable[[], bytes],
        ttl_s: float = TTL_S,
        share: float = SHARE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._build = build
        self.ttl_s = ttl_s
        self._share = share
        self._clock = clock
        self._lock = threading.Lock()
        self._data = b""
        self._parsed: tuple[int, pb.ClusterSnapshot] | None = None
        self._built_at = -float("inf")
        self._build_s = 0.0
        self.builds = 0

    @classmethod
    def of(cls, snapshot: Callable[[], pb.ClusterSnapshot], ttl_s: float = TTL_S) -> Snapshots:
        """Snapshots of a function that builds the message itself (tests, tools)."""
        return cls(lambda: snapshot().SerializeToString(), ttl_s)

    def latest(self) -> tuple[int, bytes]:
        """The current snapshot, serialized, and its build's number (1 = the first)."""
        with self._lock:  # one builder; concurrent readers wait for it, then share it
            if self._clock() - self._built_at >= max(self.ttl_s, self._build_s / self._share):
                started = self._clock()
                self._data = self._build()
                self._built_at = self._clock()
                self._build_s = self._built_at - started
                self.builds += 1
            return self.builds, self._data

    def message(self) -> pb.ClusterSnapshot:
        """The current snapshot as a message (parsed once per build)."""
        number, data = self.latest()
        with self._lock:
            if self._parsed is None or self._parsed[0] != number:
                self._parsed = (number, pb.ClusterSnapshot.FromString(data))
            return self._parsed[1]


class SnapshotWorker(WorkerProcess):
    """Cluster snapshots built in one worker process on ``db_url`` (a SQLite file or
    PostgreSQL), started at the first build; ``close`` ends it."""

    def __init__(self, db_url: str, timeout_s: float = TIMEOUT_S) -> None:
        super().__init__("snapshot", _open, (db_url,), nice=NICE)
        self.timeout_s = timeout_s

    def build(self, live: LiveTelemetry, now: float, heartbeat_timeout_s: float) -> bytes | None:
        """The snapshot built in the worker; None = build it here (no worker: this host
        cannot start one, or it failed)."""
        args = (live, now, heartbeat_timeout_s)
        out = self.call(_build, *args, timeout_s=self.timeout_s)
        if out is None and self.wait_ready(START_WAIT_S):
            out = self.call(_build, *args, timeout_s=self.timeout_s)
        return out


def builder(
    readers: sessionmaker[Session],
    *,
    ingest: HeartbeatIngest | None,
    clock: Callable[[], float],
    heartbeat_timeout_s: float,
    worker: SnapshotWorker | None,
) -> Callable[[], bytes]:
    """What ``Snapshots`` builds with: in ``worker`` where it answers, else here."""

    def build() -> bytes:
        now = clock()
        live = ingest.live() if ingest is not None else {}
        if worker is not None:
            built = worker.build(live, now, heartbeat_timeout_s)
            if built is not None:
                return built
        return _snapshot(readers, live, now, heartbeat_timeout_s)

    return build


def _snapshot(
    readers: sessionmaker[Session], live: LiveTelemetry, now: float, heartbeat_timeout_s: float
) -> bytes:
    def current(node_id: str) -> dict[int | None, TelemetryRow] | None:
        sample = live.get(node_id)
        if sample is None:
            return None
        bucket, at, samples = sample
        return telemetry_rows(node_id, bucket, at, live_values(samples))

    with readers() as s:
        snapshot = views.cluster_snapshot(s, now=now, timeout_s=heartbeat_timeout_s, live=current)
    data: bytes = snapshot.SerializeToString()
    return data


#: In the worker: its read sessions (``_open``).
_readers: sessionmaker[Session] | None = None


def _open(db_url: str) -> None:
    """The worker's database (its schema is the coordinator's, already upgraded)."""
    global _readers
    _readers = read_session_factory(connect(db_url))


def _build(live: LiveTelemetry, now: float, heartbeat_timeout_s: float) -> bytes:
    """One snapshot, in the worker."""
    assert _readers is not None, "the worker's database is not open"
    return _snapshot(_readers, live, now, heartbeat_timeout_s)
