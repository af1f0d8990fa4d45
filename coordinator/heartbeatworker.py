"""The heartbeat flush's write in a process of its own, off the interpreter lock that
answers heartbeats.

Why (issue 17): the coordinator answers heartbeats on one event loop thread
(``asyncserver``), and any pure-Python work on another of its threads takes the
interpreter lock from it. Under ``hetero-bench load --agents 1000 --ranks 256
--queued 10000`` on a 2-core box heartbeats handled in under 1 ms were seen by
the clients at p99 100 to 400 ms. The flush (``ingest``) runs four times a
second and its transaction (``store.record_heartbeats``: the known and down
nodes, the rows of each sample, the statements' parameters) cost about 4 ms
of the coordinator's CPU each time at 1,000 agents (a flush of all 1,000 nodes
13 ms). Here that transaction runs in a worker process with a database engine of
its own; what is left in the coordinator per flush is taking the parked beats
out of memory, turning the samples due into column values, and the call.

What crosses the pipe is plain data: each node's newest arrival
(``{node id: Unix s}``) and the samples due, each a ``store.Beat`` and the
heartbeat request that holds its telemetry (pickled as its serialized bytes,
turned into column values in the worker: ``wire.telemetry_values`` was two thirds
of what was left of a flush in the coordinator); back comes the set of node ids not known (deleted while
parked) and whether the write may have let a waiting job fit (a node marked up:
``capacity``). The coordinator's sessions never see the worker's writes, so
that change is told to ``on_change`` (the sweeper's ``CapacityWatch.changed``),
before the flush returns: a sweep, which flushes first, runs its admission
pass. What it writes, and the order of writers, is the coordinator's own: on a
SQLite file both queue on its lock file (``writelock``) before ``BEGIN
IMMEDIATE``, on PostgreSQL both take ``database.WRITERS_LOCK_KEY`` first; an
in-memory SQLite database cannot be opened by a second process, and there the
flush stays on the coordinator's thread (``server.serve`` starts no worker). The
database URL reaches the worker as an argument of its initializer, as the
report workers' does (``reportworker``). The worker keeps the coordinator's CPU
priority, unlike the snapshot worker (``snapshots``): while it writes it holds
the write lock the reports wait for.

A flush of fewer than :data:`MIN_BEATS` beats (a small cluster, every
coordinator a test starts) is written in the coordinator: it costs a fraction
of a millisecond there, and a worker would cost a second interpreter (about 80
MB, a second of CPU to start) for nothing.

Failure (``workerprocess``): before the worker is ready, and when it dies or
overruns :data:`TIMEOUT_S`, that flush is written in the coordinator's process
(logged once per failure) and the worker is replaced. A flush is safe to write
twice: a node's last heartbeat only moves forward, a sample replaces its
bucket's row only if it is not older, a node is marked up once. So a worker
killed after its commit and before its reply costs a second write, nothing
more. A write that fails in the worker (the database refused it) fails the
flush, as in the coordinator: logged, and the next heartbeats write liveness
again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import store, wire
from hetero.coordinator.capacity import CapacityWatch
from hetero.coordinator.database import connect, session_factory
from hetero.coordinator.workerprocess import WorkerProcess
from hetero.v1 import coordinator_pb2 as pb

log = logging.getLogger("hetero.coordinator")

#: Seconds a flush may take in the worker, its wait for the write lock included,
#: before it is written in the coordinator's process instead (a flush of 1,000 nodes
#: takes about 15 ms of CPU).
TIMEOUT_S = 3.0
#: The fewest beats (nodes heard plus samples due) a flush hands to the worker.
MIN_BEATS = 64


#: A beat whose telemetry is due to be written, and the request that holds it (None:
#: the beat's own ``telemetry``): turned into column values where it is written. Only
#: the samples count, not the arrival: a node's liveness is its newest arrival, in
#: ``alive``, and a closed bucket's sample, which arrived earlier, must not mark a node
#: up that went down since.
Sample = tuple[store.Beat, pb.HeartbeatRequest | None]


def write(
    s: Session,
    alive: dict[str, float],
    samples: Sequence[Sample],
    policy: store.TelemetryPolicy,
) -> set[str]:
    """One flush in ``s``: each node of ``alive`` heard at its newest arrival (Unix s),
    and the telemetry of ``samples``; the node ids not known. The same in the worker
    and in the coordinator."""
    beats = [store.Beat(node, t, ()) for node, t in alive.items()]
    for beat, req in samples:
        telemetry = beat.telemetry if req is None else wire.telemetry_values(req)
        beats.append(dataclasses.replace(beat, telemetry=telemetry, alive=False))
    return store.record_heartbeats(s, beats, policy=policy)


class HeartbeatWorker(WorkerProcess):
    """:func:`write` in one worker process on ``db_url`` (a SQLite file or PostgreSQL),
    started at the first flush of :data:`MIN_BEATS` or more; ``close`` ends it.
    ``on_change`` is told of a flush that may have let a waiting job fit."""

    def __init__(
        self,
        db_url: str,
        on_change: Callable[[], object] | None = None,
        *,
        timeout_s: float = TIMEOUT_S,
        min_beats: int = MIN_BEATS,
    ) -> None:
        super().__init__("heartbeat", _open, (db_url,))
        self.on_change = on_change
        self.timeout_s = timeout_s
        self.min_beats = min_beats

    def record(
        self,
        alive: dict[str, float],
        samples: Sequence[Sample],
        policy: store.TelemetryPolicy,
    ) -> set[str] | None:
        """The flush written in the worker: the node ids not known; None = write it
        here (a small flush, no worker yet, or it failed). Raises ``RuntimeError`` for
        a write that failed in the worker (rolled back, nothing written)."""
        if len(alive) + len(samples) < self.min_beats:
            return None
        outcome = self.call(_record, alive, samples, policy, timeout_s=self.timeout_s)
        if outcome is None:
            return None
        if outcome.failed is not None:  # logged with its traceback in the worker
            raise RuntimeError(f"the heartbeat worker failed: {outcome.failed}")
        if outcome.changed and self.on_change is not None:
            self.on_change()
        return outcome.gone


@dataclass(frozen=True)
class _Outcome:
    """What the worker answers for one flush (pickled): the node ids not known and
    whether the write may have let a waiting job fit, or the type of the exception
    it failed with."""

    gone: set[str]
    changed: bool = False
    failed: str | None = None


#: In the worker: its sessions, and the watch of the changes they commit (``_open``).
_sessions: sessionmaker[Session] | None = None
_watch: CapacityWatch | None = None


def _open(db_url: str) -> None:
    """The worker's database (its schema is the coordinator's, already upgraded)."""
    global _sessions, _watch
    _sessions = session_factory(connect(db_url))
    _watch = CapacityWatch(_sessions)


def _record(
    alive: dict[str, float], samples: Sequence[Sample], policy: store.TelemetryPolicy
) -> _Outcome:
    """One flush, in the worker."""
    assert _sessions is not None and _watch is not None, "the worker's database is not open"
    before = _watch.epoch
    try:
        with _sessions.begin() as s:
            gone = write(s, alive, samples, policy)
    except Exception as exc:  # the coordinator's flusher logs it, as for its own writes
        log.exception("writing heartbeats failed (heartbeat worker)")
        return _Outcome(set(), failed=type(exc).__name__)
    return _Outcome(gone, changed=_watch.epoch != before)
