"""The balancer's fits in a process of their own, off the interpreter lock that answers
heartbeats.

Why: an interval report cost about 19 ms of CPU, three quarters of it the
balancer's robust fits (``hetero.core.replan``), and 1,000 agents' heartbeats
need most of the one core a Python process runs on. With both on one
interpreter lock the heartbeats' tail grew with every report (issue 17:
heartbeat p99 132 to 362 ms, reports 255 to 1,382 ms at 32 reports a second).
The fit is a pure function of the job's recent intervals, its constraints and
its plan, so it moves to a worker process and nothing else does: the report's
transaction, its reply to the reporting rank, the database as the one source of
truth and the caches stay where they were (``plan_rpcs``). The thread that
waits for the worker holds no lock of the interpreter meanwhile.

One worker: reports change plans inside their write transaction, which the
process takes one at a time (``database``), so no two fits ever run at once.
The worker keeps no state; a worker that dies or overruns
:data:`TIMEOUT_S` is replaced, and that report is fitted in the coordinator's
own process (logged), so a report never fails for want of the worker. The
worker is started with ``spawn``, never ``fork`` (the coordinator has threads
and gRPC's), and reads its calls from a pipe: when the coordinator dies, even by
``kill -9``, the pipe closes and the worker exits.

The worker starts at the first interval report, in a thread of its own, and the
reports that arrive before it is ready are fitted here: a coordinator that never
sees a report (a queue of jobs waiting, every coordinator a test starts) never
pays for a second interpreter, and no report waits for one to start (about a
second of CPU on a loaded 2-core box, half an agent's call deadline).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Sequence
from concurrent import futures
from concurrent.futures.process import BrokenProcessPool

from hetero.core import replan
from hetero.core.balancer import Constraints, DeviceProfile, Horizon, RankInterval

log = logging.getLogger("hetero.coordinator")

#: Seconds a fit may take in the worker before the report is fitted here instead (an
#: agent's call deadline is 5 s; a fit takes about 15 ms).
TIMEOUT_S = 2.0


def _ready() -> bool:
    return True


class Replanner:
    """``hetero.core.replan.replan`` in one worker process, started at the first call;
    ``close`` ends it."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        #: Fits done here because the worker failed or overran (for logs and tests).
        self.fallbacks = 0
        self._pool: futures.ProcessPoolExecutor | None = None
        #: ``idle`` (none yet, or the last one failed), ``starting``, ``ready``,
        #: ``unavailable`` (this host cannot start one) or ``closed``.
        self._state = "idle"
        self._settled = threading.Event()  # set when a start ends, either way

    def replan(
        self,
        policy: str,
        history: Sequence[Sequence[RankInterval]],
        current: tuple[int, ...],
        constraints: Constraints,
        profiles: Sequence[DeviceProfile],
        end_step: int,
        plan_horizon: Horizon | None,
    ) -> replan.Replan:
        """``replan.replan`` of these arguments, fitted in the worker once it is ready."""
        args = (policy, history, current, constraints, profiles, end_step, plan_horizon)
        with self._lock:
            if self._state == "idle":
                self._state = "starting"
                self._settled.clear()
                threading.Thread(target=self._start, name="hetero-replanner", daemon=True).start()
            pool = self._pool
        if pool is None:
            return replan.replan(*args)
        try:
            return pool.submit(replan.replan, *args).result(self.timeout_s)
        except (BrokenProcessPool, futures.TimeoutError) as exc:
            what = "stopped" if isinstance(exc, BrokenProcessPool) else "overran"
            log.warning("the balancer's worker process %s; replacing it, fitting here", what)
            self._replace(pool)
        self.fallbacks += 1
        return replan.replan(*args)

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the worker is ready within ``timeout_s`` of a start under way."""
        self._settled.wait(timeout_s)
        with self._lock:
            return self._state == "ready"

    def _start(self) -> None:
        """Start a worker and wait for it to answer (``spawn`` imports hetero anew). A
        host without the semaphores or the helper process multiprocessing needs has
        none: every fit then runs here, and the coordinator still serves."""
        pool: futures.ProcessPoolExecutor | None = None
        try:
            pool = futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            pool.submit(_ready).result(START_TIMEOUT_S)
        except (OSError, RuntimeError, BrokenProcessPool, futures.TimeoutError) as exc:
            log.warning("the balancer fits in the coordinator's process: no worker (%s)", exc)
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
        """Drop a failed worker; the next report starts another."""
        with self._lock:
            if self._pool is not broken:
                return  # another report replaced it already
            self._pool, self._state = None, "idle"
        _terminate(broken, grace_s=0.0)

    def close(self) -> None:
        """End the worker: a fit in flight gets :data:`CLOSE_GRACE_S`, then it is killed
        (a stop never waits on the worker, nor on one still starting)."""
        with self._lock:
            pool, self._pool, self._state = self._pool, None, "closed"
        if pool is not None:
            _terminate(pool, grace_s=CLOSE_GRACE_S)


#: Seconds a new worker may take to start and answer before this host is taken to have
#: none (a spawn imports hetero: about a second on a loaded 2-core box).
START_TIMEOUT_S = 60.0
#: Seconds ``close`` lets the worker finish before it is killed.
CLOSE_GRACE_S = 2.0


def _terminate(pool: futures.ProcessPoolExecutor, grace_s: float) -> None:
    """End ``pool``'s worker within ``grace_s``, killed if it has not exited by then."""
    processes = list((getattr(pool, "_processes", None) or {}).values())  # no public handle
    pool.shutdown(wait=False, cancel_futures=True)
    for p in processes:
        p.join(grace_s)
        if p.is_alive():
            p.kill()
