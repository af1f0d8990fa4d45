"""The coordinator's gRPC server: ``create_server`` for tests and ``serve`` for the daemon.

``create_server`` binds (port 0 picks a free port) and registers the
Coordinator service, the standard health service and server reflection; it
does not start the server. ``serve`` opens the database, starts, and stops
gracefully on SIGTERM/SIGINT (in-flight RPCs get ``grace_s`` seconds).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Mapping
from concurrent import futures
from types import FrameType

import grpc
import grpc.aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from hetero.coordinator.admission import Limits
from hetero.coordinator.asyncserver import CoordinatorServer, add_coordinator
from hetero.coordinator.capacity import CapacityWatch
from hetero.coordinator.database import (
    open_database,
    read_session_factory,
    session_factory,
    writers_take_turns_across_processes,
)
from hetero.coordinator.dburl import masked
from hetero.coordinator.deps import Deps
from hetero.coordinator.heartbeatworker import HeartbeatWorker
from hetero.coordinator.identity import Caller, Identities
from hetero.coordinator.ingest import HeartbeatIngest
from hetero.coordinator.metricsserver import MetricsServer
from hetero.coordinator.pruning import IntervalPruner
from hetero.coordinator.readcache import (
    IntervalHistories,
    JobPlacements,
    LatestPlans,
    PendingOrders,
)
from hetero.coordinator.recovery import Sweeper
from hetero.coordinator.replanner import Replanner
from hetero.coordinator.reportworker import DEFAULT_PROCESSES, ReportWorkers
from hetero.coordinator.retention import IntervalRetention, LogRetention
from hetero.coordinator.service import CoordinatorService
from hetero.coordinator.snapshots import Snapshots, SnapshotWorker, builder
from hetero.coordinator.store import TelemetryPolicy
from hetero.coordinator.views import HISTORY_FOR_REPORT
from hetero.core import defaults, heap
from hetero.security.transport import ServerSecurity, bind, describe, new_aio_server
from hetero.v1 import coordinator_pb2

log = logging.getLogger("hetero.coordinator")

SERVICE_NAME = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"].full_name


def create_server(
    address: str,
    deps: Deps,
    security: ServerSecurity | None = None,
    certificates: Mapping[str, Caller] | None = None,
) -> tuple[CoordinatorServer, int]:
    """A server for ``address`` (``host:port``; port 0 = any free port) and the bound port.

    ``security`` (default: loopback only, no token, no TLS) is applied by
    ``hetero.security.transport``: token check, TLS, message limit, and no UNKNOWN status;
    ``certificates`` maps client certificates' common names to callers
    (``roles.certificate_callers``; with mutual TLS only);
    ``deps.limits`` bounds the calls in flight and the message size. The server is
    ``grpc.aio`` on a loop thread of its own (``asyncserver``)."""
    security = security or ServerSecurity()

    async def build(pool: futures.Executor) -> tuple[grpc.aio.Server, int]:
        server = new_aio_server(
            security,
            what="coordinator",
            hint="--token-file or $HETERO_TOKEN_FILE",
            max_concurrent_rpcs=deps.limits.concurrent_rpcs,
            max_message_bytes=deps.limits.max_message_bytes,
        )
        identities = Identities(security.token, security.roles, security.named, certificates)
        add_coordinator(server, deps, pool, identities)
        health_servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        for name in ("", SERVICE_NAME):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        return server, bind(server, address, security, "coordinator")

    server = CoordinatorServer(build)
    return server, server.port


def serve(
    address: str,
    db_url: str,
    grace_s: float = defaults.SHUTDOWN_GRACE_S,
    deps: Deps | None = None,
    metrics_listen: str | None = None,
    security: ServerSecurity | None = None,
    allowed_roots: tuple[str, ...] | None = None,
    heartbeat_interval_s: float = defaults.HEARTBEAT_INTERVAL_S,
    heartbeat_timeout_s: float = defaults.HEARTBEAT_TIMEOUT_S,
    master_port_base: int = defaults.MASTER_PORT_BASE,
    telemetry: TelemetryPolicy | None = None,
    interval_retention: IntervalRetention | None = None,
    log_retention: LogRetention | None = None,
    limits: Limits | None = None,
    certificates: Mapping[str, Caller] | None = None,
    report_processes: int | None = None,
) -> None:
    """Run the coordinator until SIGTERM or SIGINT; with ``metrics_listen`` (host:port)
    also serve Prometheus ``/metrics`` there. Heartbeats are written in batches
    (``HeartbeatIngest``), in a process of their own (``heartbeatworker``; not on an
    in-memory SQLite database), reads take no write lock, interval reports are handled in
    ``report_processes`` processes of their own (``reportworker``; None = one per two
    cores, one to four; not on an in-memory SQLite database, which no other process can open) and the balancer's fits of the others in a worker
    process (``replanner``). A sweeper thread marks silent
    nodes down and restarts their jobs (``recovery``); what it changes drops the
    order and plan caches (``readcache``) so polls and ``GetPlan`` see it at once.
    Telemetry is kept as ``telemetry`` says; a pruner thread keeps interval statistics
    within ``interval_retention`` (``pruning``) and log lines and events within
    ``log_retention`` (``logpruning``). Defaults: each policy's own."""
    engine = open_database(db_url)
    snapshot_worker: SnapshotWorker | None = None
    heartbeats: HeartbeatWorker | None = None
    if deps is None:
        sessions, readers = session_factory(engine), read_session_factory(engine)
        policy = telemetry or TelemetryPolicy()
        capacity = CapacityWatch(sessions)
        elsewhere = writers_take_turns_across_processes(engine)
        if elsewhere:
            heartbeats = HeartbeatWorker(db_url, on_change=capacity.changed)
        ingest = HeartbeatIngest(sessions, readers, policy, worker=heartbeats)
        snapshot_worker = SnapshotWorker(db_url) if elsewhere else None
        snapshots = Snapshots(
            builder(
                readers,
                ingest=ingest,
                clock=time.time,
                heartbeat_timeout_s=heartbeat_timeout_s,
                worker=snapshot_worker,
            )
        )
        deps = Deps(
            sessions=sessions,
            readers=readers,
            ingest=ingest,
            snapshots=snapshots,
            orders=PendingOrders(readers),
            plans=LatestPlans(readers),
            histories=IntervalHistories(HISTORY_FOR_REPORT),
            placements=JobPlacements(),
            replanner=Replanner(),
            reports=(
                ReportWorkers(db_url, report_processes or DEFAULT_PROCESSES) if elsewhere else None
            ),
            capacity=capacity,
            telemetry=policy,
            heartbeat_interval_s=heartbeat_interval_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            allowed_roots=allowed_roots,
            master_port_base=master_port_base,
            limits=limits or Limits(),
        )
    sweeper = Sweeper(
        deps.sessions,
        deps.sweep_config(),
        period_s=deps.heartbeat_interval_s / 2,
        before=deps.ingest.flush if deps.ingest is not None else None,
        on_change=deps.invalidate_caches,
        capacity=deps.capacity,
        admit_elsewhere=deps.reports.admit if deps.reports is not None else None,
    )
    kept = interval_retention or IntervalRetention()
    logs = log_retention or LogRetention()
    pruner = IntervalPruner(deps.sessions, kept, clock=deps.clock, logs=logs)
    server, port = create_server(address, deps, security, certificates)
    metrics = (
        MetricsServer(
            metrics_listen,
            deps.snapshots or Snapshots.of(CoordinatorService(deps).snapshot),
            security,
            rpc_latency=deps.rpc_latency,
        )
        if metrics_listen
        else None
    )
    if deps.ingest is not None:
        deps.ingest.start()
    server.start()
    sweeper.start()
    pruner.start()
    log.info(
        "coordinator listening on %s (port %d, %s), database %s",
        address,
        port,
        describe(security),
        masked(db_url),
    )
    log.info(
        "queue and limits: %d queued or active jobs per credential, %d ranks per CPU device, "
        "specs up to %d bytes, %d calls at once, messages up to %d bytes",
        deps.limits.jobs_per_user,
        deps.limits.ranks_per_cpu_device,
        deps.limits.max_spec_bytes,
        deps.limits.concurrent_rpcs,
        deps.limits.max_message_bytes,
    )
    log.info(
        "retention: telemetry %g h; interval stats whole for %g h, then 1 interval in %d, "
        "deleted after %g days; log lines %g days, at most %d a job; events %g days",
        deps.telemetry.retention_s / 3600,
        kept.raw_s / 3600,
        kept.thin_every,
        kept.keep_s / 86400,
        logs.logs_keep_s / 86400,
        logs.lines_per_job,
        logs.events_keep_s / 86400,
    )
    if metrics is not None and metrics_listen is not None:
        if snapshot_worker is not None:
            snapshot_worker.start()  # it will be scraped: import it before the first scrape
        metrics.start()
        host = metrics_listen.rpartition(":")[0]
        log.info("metrics on http://%s:%d/metrics", host, metrics.port)
    heap.settle()  # start-up's objects out of every full collection (``heap``)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping (grace %.0f s)", signal.Signals(signum).name, grace_s)
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stop.wait()
    finally:
        deps.stopping.set()
        sweeper.stop()
        pruner.stop()
        if metrics is not None:
            metrics.stop()
        server.stop(grace_s).wait()
        if deps.ingest is not None:
            deps.ingest.stop()  # its last flush, in the worker or here
        if heartbeats is not None:
            heartbeats.close()
        if deps.reports is not None:
            deps.reports.close()
        if deps.replanner is not None:
            deps.replanner.close()
        if snapshot_worker is not None:
            snapshot_worker.close()
        engine.dispose()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("coordinator stopped")
