"""Retention of rank log lines and events on a real SQLite file (issue 17 item 6): the
coordinator's write operations (``persist``) write them (dated by hand), and
``logpruning.prune_logs_batch`` prunes them in batches of their own transactions, as
``service.Service.prune`` runs it through the writer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from hetero.bench import seed
from hetero.coordinator import persist
from hetero.coordinator.config import load_config
from hetero.coordinator.database import open_database, session_factory
from hetero.coordinator.logpruning import prune_logs_batch
from hetero.coordinator.models import EventRow, LogLineRow
from hetero.coordinator.retention import LogRetention
from hetero.core.errors import ConfigError
from hetero.core.jobspec import parse_jobspec

NOW = 1_700_000_000.0
DAY = 86400.0
SPEC = "name: chatty\nmodel: debug\nglobal_batch: 8\nsteps: 100\nresources: {ranks: 1}\n"


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    engine = open_database(f"sqlite:///{tmp_path / 'coordinator.db'}")
    try:
        yield session_factory(engine)
    finally:
        engine.dispose()


def _job(s: Session) -> str:
    """A job's row as the coordinator writes it (``persist.save_job``)."""
    job = seed.queued_job(parse_jobspec(SPEC), SPEC, now=NOW - 50 * DAY, priority=0, owner="")
    seed.save(s, persist.save_job(job))
    return job.id


def _lines(s: Session, job_id: str, n: int, at: float) -> None:
    """``n`` lines of rank 0's stdout, shipped at ``at``, as ``AppendJobLogs`` writes them."""
    rows = tuple(
        {"job_id": job_id, "rank": 0, "stream": "stdout", "text": f"l{i}", "time_unix_s": at}
        for i in range(n)
    )
    seed.save(s, persist.AddRows(LogLineRow, rows))


def _event(s: Session, job_id: str, message: str, at: float) -> None:
    s.add(EventRow(time_unix_s=at, job_id=job_id, kind="note", message=message))


def _count(sessions: sessionmaker[Session], table: type, job_id: str | None = None) -> int:
    with sessions() as s:
        query = select(func.count()).select_from(table)
        if job_id is not None:
            query = query.where(table.job_id == job_id)  # type: ignore[attr-defined]
        return int(s.scalar(query) or 0)


def _prune_logs(sessions: sessionmaker[Session], policy: LogRetention) -> int:
    """Batches until one finds nothing more to do; the rows removed."""
    removed = 0
    while True:
        with sessions.begin() as s:
            batch = prune_logs_batch(s, policy, now=NOW)
        removed += batch.removed
        if not batch.more:
            return removed


def test_old_lines_and_events_go_and_a_chatty_job_keeps_its_newest_lines(
    sessions: sessionmaker[Session],
) -> None:
    policy = LogRetention(
        logs_keep_s=7 * DAY, lines_per_job=1_000, events_keep_s=30 * DAY, batch_rows=700
    )
    with sessions.begin() as s:
        quiet, chatty = _job(s), _job(s)
        _lines(s, quiet, 300, NOW - 8 * DAY)  # older than the window
        _lines(s, quiet, 200, NOW - 1 * DAY)
        _lines(s, chatty, 5_000, NOW - 60)  # young, but over the job's budget
        for age in (40 * DAY, 31 * DAY, 29 * DAY, 1.0):
            _event(s, quiet, f"{age}", NOW - age)
    events_before = _count(sessions, EventRow)
    removed = _prune_logs(sessions, policy)
    assert _count(sessions, LogLineRow, quiet) == 200
    assert _count(sessions, LogLineRow, chatty) == 1_000
    with sessions() as s:  # the newest lines stay, in order
        texts = s.scalars(
            select(LogLineRow.text).where(LogLineRow.job_id == chatty).order_by(LogLineRow.id)
        ).all()
    assert texts[0] == "l4000" and texts[-1] == "l4999"
    with sessions() as s:  # events by age: those of 50, 40 and 31 days went
        kept = s.scalars(select(EventRow.message).order_by(EventRow.id)).all()
    assert kept == [f"{29 * DAY}", "1.0"]
    assert removed == 300 + 4_000 + events_before - 2
    assert _prune_logs(sessions, policy) == 0  # caught up: a second pass finds nothing


def test_log_retention_keys_in_coordinator_yaml(tmp_path: Path) -> None:
    path = tmp_path / "coordinator.yaml"
    path.write_text("log_keep_days: 2\nlog_lines_per_job: 5000\nevent_keep_days: 10\n")
    assert load_config(path).log_retention == LogRetention(
        logs_keep_s=2 * DAY, lines_per_job=5_000, events_keep_s=10 * DAY
    )
    path.write_text("log_lines_per_job: 10\n")
    with pytest.raises(ConfigError, match="log_lines_per_job: must be >= 1000"):
        load_config(path)
    with pytest.raises(ConfigError, match="log_keep_days must be at least"):
        LogRetention(logs_keep_s=60)
