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
    """``hetero.core.replan.replan`` in one worker process; ``close`` ends it."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        #: Fits done here because the worker failed or overran (for logs and tests).
        self.fallbacks = 0
        self._pool = self._start()

    @staticmethod
    def _start() -> futures.ProcessPoolExecutor | None:
        """A started worker, or None where none can start (a sandbox without the
        semaphores or the helper process multiprocessing needs): then every fit runs
        here, as before the worker, and the coordinator still serves."""
        try:
            pool = futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
            pool.submit(_ready)  # start the worker now, not at the first report
        except (OSError, RuntimeError) as exc:
            log.warning("the balancer fits in the coordinator's process: no worker (%s)", exc)
            return None
        return pool

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
        """``replan.replan`` of these arguments, fitted in the worker."""
        args = (policy, history, current, constraints, profiles, end_step, plan_horizon)
        with self._lock:
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

    def _replace(self, broken: futures.ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is not broken:
                return  # another report replaced it already
            self._pool = self._start()
        _terminate(broken, grace_s=0.0)

    def close(self) -> None:
        """End the worker: a fit in flight gets :data:`CLOSE_GRACE_S`, then it is killed
        (a stop never waits on the worker)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            _terminate(pool, grace_s=CLOSE_GRACE_S)


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
