"""The cluster as the coordinator holds it in memory: nodes, jobs, ranks, plans, histories.

One event loop owns this state (``docs/design.md``, the coordinator): its handlers read
it and change it, and only that loop's thread touches it, so no lock guards it. The
database is its durable copy, written by one writer (``writer``) from the row values a
change hands over (``persist``), and read back once, at start (``persist.load``).

What is here is what the serving path needs: every node with its devices, liveness and
newest telemetry; every job not finished, and the finished ones for
:data:`KEEP_FINISHED_S` (the cluster view shows them), each with its typed spec (parsed
once, at submission or at load), its ranks, its newest plan, the recent intervals of
its current attempt that straggler detection and the balancer read, and its newest
events. What is too big to keep (log lines, every interval and plan of a job, jobs that
ended long ago) stays in the database and is read from there when asked for; what the
stored lines weigh is kept, for the log caps (``logcaps``).

The field names of :class:`Node`, :class:`Job` and :class:`Rank` are their tables'
column names (``models``), so a row and its object read alike.
"""

from __future__ import annotations

import bisect
import collections
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from hetero.coordinator import lifecycle
from hetero.coordinator.logcaps import LogLedger
from hetero.coordinator.placement import DeviceSlot
from hetero.core.balancer import Batches, RankInterval
from hetero.core.jobspec import JobSpec

#: Seconds a finished job stays in memory (the cluster view lists it that long).
KEEP_FINISHED_S = 3600.0
#: Events of a job kept in memory, newest last (what ``GetJob`` shows).
JOB_EVENTS = 50


@dataclass(frozen=True)
class Device:
    """A device's hardware profile as its agent measured it (``models.DeviceRow``)."""

    index: int
    name: str
    kind: str
    compute_score: float
    matmul_tflops: float | None = None
    memory_bandwidth_bytes_per_s: float | None = None
    host_to_device_bytes_per_s: float | None = None
    device_to_host_bytes_per_s: float | None = None
    memory_bytes: int | None = None
    emulated_slowdown: float = 1.0
    #: Comma-separated profile fields that exceeded the device's limits; "" = none.
    suspect: str = ""
    shared_while_profiled: bool = False
    foreign_utilization_percent: float | None = None


@dataclass(eq=False)
class Node:
    """A registered node. ``last_heartbeat_unix_s`` is kept here at every heartbeat and
    written with its sampled telemetry and at each change of ``down``; ``telemetry`` is
    the newest heartbeat's samples, whatever the caller keeps them as (None: none yet)."""

    id: str
    name: str
    address: str
    agent_endpoint: str
    agent_version: str
    registered_at_unix_s: float
    last_heartbeat_unix_s: float
    draining: bool = False
    down: bool = False
    devices: tuple[Device, ...] = ()
    telemetry: object | None = None
    #: The host's profile from its registration (``hetero.v1.HostProfile``; None: none sent),
    #: with the links to other nodes measured since (``peerlinks``).
    host_profile: object | None = None
    #: Where its agent answers link probes, (port, token), while its order stream is open;
    #: None: it serves none. In memory only, never shown (``peerlinks``).
    peer_probe: tuple[int, bytes] | None = field(default=None, repr=False)
    #: Ids of the nodes its agent is to measure its links to, not yet sent (``peerlinks``).
    probe_targets: list[str] = field(default_factory=list, repr=False)
    #: The newest telemetry bucket written for this node (``TelemetryPolicy.period_s``),
    #: and the newest of the samples its agent buffered while cut off.
    telemetry_bucket: int = -1
    buffered_bucket: int = -1

    def healthy(self, now: float, timeout_s: float) -> bool:
        return now - self.last_heartbeat_unix_s <= timeout_s


@dataclass(eq=False)
class Rank:
    """One rank of a job's current attempt (``models.RankRow``)."""

    rank: int
    node_id: str
    device_index: int
    device_kind: str
    device_name: str
    local_rank: int
    state: str
    exit_code: int | None = None
    emulated_slowdown: float = 1.0
    #: Compute score with emulation applied, as the balancer saw it at placement.
    effective_score: float = 1.0


