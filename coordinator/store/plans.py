"""Store functions for a job's plans: per-rank batches by version, each applied from
a step."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hetero.coordinator.models import PlanRow
from hetero.coordinator.store.rows import NotFoundError
from hetero.core.balancer import Batches


def latest_plan(s: Session, job_id: str) -> PlanRow:
    plan = s.scalars(
        select(PlanRow).where(PlanRow.job_id == job_id).order_by(PlanRow.version.desc()).limit(1)
    ).first()
    if plan is None:
        raise NotFoundError(f"job {job_id!r} has no plan")
    return plan


def latest_plans(s: Session, job_ids: Sequence[str]) -> dict[str, PlanRow]:
    """Each job's newest plan, by job id (jobs without one are absent): one query for a
    page of jobs, where ``latest_plan`` would take one a job."""
    if not job_ids:
        return {}
    newest = (
        select(PlanRow.job_id, func.max(PlanRow.version).label("version"))
        .where(PlanRow.job_id.in_(job_ids))
        .group_by(PlanRow.job_id)
        .subquery()
    )
    query = select(PlanRow).join(
        newest, (PlanRow.job_id == newest.c.job_id) & (PlanRow.version == newest.c.version)
    )
    return {p.job_id: p for p in s.scalars(query)}


def plan_batches(plan: PlanRow) -> Batches:
    return tuple(int(b) for b in plan.batches.split(",")) if plan.batches else ()


def job_plans(s: Session, job_id: str) -> list[PlanRow]:
    query = select(PlanRow).where(PlanRow.job_id == job_id).order_by(PlanRow.version)
    return list(s.scalars(query))
