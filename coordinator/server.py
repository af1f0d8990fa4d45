"""The coordinator's process: ``create_server`` (what ``serve`` and every test start) and
``serve``, the daemon.

One process, one event loop: ``CoordinatorServer`` runs a ``grpc.aio`` server and the
coordinator's service (``service``: the state in memory, its one writer, the sweep and
pruning) on one loop of a thread of its own, driven like a ``grpc.Server``:
``start()``, ``stop(grace).wait()``. ``create_server`` connects to the database, takes
its lock (``standby``), creates or upgrades its schema (the lock's holder only: never
under another coordinator serving it) and binds; ``start`` loads the state and serves.
``registry`` is what Prometheus ``/metrics`` says (``metrics``); ``serve_metrics``
serves it on the same loop (``metricsserver``), as ``serve`` does with
``metrics_listen``. ``serve`` stops gracefully on SIGTERM/SIGINT (in-flight calls get
``grace_s`` seconds, then what is queued is written).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Mapping
from concurrent import futures
from types import FrameType
from typing import Any, TypeVar

from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client.registry import CollectorRegistry

from hetero.coordinator.api import SERVICE_NAME, Api
from hetero.coordinator.database import DatabaseError, connect, prepare
from hetero.coordinator.dburl import masked
from hetero.coordinator.identity import Caller, Identities
from hetero.coordinator.logcaps import size_text
from hetero.coordinator.metrics import ClusterCollector, RpcLatency
from hetero.coordinator.metricsserver import MetricsServer
from hetero.coordinator.service import Service, Settings
from hetero.coordinator.standby import POLL_S, Leadership
from hetero.core import defaults, heap
from hetero.security.transport import ServerSecurity, bind, describe, new_aio_server
from hetero.v1 import coordinator_pb2 as pb
from hetero.v1 import coordinator_pb2_grpc

log = logging.getLogger("hetero.coordinator")

#: Seconds between the main thread's checks for a signal's handler (:func:`serve`).
SIGNAL_CHECK_S = 0.5

T = TypeVar("T")

__all__ = ["SERVICE_NAME", "CoordinatorServer", "Settings", "create_server", "serve"]


class _Stopping:
    """What ``CoordinatorServer.stop`` returns: ``wait()`` until the server, its writes and
    its loop are done, as ``grpc.Server.stop(grace).wait()``."""

    def __init__(self, server: CoordinatorServer, stopped: futures.Future[None]) -> None:
        self._server = server
        self._stopped = stopped

    def wait(self, timeout: float | None = None) -> bool:
        try:
            self._stopped.result(timeout)
        except futures.TimeoutError:
            return False
        self._server._close()
        return True


class CoordinatorServer:
    """The coordinator on an event loop of its own thread: its gRPC server (the
    Coordinator service, the standard health service, reflection) and its ``service``."""

    def __init__(
        self,
        address: str,
        settings: Settings,
        security: ServerSecurity | None = None,
        certificates: Mapping[str, Caller] | None = None,
    ) -> None:
        self.settings = settings
        self.security = security or ServerSecurity()
        self.registry = CollectorRegistry()
        self.latency = RpcLatency(self.registry)
        self.metrics: MetricsServer | None = None
        self.engine = connect(settings.db_url)
        self.leadership = Leadership(self.engine)
        try:  # a second coordinator on a SQLite file refuses here, in one line
            self._leading = self.leadership.try_acquire()
            # The schema is checked and upgraded by the lock's holder only: a standby, or
            # a second coordinator refused, must not upgrade it under the one serving.
            if self._leading:
                prepare(self.engine)
        except BaseException:
            self.leadership.release()
            self.engine.dispose()
            raise
        #: Called (on the loop) if the database's lock is lost while serving.
        self.on_lost: Callable[[], None] | None = None
        self._standby: asyncio.Task[None] | None = None
        #: The newest change of the health status the writer asked for (kept: a task alone may be collected).
        self._health_set: asyncio.Task[None] | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rpc-loop", daemon=True)
        self._thread.start()
        try:
            self.run(self._build(address, certificates))
        except BaseException:
            self._close()
            raise

    async def _build(self, address: str, certificates: Mapping[str, Caller] | None) -> None:
        security, limits = self.security, self.settings.limits
        self.service = Service(self.settings, self.engine)
        self.server = new_aio_server(
            security,
            what="coordinator",
            hint="--token-file or $HETERO_TOKEN_FILE",
            max_concurrent_rpcs=limits.concurrent_rpcs,
            max_message_bytes=limits.max_message_bytes,
        )
        identities = Identities(security.token, security.roles, security.named, certificates)
        self.api = Api(self.service, identities, self.latency)
        service = self.service
        self.registry.register(
            ClusterCollector(lambda: service.state, service.now, self.settings.heartbeat_timeout_s)
        )
        coordinator_pb2_grpc.add_CoordinatorServicer_to_server(self.api, self.server)  # type: ignore[no-untyped-call, unused-ignore]
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        await self._serving(False)
        # NOT_SERVING while the database takes no writes (a full disk, a broken database).
        self.service.on_health = self._database_health
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = bind(self.server, address, security, "coordinator")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the coordinator's loop and wait for it (from another thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the loop, which owns the state (tests and tools read it so)."""

        async def on_loop() -> T:
            return fn()

        return self.run(on_loop())

    def start(self) -> None:
        """Load the state and serve; a standby (PostgreSQL, the lock held elsewhere) serves
        NOT_SERVING and waits for the lock instead (``standby``)."""
        self.run(self._start())

    async def _start(self) -> None:
        if self._leading:
            await self._lead()
            await self.server.start()
            return
        await self.server.start()
        log.warning(
            "standby: another coordinator serves %s; waiting for its lock to take over",
            self.leadership.url,
        )
        self._standby = asyncio.get_running_loop().create_task(self._wait_to_lead())

    async def _wait_to_lead(self) -> None:
        loop = asyncio.get_running_loop()
        while not await loop.run_in_executor(None, self.leadership.try_acquire):
            await asyncio.sleep(POLL_S)
        log.info("took over %s: loading the state", self.leadership.url)
        try:
            await loop.run_in_executor(None, prepare, self.engine)
        except DatabaseError as exc:
            log.error("%s: not serving", exc)
            if self.on_lost is not None:
                self.on_lost()
            return
        await self._lead()

    async def _lead(self) -> None:
        await self.service.load()
        self.service.start()
        self.service.ready = True
        await self._serving(True)
        if self.leadership.waits:
            self._standby = asyncio.get_running_loop().create_task(self._keep_leading())

    async def _keep_leading(self) -> None:
        """Stop serving once the lock is lost (PostgreSQL: its connection failed)."""
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, self.leadership.held):
            await asyncio.sleep(POLL_S)
        log.error("lost the lock of %s (its connection failed): not serving", self.leadership.url)
        self.service.ready = False
        await self._serving(False)
        if self.on_lost is not None:
            self.on_lost()

    def _database_health(self, takes_writes: bool) -> None:
        self._health_set = asyncio.get_running_loop().create_task(
            self._serving(takes_writes and self.service.ready)
        )

    async def _serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    def flush(self) -> None:
        """Run the queue's pass a change asked for, hand the telemetry kept so far to the
        writer and wait until everything queued is committed (tests read what heartbeats
        wrote, and what a pass placed)."""

        async def flush() -> None:
            await self.service.admit_pending()
            await self.service.flush_telemetry()
            await self.service.writer.barrier()

        self.run(flush())

    def sweep(self) -> None:
        """One sweep now, as the sweeper's (silent nodes, restarts, the queue)."""
        self.run(self.service.sweep())

    def prune(self) -> None:
        """One pruning pass now, as the pruner's (retention, and the log caps' room)."""
        self.run(self.service.prune())

    def snapshot(self) -> pb.ClusterSnapshot:
        """The cluster now, from memory (``WatchCluster``'s)."""
        return self.call(self.api.snapshot)

    def serve_metrics(self, address: str) -> int:
        """Serve ``/metrics`` on ``address`` (``host:port``, port 0 = any) from this
        coordinator's loop (``metricsserver``), under its security's listen rule; its port.
        A wrong address raises ``ConfigError``; ``stop`` stops it."""
        metrics = MetricsServer(address, self.registry, self.security)
        self.run(metrics.start())
        self.metrics = metrics
        return metrics.port

    def stop(self, grace: float | None) -> _Stopping:
        """Stop taking calls; in-flight ones get ``grace`` seconds (None = until done); then
        write what is queued. Stopping a stopped server does nothing."""
        if self._loop.is_closed():
            stopped: futures.Future[None] = futures.Future()
            stopped.set_result(None)
            return _Stopping(self, stopped)

        async def stop() -> None:
            self.service.stopping.set()
            if self._standby is not None:
                self._standby.cancel()
            if self.metrics is not None:
                await self.metrics.stop()
            await self.server.stop(grace)
            await self.service.stop()

        return _Stopping(self, asyncio.run_coroutine_threadsafe(stop(), self._loop))

    def _close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self.leadership.release()
        self.engine.dispose()


