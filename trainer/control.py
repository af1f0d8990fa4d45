"""Trainers under an agent: the plan comes from the coordinator, through the node agent.

An agent launches each rank with ``HETERO_AGENT_ENDPOINT`` (its ``AgentLocal``
service), ``HETERO_JOB_ID`` and ``HETERO_PLAN`` (the coordinator's initial plan,
``VERSION:B0,B1,...``, identical on every rank so all ranks start on the same
plan without talking). At each rebalance boundary rank 0's :class:`AgentPlanner`
sends every rank's interval summary to the agent on a worker thread and answers
with the coordinator's reply to the *previous* boundary's report, so the round
trip never sits on the step path; the existing broadcast then gives all ranks
rank 0's answer at the same step.

The control plane never stalls training: if the agent or the coordinator is
slow or down, the planner keeps the current plan while an answer is out and
uses the embedded policy once a request fails or misses ``deadline_s``, and
does not try the agent again for a backoff period that doubles with each failure.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import grpc

from hetero.core import rankenv
from hetero.core.balancer import Constraints, Decision, History, Horizon
from hetero.core.errors import PlanError, UnreachableError
from hetero.core.rankenv import LaunchPlan, RankEnv
from hetero.security.auth import agent_token_from_env
from hetero.security.transport import ClientSecurity, client_channel, remote_error
from hetero.trainer.exchange import Planner, RankSummary
from hetero.v1 import agent_pb2_grpc
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.trainer.control")

#: Seconds a request to the agent may take (on the worker thread, not the step path)
#: before it counts as failed and the embedded policy answers.
DEFAULT_DEADLINE_S = 0.5

#: ``() -> (global step, every rank's summary of the interval just ended)``.
Progress = Callable[[], tuple[int, Sequence[RankSummary] | None]]


def launch_plan(constraints: Constraints, plan: LaunchPlan | None) -> LaunchPlan | None:
    """The plan the agent launched this rank with (``HETERO_PLAN``) if it is valid
    under ``constraints``; else None (with a warning naming what is wrong)."""
    if plan is None:
        return None
    try:
        constraints.check(plan.batches)
    except PlanError as exc:
        log.warning("ignoring the agent's plan (%s=%s): %s", rankenv.PLAN, plan, exc)
        return None
    return plan


@dataclass(frozen=True)
class _Answer:
    """The agent's reply to one request, handed from the worker thread to rank 0."""

    plan: tpb.Plan
    latency_s: float


