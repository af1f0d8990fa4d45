"""The agents' once-a-second calls, answered from memory: heartbeats and polls.

Heartbeats are answered from memory and written in batches.

One transaction per heartbeat did not scale: with 1,000 agents at 1 Hz every
heartbeat paid an ORM session, a write lock and a commit (about 3 ms of CPU
each, more than this 2-core machine has), and queued behind the others for the
lock. Here a heartbeat is checked against the known nodes (an unknown node is
still refused with NOT_FOUND at once, so its agent registers again) and parked
in memory; a flusher thread writes everything parked every ``flush_s`` seconds
in one transaction (``store.record_heartbeats``).

What that costs: a node's ``last_heartbeat_unix_s`` in the database lags its
last heartbeat by at most ``flush_s`` plus one write (health uses a timeout of
seconds), and a coordinator that dies loses the heartbeats of its last
``flush_s`` (telemetry is downsampled anyway; the next heartbeat restores
liveness). The sweeper flushes before it looks for silent nodes, so the lag never
makes a live node look silent; a node marked down that is heard again is marked
up (``node_up``) by the flush that writes its heartbeat. A node deleted while its heartbeats are parked is dropped at the
flush, never written against a missing row.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import store
from hetero.coordinator.models import NodeRow

log = logging.getLogger("hetero.coordinator")

#: Seconds between flushes of parked heartbeats.
DEFAULT_FLUSH_S = 0.25


class HeartbeatIngest:
    """Parks heartbeats and flushes them in batches; ``start``/``stop`` run the flusher.

    Without ``start`` nothing is written until ``flush()`` is called (tests call it).
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        readers: sessionmaker[Session],
        policy: store.TelemetryPolicy,
        *,
        flush_s: float = DEFAULT_FLUSH_S,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.sessions = sessions
        self.readers = readers
        self.policy = policy
        self.flush_s = flush_s
        self.clock = clock
        self._lock = threading.Lock()
        #: Newest sample per (node, telemetry bucket of its sample time): the store keeps
        #: only the newest of a bucket anyway (see ``offer``).
        self._parked: dict[tuple[str, int], store.Beat] = {}
        self._known: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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

    def offer(self, beat: store.Beat) -> None:
        """Park ``beat``; raises ``store.NotFoundError`` if its node is not registered."""
        with self._lock:
            known = beat.node_id in self._known
        if not known:
            with self.readers() as s:
                if s.get(NodeRow, beat.node_id) is None:
                    raise store.NotFoundError(f"unknown node {beat.node_id!r}: register first")
            with self._lock:
                self._known.add(beat.node_id)
        # Keyed by the bucket of the *sample* time, not the arrival: after a coordinator
        # outage an agent sends the telemetry it buffered (``sampled_at``) in a burst,
        # many beats arriving within one flush. Keyed by arrival they would share one
        # bucket and all but the last would be lost; keyed by sample time each bucket
        # the store keeps one row for keeps its newest sample, the same row the store
        # would keep had every beat been written on its own. The node's liveness is
        # its newest arrival: carried onto the beat kept, whichever that is.
        at = beat.sample_time
        key = (beat.node_id, int(at // self.policy.period_s))
        with self._lock:
            old = self._parked.get(key)
            keep, other = (beat, old) if old is None or at >= old.sample_time else (old, beat)
            if other is not None and other.time_unix_s > keep.time_unix_s:
                keep = dataclasses.replace(
                    keep, time_unix_s=other.time_unix_s, sampled_at=keep.sample_time
                )
            self._parked[key] = keep

    # ---- the writer side -------------------------------------------------------------

    def flush(self) -> int:
        """Write every parked heartbeat in one transaction; returns how many were written."""
        with self._lock:
            beats: Sequence[store.Beat] = list(self._parked.values())
            self._parked = {}
        if not beats:
            return 0
        with self.sessions.begin() as s:
            gone = store.record_heartbeats(s, beats, policy=self.policy)
        if gone:
            with self._lock:
                self._known -= gone
        self.flushes += 1
        self.written += len(beats) - sum(b.node_id in gone for b in beats)
        return len(beats)

    def _run(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception:
                # Never lose the flusher: the next round writes what arrives by then.
                log.exception("writing heartbeats failed")
        self.flush()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="heartbeat-ingest", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the flusher after a last flush (what is parked is written)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
