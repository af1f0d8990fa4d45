"""Store functions for the event journal: what happened to a job or a node, for
``hetero-coord job`` and the TUI."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hetero.coordinator.models import EventRow


def job_events(s: Session, job_id: str, limit: int = 20) -> list[EventRow]:
    rows = s.scalars(
        select(EventRow).where(EventRow.job_id == job_id).order_by(EventRow.id.desc()).limit(limit)
    )
    return list(reversed(list(rows)))
