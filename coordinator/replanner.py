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
truth and the caches stay where they were (``intervalreports``). The thread that
waits for the worker holds no lock of the interpreter meanwhile.

One worker (``workerprocess``: started at the first report, replaced when it dies
or overruns :data:`TIMEOUT_S`, that report then fitted here, logged): the worker
keeps no state, so a report never fails for want of it. Where the whole report
runs in a process of its own (``reportworker``) the fit runs there, and this
worker serves only the reports handled in the coordinator's process.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetero.coordinator.workerprocess import WorkerProcess
from hetero.core import replan
from hetero.core.balancer import Constraints, DeviceProfile, Horizon, RankInterval

#: Seconds a fit may take in the worker before the report is fitted here instead (an
#: agent's call deadline is 5 s; a fit takes about 15 ms).
TIMEOUT_S = 2.0


class Replanner(WorkerProcess):
    """``hetero.core.replan.replan`` in one worker process, started at the first call;
    ``close`` ends it."""

    def __init__(self, timeout_s: float = TIMEOUT_S) -> None:
        super().__init__("balancer")
        self.timeout_s = timeout_s

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
        result = self.call(replan.replan, *args, timeout_s=self.timeout_s)
        return result if result is not None else replan.replan(*args)