@dataclass(frozen=True)
class Plan:
    """One version of a job's per-rank batches (``models.PlanRow``)."""

    version: int
    apply_at_step: int
    batches: Batches
    policy: str
    reason: str
    created_at_unix_s: float
    predicted_step_s: float | None = None


@dataclass(frozen=True)
class Event:
    """One entry of the event journal (``models.EventRow``); ``id`` is given here, so a
    job's events in memory and in the database carry the same ids."""

    id: int
    time_unix_s: float
    kind: str
    message: str
    job_id: str | None = None
    node_id: str | None = None


#: One complete interval: its end step and every rank's statistics, in rank order.
Interval = tuple[int, tuple[RankInterval, ...]]


@dataclass(eq=False)
class Job:
    """A job and what the serving path reads of it (``models.JobRow`` and more).

    ``spec`` is the typed spec, parsed once; ``world_size`` is the current attempt's
    (a restart on fewer devices has fewer ranks than the spec). ``history`` holds the
    current attempt's newest complete intervals, oldest first; ``latest`` the newest
    report of one as its caller keeps it (the live view reads it)."""

    id: str
    name: str
    spec: JobSpec
    spec_yaml: str
    state: str
    submitted_at_unix_s: float
    world_size: int
    priority: int = 0
    owner: str = ""
    backend: str = ""
    master_addr: str = ""
    master_port: int = 0
    finished_at_unix_s: float | None = None
    message: str = ""
    restarts: int = 0
    last_step: int = 0
    attempt_first_plan: int = 1
    restarting_since_unix_s: float | None = None
    #: Ranks left out (``exclusion``): a JSON list, "" for none (the column's form).
    excluded: str = ""
    exclusion_restarts: int = 0
    ranks: list[Rank] = field(default_factory=list)
    plan: Plan | None = None
    history: deque[Interval] = field(default_factory=deque)
    latest: object | None = None
    #: The live view built from ``latest`` (``messages.job_live``): (that report, the
    #: newest interval's end step, the view), rebuilt when either moves.
    live: tuple[object, int, object] | None = None
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=JOB_EVENTS))
    #: The newest "not helping" message said of the job ("" = none).
    not_helping: str = ""
    #: Seconds the current attempt took from its placement to its first step (None: not
    #: measured yet, or measured before this coordinator started).
    start_up_s: float | None = None
    #: An attached job's launcher as shown ("slurm job 4242", ``attach``); "" for a job
    #: the coordinator launched.
    launcher: str = ""
    #: When an attached job's rank 0 last spoke (Unix s; this coordinator's start at most).
    heard_at_unix_s: float = 0.0

    @property
    def policy(self) -> str:
        return self.spec.policy

    @property
    def global_batch(self) -> int:
        return self.spec.global_batch

    @property
    def min_batch(self) -> int:
        return self.spec.min_batch

    @property
    def rebalance_interval(self) -> int:
        return self.spec.rebalance_interval

    @property
    def total_steps(self) -> int | None:
        return self.spec.steps

    @property
    def max_restarts(self) -> int:
        return self.spec.max_restarts

    @property
    def finished(self) -> bool:
        return self.state in lifecycle.FINISHED

    @property
    def placed(self) -> bool:
        return self.state in lifecycle.PLACED

    def queue_key(self) -> tuple[int, float, str]:
        """Its place in the queue: priority (higher first), then submission, then id."""
        return (-self.priority, self.submitted_at_unix_s, self.id)


