"""One worker process of the coordinator's, started at its first call, replaced when it
fails, and ended with the coordinator: what the balancer's fits (``replanner``) and
the interval reports (``reportworker``) run in, off the interpreter lock that answers
heartbeats.

The worker is started with ``spawn``, never ``fork`` (the coordinator has threads
and gRPC's). When the coordinator dies, even by ``kill -9``, the worker exits
within :data:`PARENT_CHECK_S`: a thread of the worker watches its parent
(``exit_with_parent``). Its call pipe does not tell it (the worker holds both
ends of multiprocessing's queue), and ``PR_SET_PDEATHSIG`` follows the thread
that started the child, which here is a short-lived one. It starts at the first call, in
a thread of its own, and the calls made before it is ready are done in the
coordinator's process (``call`` answers None): a coordinator that never needs
it (a queue of jobs waiting, every coordinator a test starts) never pays for a
second interpreter, and no call waits for one to start (about a second of CPU on
a loaded 2-core box, half an agent's call deadline). A worker that dies or
overruns its call's time is replaced, logged, and that call is done here; a host
that cannot start one does everything here.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from hetero.core import heap, procname

log = logging.getLogger("hetero.coordinator")

T = TypeVar("T")

#: Seconds a new worker may take to start and answer before this host is taken to have
#: none (a spawn imports hetero: about a second on a loaded 2-core box).
START_TIMEOUT_S = 60.0
#: Seconds ``close`` lets the worker finish before it is killed.
CLOSE_GRACE_S = 2.0
#: Seconds between a worker's checks that the coordinator is still its parent.
PARENT_CHECK_S = 1.0


def _ready() -> bool:
    return True


def _initialize(
    coordinator: int,
    initializer: Callable[..., None] | None,
    initargs: tuple[Any, ...],
    nice: int = 0,
    name: str = "",
) -> None:
    """In the worker, first: exit with the ``coordinator`` process (its pid, given by the
    coordinator itself: one that died before this ran is seen at once), take the name
    ``name`` (``procname``), lower its CPU priority by ``nice``, then
    ``initializer(*initargs)``, then start-up's objects are frozen out of full
    collections (``heap``)."""
    exit_with_parent(coordinator)
    if name:
        procname.set_name(name)
    if nice:
        os.nice(nice)
    if initializer is not None:
        initializer(*initargs)
    heap.settle()


def exit_with_parent(parent: int) -> None:
    """End this process once ``parent`` is no longer its parent (it died: the process
    was handed to init or a subreaper)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


