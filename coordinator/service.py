"""The coordinator's service on its event loop: the state, its rules, the writer, the
reads of history, and the periodic work (the sweep, pruning).

``Service.start`` loads the state from the database (the recovery, ``persist.load``),
starts the writer and the periodic tasks; after that the database is written by the
writer alone and read only for what the state does not keep (log lines, every interval
and plan of a job, jobs that ended long ago), on :data:`READ_THREADS` threads of
read-only sessions. A handler changes the state through ``cluster`` and then
``commit``\\s: the changes' operations go to the writer and the handler waits for
their commit before it answers; nodes whose orders changed are told after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle, persist
from hetero.coordinator.admission import Limits
from hetero.coordinator.cluster import Cluster, Rules
from hetero.coordinator.database import read_session_factory, session_factory
from hetero.coordinator.logcaps import LogCaps
from hetero.coordinator.logpruning import prune_logs_batch
from hetero.coordinator.models import TelemetryRow
from hetero.coordinator.pruning import PruneState, prune_batch, prune_finished_jobs
from hetero.coordinator.reports import HISTORY
from hetero.coordinator.retention import IntervalRetention, JobRetention, LogRetention
from hetero.coordinator.stalls import StallWatch
from hetero.coordinator.state import ClusterState, Node
from hetero.coordinator.store.telemetry import TelemetryPolicy
from hetero.coordinator.writer import FAILURE_LOG_S, StoreUnavailable, Writer
from hetero.core import defaults, heap

log = logging.getLogger("hetero.coordinator")

T = TypeVar("T")

#: Threads that read what the state does not keep (log and history pages).
READ_THREADS = 2
#: Seconds between the sweeper's admission passes when nothing it can see has changed
#: (the reasons of the jobs still waiting are refreshed then).
REFRESH_S = 30.0
#: The queue's pass takes at most this share of the loop's time when changes come in
#: a burst: after a pass of d s the next waits d·(1/share − 1) s at least, so a thousand
#: agents registering at once cost a few passes, not a thousand (each looks at up to
#: ``cluster.MAX_EXAMINED`` queued jobs against every device).
ADMISSION_SHARE = 0.2
#: Seconds a change waits for its pass, at least: the changes of a burst go together.
ADMISSION_DELAY_S = 0.05
#: Seconds between pruning passes; batches a pass runs at most.
PRUNE_PERIOD_S = 60.0
MAX_PRUNE_BATCHES = 100
#: Every measured column of a telemetry row, unset: a host's sample and a device's
#: fill different ones, and rows written together must name the same columns.
_NO_SAMPLE: dict[str, object] = {
    c.name: None
    for c in TelemetryRow.__table__.columns
    if c.name not in ("id", "node_id", "bucket", "time_unix_s")
}
#: Seconds between writes of the telemetry heartbeats carried.
TELEMETRY_FLUSH_S = 1.0
#: Seconds between tries to reload the state after a failed write.
RELOAD_RETRY_S = 1.0


@dataclass(frozen=True)
class Settings:
    """What the coordinator answers by: its database, node health (seconds), the
    rendezvous ports, retention, admission's limits, the byte caps on stored logs, the
    roots jobs' paths must lie under (None = only "absolute") and the paths they must
    not hold, and the clock (tests move one by hand)."""

    db_url: str
    heartbeat_interval_s: float = defaults.HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    master_port_base: int = defaults.MASTER_PORT_BASE
    master_port_span: int = defaults.MASTER_PORT_SPAN
    telemetry: TelemetryPolicy = field(default_factory=TelemetryPolicy)
    interval_retention: IntervalRetention = field(default_factory=IntervalRetention)
    log_retention: LogRetention = field(default_factory=LogRetention)
    job_retention: JobRetention = field(default_factory=JobRetention)
    limits: Limits = field(default_factory=Limits)
    log_caps: LogCaps = field(default_factory=LogCaps)
    allowed_roots: tuple[str, ...] | None = None
    #: The coordinator's own files and directories (``core.roots.absolute``), which no
    #: job path may hold (``core.roots.path_problem``).
    private_paths: tuple[str, ...] = ()
    clock: Callable[[], float] = time.time
    #: Seconds between sweeps; None = half the heartbeat interval. Tests that move a
    #: clock by hand sweep when they choose (``CoordinatorServer.sweep``) and set it long.
    sweep_period_s: float | None = None


class Service:
    """The coordinator's state and what works on it, owned by one event loop."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.started_at = settings.clock()
        rules = Rules(
            heartbeat_timeout_s=settings.heartbeat_timeout_s,
            started_at=self.started_at,
            master_port_base=settings.master_port_base,
            master_port_span=settings.master_port_span,
            ranks_per_cpu_device=settings.limits.ranks_per_cpu_device,
        )
        self.cluster = Cluster(ClusterState(), rules)
        self.writer = Writer(
            session_factory(engine), on_failure=self._reload, on_health=self._health_changed
        )
        #: Told whether the database takes writes (the server's health check).
        self.on_health: Callable[[bool], None] | None = None
        self._reader = futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="hetero-read")
        self._readers = read_session_factory(engine)
        self._tasks: list[asyncio.Task[None]] = []
        #: Each node's order streams' events, set when its orders changed (committed).
        self._watchers: dict[str, set[asyncio.Event]] = {}
        #: The loop's stalls: one of a heartbeat interval means this process was paused.
        self._stalls = StallWatch()
        #: The cluster's ``capacity`` and the time at the last admission pass.
        self._admitted: tuple[int, float] | None = None
        #: Set when ``capacity`` moved since that pass: the admission task runs one.
        self._moved = asyncio.Event()
        self._prune = PruneState()
        #: Telemetry rows and nodes' liveness kept since the last flush.
        self._samples: list[dict[str, object]] = []
        self._heard: dict[str, float] = {}
        self.stopping = asyncio.Event()
        #: Set once the state is loaded and this coordinator holds its database's lock
        #: (``standby``): until then every call is UNAVAILABLE.
        self.ready = False

    @property
    def sweep_period_s(self) -> float:
        period = self.settings.sweep_period_s
        return self.settings.heartbeat_interval_s / 2 if period is None else period

    @property
    def state(self) -> ClusterState:
        return self.cluster.state

    def now(self) -> float:
        return self.settings.clock()

    # ---- start and stop --------------------------------------------------------------

    async def load(self) -> None:
        """Read the state from the database (the recovery): before anything is served."""
        self.cluster.state = await self.read(self._load, after_writes=False)
        # The state just read (ten thousand queued jobs are about a million objects) lives
        # as long as the process, or as long as its job: out of every full collection,
        # which would walk it all and stall the loop (``core.heap``).
        heap.settle()
        jobs = self.state.jobs.values()
        log.info(
            "state loaded: %d nodes, %d jobs (%d queued, %d placed)",
            len(self.state.nodes),
            len(self.state.jobs),
            sum(j.state == lifecycle.QUEUED for j in jobs),
            sum(j.placed for j in jobs),
        )

    def _load(self, s: Session) -> ClusterState:
        return persist.load(s, now=self.now(), history=HISTORY)

    def start(self) -> None:
        """Start the writer and the periodic work (on the loop that owns the service)."""
        self.writer.start()
        self._stalls = StallWatch()  # loading the state was no stall
        self._tasks = [
            asyncio.get_running_loop().create_task(self._every(period, work), name=name)
            for name, period, work in (
                ("sweeper", self.sweep_period_s, self._sweep_on_time),
                ("pruner", PRUNE_PERIOD_S, self.prune),
                ("telemetry", TELEMETRY_FLUSH_S, self.flush_telemetry),
            )
        ]
        self._tasks.append(asyncio.get_running_loop().create_task(self._admission()))
        self._tasks.append(asyncio.get_running_loop().create_task(self._stalls.run()))

    async def stop(self) -> None:
        """End the periodic work, write what is queued, close the reading threads."""
        self.stopping.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ready:
            await self.flush_telemetry()
            await self.writer.stop()
        self._reader.shutdown(wait=False, cancel_futures=True)

    async def _every(self, period_s: float, work: Callable[[], Any]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await work()
            except StoreUnavailable as exc:
                log.warning("%s: %s", work.__name__, exc)
            except Exception:  # the next round tries again; never let the task die
                log.exception("%s failed", work.__name__)

    # ---- writing and reading ---------------------------------------------------------

    async def commit(self) -> None:
        """Write what the rules changed and wait for the commit; then tell the nodes whose
        orders changed. Raises ``StoreUnavailable`` if the write failed."""
        ops, touched = self.cluster.take()
        self._note_capacity()
        if ops:
            await self.writer.write(*ops)
        self._tell(touched)

    def commit_later(self) -> None:
        """Write what the rules changed without waiting (a heartbeat's liveness change and
        telemetry: nobody waits for those)."""
        ops, touched = self.cluster.take()
        self._note_capacity()
        if ops:
            try:
                self.writer.put(*ops)
            except StoreUnavailable as exc:
                log.debug("not written: %s", exc)
        self._tell(touched)

    async def read(self, fn: Callable[[Session], T], *, after_writes: bool = True) -> T:
        """``fn`` on a reading thread with a read-only session (what the state does not keep).
        ``after_writes``: once what was put before it is committed, so a rank's interval
        report written with a later batch (``commit_later``) is in the history a caller
        reads after it. Not from the writer's own recovery (``_reload``), which runs while
        the writer waits for it."""
        if after_writes:
            with contextlib.suppress(StoreUnavailable):  # the read says what the store can
                await self.writer.barrier()

        def run() -> T:
            with self._readers() as s:
                return fn(s)

        return await asyncio.get_running_loop().run_in_executor(self._reader, run)

    def _health_changed(self, takes_writes: bool) -> None:
        if self.on_health is not None:
            self.on_health(takes_writes)

    async def _reload(self, error: StoreUnavailable) -> None:
        """After a failed write: the state again as the database has it, the changes not
        kept gone from memory too. Nodes keep their liveness and newest telemetry. A
        database that cannot be read either (a damaged file) is tried again until it
        can, or until the coordinator stops (which then has nothing to write)."""
        tries = 0
        while True:
            try:
                state = await self.read(self._load, after_writes=False)
                break
            except Exception as exc:
                if tries % int(FAILURE_LOG_S / RELOAD_RETRY_S) == 0:  # a line a minute
                    log.warning(
                        "reloading the state after %s failed %d times (%s); trying again",
                        error,
                        tries + 1,
                        str(exc).splitlines()[0],
                    )
                tries += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), RELOAD_RETRY_S)
                if self.stopping.is_set():
                    return
        for node_id, node in state.nodes.items():
            old = self.state.nodes.get(node_id)
            if old is not None:
                node.last_heartbeat_unix_s = max(
                    node.last_heartbeat_unix_s, old.last_heartbeat_unix_s
                )
                node.telemetry, node.telemetry_bucket = old.telemetry, old.telemetry_bucket
                node.peer_probe = old.peer_probe  # its order stream is still open
        self.cluster.state = state
        self.cluster.take()
        self._tell(set(self._watchers))
        log.warning("state reloaded from the database after a failed write")

    # ---- orders ----------------------------------------------------------------------

    def watch(self, node_id: str) -> asyncio.Event:
        """An event set each time ``node_id``'s orders change (an order stream's)."""
        event = asyncio.Event()
        self._watchers.setdefault(node_id, set()).add(event)
        return event

    def unwatch(self, node_id: str, event: asyncio.Event) -> None:
        self._watchers.get(node_id, set()).discard(event)

    def _tell(self, nodes: set[str]) -> None:
        for node_id in nodes:
            for event in self._watchers.get(node_id, ()):
                event.set()

    async def until(self, event: asyncio.Event) -> None:
        """Wait for ``event``, or for the coordinator to stop."""
        stopping = asyncio.ensure_future(self.stopping.wait())
        waiting = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait((stopping, waiting), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            waiting.cancel()

    # ---- telemetry -------------------------------------------------------------------

    def keep_telemetry(
        self,
        node: Node,
        values: Callable[[], tuple[dict[str, object], ...]],
        at: float,
        *,
        buffered: bool,
    ) -> None:
        """Keep a heartbeat's samples (``values()``: ``TelemetryRow`` values) once per bucket
        of ``TelemetryPolicy.period_s``, the first sample of each, and the node's liveness
        with it; a sample its agent ``buffered`` while cut off (sent in order once it is
        back) fills its own bucket, if telemetry of that age is still kept. They are
        written together every :data:`TELEMETRY_FLUSH_S` (``flush_telemetry``): one
        statement for all nodes' rows, not three for each node."""
        policy = self.settings.telemetry
        bucket = int(at // policy.period_s)
        if self.now() - at > policy.retention_s:
            return
        if buffered:
            if bucket == node.telemetry_bucket or bucket <= node.buffered_bucket:
                return
            node.buffered_bucket = bucket
        else:
            if bucket <= node.telemetry_bucket:
                return
            node.telemetry_bucket = bucket
            self._heard[node.id] = node.last_heartbeat_unix_s
        self._samples.extend(
            {**_NO_SAMPLE, **v, "node_id": node.id, "bucket": bucket, "time_unix_s": at}
            for v in values()
        )

    async def flush_telemetry(self) -> None:
        """Hand the samples kept since the last flush, and their nodes' liveness, to the
        writer (not waited for: nobody waits on telemetry)."""
        rows, self._samples = self._samples, []
        heard, self._heard = self._heard, {}
        if not rows and not heard:
            return
        try:
            self.writer.put(persist.AddRows(TelemetryRow, tuple(rows)), persist.Liveness(heard))
        except StoreUnavailable as exc:
            log.debug("telemetry not written: %s", exc)

    # ---- periodic work ---------------------------------------------------------------

    def _note_capacity(self) -> None:
        if self._admitted is None or self.cluster.capacity != self._admitted[0]:
            self._moved.set()

    async def admit_pending(self) -> None:
        """The pass a change asked for, now, if it has not run yet (tests; the admission
        task's pacing is for bursts)."""
        if self._moved.is_set():
            self._moved.clear()
            now = self.now()
            self.cluster.place_waiting(now=now)
            self._admitted = (self.cluster.capacity, now)
            await self.commit()

    async def _admission(self) -> None:
        """The queue's pass after a change that may let a waiting job fit (a node joined,
        was undrained or came back, a job ended or was cancelled): soon, and once for
        a burst of them (:data:`ADMISSION_SHARE`). Submit runs its own pass at once."""
        while True:
            await self._moved.wait()
            await asyncio.sleep(ADMISSION_DELAY_S)
            if not self._moved.is_set():
                continue  # a sweep's pass (or ``admit_pending``) ran since the change
            self._moved.clear()
            started, now = time.perf_counter(), self.now()
            try:
                self.cluster.place_waiting(now=now)
            except Exception:  # the next change tries again; never let the task die
                log.exception("admission failed")
            self._admitted = (self.cluster.capacity, now)
            spent = time.perf_counter() - started
            try:
                await self.commit()
            except StoreUnavailable as exc:
                log.warning("admission: %s", exc)
            await asyncio.sleep(spent * (1 / ADMISSION_SHARE - 1))

    async def _sweep_on_time(self) -> None:
        await self.sweep(stalled_s=self._stalls.take())

    async def sweep(self, stalled_s: float = 0.0) -> None:
        """Mark silent nodes down, place restarts, run the queue's pass when what waits
        may fit (a change since the last pass, or every ``REFRESH_S``).

        A coordinator that was paused (SIGSTOP, a suspended VM, a host starved of CPU)
        heard no heartbeat meanwhile, through no fault of the nodes: after a stall of the
        loop (``stalled_s``, the sweeper's from ``stalls``; a sweep asked for by hand, on
        a clock moved by hand, has none) of a heartbeat interval or more the sweep counts
        every node's silence from now, as after a restart, instead of declaring the
        cluster down."""
        now = self.now()
        if stalled_s >= self.settings.heartbeat_interval_s:
            log.warning(
                "the coordinator was paused for %.1f s (stopped, or starved of CPU): every "
                "node's silence counts from now, as after a restart",
                stalled_s,
            )
            self.cluster.rules = dataclasses.replace(self.cluster.rules, started_at=now)
        last = self._admitted
        due = last is None or self.cluster.capacity != last[0] or now - last[1] >= REFRESH_S
        self.cluster.sweep(now=now, admit=due)
        if due:
            self._admitted = (self.cluster.capacity, now)
            self._moved.clear()
        await self.commit()

    async def prune(self) -> None:
        """Telemetry, interval statistics, log lines, events and finished jobs within their
        retention, in batches written by the writer between the others' (``pruning``,
        ``logpruning``); the log caps' ledger gets back what the deleted lines weighed."""
        policy = self.settings.telemetry
        oldest = int((self.now() - policy.retention_s) // policy.period_s)
        await self.writer.write(persist.DropTelemetry(tuple(self.state.nodes), oldest))
        retention, logs = self.settings.interval_retention, self.settings.log_retention
        jobs = self.settings.job_retention
        for _ in range(MAX_PRUNE_BATCHES):
            op = persist.Call(lambda s: prune_batch(s, retention, self._prune, now=self.now()))
            await self.writer.write(op)
            self._prune = op.result.state
            if not op.result.more or self.stopping.is_set():
                break
        for _ in range(MAX_PRUNE_BATCHES):
            ledger = self.state.logs  # a reload meanwhile brings a ledger read after the delete
            op = persist.Call(lambda s: prune_logs_batch(s, logs, now=self.now()))
            await self.writer.write(op)
            if self.state.logs is ledger:
                ledger.release(op.result.freed)
            if not op.result.more or self.stopping.is_set():
                break
        for _ in range(MAX_PRUNE_BATCHES):
            ledger = self.state.logs
            op = persist.Call(lambda s: prune_finished_jobs(s, jobs, now=self.now()))
            await self.writer.write(op)
            gone, more = op.result
            if self.state.logs is ledger:
                ledger.forget(gone)
            for job_id in gone:  # no later write of it may bring its row back
                self.state.forget_job(job_id)
            if not more or self.stopping.is_set():
                break
