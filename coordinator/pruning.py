"""Applying ``retention.IntervalRetention`` to the ``interval_stats`` table, and
``retention.JobRetention`` to finished jobs (``prune_finished_jobs``).

Never pruned, whatever their age: the rows of each job's history, i.e. the current
attempt's newest ``reports.HISTORY`` complete intervals (and any newer rows) of every
job not finished. The history is kept in memory, but recovery (``persist.load``)
rebuilds it from these rows, so a restarted coordinator plans from the same
intervals. A job whose intervals take longer than ``raw_s / HISTORY`` has such rows
beyond ``raw_s``.

``prune_batch`` does one bounded batch in the caller's transaction: it deletes
at most ``batch_rows`` rows and scans a bounded range of ids, so one batch keeps
the writer briefly; ``service.Service.prune`` runs batches through the writer,
carrying the ``PruneState`` from one committed batch to the next. Row ids stand for arrival order (they grow as rows are
inserted, and received_at is the insertion time), which lets both walks go by
the primary key: no index on ``received_at_unix_s``, no schema change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, select
from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle, store
from hetero.coordinator.models import (
    EventRow,
    IntervalStatRow,
    JobRow,
    LogLineRow,
    PlanRow,
    RankRow,
)
from hetero.coordinator.reports import HISTORY
from hetero.coordinator.retention import IntervalRetention, JobRetention

#: Ids one batch's thinning walk covers (the database reads them, not Python).
SCAN_IDS = 50_000
#: Pages of the expiry walk per batch: protected rows (a stalled job's newest) may sit
#: at the head of the table; the walk passes over at most this many pages of them.
_HEAD_PAGES = 10
#: Ids per ``... WHERE id IN (...)`` (below every database's parameter limit).
_IN_CHUNK = 500


@dataclass(frozen=True)
class PruneState:
    """Where pruning stands, carried from batch to batch by the caller.

    ``thinned_through``: every row with a lower or equal id was checked against
    the thinning rule (after a restart a fresh state walks the table once
    more). ``deferred``: rows the walk passed that were due to go but were
    protected then; they are checked again each batch."""

    thinned_through: int = 0
    deferred: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Batch:
    """What one ``prune_batch`` did; ``more``: another batch now would find work."""

    removed: int
    state: PruneState
    more: bool


class _Protected:
    """Which rows the balancer may still read, worked out per job on first need."""

    def __init__(self, s: Session) -> None:
        self.s = s
        self._floors: dict[str, tuple[int, int] | None] = {}

    def __call__(self, job_id: str, end_step: int, plan_version: int) -> bool:
        if job_id not in self._floors:
            self._floors[job_id] = self._floor(job_id)
        floor = self._floors[job_id]
        return floor is not None and plan_version >= floor[0] and end_step >= floor[1]

    def _floor(self, job_id: str) -> tuple[int, int] | None:
        """(first plan version, first end step) of the job's protected rows; None if none."""
        job = self.s.get(JobRow, job_id)
        if job is None or job.state in lifecycle.FINISHED:
            return None
        steps = store.complete_steps(self.s, job, HISTORY)
        # Fewer complete intervals than the window: the balancer reads all there are.
        floor = steps[-1] if len(steps) == HISTORY else -1
        return job.attempt_first_plan, floor


def prune_batch(s: Session, policy: IntervalRetention, state: PruneState, *, now: float) -> Batch:
    """Delete at most ``policy.batch_rows`` interval rows that ``policy`` lets go.

    In order: rows older than ``keep_s`` (oldest first), deferred rows no longer
    protected, then a walk of at most ``SCAN_IDS`` ids from
    ``state.thinned_through`` over rows older than ``raw_s`` that the thinning
    rule drops. Never commits (the caller owns the transaction)."""
    t = cast(Table, IntervalStatRow.__table__)
    protected = _Protected(s)
    budget = policy.batch_rows
    # An ordered set: a row may be both expired and deferred, or expired and walked.
    doomed = dict.fromkeys(_expired(s, t, now - policy.keep_s, budget, protected))
    more = len(doomed) >= budget
    deferred = set(state.deferred)
    if deferred and len(doomed) < budget:
        doomed.update(dict.fromkeys(_released(s, t, deferred, budget - len(doomed), protected)))
    cursor = state.thinned_through
    if policy.thin_every > 1 and len(doomed) < budget:
        walked, cursor, walk_more = _thin(
            s, t, policy, cursor, now - policy.raw_s, budget - len(doomed), protected
        )
        for row_id, is_protected in walked:
            if is_protected:
                deferred.add(row_id)
            else:
                doomed[row_id] = None
        more = more or walk_more
    elif policy.thin_every > 1:
        more = True
    # Every doomed id was read in this transaction: all are deleted (an executemany's
    # rowcount is the last statement's on some drivers, so it is not counted here).
    removed = len(doomed)
    if doomed:
        # A report's rows have consecutive ids, and so do most doomed rows: one
        # executemany of id ranges costs a fraction of one parameter per id.
        runs = delete(t).where(t.c.id.between(bindparam("lo"), bindparam("hi")))
        s.connection().execute(runs, _runs(doomed))
        # SQLite gives the next row the newest remaining id + 1: if the newest row just
        # went, that id may be at or below the cursor, and the walk must not skip it.
        cursor = min(cursor, s.scalar(select(func.max(t.c.id))) or 0)
    return Batch(removed, PruneState(cursor, frozenset(deferred - doomed.keys())), more)


