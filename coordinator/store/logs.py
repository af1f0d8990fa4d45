"""Store functions for the ranks' log lines, as the agents ship them."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hetero.coordinator.models import LogLineRow
from hetero.coordinator.store.jobs import get_job


def job_logs(s: Session, job_id: str, after_seq: int, limit: int) -> list[LogLineRow]:
    get_job(s, job_id)
    query = (
        select(LogLineRow)
        .where(LogLineRow.job_id == job_id, LogLineRow.id > after_seq)
        .order_by(LogLineRow.id)
        .limit(limit)
    )
    return list(s.scalars(query))
