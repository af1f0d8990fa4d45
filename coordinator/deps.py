"""What the Coordinator servicer needs from its process: the database, caches, clock
and the settings it answers by."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import recovery, store
from hetero.coordinator.admission import Limits
from hetero.coordinator.capacity import CapacityWatch
from hetero.coordinator.ingest import HeartbeatIngest
from hetero.coordinator.readcache import (
    IntervalHistories,
    JobPlacements,
    LatestPlans,
    PendingOrders,
)
from hetero.coordinator.replanner import Replanner
from hetero.coordinator.reportworker import ReportWorkers
from hetero.coordinator.rpclatency import RpcLatency
from hetero.coordinator.snapshots import Snapshots
from hetero.core import defaults


@dataclass(frozen=True)
class Deps:
    """What the servicer needs from its process: the database and the clock.

    ``readers`` (``database.read_session_factory``) serves the handlers that only
    read; None = ``sessions``. ``ingest`` parks heartbeats and writes them in
    batches; None = each heartbeat is written in its own transaction. ``orders``
    answers most order polls and ``plans`` most ``GetPlan`` calls from memory, and
    ``histories`` keeps each job's recent intervals for its next report, and
    ``placements`` where each job's ranks are for the checks of node credentials
    (``readcache``); None = every call queries. ``replanner`` fits the balancer for
    interval reports in a worker process (``replanner``); None = in the handler's thread.
    ``reports`` handles whole interval reports in a process of their own
    (``reportworker``; not on an in-memory SQLite database); None = on the handler's
    thread. ``capacity`` is the sweeper's watch of changes that may let a waiting job fit,
    told of the ones made outside this process's sessions; None = not told.
    ``rpc_latency`` times every call's handling for ``/metrics`` (``rpclatency``).
    ``snapshots`` is the cluster snapshot ``WatchCluster`` and ``/metrics`` share, built
    in a process of its own where there is one (``snapshots``); None = each call builds
    its own on its thread.
    """

    sessions: sessionmaker[Session]
    readers: sessionmaker[Session] | None = None
    ingest: HeartbeatIngest | None = None
    orders: PendingOrders | None = None
    plans: LatestPlans | None = None
    histories: IntervalHistories | None = None
    placements: JobPlacements | None = None
    replanner: Replanner | None = None
    reports: ReportWorkers | None = None
    capacity: CapacityWatch | None = None
    snapshots: Snapshots | None = None
    clock: Callable[[], float] = time.time
    heartbeat_interval_s: float = defaults.HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S
    telemetry: store.TelemetryPolicy = field(default_factory=store.TelemetryPolicy)
    master_port_base: int = defaults.MASTER_PORT_BASE
    master_port_span: int = defaults.MASTER_PORT_SPAN
    #: Set on shutdown: ends WatchCluster streams so a graceful stop does not wait for them.
    stopping: threading.Event = field(default_factory=threading.Event)
    #: Directories jobs' checkpoint.dir and data_dir must lie under (core.roots);
    #: None = only "absolute".
    allowed_roots: tuple[str, ...] | None = None
    #: What the coordinator admits: jobs per credential, ranks per CPU device, spec
    #: bytes, calls at once, message size (``admission.Limits``).
    limits: Limits = field(default_factory=Limits)
    #: When this coordinator started (Unix s; None = ``clock()`` at construction):
    #: a node's silence counts from here at most.
    started_at_unix_s: float | None = None
    #: The server-side duration of each call, by method and status (one per coordinator).
    rpc_latency: RpcLatency = field(default_factory=RpcLatency)

    def __post_init__(self) -> None:
        if self.started_at_unix_s is None:
            object.__setattr__(self, "started_at_unix_s", self.clock())

    def sweep_config(self) -> recovery.SweepConfig:
        return recovery.SweepConfig(
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            started_at=self.started_at_unix_s or 0.0,
            master_port_base=self.master_port_base,
            master_port_span=self.master_port_span,
            ranks_per_cpu_device=self.limits.ranks_per_cpu_device,
        )

    def invalidate_caches(self) -> None:
        """Drop the order and plan caches: a write just changed what polls and
        ``GetPlan`` answer (a submission, a cancel, a rank's exit, a restart placed by
        the sweeper or by the last old rank's exit: a new plan and new launches)."""
        if self.orders is not None:
            self.orders.invalidate()
        if self.plans is not None:
            self.plans.invalidate()
        if self.histories is not None:
            self.histories.invalidate()
        if self.placements is not None:
            self.placements.invalidate()