class WorkerProcess:
    """One ``spawn`` worker, started at the first :meth:`call`; ``close`` ends it.

    ``initializer(*initargs)`` runs in the worker before its first call (what it
    opens there: a database); ``what`` names it in log lines. ``nice`` lowers the
    worker's CPU priority below the coordinator's (work nobody waits on in a hurry:
    on a busy host the kernel gives the coordinator the CPU first)."""

    def __init__(
        self,
        what: str,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        nice: int = 0,
    ) -> None:
        self.what = what
        self._initializer = initializer
        self._initargs = initargs
        self._nice = nice
        self._lock = threading.Lock()
        #: Calls the worker answered, and calls done here because it failed or overran
        #: (for logs and tests).
        self.answered = 0
        self.fallbacks = 0
        self._pool: futures.ProcessPoolExecutor | None = None
        #: ``idle`` (none yet, or the last one failed), ``starting``, ``ready``,
        #: ``unavailable`` (this host cannot start one) or ``closed``.
        self._state = "idle"
        self._settled = threading.Event()  # set when a start ends, either way

    def start(self) -> None:
        """Start the worker now, in the background, rather than at the first call (a
        coordinator that knows it will need it: the first call then finds it ready)."""
        with self._lock:
            self._start_if_idle()

    def _start_if_idle(self) -> None:
        if self._state == "idle":
            self._state = "starting"
            self._settled.clear()
            threading.Thread(target=self._start, name=f"hetero-{self.what}", daemon=True).start()

    def call(self, fn: Callable[..., T], *args: Any, timeout_s: float) -> T | None:
        """``fn(*args)`` in the worker; None = do it here: no worker yet (one is being
        started), or it stopped or overran ``timeout_s`` (replaced, logged)."""
        with self._lock:
            self._start_if_idle()
            pool = self._pool
        if pool is None:
            return None
        try:
            result = _submit(pool, fn, *args).result(timeout_s)
        except (BrokenProcessPool, futures.TimeoutError, futures.CancelledError) as exc:
            # Stopped: it died (BrokenProcessPool), or another call replaced it or the
            # coordinator closed it (the calls queued then are cancelled or refused).
            what = "overran" if isinstance(exc, futures.TimeoutError) else "stopped"
            log.warning("the %s worker process %s; replacing it, working here", self.what, what)
            self._replace(pool)
        else:
            with self._lock:
                self.answered += 1
            return result
        with self._lock:
            self.fallbacks += 1
        return None

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the worker is ready within ``timeout_s`` of a start under way."""
        self._settled.wait(timeout_s)
        with self._lock:
            return self._state == "ready"

    @property
    def state(self) -> str:
        """``idle`` (none started, or the last one failed), ``starting``, ``ready``,
        ``unavailable`` or ``closed`` (for tests and logs)."""
        with self._lock:
            return self._state

    def pids(self) -> list[int]:
        """The worker's process id, if one runs (for tests and logs)."""
        with self._lock:
            pool = self._pool
        processes = (getattr(pool, "_processes", None) or {}).values()  # no public handle
        return [p.pid for p in processes if p.pid is not None]

    def _start(self) -> None:
        """Start a worker and wait for it to answer (``spawn`` imports hetero anew). A
        host without the semaphores or the helper process multiprocessing needs has
        none: every call then runs here, and the coordinator still serves."""
        pool: futures.ProcessPoolExecutor | None = None
        try:
            pool = futures.ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_initialize,
                initargs=(
                    os.getpid(),
                    self._initializer,
                    self._initargs,
                    self._nice,
                    f"hetero-{self.what}",
                ),
            )
            pool.submit(_ready).result(START_TIMEOUT_S)
        except (OSError, RuntimeError, BrokenProcessPool, futures.TimeoutError) as exc:
            log.warning(
                "the %s work runs in the coordinator's process: no worker (%s)", self.what, exc
            )
            if pool is not None:
                _terminate(pool, grace_s=0.0)
            pool = None
        with self._lock:
            if self._state == "closed":
                if pool is not None:
                    _terminate(pool, grace_s=0.0)
            else:
                self._pool = pool
                self._state = "ready" if pool is not None else "unavailable"
        self._settled.set()

    def _replace(self, broken: futures.ProcessPoolExecutor) -> None:
        """Drop a failed worker; the next call starts another."""
        with self._lock:
            if self._pool is not broken:
                return  # another call replaced it already
            self._pool, self._state = None, "idle"
        _terminate(broken, grace_s=0.0)

    def close(self) -> None:
        """End the worker: a call in flight gets :data:`CLOSE_GRACE_S`, then it is killed
        (a stop never waits on the worker, nor on one still starting)."""
        with self._lock:
            pool, self._pool, self._state = self._pool, None, "closed"
        if pool is not None:
            _terminate(pool, grace_s=CLOSE_GRACE_S)


def _submit(
    pool: futures.ProcessPoolExecutor, fn: Callable[..., T], *args: Any
) -> futures.Future[T]:
    """``pool.submit``; a pool already shut down gives a future cancelled at once."""
    try:
        return pool.submit(fn, *args)
    except RuntimeError:  # "cannot schedule new futures after shutdown"
        cancelled: futures.Future[T] = futures.Future()
        cancelled.cancel()
        return cancelled


def _terminate(pool: futures.ProcessPoolExecutor, grace_s: float) -> None:
    """End ``pool``'s worker within ``grace_s``, killed if it has not exited by then."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        p.join(grace_s)
        if p.is_alive():
            p.kill()
