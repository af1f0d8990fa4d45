"""Store functions for interval statistics: what every rank measured over each
rebalance interval, and the windows of complete intervals the balancer reads."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hetero.coordinator.models import IntervalStatRow, JobRow, PlanRow
from hetero.core.balancer import RankInterval


def rank_interval(row: dict[str, Any]) -> RankInterval:
    """The balancer's view of one rank's ``IntervalStatRow`` column values."""
    return RankInterval(
        row["rank"],
        row["batch"],
        row["steps"],
        row["compute_s"],
        row["step_s"],
        row["peak_memory_bytes"],
        data_s=row.get("data_s"),
        optimizer_s=row.get("optimizer_s"),
        switch_s=row.get("switch_s"),
        busy_cv=row.get("busy_cv"),
        input_s=row.get("input_s"),
        input_cv=row.get("input_cv"),
    )


def complete_steps(s: Session, job: JobRow, limit: int) -> list[int]:
    """The newest ``limit`` end steps every rank of the current attempt reported, newest
    first (a restart resumes from a checkpoint: its steps repeat the old attempt's).

    Counting ranks per step over a job's whole history made every interval report
    slower the longer the job ran; the newest ``2 * limit`` steps (an index-only
    reverse scan) nearly always hold them, and only if not is the rest counted.
    """
    t = IntervalStatRow
    recent = list(
        s.scalars(
            select(t.end_step)
            .where(*_this_attempt(job))
            .distinct()
            .order_by(t.end_step.desc())
            .limit(2 * limit)
        )
    )
    if not recent:
        return []
    query = (
        select(t.end_step)
        .where(*_this_attempt(job))
        .group_by(t.end_step)
        .having(func.count(func.distinct(t.rank)) == job.world_size)
        .order_by(t.end_step.desc())
        .limit(limit)
    )
    if len(recent) == 2 * limit:
        steps = list(s.scalars(query.where(t.end_step >= recent[-1])))
        if len(steps) == limit:
            return steps
    return list(s.scalars(query))


def interval_history(s: Session, job: JobRow, window: int) -> list[list[RankInterval]]:
    """The last ``window`` complete intervals (every rank reported) of the current
    attempt, oldest first."""
    return [ranks for _, ranks in interval_steps(s, job, window)]


def interval_steps(s: Session, job: JobRow, window: int) -> list[tuple[int, list[RankInterval]]]:
    """``interval_history`` with each interval's end step: (end step, ranks in rank
    order), oldest first."""
    steps = complete_steps(s, job, window)
    if not steps:
        return []
    # Columns, not ORM objects: this runs on every interval report of every job,
    # and building the objects was most of a report's CPU.
    t = IntervalStatRow
    rows = s.execute(
        select(
            t.end_step,
            t.rank,
            t.batch,
            t.steps,
            t.compute_s,
            t.step_s,
            t.peak_memory_bytes,
            t.data_s,
            t.optimizer_s,
            t.switch_s,
            t.busy_cv,
            t.input_s,
            t.input_cv,
        )
        .where(*_this_attempt(job), t.end_step.in_(steps))
        .order_by(t.end_step, t.rank, t.id.desc())
    )
    by_step: dict[int, dict[int, RankInterval]] = {}
    for row in rows:
        # A re-sent report leaves duplicates: the newest row (highest id) wins.
        ranks = by_step.setdefault(row.end_step, {})
        if row.rank not in ranks:
            ranks[row.rank] = rank_interval(row._asdict())
    return [
        (step, [by_step[step][rank] for rank in sorted(by_step[step])]) for step in sorted(by_step)
    ]


def _this_attempt(job: JobRow) -> tuple[Any, ...]:
    """Interval rows of the job's current placement (earlier ones had other ranks)."""
    return (
        IntervalStatRow.job_id == job.id,
        IntervalStatRow.plan_version >= job.attempt_first_plan,
    )


def latest_interval(s: Session, job: JobRow) -> list[IntervalStatRow]:
    """The newest complete interval's rows of the current attempt (one per rank, rank
    order); [] before any."""
    steps = complete_steps(s, job, 1)
    if not steps:
        return []
    step = steps[0]
    return _newest_per_rank(
        s.scalars(
            select(IntervalStatRow).where(*_this_attempt(job), IntervalStatRow.end_step == step)
        )
    )


def job_intervals(
    s: Session, job_id: str, limit: int, after_step: int | None = None
) -> list[list[IntervalStatRow]]:
    """Intervals oldest first, each its rows in rank order: the newest ``limit``, or
    with ``after_step`` the oldest ``limit`` whose end_step is greater."""
    query = (
        select(IntervalStatRow.end_step)
        .where(IntervalStatRow.job_id == job_id)
        .group_by(IntervalStatRow.end_step)
    )
    if after_step is None:
        query = query.order_by(IntervalStatRow.end_step.desc())
    else:
        query = query.where(IntervalStatRow.end_step > after_step)
        query = query.order_by(IntervalStatRow.end_step)
    steps = sorted(s.scalars(query.limit(limit)))
    if not steps:
        return []
    rows = s.scalars(
        select(IntervalStatRow).where(
            IntervalStatRow.job_id == job_id, IntervalStatRow.end_step.in_(steps)
        )
    )
    by_step: dict[int, list[IntervalStatRow]] = {}
    for row in rows:
        by_step.setdefault(row.end_step, []).append(row)
    return [_newest_per_rank(by_step[step]) for step in steps]


def _newest_per_rank(rows: Iterable[IntervalStatRow]) -> list[IntervalStatRow]:
    """One row per rank from the newest report of a step.

    A re-sent report leaves duplicates: the newest row (highest id) wins. A step
    run again after a restart (resumed from an older checkpoint, perhaps with
    fewer ranks) keeps only the newest report's plan version, so ranks of two
    placements never mix.
    """
    rows = list(rows)
    if not rows:
        return []
    version = max(rows, key=lambda r: r.id).plan_version
    newest: dict[int, IntervalStatRow] = {}
    for row in rows:
        if row.plan_version != version:
            continue
        if row.rank not in newest or row.id > newest[row.rank].id:
            newest[row.rank] = row
    return [newest[rank] for rank in sorted(newest)]


def attempt_start_up_s(s: Session, job: JobRow) -> float | None:
    """Seconds the job's current attempt took from its placement (its first plan) to its
    first training step: the first complete interval's arrival less the time its steps
    took (the slowest rank's), so warm-up steps slower than the settled ones count as
    start-up. None before the attempt's first complete interval."""
    t = IntervalStatRow
    first = s.scalar(
        select(t.end_step)
        .where(*_this_attempt(job))
        .group_by(t.end_step)
        .having(func.count(func.distinct(t.rank)) == job.world_size)
        .order_by(t.end_step)
        .limit(1)
    )
    placed = s.get(PlanRow, (job.id, job.attempt_first_plan))
    if first is None or placed is None:
        return None
    rows = list(s.scalars(select(t).where(*_this_attempt(job), t.end_step == first)))
    arrived = max(r.received_at_unix_s for r in rows)
    ran = max(r.steps * r.step_s for r in rows)
    return max(0.0, arrived - placed.created_at_unix_s - ran)
