"""Store functions for jobs: one job, and pages of jobs newest first, for the jobs the
coordinator's state no longer holds (``state.KEEP_FINISHED_S``) and the listings."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from hetero.coordinator.models import JobRow, RankRow
from hetero.coordinator.store.rows import NotFoundError


def get_job(s: Session, job_id: str) -> JobRow:
    job = s.get(JobRow, job_id)
    if job is None:
        raise NotFoundError(f"unknown job {job_id!r}")
    return job


#: Where a page of ``list_jobs`` ends: the last job's (submission time, id).
JobKey = tuple[float, str]


def list_jobs(
    s: Session,
    states: Sequence[str] = (),
    limit: int = 100,
    after: JobKey | None = None,
    owner: str | None = None,
) -> list[JobRow]:
    """Jobs newest first (then by id), those older than ``after`` when given (keyset
    paging: a page costs the same however deep), ``limit`` at most, ``owner``'s alone
    when given. Their ranks and the ranks' nodes come with them, in one more query
    each, not one per job."""
    query = (
        select(JobRow)
        .options(selectinload(JobRow.ranks).joinedload(RankRow.node))
        .order_by(JobRow.submitted_at_unix_s.desc(), JobRow.id)
        .limit(limit)
    )
    if states:
        query = query.where(JobRow.state.in_(states))
    if owner is not None:
        query = query.where(JobRow.owner == owner)
    if after is not None:
        submitted, job_id = after
        query = query.where(
            (JobRow.submitted_at_unix_s < submitted)
            | ((JobRow.submitted_at_unix_s == submitted) & (JobRow.id > job_id))
        )
    return list(s.scalars(query))


def count_jobs(s: Session, states: Sequence[str] = (), owner: str | None = None) -> int:
    query = select(func.count()).select_from(JobRow)
    if states:
        query = query.where(JobRow.state.in_(states))
    if owner is not None:
        query = query.where(JobRow.owner == owner)
    return s.scalar(query) or 0