class ClusterState:
    """Nodes and jobs by id, the queue in order, and the counters the database would
    otherwise be asked for (the next event id, where the search for a free rendezvous
    port starts)."""

    def __init__(self, *, next_event_id: int = 1, port_cursor: int = 0) -> None:
        self.nodes: dict[str, Node] = {}
        self._node_ids: dict[str, str] = {}
        self.jobs: dict[str, Job] = {}
        #: Queued jobs' keys in queue order, and the jobs behind them.
        self._queue_keys: list[tuple[int, float, str]] = []
        #: The jobs out of the queue (placed, restarting, attached, finished), so that
        #: what concerns ranks reads tens of jobs, not the thousands that may wait; and
        #: the queued jobs of each owner.
        self._unqueued: dict[str, Job] = {}
        self._queued_of: collections.Counter[str] = collections.Counter()
        #: The jobs whose spec names a directory they write (``jobdirs.written``): a submission
        #: compares its directories with these, not with every queued job.
        self._writers: dict[str, Job] = {}
        #: Each node's devices as placement sees them on a healthy, undrained node with
        #: nothing running, kept until its devices, address or the CPU capacity change
        #: (``device_slots`` copies only the slots that differ); the nodes by name.
        self._slots: dict[str, tuple[tuple[Device, ...], str, int | None, list[DeviceSlot]]] = {}
        self._by_name: list[Node] | None = None
        self.next_event_id = next_event_id
        #: Where the next search for a free rendezvous port starts (``free_ports``).
        self.port_cursor = port_cursor
        #: Bytes charged for every job's stored log lines, the ended ones' too (``logcaps``).
        self.logs = LogLedger()

    # ---- nodes -------------------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        self.nodes[node.id] = node
        self._node_ids[node.name] = node.id
        self._by_name = None

    def node_named(self, name: str) -> Node | None:
        node_id = self._node_ids.get(name)
        return None if node_id is None else self.nodes.get(node_id)

    def find_node(self, ref: str) -> Node | None:
        """A node by id, else by name."""
        return self.nodes.get(ref) or self.node_named(ref)

    # ---- jobs and the queue ------------------------------------------------------------

    def add_job(self, job: Job) -> None:
        """Jobs are added in submission order (``persist.load`` sorts them): the views
        that show the newest read them backwards."""
        self.jobs[job.id] = job
        spec = job.spec
        if (spec.checkpoint is not None and spec.checkpoint.dir) or spec.options.tensorboard:
            self._writers[job.id] = job
        if job.state == lifecycle.QUEUED:
            bisect.insort(self._queue_keys, job.queue_key())
            self._queued_of[job.owner] += 1
        else:
            self._unqueued[job.id] = job

    def left_queue(self, job: Job) -> None:
        """``job`` was placed or cancelled: it no longer waits."""
        key = job.queue_key()
        at = bisect.bisect_left(self._queue_keys, key)
        if at < len(self._queue_keys) and self._queue_keys[at] == key:
            del self._queue_keys[at]
            self._queued_of[job.owner] -= 1
        self._unqueued[job.id] = job

    def queued(self, limit: int | None = None) -> list[Job]:
        """Queued jobs in queue order; the first ``limit`` (None = all)."""
        keys = self._queue_keys if limit is None else self._queue_keys[:limit]
        return [self.jobs[key[2]] for key in keys]

    def ahead_of(self, job: Job) -> int:
        """Queued jobs placed before ``job`` would be."""
        return bisect.bisect_left(self._queue_keys, job.queue_key())

    def forget_job(self, job_id: str) -> None:
        """Drop a finished job from memory (the database keeps it)."""
        job = self.jobs.pop(job_id, None)
        if job is not None and job.state == lifecycle.QUEUED:
            self.left_queue(job)
        self._unqueued.pop(job_id, None)
        self._writers.pop(job_id, None)

    def writers(self) -> Iterator[Job]:
        """The jobs whose spec names a directory they write (checkpoints, TensorBoard)."""
        return iter(self._writers.values())

    def unqueued(self) -> Iterator[Job]:
        """The jobs out of the queue: placed, restarting, attached and finished ones (only
        these have ranks)."""
        return iter(self._unqueued.values())

    def placed_jobs(self) -> Iterator[Job]:
        return (j for j in self._unqueued.values() if j.placed)

    def restarting_jobs(self) -> list[Job]:
        """RESTARTING jobs in queue order: the first placed when devices are short."""
        jobs = (j for j in self._unqueued.values() if j.state == lifecycle.RESTARTING)
        return sorted(jobs, key=Job.queue_key)

    def queued_count(self) -> int:
        return len(self._queue_keys)

    def jobs_of(self, owner: str) -> int:
        """Queued and placed jobs of ``owner`` (a credential's name)."""
        active = sum(1 for j in self._unqueued.values() if j.owner == owner and not j.finished)
        return self._queued_of[owner] + active

    def finished_before(self, cutoff: float) -> list[str]:
        """Ids of jobs that finished before ``cutoff`` (Unix s): those to forget."""
        return [
            j.id
            for j in self._unqueued.values()
            if j.finished_at_unix_s is not None and j.finished_at_unix_s < cutoff and j.finished
        ]

    def new_event_id(self) -> int:
        event_id = self.next_event_id
        self.next_event_id += 1
        return event_id

    # ---- devices and ports for placement -----------------------------------------------

    def device_slots(
        self, *, now: float, timeout_s: float, cpu_capacity: int | None = None
    ) -> list[DeviceSlot]:
        """Every registered device with its node's health and its active ranks, for
        placement, nodes by name; a CPU device takes at most ``cpu_capacity`` ranks (None
        = no limit). A pass reads this at every submission: the slots of idle devices on
        healthy nodes are built once per node (:attr:`_slots`), and only the others are
        copied (with 4,000 devices, 10 ms a pass on the 2-core box became 1 ms)."""
        busy: dict[tuple[str, int], int] = {}
        for job in self.placed_jobs():
            for r in job.ranks:
                if r.state != lifecycle.EXITED:
                    key = (r.node_id, r.device_index)
                    busy[key] = busy.get(key, 0) + 1
        if self._by_name is None:
            self._by_name = sorted(self.nodes.values(), key=lambda n: n.name)
        slots: list[DeviceSlot] = []
        for node in self._by_name:
            base = self._base_slots(node, cpu_capacity)
            healthy = node.healthy(now, timeout_s)
            if healthy and not node.draining:
                if not busy:
                    slots.extend(base)
                    continue
                for slot in base:
                    running = busy.get((node.id, slot.index), 0)
                    slots.append(replace(slot, ranks_running=running) if running else slot)
                continue
            for slot in base:
                running = busy.get((node.id, slot.index), 0)
                slots.append(
                    replace(slot, healthy=healthy, draining=node.draining, ranks_running=running)
                )
        return slots

    def _base_slots(self, node: Node, cpu_capacity: int | None) -> list[DeviceSlot]:
        cached = self._slots.get(node.id)
        if (
            cached is not None
            and cached[0] is node.devices
            and cached[1] == node.address
            and cached[2] == cpu_capacity
        ):
            return cached[3]
        base = [
            DeviceSlot(
                node_id=node.id,
                node_name=node.name,
                node_address=node.address,
                index=d.index,
                kind=d.kind,
                name=d.name,
                compute_score=d.compute_score,
                memory_bytes=d.memory_bytes,
                emulated_slowdown=d.emulated_slowdown,
                capacity=cpu_capacity if d.kind == "cpu" else None,
            )
            for d in node.devices
        ]
        self._slots[node.id] = (node.devices, node.address, cpu_capacity, base)
        return base

    def ports_in_use(self) -> set[int]:
        """Rendezvous ports of the placed jobs (a RESTARTING job's old ranks may hold it)."""
        return {j.master_port for j in self.placed_jobs()}

    def free_ports(self, base: int, span: int) -> Iterator[int]:
        """Ports of ``[base, base + span)`` no placed job holds, each once, from
        ``port_cursor`` on: consecutive placements get different ports, and a port just
        released is reused last. Each port taken moves the cursor past it."""
        used = self.ports_in_use()
        start = self.port_cursor
        for i in range(span):
            port = base + (start + i) % span
            if port not in used:
                self.port_cursor = (start + i + 1) % span
                yield port
