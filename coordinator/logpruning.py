"""Applying ``retention.LogRetention`` to the ``log_lines`` and ``events`` tables.

Like the other tables, both are bounded: rows older than their window go, and a
job keeps at most ``lines_per_job`` log lines (its oldest go first), since a
chatty rank can ship 10,000 lines a second. Each batch deletes at most
``batch_rows`` rows in the caller's transaction (one batch keeps the writer
briefly); ``service.Service.prune`` runs batches beside the interval ones.

Ids follow arrival, so both age walks go by the primary key from the head of
the table and stop at the first young row: no index on the times, no schema
change. A log line's time is its agent's clock (the coordinator's when the
agent sent none), close to arrival on any node with a synchronised clock.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import Table, bindparam, delete, func, select
from sqlalchemy.orm import Session

from hetero.coordinator.models import EventRow, LogLineRow
from hetero.coordinator.retention import LogRetention

#: Rows the age walk reads per batch beyond its budget: it stops at the first young row.
_WALK_LIMIT = 10_000


def prune_logs_batch(s: Session, policy: LogRetention, *, now: float) -> tuple[int, bool]:
    """Delete at most ``policy.batch_rows`` rows of ``log_lines`` and ``events`` that the
    policy lets go; returns (rows removed, whether another batch now would find more).
    Never commits (the caller owns the transaction)."""
    budget = policy.batch_rows
    lines = cast(Table, LogLineRow.__table__)
    events = cast(Table, EventRow.__table__)
    doomed = _expired(s, lines, now - policy.logs_keep_s, budget)
    removed = _delete(s, lines, doomed)
    if removed < budget:
        removed += _over_budget(s, lines, policy.lines_per_job, budget - removed)
    if removed < budget:
        removed += _delete(
            s, events, _expired(s, events, now - policy.events_keep_s, budget - removed)
        )
    return removed, removed >= budget


def _expired(s: Session, t: Table, cutoff: float, budget: int) -> list[int]:
    """Ids of the oldest rows (by id) timed before ``cutoff``, at most ``budget``."""
    rows = s.execute(
        select(t.c.id, t.c.time_unix_s).order_by(t.c.id).limit(min(budget, _WALK_LIMIT))
    ).all()
    doomed = []
    for row_id, when in rows:
        if when >= cutoff:
            break
        doomed.append(row_id)
    return doomed


def _over_budget(s: Session, t: Table, lines_per_job: int, budget: int) -> int:
    """Delete the oldest lines of jobs holding more than ``lines_per_job`` (at most
    ``budget`` rows); returns how many went."""
    removed = 0
    counts = s.execute(
        select(t.c.job_id, func.count()).group_by(t.c.job_id).having(func.count() > lines_per_job)
    ).all()
    for job_id, count in counts:
        take = min(count - lines_per_job, budget - removed)
        if take <= 0:
            break
        last = s.scalar(
            select(t.c.id).where(t.c.job_id == job_id).order_by(t.c.id).offset(take - 1).limit(1)
        )
        if last is None:
            continue
        s.execute(delete(t).where(t.c.job_id == job_id, t.c.id <= last))
        removed += take
    return removed


def _delete(s: Session, t: Table, ids: list[int]) -> int:
    if not ids:
        return 0
    runs: list[dict[str, int]] = []
    for i in ids:  # ascending: consecutive ids become one range
        if runs and runs[-1]["hi"] == i - 1:
            runs[-1]["hi"] = i
        else:
            runs.append({"lo": i, "hi": i})
    s.connection().execute(delete(t).where(t.c.id.between(bindparam("lo"), bindparam("hi"))), runs)
    return len(ids)
