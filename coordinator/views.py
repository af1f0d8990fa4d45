"""Read views: API messages assembled from the store, shared by the gRPC servicer and
the metrics endpoint, so ``hetero-top`` and Prometheus see the same numbers.

Each function takes an open session and the current time; none writes.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from hetero.coordinator import store, wire
from hetero.coordinator.models import JobRow, PlanRow
from hetero.core.balancer import StragglerEvidence, detect_stragglers
from hetero.core.balancer.straggler import LOOKBACK
from hetero.v1 import coordinator_pb2 as pb

#: Events a job's detail carries, newest last.
DETAIL_EVENTS = 50
#: Default and largest number of intervals in one GetJobDetail reply.
DEFAULT_INTERVALS = 120
MAX_INTERVALS = 2000


def stragglers(s: Session, job: JobRow) -> tuple[StragglerEvidence, ...]:
    """Ranks flagged at the newest complete interval (the balancer's default rule)."""
    return detect_stragglers(store.interval_history(s, job, LOOKBACK))


def job_message(s: Session, job: JobRow, detail: bool = False) -> pb.Job:
    """The API's view of a job; ``detail`` adds the spec and recent events."""
    try:
        plan = store.latest_plan(s, job.id)
    except store.NotFoundError:
        plan = None
    return _job_message(s, job, plan, detail)


def job_messages(s: Session, jobs: Sequence[JobRow]) -> list[pb.Job]:
    """``job_message`` of each of ``jobs`` (from ``store.list_jobs``: ranks loaded), their
    plans read in one query. Jobs that ran still cost their newest interval's queries;
    queued ones (the many, in a flood) none."""
    plans = store.latest_plans(s, [j.id for j in jobs])
    return [_job_message(s, j, plans.get(j.id)) for j in jobs]


def _job_message(s: Session, job: JobRow, plan: PlanRow | None, detail: bool = False) -> pb.Job:
    names = {r.node_id: r.node.name for r in job.ranks}
    events = store.job_events(s, job.id, DETAIL_EVENTS) if detail else []
    # A job never placed (queued) has no intervals: no query for them.
    latest = store.latest_interval(s, job) if job.ranks else []
    live = wire.job_live(job, latest, stragglers(s, job)) if latest else None
    return wire.job_message(job, plan, names, events, with_spec=detail, live=live)


def job_detail(s: Session, job_id: str, max_intervals: int, after_step: int | None) -> pb.JobDetail:
    """A job with its intervals (see ``GetJobDetailRequest``) and every plan."""
    job = store.get_job(s, job_id)
    limit = min(max_intervals or DEFAULT_INTERVALS, MAX_INTERVALS)
    # One more than asked tells whether a next page exists.
    intervals = store.job_intervals(s, job.id, limit + 1, after_step)
    more = len(intervals) > limit
    if more:
        intervals = intervals[:limit] if after_step is not None else intervals[1:]
    return pb.JobDetail(
        job=job_message(s, job, detail=True),
        intervals=[wire.interval_message(job.id, rows) for rows in intervals],
        plans=[wire.plan_message(p) for p in store.job_plans(s, job.id)],
        more=more and after_step is not None,
    )
