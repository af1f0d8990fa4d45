"""The agents' once-a-second calls, answered from memory: heartbeats and polls.

Heartbeats are answered from memory and written in batches.

One transaction per heartbeat did not scale: with 1,000 agents at 1 Hz every
heartbeat paid an ORM session, a write lock and a commit (about 3 ms of CPU
each, more than this 2-core machine has), and queued behind the others for the
lock. Here a heartbeat is checked against the known nodes (an unknown node is
still refused with NOT_FOUND at once, so its agent registers again) and parked
in memory; a flusher thread writes everything parked every ``flush_s`` seconds
in one transaction (``store.record_heartbeats``). That transaction runs in a
process of its own where the database lets a second process write it
(``heartbeatworker``: a SQLite file, PostgreSQL), so its Python work does not
take the interpreter lock from the event loop that answers heartbeats; the
flusher waits for it holding none. It runs on the flusher's thread for an
in-memory database, a flush of a few beats, and while the worker is starting or
after it failed; either way a flush returns once its write is committed.

Liveness and telemetry are parked apart. Each flush writes every node's newest
arrival. Telemetry is stored downsampled, one row per device per bucket of
``TelemetryPolicy.period_s`` holding the bucket's newest sample, so a sample is
written once, after its bucket has closed: writing the open bucket at every
flush rewrote each row ten times. Each node's closed bucket is written at the
node's own moment of the following period (``_phase``), so the writes are
spread over the period instead of all landing when the buckets close. Until then the newest sample is served from memory
(``current``): views show telemetry as fresh as the last heartbeat.

What that costs: a node's ``last_heartbeat_unix_s`` in the database lags its
last heartbeat by at most ``flush_s`` plus one write (health uses a timeout of
seconds), and a coordinator that dies loses the heartbeats of its last
``flush_s`` and the telemetry of the bucket still open (at most ``period_s``, one
row per device; the next heartbeat restores liveness). ``stop`` writes
everything, open buckets included. The sweeper flushes before it looks for
silent nodes, so the lag never makes a live node look silent; a node marked
down that is heard again is marked up (``node_up``) by the flush that writes its
heartbeat (written by the worker, the coordinator's admission pass is told:
``HeartbeatWorker.on_change``). A node deleted while its heartbeats are parked is
dropped at the flush, never written against a missing row. These hold wherever
the flush is written; the worker is closed only after ``stop``'s last flush.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import threading
import zlib
from typing import cast

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import heartbeatworker, store, wire
from hetero.coordinator.heartbeatworker import HeartbeatWorker
from hetero.coordinator.models import NodeRow, TelemetryRow
from hetero.coordinator.periodic import Periodic
from hetero.v1 import coordinator_pb2 as pb

#: Seconds between flushes of parked heartbeats.
DEFAULT_FLUSH_S = 0.25


@dataclasses.dataclass(frozen=True, slots=True)
class _Parked:
    """A beat's telemetry waiting for its bucket to be written: still its ``request``'s
    (None: the beat's own ``telemetry``)."""

    beat: store.Beat
    request: pb.HeartbeatRequest | None


def _values(parked: _Parked) -> tuple[dict[str, object], ...]:
    """A parked beat's samples as ``TelemetryRow`` column values."""
    if parked.request is None:
        return parked.beat.telemetry
    return wire.telemetry_values(parked.request)


#: Each node's newest sample not yet written: (its bucket, its time, its rows' values or
#: the serialized ``HeartbeatRequest`` they are read from, ``live_values``).
LiveTelemetry = dict[str, tuple[int, float, tuple[dict[str, object], ...] | bytes]]


def live_values(samples: tuple[dict[str, object], ...] | bytes) -> tuple[dict[str, object], ...]:
    """A ``LiveTelemetry`` sample's rows' values."""
    if isinstance(samples, bytes):
        return wire.telemetry_values(pb.HeartbeatRequest.FromString(samples))
    return samples


def telemetry_rows(
    node_id: str, bucket: int, at: float, samples: tuple[dict[str, object], ...]
) -> dict[int | None, TelemetryRow] | None:
    """A sample's values as unsaved rows keyed by device (None = host); None if empty."""
    return {
        cast(int | None, values.get("device_index")): TelemetryRow(
            node_id=node_id, bucket=bucket, time_unix_s=at, **values
        )
        for values in samples
    } or None


def _phase(node_id: str) -> float:
    """The node's turn, as a fraction of a period after its bucket closes: buckets close
    on the same clock for every node, and writing every node's at once (5,000 rows
    for 1,000 agents) held the coordinator for a tenth of a second every period."""
    return (zlib.crc32(node_id.encode()) % 1000) / 1000


class HeartbeatIngest:
    """Parks heartbeats and flushes them in batches; ``start``/``stop`` run the flusher.

    Without ``start`` nothing is written until ``flush()`` is called (tests call it).
    ``worker`` writes the flushes in a process of its own (None: all on the calling
    thread); its owner closes it after ``stop``.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        readers: sessionmaker[Session],
        policy: store.TelemetryPolicy,
        *,
        flush_s: float = DEFAULT_FLUSH_S,
        worker: HeartbeatWorker | None = None,
    ) -> None:
        self.sessions = sessions
        #: Writes the flushes in a process of its own (``heartbeatworker``); None = here.
        self.worker = worker
        self.readers = readers
        self.policy = policy
        self.flush_s = flush_s
        self._lock = threading.Lock()
        #: Each node's newest arrival not yet written.
        self._alive: dict[str, float] = {}
        #: Newest sample per (node, telemetry bucket of its sample time) not yet written:
        #: the store keeps only the newest of a bucket anyway (see ``offer``).
        self._samples: dict[tuple[str, int], _Parked] = {}
        #: (due, key) of each parked sample, soonest first: a flush takes the due ones
        #: without looking at the others (1,000 nodes park about 1,000 samples, and
        #: scanning them all was most of what a flush left in the coordinator once its
        #: write had moved to the worker). An entry whose sample is gone is skipped.
        self._due: list[tuple[float, tuple[str, int]]] = []
        #: Each node's newest bucket: where ``current`` finds its freshest sample.
        self._newest_bucket: dict[str, int] = {}
        #: The newest arrival of any node: buckets that ended before it are closed. The
        #: beats' own clock, so a test's hand-moved clock moves it too.
        self._now = -math.inf
        self._known: set[str] = set()
        # Never lose the flusher: the next round writes what arrives by then.
        self._flusher = Periodic(
            "heartbeat-ingest",
            flush_s,
            self.flush,
            failure="writing heartbeats failed",
            last=lambda: self.flush(everything=True),
        )
        self.flushes = 0
        self.written = 0

    # ---- the RPC side ----------------------------------------------------------------

    def known(self, node_id: str) -> None:
        """Remember a node that just registered (saves the lookup on its first heartbeat)."""
        with self._lock:
            self._known.add(node_id)

    def is_known(self, node_id: str) -> bool:
        """Whether the node registered or heartbeated here (memory only; False = ask the DB)."""
        with self._lock:
            return node_id in self._known

    def offer(self, beat: store.Beat, request: pb.HeartbeatRequest | None = None) -> None:
        """Park ``beat``; raises ``store.NotFoundError`` if its node is not registered.

        ``request`` holds the beat's telemetry, in place of ``beat.telemetry``: it is
        turned into column values (``wire.telemetry_values``) only when needed, and for
        a write in the process that writes it (``heartbeatworker``). Nine of ten samples
        are replaced by a newer one of their bucket before they are written, so turning
        each into rows on arrival was wasted."""
        with self._lock:
            known = beat.node_id in self._known
        if not known:
            with self.readers() as s:
                if s.get(NodeRow, beat.node_id) is None:
                    raise store.NotFoundError(f"unknown node {beat.node_id!r}: register first")
            with self._lock:
                self._known.add(beat.node_id)
        # Keyed by the bucket of the *sample* time, not the arrival: after a coordinator
        # outage an agent sends the telemetry it buffered (``sampled_at``) in a burst.
        # Keyed by arrival they would share one bucket and all but the last would be
        # lost; keyed by sample time each bucket keeps its newest sample, the row the
        # store would keep had every beat been written on its own.
        at = beat.sample_time
        period = self.policy.period_s
        bucket = int(at // period)
        key = (beat.node_id, bucket)
        due = (bucket + 1 + _phase(beat.node_id)) * period  # Unix s
        parked = _Parked(beat, request)
        with self._lock:
            node = beat.node_id
            self._alive[node] = max(beat.time_unix_s, self._alive.get(node, -math.inf))
            self._now = max(self._now, beat.time_unix_s)
            old = self._samples.get(key)
            if old is None:
                heapq.heappush(self._due, (due, key))
            if old is None or at >= old.beat.sample_time:
                self._samples[key] = parked
            if bucket >= self._newest_bucket.get(node, bucket):
                self._newest_bucket[node] = bucket

    def current(self, node_id: str) -> dict[int | None, TelemetryRow] | None:
        """The node's newest sample if it is not written yet (its bucket is open), as
        unsaved rows keyed by device (None = host); None = read the database."""
        with self._lock:
            bucket = self._newest_bucket.get(node_id)
            parked = None if bucket is None else self._samples.get((node_id, bucket))
        if parked is None or bucket is None:
            return None
        return telemetry_rows(node_id, bucket, parked.beat.sample_time, _values(parked))

    def live(self) -> LiveTelemetry:
        """``current`` of every node whose newest sample is not written yet, for a
        snapshot built in another process: a request serialized (by protobuf's C code),
        read there. Read here and pickled, 1,000 nodes' requests took 28 ms of the
        interpreter the event loop answering heartbeats needs at each snapshot (once a
        second while ``/metrics`` is scraped or the cluster watched); serialized, 2 ms
        (a 2-core x86_64 box, Python 3.11)."""
        with self._lock:
            newest = [(n, b, self._samples.get((n, b))) for n, b in self._newest_bucket.items()]
        return {
            node: (
                bucket,
                parked.beat.sample_time,
                parked.beat.telemetry
                if parked.request is None
                else parked.request.SerializeToString(),
            )
            for node, bucket, parked in newest
            if parked is not None
        }

    # ---- the writer side -------------------------------------------------------------

    def flush(self, *, everything: bool = False) -> int:
        """Write, in one transaction, every node's newest arrival and the telemetry of
        closed buckets whose node's turn has come (``everything``: all parked telemetry,
        open buckets included, as ``stop`` does); returns how many beats that was (one
        per node heard, plus one per bucket of telemetry)."""
        with self._lock:
            alive, self._alive = self._alive, {}
            now = self._now
            if everything:
                parked = list(self._samples.values())
                self._samples.clear()
                self._due.clear()
            else:
                parked = []
                while self._due and self._due[0][0] <= now:
                    sample = self._samples.pop(heapq.heappop(self._due)[1], None)
                    if sample is not None:
                        parked.append(sample)
        samples = [(p.beat, p.request) for p in parked]
        if not alive and not samples:
            return 0
        gone = None if self.worker is None else self.worker.record(alive, samples, self.policy)
        if gone is None:
            with self.sessions.begin() as s:
                gone = heartbeatworker.write(s, alive, samples, self.policy)
        if gone:
            with self._lock:
                self._known -= gone
                for key in [k for k in self._samples if k[0] in gone]:
                    del self._samples[key]
                for node in gone:
                    self._newest_bucket.pop(node, None)
        self.flushes += 1
        beats = len(alive) + len(samples)
        self.written += beats
        if gone:
            self.written -= sum(n in gone for n in alive) + sum(
                b.node_id in gone for b, _ in samples
            )
        return beats

    def start(self) -> None:
        self._flusher.start()

    def stop(self) -> None:
        """Stop the flusher after a last flush (everything parked is written, open
        telemetry buckets included)."""
        self._flusher.stop(timeout_s=None)
