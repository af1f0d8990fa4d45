"""The coordinator's RPCs on ``grpc.aio``: calls answered from memory never leave the
event loop; the rest run on a thread pool.

Why not ``grpc.server``: under ``hetero-bench load`` (1,000 agents heartbeating
at 1 Hz, 256 ranks) the thread-pool server had the CPU to spare (0.7 of its one
core of Python) yet a Heartbeat p99 of 100 to 300 ms: each call crossed threads
twice (the server's poller, then a worker), and every crossing waited for the GIL
behind whichever of 32 workers or the heartbeat writer held it. Here a heartbeat
of a known node, a ``GetPlan`` whose plan is cached, a poll of a node the order
cache knows has none, and a ``Probe`` are answered on the loop thread itself
(``_inline``); everything else, the calls that touch the database, runs
unchanged (``CoordinatorService``'s own methods) on ``DB_THREADS`` threads.

``CoordinatorServer`` runs the loop on a thread of its own and is driven like a
``grpc.Server``: ``start()``, ``stop(grace).wait()``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from concurrent import futures
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio

from hetero.coordinator.deps import Deps
from hetero.coordinator.identity import ANYONE, Caller, Identities
from hetero.coordinator.rpc import abort_for
from hetero.coordinator.scope import Scope
from hetero.coordinator.service import CoordinatorService
from hetero.v1 import coordinator_pb2, coordinator_pb2_grpc

T = TypeVar("T")

#: Threads for the calls that touch the database (SQLite takes one writer at a time).
DB_THREADS = 16

_SERVICE = coordinator_pb2.DESCRIPTOR.services_by_name["Coordinator"]
_METHODS = tuple(_SERVICE.methods_by_name)
SERVICE_NAME = _SERVICE.full_name


class _Aborted(Exception):
    """``context.abort`` from a method running off the loop: re-raised there as the real one."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _ThreadContext:
    """The part of a call's context ``CoordinatorService`` uses, safe off the loop: who
    calls (``identity``), the time it has left, and ``abort``."""

    def __init__(self, caller: str = ANYONE, time_remaining_s: float | None = None) -> None:
        self.caller = caller
        self._deadline = None if time_remaining_s is None else time.monotonic() + time_remaining_s

    def time_remaining(self) -> float | None:
        """Seconds until the client's deadline (None: it set none), as gRPC's own."""
        return None if self._deadline is None else self._deadline - time.monotonic()

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise _Aborted(code, details)


def _inline(deps: Deps, method: str, request: Any) -> bool:
    """Whether ``request`` is answered from memory (no database, no waiting)."""
    if method == "Heartbeat":
        return deps.ingest is not None and deps.ingest.is_known(request.node_id)
    if method == "GetPlan":
        return deps.plans is not None and deps.plans.cached(request.job_id)
    if method == "PollAssignments":  # agents that predate orders_pending poll every beat
        ingest, orders = deps.ingest, deps.orders
        node = request.node_id
        return bool(ingest and orders and ingest.is_known(node) and orders.known_idle(node))
    return method == "Probe"


