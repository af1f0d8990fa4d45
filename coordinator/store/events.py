"""Store functions for the event journal: what happened to a job or a node, for
``hetero-coord job`` and the TUI."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hetero.coordinator.models import EventRow


def add_event(
    s: Session,
    kind: str,
    message: str,
    *,
    job_id: str | None = None,
    node_id: str | None = None,
    now: float,
) -> None:
    s.add(EventRow(time_unix_s=now, job_id=job_id, node_id=node_id, kind=kind, message=message))


def job_events(s: Session, job_id: str, limit: int = 20) -> list[EventRow]:
    rows = s.scalars(
        select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id.desc()).limit(limit)
    )
    return list(reversed(list(rows)))


def last_event_message(s: Session, job_id: str, kind: str) -> str | None:
    """The message of the job's newest event of ``kind``; None if it has none."""
    return s.scalars(
        select(EventRow.message)
        .where(EventRow.job_id == job_id, EventRow.kind == kind)
        .order_by(EventRow.id.desc())
        .limit(1)
    ).first()