def create_server(
    address: str,
    settings: Settings,
    security: ServerSecurity | None = None,
    certificates: Mapping[str, Caller] | None = None,
) -> tuple[CoordinatorServer, int]:
    """A coordinator for ``address`` (``host:port``; port 0 = any free port) on
    ``settings.db_url``, its state loaded, not started; and its port.

    ``security`` (default: loopback only, no token, no TLS) is applied by
    ``hetero.security.transport``: token check, TLS, message limit, and no UNKNOWN status;
    ``certificates`` maps client certificates' common names to callers
    (``roles.certificate_callers``; with mutual TLS only); ``settings.limits`` bounds the
    calls in flight and the message size."""
    server = CoordinatorServer(address, settings, security, certificates)
    return server, server.port


def serve(
    address: str,
    settings: Settings,
    grace_s: float = defaults.SHUTDOWN_GRACE_S,
    metrics_listen: str | None = None,
    security: ServerSecurity | None = None,
    certificates: Mapping[str, Caller] | None = None,
) -> None:
    """Run the coordinator until SIGTERM or SIGINT; with ``metrics_listen`` (host:port)
    also serve Prometheus ``/metrics`` there."""
    stop = threading.Event()

    def _on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s, stopping (grace %.0f s)", signal.Signals(signum).name, grace_s)
        stop.set()

    # Before anything starts: a SIGTERM that arrives while the state loads stops it too.
    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server, port = create_server(address, settings, security, certificates)
    except BaseException:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    server.on_lost = stop.set  # another coordinator may serve the database now
    try:  # a wrong address fails before the coordinator serves
        metrics_port = server.serve_metrics(metrics_listen) if metrics_listen else None
    except BaseException:
        server.stop(0).wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise
    server.start()
    log.info(
        "coordinator listening on %s (port %d, %s), database %s",
        address,
        port,
        describe(security),
        masked(settings.db_url),
    )
    limits, kept, logs = settings.limits, settings.interval_retention, settings.log_retention
    log.info(
        "queue and limits: %d queued or active jobs per credential, %d ranks per CPU device, "
        "specs up to %d bytes, %d calls at once, messages up to %d bytes",
        limits.jobs_per_user,
        limits.ranks_per_cpu_device,
        limits.max_spec_bytes,
        limits.concurrent_rpcs,
        limits.max_message_bytes,
    )
    log.info(
        "retention: telemetry %g h; interval stats whole for %g h, then 1 interval in %d, "
        "deleted after %g days; log lines %g days, at most %d a job; events %g days; "
        "finished jobs %g days",
        settings.telemetry.retention_s / 3600,
        kept.raw_s / 3600,
        kept.thin_every,
        kept.keep_s / 86400,
        logs.logs_keep_s / 86400,
        logs.lines_per_job,
        logs.events_keep_s / 86400,
        settings.job_retention.keep_s / 86400,
    )
    caps = settings.log_caps
    log.info(
        "stored logs: at most %s a job, %s a user, %s in all",
        size_text(caps.per_job),
        size_text(caps.per_user),
        size_text(caps.total),
    )
    if metrics_listen is not None and metrics_port is not None:
        host = metrics_listen.rpartition(":")[0]
        log.info("metrics on http://%s:%d/metrics", host, metrics_port)
    heap.settle()  # start-up's objects out of every full collection (``heap``)
    try:
        # Not one unbounded wait: a blocked wait returns to Python only when the signal
        # lands on this thread, and the kernel may give a process's SIGTERM to another
        # of its threads (the handler then never ran: a loaded CI box saw a coordinator
        # still serving 30 s after SIGTERM). Each wake lets a pending handler run.
        while not stop.wait(SIGNAL_CHECK_S):
            pass
    finally:
        server.stop(grace_s).wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("coordinator stopped")
