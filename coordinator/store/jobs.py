"""Store functions for jobs and their ranks: submission, cancel, the ranks' reported
states moving a job along its lifecycle, a lost node, and restarts."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from hetero.coordinator import lifecycle
from hetero.coordinator.models import JobRow, RankRow
from hetero.coordinator.placement import Placement, initial_plan
from hetero.coordinator.store.events import add_event
from hetero.coordinator.store.plans import add_plan
from hetero.coordinator.store.rows import NotFoundError
from hetero.core.jobspec import JobSpec


def create_job(
    s: Session,
    spec: JobSpec,
    spec_yaml: str,
    placement: Placement,
    *,
    now: float,
    priority: int = 0,
    owner: str = "",
) -> JobRow:
    """A job placed at once (``placement``): PENDING, its ranks assigned."""
    job = new_job(spec, spec_yaml, now=now, priority=priority, owner=owner)
    s.add(job)
    place_job(s, job, spec, placement, now=now)
    return job


def new_job(spec: JobSpec, spec_yaml: str, *, now: float, priority: int, owner: str) -> JobRow:
    """The row of a job not placed yet (QUEUED, no ranks, no rendezvous); not added."""
    return JobRow(
        id=uuid.uuid4().hex[:12],
        name=spec.name,
        state=lifecycle.QUEUED,
        spec_yaml=spec_yaml,
        policy=spec.policy,
        global_batch=spec.global_batch,
        world_size=spec.world_size,
        min_batch=spec.min_batch,
        rebalance_interval=spec.rebalance_interval,
        backend="",
        master_addr="",
        master_port=0,
        submitted_at_unix_s=now,
        message="",
        restarts=0,
        last_step=0,
        total_steps=spec.steps,
        max_restarts=spec.max_restarts,
        attempt_first_plan=1,
        priority=priority,
        owner=owner,
    )


def place_job(
    s: Session, job: JobRow, spec: JobSpec, placement: Placement, *, now: float
) -> Placement:
    """Give a QUEUED (or new) job its ranks, rendezvous and first plan: PENDING. Returns
    ``placement``: a first start leaves no rank out (``exclusion``: profiles are
    too noisy to act on; the job's own intervals decide later)."""
    job.state, job.message = lifecycle.PENDING, ""
    job.world_size = len(placement.ranks)
    job.backend = placement.backend
    job.master_addr, job.master_port = placement.master_addr, placement.master_port
    job.ranks = _rank_rows(placement)
    s.flush()
    first = initial_plan(spec, placement)
    add_plan(s, job.id, first.batches, 0, first.policy, first.reason, now=now)
    emulated = " (emulated slowdown)" if placement.emulated else ""
    waited = now - job.submitted_at_unix_s
    # Placed by the submission itself: "job_submitted", as before the queue; from the
    # queue later: "job_placed", with the time it waited.
    kind, after = (
        ("job_placed", f" after {waited:.1f} s in the queue")
        if waited > 0
        else ("job_submitted", "")
    )
    add_event(
        s,
        kind,
        f"job {spec.name} placed on {spec.world_size} ranks, {placement.backend}{emulated}{after}",
        job_id=job.id,
        now=now,
    )
    return placement


def _rank_rows(placement: Placement) -> list[RankRow]:
    return [
        RankRow(
            rank=r.rank,
            node_id=r.device.node_id,
            device_index=r.device.index,
            device_kind=r.device.kind,
            device_name=r.device.name,
            local_rank=r.local_rank,
            state=lifecycle.ASSIGNED,
            emulated_slowdown=r.emulated_slowdown,
            effective_score=r.effective_score,
        )
        for r in placement.ranks
    ]


def get_job(s: Session, job_id: str) -> JobRow:
    job = s.get(JobRow, job_id)
    if job is None:
        raise NotFoundError(f"unknown job {job_id!r}")
    return job


#: Where a page of ``list_jobs`` ends: the last job's (submission time, id).
JobKey = tuple[float, str]


def list_jobs(
    s: Session, states: Sequence[str] = (), limit: int = 100, after: JobKey | None = None
) -> list[JobRow]:
    """Jobs newest first (then by id), those older than ``after`` when given (keyset
    paging: a page costs the same however deep), ``limit`` at most. Their ranks and
    the ranks' nodes come with them, in one more query each, not one per job."""
    query = (
        select(JobRow)
        .options(selectinload(JobRow.ranks).joinedload(RankRow.node))
        .order_by(JobRow.submitted_at_unix_s.desc(), JobRow.id)
        .limit(limit)
    )
    if states:
        query = query.where(JobRow.state.in_(states))
    if after is not None:
        submitted, job_id = after
        query = query.where(
            (JobRow.submitted_at_unix_s < submitted)
            | ((JobRow.submitted_at_unix_s == submitted) & (JobRow.id > job_id))
        )
    return list(s.scalars(query))


def count_jobs(s: Session, states: Sequence[str] = ()) -> int:
    query = select(func.count()).select_from(JobRow)
    if states:
        query = query.where(JobRow.state.in_(states))
    return s.scalar(query) or 0


def cancel_job(s: Session, job_id: str, *, now: float) -> JobRow:
    job = get_job(s, job_id)
    if job.state == lifecycle.CANCELLED:
        return job
    lifecycle.check_cancellable(job_id, job.state)
    for rank in job.ranks:
        rank.state = lifecycle.rank_state_after_cancel(rank.state)
    job.state, job.finished_at_unix_s, job.message = lifecycle.CANCELLED, now, "cancelled by user"
    add_event(s, "job_cancelled", f"job {job.name} cancelled", job_id=job_id, now=now)
    return job


def set_rank_status(
    s: Session,
    job_id: str,
    rank: int,
    *,
    node_id: str,
    state: str,
    exit_code: int | None,
    now: float,
    attempt: int = 0,
    message: str = "",
) -> JobRow:
    """Record what an agent saw of one rank, then move the job along its lifecycle.

    A report about an earlier ``attempt`` (a rank of a placement the job has
    since left) changes nothing.
    """
    job = get_job(s, job_id)
    if attempt != job.restarts:
        return job
    row = next((r for r in job.ranks if r.rank == rank), None)
    if row is None or row.node_id != node_id:
        raise NotFoundError(f"job {job_id} has no rank {rank} on node {node_id}")
    row.state, row.exit_code = state, exit_code
    statuses = [_status(r, message if r.rank == rank else "") for r in job.ranks]
    apply_transition(
        s,
        job,
        lifecycle.job_state(job.state, statuses, failure_restarts(job), job.max_restarts),
        now=now,
    )
    return job


def failure_restarts(job: JobRow) -> int:
    """Restarts that count against ``max_restarts``: those to leave a rank out do not."""
    return job.restarts - job.exclusion_restarts


def _status(r: RankRow, message: str = "") -> lifecycle.RankStatus:
    return lifecycle.RankStatus(r.rank, r.state, r.exit_code, message)


def apply_transition(
    s: Session, job: JobRow, t: lifecycle.Transition, *, now: float, lost_node: str | None = None
) -> None:
    """Make ``t`` so: the job's state and message, its ranks' stop orders, an event.

    Ranks on ``lost_node`` (down) count as gone at once; the others are ordered to
    stop when the job fails or restarts (the survivors would block in a collective).
    """
    before = job.state
    if t.state == before:
        return
    job.state = t.state
    job.message = t.message or job.message
    if t.state in lifecycle.FINISHED:
        job.finished_at_unix_s = now
    if t.state in (lifecycle.FAILED, lifecycle.RESTARTING):
        for other in job.ranks:
            if other.node_id == lost_node:
                other.state = lifecycle.rank_state_when_node_lost(other.state)
            else:
                other.state = lifecycle.rank_state_after_cancel(other.state)
    if t.restart:
        job.restarting_since_unix_s = now
        add_event(s, "job_restarting", f"job {job.name} {t.message}", job_id=job.id, now=now)
        return
    text = f"job {job.name} {job.state.lower()}" + (f": {t.message}" if t.message else "")
    add_event(s, f"job_{job.state.lower()}", text, job_id=job.id, now=now)
