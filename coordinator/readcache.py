"""Answers to the calls every agent and rank makes every second, from memory.

An agent polls for orders every heartbeat and ranks ask for the plan every
interval; for 1,000 agents and 256 ranks one query per call cost more CPU than
the coordinator (one core of Python: the GIL) had, though almost every answer
is the same as a moment ago. Each answer here is at most ``ttl_s`` seconds old.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import store, wire
from hetero.core.balancer import RankInterval
from hetero.v1 import types_pb2 as tpb

#: Seconds an answer is reused.
DEFAULT_TTL_S = 0.25


class PendingOrders:
    """Which nodes have ranks to launch or stop, read at most every ``ttl_s`` seconds.

    One query serves every poll within ``ttl_s``: a launch or stop reaches its
    agent at most ``ttl_s`` later than it would otherwise.
    """

    def __init__(
        self,
        readers: sessionmaker[Session],
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.readers = readers
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._nodes: frozenset[str] = frozenset()
        self._read_at = -math.inf
        #: Bumped by ``invalidate``: a read that began before it is used once, not kept.
        self._generation = 0

    def invalidate(self) -> None:
        """Forget the answer: a write just added or removed orders (the next poll reads)."""
        with self._lock:
            self._read_at = -math.inf
            self._generation += 1

    def known_idle(self, node_id: str) -> bool:
        """True if a fresh answer (no read needed) says ``node_id`` has no orders."""
        with self._lock:
            fresh = self.clock() - self._read_at < self.ttl_s
            return fresh and node_id not in self._nodes

    def may_have(self, node_id: str) -> bool:
        """False only if ``node_id`` had no orders as of at most ``ttl_s`` ago (or since
        the last ``invalidate``)."""
        with self._lock:
            if self.clock() - self._read_at < self.ttl_s:
                return node_id in self._nodes
            # Claim the refresh; concurrent polls keep the previous answer meanwhile.
            self._read_at = self.clock()
            generation = self._generation
        with self.readers() as s:
            nodes = frozenset(store.nodes_with_orders(s))
        with self._lock:
            self._nodes = nodes
            if self._generation != generation:
                # Invalidated while reading: the read may predate that write.
                self._read_at = -math.inf
        return node_id in nodes


class LatestPlans:
    """Each job's latest plan as ``GetPlan`` returns it, read at most every ``ttl_s``.

    ``put`` records a plan this process just stored (the answer to an interval
    report), so ``GetPlan`` never goes back behind it; a plan stored elsewhere
    (a restart) drops the cache (``invalidate``, from ``Deps.invalidate_caches``)
    and is seen at once, else within ``ttl_s``. A trainer ignores a plan whose
    version it has already seen, so a late answer costs nothing.
    """

    def __init__(
        self,
        readers: sessionmaker[Session],
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.readers = readers
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._plans: dict[str, tuple[float, tpb.Plan]] = {}
        #: Bumped by ``invalidate``: a read that began before it is not kept.
        self._generation = 0

    def put(self, job_id: str, plan: tpb.Plan) -> None:
        with self._lock:
            self._plans[job_id] = (self.clock(), plan)

    def invalidate(self) -> None:
        """Forget every plan: a write (a restart placed by the sweeper or by a rank's
        exit) may have stored a newer one; the next ``get`` of each job reads."""
        with self._lock:
            self._plans.clear()
            self._generation += 1

    def cached(self, job_id: str) -> bool:
        """Whether ``get`` would answer from memory."""
        with self._lock:
            hit = self._plans.get(job_id)
        return hit is not None and self.clock() - hit[0] < self.ttl_s

    def get(self, job_id: str) -> tpb.Plan:
        """The job's latest plan; raises ``store.NotFoundError`` for an unknown job."""
        with self._lock:
            hit = self._plans.get(job_id)
            generation = self._generation
        if hit is not None and self.clock() - hit[0] < self.ttl_s:
            return hit[1]
        with self.readers() as s:
            plan = wire.plan_message(store.latest_plan(s, store.get_job(s, job_id).id))
        with self._lock:
            if self._generation == generation:
                self._plans[job_id] = (self.clock(), plan)
        return plan


class JobPlacements:
    """Where each job's ranks are (rank -> node name), as ``scope`` checks a node's
    credential: ``GetPlan``, interval reports and log lines of a job only from a node
    it has a rank on. Reading the ranks for every call took a query where the plan
    itself came from memory (``LatestPlans``).

    A job's ranks change only when it is placed or its restart is (a submission, a
    cancel, a rank's exit, a registration or drain that moves the queue, the
    sweeper), and each of those writes calls ``Deps.invalidate_caches`` after its
    commit, which drops every entry here: a node never passes on a placement the
    database no longer holds. A read that began before an ``invalidate`` is not kept.
    At most ``max_jobs`` entries (then all are dropped and read again).
    """

    def __init__(self, max_jobs: int = 10_000) -> None:
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self._places: dict[str, dict[int, str]] = {}
        self._generation = 0

    def get(self, job_id: str) -> dict[int, str] | None:
        """The job's ranks and their nodes' names; None if not known here."""
        with self._lock:
            return self._places.get(job_id)

    def generation(self) -> int:
        """Pass to ``put`` with what is read after this call."""
        with self._lock:
            return self._generation

    def put(self, job_id: str, places: dict[int, str], generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return  # invalidated while it was read: it may predate the write
            if len(self._places) >= self.max_jobs:
                self._places.clear()
            self._places[job_id] = dict(places)

    def invalidate(self) -> None:
        with self._lock:
            self._places.clear()
            self._generation += 1


class IntervalHistories:
    """Each job's newest complete intervals, kept as its reports are stored, so an
    interval report needs no history query (reading it back was a third of a
    report's CPU at 32 reports a second).

    Only ``ReportIntervalStats`` writes intervals, and only after its commit does it
    ``put`` the history it computed, keyed by the job's attempt (a restart's first
    plan version): a restart starts a new history, and ``invalidate`` drops them all
    (with the other caches, at every submission, cancel, rank exit and restart), so
    memory holds only jobs that reported since. A job's reports come one at a time
    from its rank 0; two that overlapped could leave one interval out of the
    history one decision sees, never out of the database.
    """

    def __init__(self, window: int) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._histories: dict[str, tuple[int, list[tuple[int, list[RankInterval]]]]] = {}

    def invalidate(self) -> None:
        with self._lock:
            self._histories.clear()

    def drop(self, job_id: str) -> None:
        """Forget ``job_id``'s history: a report of it was stored by another process."""
        with self._lock:
            self._histories.pop(job_id, None)

    def get(self, job_id: str, attempt: int) -> list[tuple[int, list[RankInterval]]] | None:
        """(end step, ranks in rank order) oldest first, or None if not known."""
        with self._lock:
            hit = self._histories.get(job_id)
        return list(hit[1]) if hit is not None and hit[0] == attempt else None

    def put(self, job_id: str, attempt: int, history: list[tuple[int, list[RankInterval]]]) -> None:
        with self._lock:
            self._histories[job_id] = (attempt, history[-self.window :])


def with_interval(
    history: list[tuple[int, list[RankInterval]]],
    end_step: int,
    ranks: list[RankInterval],
    window: int,
) -> list[tuple[int, list[RankInterval]]]:
    """``history`` with a complete interval added (a re-sent one replaces its step, as
    the newest rows win in the database), the newest ``window`` kept."""
    merged = [(step, rs) for step, rs in history if step != end_step]
    merged.append((end_step, sorted(ranks, key=lambda r: r.rank)))
    merged.sort(key=lambda item: item[0])
    return merged[-window:]