def _runs(ids: Iterable[int]) -> list[dict[str, int]]:
    """``ids`` as ranges of consecutive integers, ``{"lo": first, "hi": last}``."""
    runs: list[dict[str, int]] = []
    for i in sorted(ids):
        if runs and runs[-1]["hi"] == i - 1:
            runs[-1]["hi"] = i
        else:
            runs.append({"lo": i, "hi": i})
    return runs


def _expired(s: Session, t: Table, cutoff: float, budget: int, protected: _Protected) -> list[int]:
    """Ids of unprotected rows received before ``cutoff``, oldest first, at most
    ``budget``. Stops at the first younger row: ids follow arrival, so a row out of
    order by a moment waits for the next pass, and no pass reads the rows that stay."""
    doomed: list[int] = []
    after = -1
    for _ in range(_HEAD_PAGES):  # protected rows at the head are passed over, not counted
        rows = s.execute(
            select(t.c.id, t.c.job_id, t.c.end_step, t.c.plan_version, t.c.received_at_unix_s)
            .where(t.c.id > after)
            .order_by(t.c.id)
            .limit(budget - len(doomed))
        ).all()
        for row_id, job_id, end_step, plan_version, received in rows:
            if received >= cutoff:
                return doomed
            if not protected(job_id, end_step, plan_version):
                doomed.append(row_id)
        if not rows or len(doomed) >= budget:
            return doomed
        after = rows[-1][0]
    return doomed


def _released(
    s: Session, t: Table, deferred: set[int], budget: int, protected: _Protected
) -> list[int]:
    """Deferred ids whose rows are no longer protected (at most ``budget``); every id
    that leaves ``deferred`` (released, or its row gone) is removed from it."""
    ids = sorted(deferred)
    rows: list[Sequence[Any]] = []
    for i in range(0, len(ids), _IN_CHUNK):
        chunk = ids[i : i + _IN_CHUNK]
        rows += s.execute(
            select(t.c.id, t.c.job_id, t.c.end_step, t.c.plan_version).where(t.c.id.in_(chunk))
        ).all()
    deferred.intersection_update(r[0] for r in rows)
    released = [r[0] for r in rows if not protected(r[1], r[2], r[3])][:budget]
    deferred.difference_update(released)
    return released


def _thin(
    s: Session,
    t: Table,
    policy: IntervalRetention,
    cursor: int,
    cutoff: float,
    budget: int,
    protected: _Protected,
) -> tuple[list[tuple[int, bool]], int, bool]:
    """Walk ids after ``cursor`` up to the first row received at or after ``cutoff``
    (at most ``SCAN_IDS`` ids, at most ``budget`` rows to drop): the rows the rule
    drops, each with whether it is protected, the new cursor, and whether ids
    remain to walk now."""
    top = s.scalar(select(func.max(t.c.id)))
    if top is None:
        return [], 0, False
    cursor = min(cursor, top)  # a state from before the newest rows went
    hi = min(cursor + SCAN_IDS, top)
    young = s.scalar(
        select(func.min(t.c.id)).where(
            t.c.id > cursor, t.c.id <= hi, t.c.received_at_unix_s >= cutoff
        )
    )
    caught_up = young is not None
    if young is not None:
        hi = young - 1
    jobs = cast(Table, JobRow.__table__)
    drops = (t.c.end_step // jobs.c.rebalance_interval) % policy.thin_every != 0
    rows = s.execute(
        select(t.c.id, t.c.job_id, t.c.end_step, t.c.plan_version)
        .join(jobs, jobs.c.id == t.c.job_id)
        .where(t.c.id > cursor, t.c.id <= hi, drops)
        .order_by(t.c.id)
        .limit(budget)
    ).all()
    if len(rows) == budget:
        hi, caught_up = rows[-1][0], False
    walked = [(row_id, protected(job_id, step, pv)) for row_id, job_id, step, pv in rows]
    return walked, hi, not caught_up and hi < top


def prune_finished_jobs(s: Session, policy: JobRetention, *, now: float) -> tuple[list[str], bool]:
    """Delete at most ``policy.batch_jobs`` jobs that finished more than ``policy.keep_s``
    before ``now``, oldest first, with every row of theirs; returns their ids and
    whether another batch now would find more. Never commits.

    Their rows go table by table (the schema's ``ON DELETE CASCADE`` would do it on a
    database that enforces foreign keys; this does not depend on it). By then their
    log lines and most of their intervals have aged out (``log_keep_days``,
    ``interval_stats_keep_days``): a batch deletes little beside the jobs' rows."""
    cutoff = now - policy.keep_s
    ids = list(
        s.scalars(
            select(JobRow.id)
            .where(JobRow.state.in_(lifecycle.FINISHED), JobRow.finished_at_unix_s < cutoff)
            .order_by(JobRow.finished_at_unix_s, JobRow.id)
            .limit(policy.batch_jobs)
        )
    )
    if not ids:
        return [], False
    for model in (LogLineRow, IntervalStatRow, PlanRow, RankRow, EventRow, JobRow):
        t = cast(Table, model.__table__)
        key = t.c.id if model is JobRow else t.c.job_id
        s.connection().execute(delete(t).where(key.in_(ids)))
    return ids, len(ids) == policy.batch_jobs
