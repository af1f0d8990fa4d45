"""Applying ``retention.LogRetention`` to the ``log_lines`` and ``events`` tables.

Like the other tables, both are bounded: rows older than their window go, and a
job keeps at most ``lines_per_job`` log lines (its oldest go first), since a
chatty rank can ship 10,000 lines a second. Each batch deletes at most
``batch_rows`` rows in the caller's transaction (one batch keeps the writer
briefly); ``service.Service.prune`` runs batches beside the interval ones.

Ids follow arrival, so both age walks go by the primary key from the head of
the table and stop at the first young row: no index on the times, no schema
change. A log line's time is its agent's clock (the coordinator's when the
agent sent none, and never later than its arrival: ``logwire``), close to arrival on
any node with a synchronised clock.

What the deleted lines were charged against the log caps (``logcaps``) comes off
their jobs' ``log_bytes`` in the same transaction, and the batch says it by job
(``LogBatch.freed``), so the coordinator gives the room back to its ledger.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, select, update
from sqlalchemy.orm import Session

from hetero.coordinator.models import EventRow, JobRow, LogLineRow
from hetero.coordinator.retention import LogRetention

#: Rows the age walk reads per batch beyond its budget: it stops at the first young row.
_WALK_LIMIT = 10_000


@dataclass(frozen=True)
class LogBatch:
    """What one batch did: rows removed, whether another batch now would find more,
    and the bytes charged for the deleted log lines, by job."""

    removed: int
    more: bool
    freed: dict[str, int] = field(default_factory=dict)


def prune_logs_batch(s: Session, policy: LogRetention, *, now: float) -> LogBatch:
    """Delete at most ``policy.batch_rows`` rows of ``log_lines`` and ``events`` that the
    policy lets go. Never commits (the caller owns the transaction)."""
    budget = policy.batch_rows
    lines = cast(Table, LogLineRow.__table__)
    events = cast(Table, EventRow.__table__)
    freed: Counter[str] = Counter()
    cutoff = now - policy.logs_keep_s
    doomed = _expired(s, lines, cutoff, budget, lines.c.job_id, lines.c.cost_bytes)
    for _, job_id, cost in doomed:
        freed[job_id] += cost
    removed = _delete(s, lines, [row[0] for row in doomed])
    if removed < budget:
        removed += _over_budget(s, lines, policy.lines_per_job, budget - removed, freed)
    if removed < budget:
        cutoff = now - policy.events_keep_s
        removed += _delete(s, events, [e[0] for e in _expired(s, events, cutoff, budget - removed)])
    _uncharge(s, freed)
    return LogBatch(removed, removed >= budget, dict(freed))


def _expired(
    s: Session, t: Table, cutoff: float, budget: int, *extra: Any
) -> list[tuple[Any, ...]]:
    """The oldest rows (by id) timed before ``cutoff``, at most ``budget``: each its id and
    the ``extra`` columns."""
    rows = s.execute(
        select(t.c.id, t.c.time_unix_s, *extra).order_by(t.c.id).limit(min(budget, _WALK_LIMIT))
    ).all()
    doomed: list[tuple[Any, ...]] = []
    for row in rows:
        if row[1] >= cutoff:
            break
        doomed.append((row[0], *row[2:]))
    return doomed


def _uncharge(s: Session, freed: Counter[str]) -> None:
    """Take what the deleted lines were charged off their jobs' ``log_bytes``."""
    if not any(freed.values()):
        return
    jobs = cast(Table, JobRow.__table__)
    statement = (
        update(jobs)
        .where(jobs.c.id == bindparam("job"))
        .values(log_bytes=jobs.c.log_bytes - bindparam("cost"))
    )
    rows = [{"job": job_id, "cost": cost} for job_id, cost in freed.items() if cost]
    s.connection().execute(statement, rows)


def _over_budget(s: Session, t: Table, lines_per_job: int, budget: int, freed: Counter[str]) -> int:
    """Delete the oldest lines of jobs holding more than ``lines_per_job`` (at most
    ``budget`` rows), their charge counted into ``freed``; returns how many went."""
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
        oldest = (t.c.job_id == job_id, t.c.id <= last)
        freed[job_id] += s.scalar(select(func.sum(t.c.cost_bytes)).where(*oldest)) or 0
        s.execute(delete(t).where(*oldest))
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
