"""Store functions for the agents' orders: the ranks a node should launch or stop.

Both lists are read a page at a time, in a fixed order, after a key (keyset
paging): launches by (job submission time, job id, rank), stops by (job id,
rank). A page of launches ends at a job's boundary, so an agent always gets all
of a job's ranks on its node at once (it sizes their CPU threads by their count).
"""

from __future__ import annotations

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle
from hetero.coordinator.models import JobRow, RankRow

#: Where a page of launches ends: the last job's (submission time, id).
LaunchKey = tuple[float, str]
#: Where a page of stops ends: the last (job id, rank).
StopKey = tuple[str, int]


def nodes_with_orders(s: Session) -> set[str]:
    """Nodes for which ``ranks_to_launch`` or ``ranks_to_stop`` might return anything: one
    query that lets the agents' once-a-second polls skip theirs. Keep it a superset of
    those two functions' conditions."""
    query = select(RankRow.node_id).where(
        RankRow.state.in_((lifecycle.ASSIGNED, lifecycle.STOPPING))
    )
    return set(s.scalars(query.distinct()))


def ranks_to_launch(
    s: Session, node_id: str, after: LaunchKey | None = None, limit: int | None = None
) -> list[RankRow]:
    """Ranks placed on ``node_id`` that its agent has not reported started, of the jobs
    after ``after``: whole jobs, at most ``limit`` ranks unless the first job alone has
    more (None = all)."""
    query = (
        select(RankRow)
        .join(JobRow)
        .where(
            RankRow.node_id == node_id,
            RankRow.state == lifecycle.ASSIGNED,
            JobRow.state.not_in(lifecycle.FINISHED),
        )
        .order_by(JobRow.submitted_at_unix_s, JobRow.id, RankRow.rank)
    )
    if after is not None:
        query = query.where(tuple_(JobRow.submitted_at_unix_s, JobRow.id) > tuple_(*after))
    if limit is None:
        return list(s.scalars(query))
    rows = list(s.scalars(query.limit(limit + 1)))
    if len(rows) <= limit:
        return rows
    cut = rows[limit - 1].job_id  # the job the page would split
    if rows[limit].job_id != cut:
        return rows[:limit]
    whole = [r for r in rows if r.job_id != cut]
    if whole:
        return whole
    # One job with more ranks here than a page holds: all of it, alone.
    return list(s.scalars(query.where(JobRow.id == cut)))


def ranks_to_stop(
    s: Session, node_id: str, after: StopKey | None = None, limit: int | None = None
) -> list[RankRow]:
    """Ranks on ``node_id`` ordered to stop and not yet confirmed, after ``after``."""
    query = select(RankRow).where(RankRow.node_id == node_id, RankRow.state == lifecycle.STOPPING)
    if after is not None:
        query = query.where(tuple_(RankRow.job_id, RankRow.rank) > tuple_(*after))
    query = query.order_by(RankRow.job_id, RankRow.rank)
    return list(s.scalars(query if limit is None else query.limit(limit)))
