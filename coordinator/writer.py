"""The coordinator's one writer: a queue of write operations, committed in batches.

Every change the coordinator makes to its database is an operation (``persist``'s
ops: plain row values, taken on the event loop when the change was made) put on one
queue. One task of the event loop drains it: it waits a few milliseconds after the
first operation for more (:data:`LINGER_S`, at most :data:`MAX_OPS` a batch), then
writes the batch in one transaction on one dedicated thread, with SQLAlchemy's
session, so the event loop never waits for the database. There is no other writer in
the process and no lock between writers: the queue is the order.

``put`` returns a future that resolves once the operation is committed. What must be
durable before a caller is answered (a submission, a cancel, a job's or a rank's new
state, a plan a rank will run, a registration) awaits it (``write``); a heartbeat's
liveness change and its sampled telemetry do not. ``barrier`` waits until everything
put so far is committed (what is about to be sent elsewhere, built from memory that
may hold newer changes than the database).

A batch that fails to commit (the disk full, the database server gone) fails the
futures of its operations and of every operation queued behind it: their changes
are in memory only, and memory is not to be trusted past them. The error is
``StoreFull`` (RESOURCE_EXHAUSTED, "disk full") when the database says its disk is
full, else ``StoreUnavailable`` (UNAVAILABLE). Then ``on_failure`` runs (the
coordinator reloads its state from the database: the changes not kept are gone from
memory too), and until it returns every ``put`` fails at once with the same error.

The writer says whether the database takes writes (``on_health``: False at the first
failed batch, True at the first commit after it), so the coordinator's health check
answers NOT_SERVING while it does not: a full disk or a broken database is seen by
whoever watches health, not only by the callers it fails. While batches keep failing
the error is logged once a minute (:data:`FAILURE_LOG_S`) with the count, not once a
batch.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent import futures
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from hetero.core.errors import HeteroError

log = logging.getLogger("hetero.coordinator.writer")

#: Seconds the writer waits after the first operation of a batch for more.
LINGER_S = 0.002
#: Operations one batch (one transaction) holds at most.
MAX_OPS = 2000
#: Seconds between log lines about batches that keep failing.
FAILURE_LOG_S = 60.0


class Op(Protocol):
    """One write: ``apply`` runs inside the batch's transaction, on the writer's thread."""

    def apply(self, s: Session) -> None: ...


class StoreUnavailable(HeteroError):
    """The database did not take a write: nothing of it, or of what came after, was kept."""

    grpc_code = "UNAVAILABLE"


class StoreFull(StoreUnavailable):
    """The database's disk is full."""

    grpc_code = "RESOURCE_EXHAUSTED"


def classify(exc: BaseException) -> StoreUnavailable:
    """The error a failed commit gives its callers: ``StoreFull`` when the disk is full
    (SQLite's SQLITE_FULL, PostgreSQL's "No space left on device", ENOSPC), else
    ``StoreUnavailable``; one line either way, the first error's (a rollback that fails
    after it, as SQLite's after SQLITE_FULL, which has ended the transaction itself,
    raises another on top)."""
    chain: list[BaseException] = []
    at: BaseException | None = exc
    while at is not None and at not in chain:
        chain.append(at)
        at = at.__cause__ or at.__context__
    texts = [str(getattr(e, "orig", None) or e) for e in chain]
    full = any(
        "database or disk is full" in t
        or "No space left on device" in t
        or "could not extend file" in t
        for t in texts
    ) or any(getattr(e, "errno", None) == errno.ENOSPC for e in chain)
    first = next((t for t in reversed(texts) if t), type(chain[-1]).__name__).splitlines()[0]
    if full:
        return StoreFull(f"the coordinator's database is out of disk space: {first}")
    return StoreUnavailable(f"the coordinator's database did not take the write: {first}")


