"""Interval reports in a process of their own, off the interpreter lock that answers
heartbeats.

Why (issue 17): with 10,000 jobs queued, 1,000 agents and 256 ranks on a 2-core
box, the coordinator's one Python interpreter was saturated (0.97 to 1.00 cores)
and the event loop that answers heartbeats got the interpreter lock only in turn:
Heartbeat p99 1.5 to 2.5 s. A report's two transactions, straggler detection and
the arguments of its fit cost about 10 ms of the coordinator's CPU each, 32 a
second; a heartbeat answered from memory costs gRPC's per-call work. Here a
report's whole work (``intervalreports.handle``, its fit included) runs in a
worker process with a database engine of its own; the coordinator's thread that
waits for it holds no lock of the interpreter meanwhile, and what is left in the
coordinator per report is the call itself and the update of its own caches.

A worker takes its reports one at a time, in the order they were handed over, and
every report of a job goes to the same worker (``ReportWorkers``: by a hash of the
job's id), so a job's reports are stored in the order they arrived and no two of
its writes ever overlap. Several workers take different jobs' reports side by
side: the reports of jobs whose intervals end together arrive in a burst, and
with one worker the last of a burst of six waits for five fits before its own
(under ``hetero-bench load --agents 1000 --ranks 256`` the one worker was busy
half the time). Their writes still take turns on the database's write lock;
their fits run on separate cores, where the host has cores to spare
(``DEFAULT_PROCESSES``). It writes to the same database as the coordinator, and their write
transactions run one after another as the coordinator's own writers do
(``database``): on a SQLite file both queue on its lock file (``writelock``)
before ``BEGIN IMMEDIATE`` takes SQLite's write lock; on PostgreSQL both take
the same advisory lock first (``database.WRITERS_LOCK_KEY``). An in-memory
SQLite database cannot be opened by a second process: there reports stay on the
coordinator's threads (``server.serve`` starts no worker).

The worker is given the database URL, password included, as an argument of its
initializer: multiprocessing pickles it down the pipe it starts the worker
with, never onto the worker's command line or environment, and every message
that names the URL masks the password (``dburl``).

What the worker keeps: its own history of each job's newest intervals
(``readcache.IntervalHistories``; a new worker starts with none and reads them
back). The coordinator's caches stay in the coordinator: the reply is put in its
plan cache, a restart the report caused drops its order and plan caches and
tells the admission pass, as a report handled in the coordinator does.

Failure (``workerprocess``): before the worker is ready, and when it dies or
overruns :data:`TIMEOUT_S`, the report is handled in the coordinator's process
(logged once per failure) and the worker is replaced. A worker killed after its
commit and before its reply has stored the interval once; the coordinator's
retry stores it again, as a rank that re-sends a report does (the newest rows of
an interval win: ``readcache.with_interval``, ``store.interval_steps``).
"""

from __future__ import annotations

import logging
import zlib
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import intervalreports, store
from hetero.coordinator.database import connect, session_factory
from hetero.coordinator.readcache import IntervalHistories
from hetero.coordinator.views import HISTORY_FOR_REPORT
from hetero.coordinator.workerprocess import WorkerProcess
from hetero.core import cpus, replan
from hetero.core.errors import HeteroError
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.coordinator")

