"""Store functions for rendezvous ports: each placed job's own, from the free set.

A job's ranks meet at ``MASTER_ADDR:MASTER_PORT``; two jobs on one port would
join each other's rendezvous (or fail to bind it). Ports were once the count of
jobs and restarts modulo the span, so every 1,000th job landed on the port of a
job still running; now a port held by a placed job (PENDING, RUNNING, or
RESTARTING: its old ranks may still hold it) is never handed out again until
that job ends. The search starts where that count points, so consecutive
attempts still get different ports and a port just released is reused last.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle
from hetero.coordinator.models import JobRow
from hetero.core.errors import HeteroError


class PortsExhaustedError(HeteroError):
    """Every port of the rendezvous range is held by a placed job."""

    grpc_code = "RESOURCE_EXHAUSTED"


def ports_in_use(s: Session) -> set[int]:
    """Rendezvous ports of the placed jobs."""
    query = select(JobRow.master_port).where(JobRow.state.in_(lifecycle.PLACED))
    return set(s.scalars(query))


def free_ports(s: Session, base: int, span: int) -> Iterator[int]:
    """Ports of ``[base, base + span)`` no placed job holds, each once, in rotating order."""
    used = ports_in_use(s)
    count = s.scalar(select(func.count()).select_from(JobRow)) or 0
    restarts = s.scalar(select(func.sum(JobRow.restarts))) or 0
    start = (count + restarts) % span
    for i in range(span):
        port = base + (start + i) % span
        if port not in used:
            yield port


def free_port(s: Session, base: int, span: int) -> int:
    """One free rendezvous port; ``PortsExhaustedError`` if every one is held."""
    port = next(free_ports(s, base, span), None)
    if port is None:
        raise PortsExhaustedError(
            f"every rendezvous port {base}-{base + span - 1} is held by a placed job "
            "(a job waits until one ends)"
        )
    return port