class Writer:
    """The queue and the task that drains it; ``start`` and ``stop`` on the event loop.

    ``on_failure(error)`` runs on the loop after a failed batch (the owner reloads its
    state); ``puts`` fail at once until it returns. ``batches`` and ``written`` count
    committed transactions and operations."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        linger_s: float = LINGER_S,
        max_ops: int = MAX_OPS,
        on_failure: Callable[[StoreUnavailable], Awaitable[None]] | None = None,
        on_health: Callable[[bool], None] | None = None,
    ) -> None:
        self.sessions = sessions
        self.linger_s = linger_s
        self.max_ops = max_ops
        self.on_failure = on_failure
        self.on_health = on_health
        #: Batches failed in a row (0: the database takes writes), and when it was last said.
        self.failing = 0
        self._said_at = 0.0
        self._thread = futures.ThreadPoolExecutor(1, thread_name_prefix="hetero-writer")
        self._queue: list[tuple[Op, asyncio.Future[None]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failed: StoreUnavailable | None = None
        self._stopping = False
        #: The future of the batch being committed (``barrier`` waits for it).
        self._batch_done: asyncio.Future[None] | None = None
        self.batches = 0
        self.written = 0
        #: Seconds the newest batch's transaction took on the writer's thread.
        self.last_commit_s = 0.0

    def start(self) -> None:
        """Start draining (call on the event loop that will own the writer)."""
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._drain(), name="writer")

    async def stop(self) -> None:
        """Write what is queued, then stop the task and the thread."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
        self._thread.shutdown(wait=True)

    def put(self, *ops: Op) -> asyncio.Future[None]:
        """Queue ``ops`` (in order, in one batch or consecutive ones); the future of the
        last resolves once all are committed. Raises the last failure's error at once
        while the owner recovers from it."""
        if self._failed is not None:
            raise self._failed
        if self._wake is None or self._stopping:
            raise StoreUnavailable("the coordinator's writer is not running")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        for i, op in enumerate(ops):
            self._queue.append((op, done if i == len(ops) - 1 else loop.create_future()))
        if not ops:
            done.set_result(None)
        self._wake.set()
        return done

    async def write(self, *ops: Op) -> None:
        """``put`` and wait for the commit (raises ``StoreUnavailable`` if it failed)."""
        await self.put(*ops)

    async def barrier(self) -> None:
        """Wait until every operation put so far is committed."""
        if self._queue:
            await self._queue[-1][1]
        elif self._batch_done is not None:
            await asyncio.shield(self._batch_done)

    async def _drain(self) -> None:
        assert self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.linger_s > 0 and len(self._queue) < self.max_ops and not self._stopping:
                await asyncio.sleep(self.linger_s)
            batch, self._queue = self._queue[: self.max_ops], self._queue[self.max_ops :]
            self._batch_done = batch[-1][1]
            try:
                await loop.run_in_executor(self._thread, self._commit, [op for op, _ in batch])
            except Exception as exc:  # the database's error, whatever its type
                await self._fail(batch, exc)
                continue
            self.batches += 1
            self.written += len(batch)
            if self.failing:
                log.warning("the database takes writes again after %d failed batches", self.failing)
                self.failing = 0
                if self.on_health is not None:
                    self.on_health(True)
            for _, done in batch:
                if not done.done():
                    done.set_result(None)

    def _commit(self, ops: list[Op]) -> None:
        started = time.perf_counter()
        with self.sessions.begin() as s:
            for op in ops:
                op.apply(s)
        self.last_commit_s = time.perf_counter() - started

    async def _fail(self, batch: list[tuple[Op, asyncio.Future[None]]], exc: Exception) -> None:
        """Fail ``batch`` and everything queued behind it; let the owner recover."""
        error = classify(exc)
        behind, self._queue = self._queue, []
        self.failing += 1
        now = time.monotonic()
        if self.failing == 1 or now - self._said_at >= FAILURE_LOG_S:
            self._said_at = now
            log.error(
                "a write of %d operations failed (%s); %d queued behind it fail with it%s",
                len(batch),
                error,
                len(behind),
                f" ({self.failing} batches in a row)" if self.failing > 1 else "",
            )
        if self.failing == 1 and self.on_health is not None:
            self.on_health(False)
        self._failed = error
        for _, done in (*batch, *behind):
            if not done.done():
                done.set_exception(error)
                done.exception()  # retrieved: an op nobody awaited fails silently
        try:
            if self.on_failure is not None:
                await self.on_failure(error)
        finally:
            self._failed = None
