"""Trainers under an agent: the plan comes from the coordinator, through the node agent.

An agent launches each rank with ``HETERO_AGENT_ENDPOINT`` (its ``AgentLocal``
service), ``HETERO_JOB_ID`` and ``HETERO_PLAN`` (the coordinator's initial plan,
``VERSION:B0,B1,...``, identical on every rank so all ranks start on the same
plan without talking). At each rebalance boundary rank 0's :class:`AgentPlanner`
reports every rank's interval summary to the agent and gets the coordinator's
latest plan back within ``deadline_s``; the existing broadcast then gives all
ranks rank 0's answer at the same step.

The control plane never stalls training: if the agent or the coordinator is
slow or down, the planner answers from the embedded policy instead, and does
not try the agent again for a backoff period that doubles with each failure.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from hetero.auth import agent_token_from_env, with_token
from hetero.coordinator.balancer import Constraints, Decision, History
from hetero.trainer.exchange import Planner, RankSummary
from hetero.v1 import agent_pb2_grpc
from hetero.v1 import types_pb2 as tpb

log = logging.getLogger("hetero.trainer.control")

ENDPOINT_ENV = "HETERO_AGENT_ENDPOINT"
JOB_ENV = "HETERO_JOB_ID"
PLAN_ENV = "HETERO_PLAN"
SLOWDOWN_ENV = "HETERO_EMULATE_SLOWDOWN"
#: Seconds rank 0 waits for the agent at a boundary before using the embedded policy.
DEFAULT_DEADLINE_S = 0.5

#: ``() -> (global step, every rank's summary of the interval just ended)``.
Progress = Callable[[], tuple[int, Sequence[RankSummary] | None]]


@dataclass(frozen=True)
class LaunchPlan:
    """The coordinator's plan the agent launched this rank with."""

    version: int
    batches: tuple[int, ...]


def launch_plan(constraints: Constraints) -> LaunchPlan | None:
    """``HETERO_PLAN`` if it is set and fits ``constraints``; else None (with a warning)."""
    raw = os.environ.get(PLAN_ENV, "")
    if not raw:
        return None
    try:
        version_text, batches_text = raw.split(":", 1)
        plan = LaunchPlan(int(version_text), tuple(int(b) for b in batches_text.split(",")))
    except ValueError:
        log.warning("ignoring %s=%r: expected VERSION:B0,B1,...", PLAN_ENV, raw)
        return None
    if not _fits(plan.batches, constraints):
        log.warning(
            "ignoring the agent's plan %s: it does not split %d samples over %d ranks",
            list(plan.batches),
            constraints.global_batch,
            constraints.world_size,
        )
        return None
    return plan


def _fits(batches: Sequence[int], c: Constraints) -> bool:
    return (
        len(batches) == c.world_size
        and sum(batches) == c.global_batch
        and all(b >= c.min_batch for b in batches)
    )


def emulated_slowdown_from_env(rank: int) -> str | None:
    """``RANK:FACTOR`` from the agent's ``HETERO_EMULATE_SLOWDOWN`` (None if absent or 1)."""
    raw = os.environ.get(SLOWDOWN_ENV, "")
    try:
        factor = float(raw) if raw else 1.0
    except ValueError:
        log.warning("ignoring %s=%r: not a number", SLOWDOWN_ENV, raw)
        return None
    return f"{rank}:{factor:g}" if factor > 1.0 else None


class AgentPlanner:
    """Rank 0's planner under an agent; ``fallback`` answers whenever the agent cannot."""

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
    ) -> None:
        self.endpoint = endpoint
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
        #: Seconds each answered request took (for measurements and logs).
        self.latencies_s: list[float] = []
        self._channel: grpc.Channel | None = None
        self._stub: agent_pb2_grpc.AgentLocalStub | None = None

    def _connect(self) -> agent_pb2_grpc.AgentLocalStub:
        if self._stub is None:
            self._channel = with_token(grpc.insecure_channel(self.endpoint), agent_token_from_env())
            self._stub = agent_pb2_grpc.AgentLocalStub(self._channel)  # type: ignore[no-untyped-call, unused-ignore]
        return self._stub

    def stats(self) -> dict[str, float | int]:
        """Rank 0's time in the control plane: answered calls, their p50/max and total, in s."""
        lat = sorted(self.latencies_s)
        return {
            "calls": len(lat),
            "failures": self.failures,
            "p50_s": lat[len(lat) // 2] if lat else 0.0,
            "max_s": lat[-1] if lat else 0.0,
            "total_s": sum(lat),
        }

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel, self._stub = None, None

    def decide(self, history: History, current: tuple[int, ...]) -> Decision:
        if self.clock() < self.retry_at:
            return self.fallback.decide(history, current)
        t0 = time.perf_counter()
        try:
            plan = self._ask()
        except grpc.RpcError as exc:
            self._failed(exc)
            return self.fallback.decide(history, current)
        self.latencies_s.append(time.perf_counter() - t0)
        if self.failures:
            log.info("agent %s answering again; following the coordinator's plans", self.endpoint)
            self.failures = 0
        if plan.version <= self.seen_version:
            return Decision(current, False, f"coordinator plan v{plan.version} is current")
        self.seen_version = plan.version
        batches = tuple(int(b) for b in plan.batches)
        if not _fits(batches, self.constraints):
            log.warning(
                "coordinator plan v%d %s does not fit this job; ignored",
                plan.version,
                list(batches),
            )
            return Decision(current, False, f"coordinator plan v{plan.version} ignored")
        predicted = plan.predicted_step_s if plan.HasField("predicted_step_s") else None
        reason = f"coordinator plan v{plan.version}: {plan.reason}"
        return Decision(batches, batches != current, reason, predicted)

    def _ask(self) -> tpb.Plan:
        stub = self._connect()
        step, summaries = self.progress()
        if summaries and all(s.steps > 0 for s in summaries):
            report = tpb.IntervalReport(
                job_id=self.job_id,
                end_step=step,
                plan_version=self.seen_version,
                ranks=[_rank_stats(s) for s in summaries],
            )
            resp = stub.ReportIntervalStats(report, timeout=self.deadline_s)
            return resp.plan
        return stub.GetPlan(tpb.GetPlanRequest(job_id=self.job_id), timeout=self.deadline_s)

    def _failed(self, exc: grpc.RpcError) -> None:
        self.failures += 1
        backoff_s = min(30.0, 2.0 ** (self.failures - 1))
        self.retry_at = self.clock() + backoff_s
        if self.failures == 1:
            code = exc.code().name if hasattr(exc, "code") else "error"
            log.warning(
                "agent %s did not answer (%s); using the embedded policy, retrying in %.0f s",
                self.endpoint,
                code,
                backoff_s,
            )


def _rank_stats(s: RankSummary) -> tpb.RankIntervalStats:
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
    )


def planner_from_env(fallback: Planner, constraints: Constraints, progress: Progress) -> Planner:
    """An :class:`AgentPlanner` when launched by an agent, else ``fallback`` itself."""
    endpoint = os.environ.get(ENDPOINT_ENV, "")
    job_id = os.environ.get(JOB_ENV, "")
    if not endpoint or not job_id:
        return fallback
    launched = launch_plan(constraints)
    return AgentPlanner(
        endpoint,
        job_id,
        fallback,
        constraints,
        progress,
        plan_version=launched.version if launched else 0,
    )