#: Report workers a coordinator starts by default: one per two cores, at least one, at
#: most four (each is a Python interpreter with its own database engine, about 80 MB).
#: The coordinator's event loop keeps a core busy: on a 2-core box two workers gave
#: reports no shorter tail under ``hetero-bench load`` (p99 113 and 233 ms against 129
#: and 120 with one) and the heartbeats a longer one in one run of two.
DEFAULT_PROCESSES = max(1, min(4, cpus.usable() // 2))

#: Seconds a report may take in the worker, queue included, before it is handled in
#: the coordinator's process instead (an agent's call deadline is 5 s; a report takes
#: about 20 ms).
TIMEOUT_S = 3.0


class Refused(HeteroError):
    """A report the worker refused (unknown job, a report the balancer cannot use), with
    the status code and message it would have had in the coordinator's process."""

    def __init__(self, grpc_code: str, message: str) -> None:
        super().__init__(message)
        self.grpc_code = grpc_code


class ReportWorker(WorkerProcess):
    """``intervalreports.handle`` in one worker process on ``db_url`` (a SQLite file or
    PostgreSQL), started at the first report; ``close`` ends it."""

    def __init__(self, db_url: str, timeout_s: float = TIMEOUT_S) -> None:
        super().__init__("report", _open, (db_url,))
        self.timeout_s = timeout_s

    def handle(self, req: tpb.IntervalReport, now: float) -> intervalreports.Handled | None:
        """The report handled in the worker; None = handle it here (no worker yet, or it
        failed). Raises ``Refused`` for a report the worker refused (nothing stored).

        The wait is :data:`TIMEOUT_S` whatever the client's deadline: a call whose
        client gives up first is finished all the same, as on a thread, and a short
        deadline never takes a working worker for a stuck one."""
        outcome = self.call(_handle, req.SerializeToString(), now, timeout_s=self.timeout_s)
        if outcome is None:
            return None
        if outcome.refused is not None:
            raise Refused(*outcome.refused)
        if outcome.failed is not None:  # logged with its traceback in the worker
            raise RuntimeError(f"the report worker failed: {outcome.failed}")
        return intervalreports.Handled(tpb.Plan.FromString(outcome.plan), outcome.restarted)


class ReportWorkers:
    """``processes`` report workers; each job's reports go to one of them, always the
    same (``of``). Each starts at its first report, as a ``ReportWorker`` does."""

    def __init__(
        self, db_url: str, processes: int = DEFAULT_PROCESSES, timeout_s: float = TIMEOUT_S
    ) -> None:
        if processes < 1:
            raise ValueError(f"report processes must be >= 1, got {processes}")
        self.workers = tuple(ReportWorker(db_url, timeout_s) for _ in range(processes))

    def of(self, job_id: str) -> ReportWorker:
        """The worker that takes ``job_id``'s reports (a hash of the id: stable across
        restarts of the coordinator and of the workers)."""
        return self.workers[zlib.crc32(job_id.encode()) % len(self.workers)]

    def handle(self, req: tpb.IntervalReport, now: float) -> intervalreports.Handled | None:
        """``ReportWorker.handle`` in the job's worker."""
        return self.of(req.job_id).handle(req, now)

    def admit(self, queue: store.QueueConfig, now: float) -> bool | None:
        """The sweeper's admission pass (``store.admit_queued``) in the first worker, in a
        transaction of its own; True if it placed a job. None = run it here (no worker
        running: none is started for it, or it failed).

        Why: with 10,000 jobs queued and 1,000 nodes a pass costs 80 to 130 ms of CPU
        (a 2-core box), and in the coordinator's process every one of them held the
        interpreter lock the event loop answering heartbeats needs; the sweeper runs one
        at least every ``capacity.REFRESH_S``. The worker's reports wait behind it."""
        worker = self.workers[0]
        if worker.state != "ready":
            return None
        return worker.call(_admit, queue, now, timeout_s=worker.timeout_s)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


@dataclass(frozen=True)
class _Outcome:
    """What the worker answers for one report (pickled): the plan and whether the job
    restarts, or the status code and message it was refused with, or the type of
    the exception it failed with."""

    plan: bytes = b""
    restarted: bool = False
    refused: tuple[str, str] | None = None
    failed: str | None = None


#: In the worker: its sessions and history cache (``_open``).
_sessions: sessionmaker[Session] | None = None
_histories: IntervalHistories | None = None


def _open(db_url: str) -> None:
    """The worker's database (its schema is the coordinator's, already upgraded)."""
    global _sessions, _histories
    _sessions = session_factory(connect(db_url))
    _histories = IntervalHistories(HISTORY_FOR_REPORT)


def _admit(queue: store.QueueConfig, now: float) -> bool:
    """One admission pass, in the worker: True if a job was placed."""
    assert _sessions is not None, "the worker's database is not open"
    with _sessions.begin() as s:
        return bool(store.admit_queued(s, queue, now=now))


def _handle(request: bytes, now: float) -> _Outcome:
    """One report, in the worker."""
    assert _sessions is not None, "the worker's database is not open"
    req = tpb.IntervalReport.FromString(request)
    try:
        handled = intervalreports.handle(_sessions, _histories, replan.replan, req, now)
    except HeteroError as exc:
        return _Outcome(refused=(exc.grpc_code, str(exc)))
    except Exception as exc:  # the coordinator answers INTERNAL, as for its own threads
        log.exception("internal error in ReportIntervalStats (report worker)")
        return _Outcome(failed=type(exc).__name__)
    return _Outcome(handled.reply.SerializeToString(), handled.restarted)
