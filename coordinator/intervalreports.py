"""Storing one interval report and the plan it leads to, wherever it runs: on a
thread of the coordinator (``plan_rpcs``) or in the report process (``reportworker``).

``handle`` is the whole of a report: its first transaction (the interval, straggler
events, a restart without a rank that is paying for it), the balancer's fit with no
transaction open, and the second transaction that stores a changed plan if nothing
changed the job meanwhile. It takes its database, its history cache and its fit as
arguments, so the two places run the same code. The caches of the process that
answers ``GetPlan`` and polls are its caller's to update (``Handled``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from hetero.coordinator import exclusion, store, views, wire
from hetero.coordinator.models import JobRow, PlanRow
from hetero.coordinator.readcache import IntervalHistories, with_interval
from hetero.core import replan
from hetero.core.balancer import Constraints, DeviceProfile, Horizon, RankInterval
from hetero.core.balancer.straggler import new_stragglers
from hetero.core.errors import ConfigError
from hetero.core.states import JobState
from hetero.v1 import types_pb2 as tpb

#: ``replan.replan`` or what stands in for it (``replanner.Replanner.replan``).
Fit = Callable[..., replan.Replan]


@dataclass(frozen=True)
class Handled:
    """A stored report's answer: the plan for the reporting rank, and whether the job
    now restarts without a rank (its stop orders and the freed devices: the caller
    drops its order and plan caches and tells the admission pass)."""

    reply: tpb.Plan
    restarted: bool


def handle(
    sessions: sessionmaker[Session],
    histories: IntervalHistories | None,
    fit_with: Fit,
    req: tpb.IntervalReport,
    now: float,
) -> Handled:
    """Store the interval, then fit the balancer with no transaction open, then store
    the plan it chose if nothing changed the job meanwhile. The fit held the
    database's write lock while it ran when it was one transaction, and every other
    writer (the heartbeat flush, the other reports) queued behind it.

    Raises ``HeteroError`` (nothing stored) for a report of an unknown job or one the
    balancer cannot use."""
    with sessions.begin() as s:
        job = store.get_job(s, req.job_id)
        _check_report(req, job)
        rows = wire.interval_rows(req)
        store.add_interval(s, job, req.end_step, req.plan_version, rows, now=now)
        # One history serves straggler detection and the balancer.
        attempt, steps = job.attempt_first_plan, _history(histories, job, req, rows)
        if steps is None:
            steps = store.interval_steps(s, job, views.HISTORY_FOR_REPORT)
        history = [ranks for _, ranks in steps]
        for flag in new_stragglers(history):
            store.add_event(s, "straggler", flag.message, job_id=job.id, now=now)
        plan = store.latest_plan(s, job.id)
        fit = _fit_arguments(req, job, plan, history)
        left_out = None
        if req.plan_version >= job.attempt_first_plan:
            spec = store.spec_of(job)
            left_out = exclusion.while_running(spec, job, history)
            if left_out is not None:
                start_up = store.attempt_start_up_s(s, job)
                left_out = exclusion.paying(left_out, spec, job, req.end_step, start_up)
            if left_out is not None:
                store.restart_without(s, job, left_out, now=now)
                fit = None  # the job restarts: the restart's plan is the next one
        reply = wire.plan_message(plan)
    # After the commit: what the next report of this job starts from.
    if histories is not None:
        histories.put(req.job_id, attempt, steps)
    if fit is not None:
        reply = _replan(sessions, fit_with, req, fit, plan.version, attempt, now) or reply
    return Handled(reply, left_out is not None)


def _replan(
    sessions: sessionmaker[Session],
    fit_with: Fit,
    req: tpb.IntervalReport,
    fit: _Fit,
    based_on: int,
    attempt: int,
    now: float,
) -> tpb.Plan | None:
    """The plan the balancer chooses, stored if it changes the plan and the job is
    as the report found it (the same newest plan and attempt, not ended: a
    restart, a cancel or an overlapping report of the job came first otherwise;
    then the newest plan is the answer); None = the plan the report found stands.

    "Changes the plan" is against the newest stored plan, not the batches the
    interval ran: a trainer applies a plan after its loader's prefetch, so the
    interval reported with the newest version may still have run the batches of
    the one before, and the balancer, asked from those, chooses the newest plan
    again; stored, it was a new version without a change ("plan v3: 181,75" after
    "plan v2: 181,75")."""
    result = fit_with(*fit)
    if result.decision.not_helping:
        _say_not_helping(sessions, req.job_id, result.decision.not_helping, now)
    if not result.decision.changed:
        return None
    with sessions.begin() as s:
        job = store.get_job(s, req.job_id)
        newest = store.latest_plan(s, job.id)
        # As ``replan.should_replan`` asks of a report, now: still the newest plan
        # of this attempt, and a job that has not ended.
        moved = (newest.version, job.attempt_first_plan) != (based_on, attempt)
        if moved or JobState[job.state].is_terminal:
            return wire.plan_message(newest)
        if tuple(result.decision.batches) == store.plan_batches(newest):
            return None
        plan = store.add_plan(
            s,
            job.id,
            result.decision.batches,
            result.apply_at_step,
            job.policy,
            result.decision.reason,
            predicted_step_s=result.decision.predicted_step_s,
            now=now,
        )
        store.add_event(
            s,
            "replanned",
            f"plan v{plan.version}: {plan.batches} ({plan.reason})",
            job_id=job.id,
            now=now,
        )
        return wire.plan_message(plan)


#: The event kind that says why balancing does not beat equal batches for a job.
NOT_HELPING = "not-helping"


def _say_not_helping(sessions: sessionmaker[Session], job_id: str, why: str, now: float) -> None:
    """An event, once each time the reason changes: "hetero is not helping here: ..."."""
    message = f"hetero is not helping here: {why}"
    with sessions.begin() as s:
        if store.last_event_message(s, job_id, NOT_HELPING) != message:
            store.add_event(s, NOT_HELPING, message, job_id=job_id, now=now)


def _history(
    histories: IntervalHistories | None,
    job: JobRow,
    req: tpb.IntervalReport,
    rows: list[dict[str, Any]],
) -> list[tuple[int, list[RankInterval]]] | None:
    """The job's recent complete intervals with this report's (every report is
    complete: ``_check_report``), from memory; None if not cached."""
    if histories is None:
        return None
    cached = histories.get(job.id, job.attempt_first_plan)
    if cached is None:
        return None
    if req.plan_version < job.attempt_first_plan:
        return cached  # kept in the database, not part of this attempt's history
    ranks = [store.rank_interval(r) for r in rows]
    return with_interval(cached, req.end_step, ranks, views.HISTORY_FOR_REPORT)


#: What the balancer is given for one report (``replan.replan``'s arguments).
_Fit = tuple[
    str,
    list[list[RankInterval]],
    tuple[int, ...],
    Constraints,
    list[DeviceProfile],
    int,
    Horizon,
]


def _fit_arguments(
    req: tpb.IntervalReport, job: JobRow, plan: PlanRow, history: list[list[RankInterval]]
) -> _Fit | None:
    """The balancer's arguments for this report, None if the report may not change the
    plan (``replan.should_replan``)."""
    if not replan.should_replan(
        ran_version=req.plan_version,
        attempt_first_version=job.attempt_first_plan,
        newest_version=plan.version,
        job_state=JobState[job.state],
        end_step=req.end_step,
        rebalance_interval=job.rebalance_interval,
    ):
        return None
    profiles = [
        DeviceProfile(r.device_name, r.effective_score, None, r.emulated_slowdown)
        for r in job.ranks
    ]
    constraints = Constraints(job.global_batch, job.world_size, job.min_batch)
    ran = tuple(r.batch for r in sorted(req.ranks, key=lambda r: r.rank))
    return (
        job.policy,
        history,
        replan.running_plan(ran, constraints) or store.plan_batches(plan),
        constraints,
        profiles,
        req.end_step,
        replan.horizon(job.rebalance_interval, req.end_step, job.total_steps),
    )


#: The optional measurements of ``RankIntervalStats`` the balancer reads.
_MEASURED = ("data_s", "optimizer_s", "switch_s", "busy_cv", "input_s")


def _check_report(req: tpb.IntervalReport, job: JobRow) -> None:
    """Reject reports the balancer cannot use: wrong rank set, negative or NaN times."""
    ranks = sorted(r.rank for r in req.ranks)
    if ranks != list(range(job.world_size)):
        raise ConfigError(f"job {job.id}: report has ranks {ranks}, want 0..{job.world_size - 1}")
    if req.end_step < 0:
        raise ConfigError(f"job {job.id}: end_step must be >= 0, got {req.end_step}")
    for r in req.ranks:
        # Input wait and the optimizer are part of the busy time the balancer fits; it
        # reads a plan change's cost, the steps' spread and the input rate too.
        phases = [getattr(r, f) for f in _MEASURED if r.HasField(f)]
        values = (r.compute_s, r.step_s, *phases)
        if r.batch < 0 or r.steps < 0 or not all(math.isfinite(v) and v >= 0 for v in values):
            raise ConfigError(f"job {job.id} rank {r.rank}: batch, steps and times must be >= 0")