class AsyncCoordinator:
    """``CoordinatorService`` as coroutines, for ``add_CoordinatorServicer_to_server``.

    A call that waited for a thread past its client's deadline is not started: the
    client has gone (finding: a server that kept working for a client that had left).
    A call of a node's or user's credential is checked against what it acts on
    (``scope``) first: from memory where it can, else on the thread with the call.
    Each call's handling, from here to its reply or abort, is timed into
    ``deps.rpc_latency`` (``rpclatency``)."""

    def __init__(
        self, service: CoordinatorService, pool: futures.Executor, identities: Identities
    ) -> None:
        self.service = service
        self.pool = pool
        self.identities = identities
        deps = service.deps
        self.scope = Scope(deps.readers or deps.sessions, SERVICE_NAME, deps.placements)
        for name in _METHODS:
            if name != "WatchCluster":
                setattr(self, name, self._unary(name))

    def _unary(
        self, name: str
    ) -> Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Coroutine[Any, Any, Any]]:
        method = getattr(self.service, name)
        deps = self.service.deps
        latency = deps.rpc_latency

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            started = time.perf_counter()
            code = "OK"
            try:
                caller = self.identities.of(context.invocation_metadata(), context.auth_context())
                verdict = self.scope.quick(caller, name, request) if caller.scoped else True
                if isinstance(verdict, str):
                    raise _Aborted(grpc.StatusCode.PERMISSION_DENIED, verdict)
                if verdict and _inline(deps, name, request):
                    return method(request, _ThreadContext())
                thread_context = _ThreadContext(caller.label, context.time_remaining())
                checked = verdict is None
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(
                    self.pool,
                    self._checked,
                    caller if checked else None,
                    name,
                    request,
                    thread_context,
                )
            except _Aborted as exc:
                aborted, code = exc, exc.code.name
            except asyncio.CancelledError:  # the client went away, or its deadline passed
                left = context.time_remaining()
                code = "DEADLINE_EXCEEDED" if left is not None and left <= 0 else "CANCELLED"
                raise
            except Exception:  # AioGuardInterceptor answers it INTERNAL
                code = "INTERNAL"
                raise
            finally:
                latency.observe(name, code, time.perf_counter() - started)
            # Counted first: the status leaves with the abort, and whoever got it may read
            # the histogram next.
            await context.abort(aborted.code, aborted.details)

        call.__name__ = name
        return call

    def _checked(
        self, caller: Caller | None, name: str, request: Any, context: _ThreadContext
    ) -> Any:
        """The call on a pool thread, unless late: checked against ``caller`` first (None:
        already allowed); a registration teaches ``scope`` the node's id."""
        method = getattr(self.service, name)

        def run(request: Any, context: _ThreadContext) -> Any:
            if caller is not None:
                refused = self.scope.check(caller, name, request)
                if refused is not None:
                    context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
            reply = method(request, context)
            if name == "RegisterNode":
                self.scope.learn(reply.node_id, request.name)
            return reply

        return _unless_late(run, request, context)

    async def WatchCluster(
        self, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        caller = self.identities.of(context.invocation_metadata(), context.auth_context())
        refused = self.scope.method_refusal(caller, "WatchCluster")
        if refused is not None:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refused)
        period_s = min(max(request.period_s or 1.0, 0.2), 60.0)
        stopping = self.service.deps.stopping
        loop = asyncio.get_running_loop()
        while not stopping.is_set():
            try:
                snapshot = await loop.run_in_executor(self.pool, self._snapshot)
            except _Aborted as aborted:
                await context.abort(aborted.code, aborted.details)
            yield snapshot
            waited = 0.0
            while waited < period_s and not stopping.is_set():
                await asyncio.sleep(min(0.2, period_s - waited))
                waited += 0.2

    def _snapshot(self) -> Any:
        try:
            return self.service.snapshot()
        except Exception as exc:
            abort_for(_ThreadContext(), exc, "WatchCluster")
            raise


def _unless_late(method: Callable[[Any, Any], T], request: Any, context: _ThreadContext) -> T:
    left = context.time_remaining()
    if left is not None and left <= 0:
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before the call started")
    return method(request, context)


class _Stopping:
    """What ``CoordinatorServer.stop`` returns: ``wait()`` until the server and its loop
    are down, as ``grpc.Server.stop(grace).wait()``."""

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
    """A ``grpc.aio`` server on an event loop of its own thread, with the thread pool
    its database calls run on.

    ``build`` is awaited on that loop (a ``grpc.aio`` server belongs to the loop it
    was made on), is given the pool, and returns the server, services added, and
    its bound port.
    """

    def __init__(
        self, build: Callable[[futures.Executor], Awaitable[tuple[grpc.aio.Server, int]]]
    ) -> None:
        self.pool = futures.ThreadPoolExecutor(DB_THREADS, thread_name_prefix="rpc")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rpc-loop", daemon=True)
        self._thread.start()

        async def _build() -> tuple[grpc.aio.Server, int]:
            return await build(self.pool)

        try:
            self.server, self.port = self._run(_build())
        except BaseException:
            self._close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def start(self) -> None:
        self._run(self.server.start())

    def stop(self, grace: float | None) -> _Stopping:
        """Stop taking calls; in-flight ones get ``grace`` seconds (None = until done).
        Stopping a stopped server does nothing, as with ``grpc.Server``."""
        if self._loop.is_closed():
            stopped: futures.Future[None] = futures.Future()
            stopped.set_result(None)
            return _Stopping(self, stopped)
        return _Stopping(
            self, asyncio.run_coroutine_threadsafe(self.server.stop(grace), self._loop)
        )

    def _close(self) -> None:
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


def add_coordinator(
    server: grpc.aio.Server,
    deps: Deps,
    pool: futures.Executor,
    identities: Identities | None = None,
) -> None:
    """Serve the Coordinator service of ``deps`` on ``server``; ``identities`` names callers
    (default: everyone is "anyone", unchecked)."""
    servicer = AsyncCoordinator(CoordinatorService(deps), pool, identities or Identities())
    coordinator_pb2_grpc.add_CoordinatorServicer_to_server(servicer, server)  # type: ignore[no-untyped-call, unused-ignore]