class AgentPlanner:
    """Rank 0's planner under an agent: reports in the background, never waits for it.

    At each boundary :meth:`decide`

    1. takes the coordinator's answer to the request sent at the previous boundary,
       if it has arrived (it never waits for it);
    2. hands this boundary's report to a single worker thread (at most one request
       in flight: if the previous one is still out, this interval goes unreported);
    3. answers with the plan from (1) if its version is newer than the one adopted,
       else with the current plan.

    A coordinator plan computed from the interval ending at boundary k is therefore
    scheduled at boundary k+1 (and runs after the loader's prefetch depth), one
    interval later than a blocking call would; in exchange rank 0 spends
    microseconds per boundary instead of a round trip. The plan reaches the other
    ranks only through the context's broadcast, so all ranks apply rank 0's plan
    at the same step.

    Each report carries the coordinator plan version the interval *ran* (the one
    adopted at the boundary before), which the coordinator stores with the stats
    and re-plans only against its newest plan (``hetero.core.replan.should_replan``).

    ``fallback`` (the embedded policy) answers while the agent fails: an error or a
    missed deadline starts a backoff (1 s, doubling up to 30 s) during which
    nothing is sent.
    """

    def __init__(
        self,
        endpoint: str,
        job_id: str,
        fallback: Planner,
        constraints: Constraints,
        progress: Progress,
        *,
        plan_version: int = 0,
        deadline_s: float = DEFAULT_DEADLINE_S,
        clock: Callable[[], float] = time.perf_counter,
        connect: Callable[[], tuple[grpc.Channel, Any]] | None = None,
        peer: str = "agent",
    ) -> None:
        self.endpoint = endpoint
        #: Opens the channel and the stub the reports go to (default: the agent's
        #: ``AgentLocal``; an attached job's rank 0 talks to the coordinator itself,
        #: whose service has the same two calls). ``peer`` names it in log lines.
        self._open = connect or self._open_agent
        self.peer = peer
        self.job_id = job_id
        self.fallback = fallback
        self.constraints = constraints
        self.progress = progress
        self.deadline_s = deadline_s
        self.clock = clock
        #: The newest coordinator plan version this job has adopted.
        self.seen_version = plan_version
        self.failures = 0
        self.retry_at = 0.0
        #: Seconds each answered request took on the worker thread (off the step path).
        self.latencies_s: list[float] = []
        #: Seconds rank 0 spent in each :meth:`decide` (on the step path).
        self.blocked_s: list[float] = []
        #: Boundaries not reported because the previous request was still out.
        self.skipped = 0
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future[_Answer] | None = None

    def _open_agent(self) -> tuple[grpc.Channel, Any]:
        channel = client_channel(self.endpoint, ClientSecurity(token=agent_token_from_env()))
        return channel, agent_pb2_grpc.AgentLocalStub(channel)  # type: ignore[no-untyped-call, unused-ignore]

    def _connect(self) -> Any:
        if self._stub is None:
            self._channel, self._stub = self._open()
        return self._stub

    def stats(self) -> dict[str, float | int]:
        """Rank 0's control plane, in s: ``blocked_s`` is the time on the step path
        (inside :meth:`decide`); ``p50_s``/``max_s``/``total_s`` are the answered
        requests' round trips, which run on the worker thread."""
        lat = sorted(self.latencies_s)
        blocked = sorted(self.blocked_s)
        return {
            "calls": len(lat),
            "failures": self.failures,
            "skipped": self.skipped,
            "p50_s": lat[len(lat) // 2] if lat else 0.0,
            "max_s": lat[-1] if lat else 0.0,
            "total_s": sum(lat),
            "blocked_s": sum(blocked),
            "blocked_p50_s": blocked[len(blocked) // 2] if blocked else 0.0,
            "blocked_max_s": blocked[-1] if blocked else 0.0,
        }

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait up to ``timeout_s`` (default: the deadline) for the request in flight.

        The answer is kept for the next :meth:`decide`. True if nothing is out any more.
        """
        pending = self._pending
        if pending is None:
            return True
        try:
            pending.exception(timeout=self.deadline_s if timeout_s is None else timeout_s)
        except FutureTimeout:
            return False
        return True

    def close(self, *, failed: bool = False) -> None:
        """Let the last report reach the agent (at most the deadline), then disconnect.

        The last answer cannot be applied any more; only its round trip is counted.
        ``failed`` (the rank stops on an error) changes nothing here.
        """
        self.flush()
        pending, self._pending = self._pending, None
        if pending is not None and pending.done() and pending.exception() is None:
            self.latencies_s.append(pending.result().latency_s)
        if self._worker is not None:
            self._worker.shutdown(wait=False, cancel_futures=True)
            self._worker = None
        if self._channel is not None:
            self._channel.close()
            self._channel, self._stub = None, None

    def decide(
        self, history: History, current: tuple[int, ...], horizon: Horizon | None = None
    ) -> Decision:
        t0 = time.perf_counter()
        try:
            return self._decide(history, current, horizon)
        finally:
            self.blocked_s.append(time.perf_counter() - t0)

    def _decide(
        self, history: History, current: tuple[int, ...], horizon: Horizon | None
    ) -> Decision:
        ran_version = self.seen_version  # the plan the interval just ended ran with
        answer = self._take_answer()
        if self.clock() < self.retry_at:
            return self.fallback.decide(history, current, horizon)
        if self._pending is None:
            self._send(ran_version)
        else:
            self.skipped += 1
        if answer is None:
            return Decision(current, False, "coordinator's answer not in yet; plan kept")
        return self._adopt(answer.plan, current)

    def _take_answer(self) -> _Answer | None:
        """The finished request's answer; None if none finished or it failed."""
        pending = self._pending
        if pending is None or not pending.done():
            return None
        self._pending = None
        try:
            answer = pending.result()
        except grpc.RpcError as exc:
            self._failed(exc)
            return None
        self.latencies_s.append(answer.latency_s)
        if self.failures:
            log.info(
                "%s %s answering again; following the coordinator's plans", self.peer, self.endpoint
            )
            self.failures = 0
        return answer

    def _adopt(self, plan: tpb.Plan, current: tuple[int, ...]) -> Decision:
        if plan.version <= self.seen_version:
            return Decision(current, False, f"coordinator plan v{plan.version} is current")
        self.seen_version = plan.version
        batches = tuple(int(b) for b in plan.batches)
        try:
            self.constraints.check(batches)
        except PlanError as exc:
            log.warning(
                "coordinator plan v%d does not fit this job (%s); ignored", plan.version, exc
            )
            return Decision(current, False, f"coordinator plan v{plan.version} ignored")
        predicted = plan.predicted_step_s if plan.HasField("predicted_step_s") else None
        reason = f"coordinator plan v{plan.version}: {plan.reason}"
        return Decision(batches, batches != current, reason, predicted)

    def _send(self, ran_version: int) -> None:
        """Hand this boundary's report (or, without complete stats, a plan query) to
        the worker thread. The message is built here, so the worker shares nothing."""
        step, summaries = self.progress()
        request: tpb.IntervalReport | tpb.GetPlanRequest
        if summaries and all(s.steps > 0 for s in summaries):
            request = tpb.IntervalReport(
                job_id=self.job_id,
                end_step=step,
                plan_version=ran_version,
                ranks=[_rank_stats(s) for s in summaries],
            )
        else:
            request = tpb.GetPlanRequest(job_id=self.job_id)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetero-control")
        self._pending = self._worker.submit(self._ask, self._connect(), request)

    def _ask(
        self,
        stub: Any,
        request: tpb.IntervalReport | tpb.GetPlanRequest,
    ) -> _Answer:
        """On the worker thread: one blocking call with the deadline."""
        t0 = time.perf_counter()
        if isinstance(request, tpb.IntervalReport):
            plan = stub.ReportIntervalStats(request, timeout=self.deadline_s).plan
        else:
            plan = stub.GetPlan(request, timeout=self.deadline_s)
        return _Answer(plan, time.perf_counter() - t0)

    def _failed(self, exc: grpc.RpcError) -> None:
        self.failures += 1
        backoff_s = min(30.0, 2.0 ** (self.failures - 1))
        self.retry_at = self.clock() + backoff_s
        if self.failures == 1:
            error = remote_error(exc, f"{self.peer} {self.endpoint}")
            log.warning(
                "%s; using the embedded policy, retrying in %.0f s",
                error
                if isinstance(error, UnreachableError)
                else f"{self.peer} {self.endpoint} refused the report ({error.status}: {error})",
                backoff_s,
            )


def _rank_stats(s: RankSummary) -> tpb.RankIntervalStats:
    # The optional measurements travel only where measured (unset = None).
    return tpb.RankIntervalStats(
        rank=s.rank,
        batch=s.batch,
        steps=s.steps,
        compute_s=s.compute_s,
        step_s=s.step_s,
        peak_memory_bytes=s.peak_memory_bytes,
        data_s=s.data_s,
        comm_wait_s=s.comm_s,
        forward_s=s.forward_s,
        backward_s=s.backward_s,
        optimizer_s=s.optimizer_s,
        loss_sum=s.loss_sum,
        samples=s.samples,
        switch_s=s.switch_s,
        busy_cv=s.busy_cv,
        input_s=s.input_s,
        input_cv=s.input_cv,
    )


def planner_from_env(
    env: RankEnv, fallback: Planner, constraints: Constraints, progress: Progress
) -> Planner:
    """An :class:`AgentPlanner` when launched by an agent, else ``fallback`` itself."""
    if not env.agent_endpoint or not env.job_id:
        return fallback
    launched = launch_plan(constraints, env.plan)
    return AgentPlanner(
        env.agent_endpoint,
        env.job_id,
        fallback,
        constraints,
        progress,
        plan_version=launched.version if launched else 0,
    )
