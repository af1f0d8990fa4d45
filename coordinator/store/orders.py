"""Store functions for the agents' orders: the ranks a node should launch or stop."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle
from hetero.coordinator.models import JobRow, RankRow


def nodes_with_orders(s: Session) -> set[str]:
    """Nodes for which ``ranks_to_launch`` or ``ranks_to_stop`` might return anything: one
    query that lets the agents' once-a-second polls skip theirs. Keep it a superset of
    those two functions' conditions."""
    query = select(RankRow.node_id).where(
        RankRow.state.in_((lifecycle.ASSIGNED, lifecycle.STOPPING))
    )
    return set(s.scalars(query.distinct()))


def ranks_to_launch(s: Session, node_id: str) -> list[RankRow]:
    """Ranks placed on ``node_id`` that its agent has not reported started."""
    return list(
        s.scalars(
            select(RankRow)
            .join(JobRow)
            .where(
                RankRow.node_id == node_id,
                RankRow.state == lifecycle.ASSIGNED,
                JobRow.state.not_in(lifecycle.FINISHED),
            )
            .order_by(JobRow.submitted_at_unix_s, RankRow.rank)
        )
    )


def ranks_to_stop(s: Session, node_id: str) -> list[RankRow]:
    query = select(RankRow).where(RankRow.node_id == node_id, RankRow.state == lifecycle.STOPPING)
    return list(s.scalars(query.order_by(RankRow.job_id, RankRow.rank)))
