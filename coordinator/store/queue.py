"""Store functions for the job queue: jobs waiting for devices, and the pass that
places them (``admission.admit``) as devices free up.

The pass runs in the transaction of whatever freed or asked for devices (a
submission, a cancel, a job's end) and on the sweeper's period; it reads the
queue's ids in order and a queued job's spec only when the pass reaches it, so
its cost follows the head of the queue, not its length.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from hetero.coordinator import admission, exclusion, lifecycle
from hetero.coordinator.models import JobRow
from hetero.coordinator.placement import DeviceSlot, Placement, suitable
from hetero.coordinator.store.events import add_event
from hetero.coordinator.store.jobs import place_job
from hetero.coordinator.store.nodes import device_slots
from hetero.coordinator.store.ports import free_ports
from hetero.core.jobspec import JobSpec, parse_jobspec

#: Queued jobs one pass looks at, at most: a bound on its time when thousands wait
#: behind held devices; those further back keep their reason until the head moves.
MAX_EXAMINED = 1000
#: States a job holds a place in its owner's count (``Limits.jobs_per_user``).
COUNTED = frozenset({lifecycle.QUEUED}) | lifecycle.PLACED


@dataclass(frozen=True)
class QueueConfig:
    """What a pass needs besides the database: node health, CPU capacity, ports."""

    heartbeat_timeout_s: float
    ranks_per_cpu_device: int
    master_port_base: int
    master_port_span: int


@functools.lru_cache(maxsize=2048)
def _parsed(job_id: str, spec_yaml: str) -> JobSpec:
    # A job's spec never changes: a pass that meets the same head job again (every
    # sweep while it waits) parses it once.
    return parse_jobspec(spec_yaml, source=f"job {job_id}")


def spec_of(job: JobRow) -> JobSpec:
    return _parsed(job.id, job.spec_yaml)


def jobs_of(s: Session, owner: str) -> int:
    """Queued and placed jobs of ``owner`` (a credential's name)."""
    query = select(func.count()).where(JobRow.owner == owner, JobRow.state.in_(COUNTED))
    return s.scalar(query.select_from(JobRow)) or 0


def queued_ids(s: Session, limit: int | None = None) -> list[str]:
    """Queued jobs in queue order: priority (higher first), then submission; the first
    ``limit`` (None = all)."""
    query = (
        select(JobRow.id)
        .where(JobRow.state == lifecycle.QUEUED)
        .order_by(JobRow.priority.desc(), JobRow.submitted_at_unix_s, JobRow.id)
        .limit(limit)
    )
    return list(s.scalars(query))


def ahead_of(s: Session, job: JobRow) -> int:
    """Queued jobs placed before ``job`` would be."""
    query = select(func.count()).where(
        JobRow.state == lifecycle.QUEUED,
        (JobRow.priority > job.priority)
        | (
            (JobRow.priority == job.priority)
            & (JobRow.submitted_at_unix_s < job.submitted_at_unix_s)
        ),
    )
    return s.scalar(query.select_from(JobRow)) or 0


def admit_queued(s: Session, cfg: QueueConfig, *, now: float) -> dict[str, Placement]:
    """One admission pass: place the queued jobs that fit, in queue order; update the
    reasons of those looked at that still wait. Returns the placements made, by job id."""
    # Only the ids a pass may reach: all 10,000 of a long queue, read every sweep, were
    # a cost per second that grew with the queue.
    ids = queued_ids(s, MAX_EXAMINED)
    if not ids:
        return {}
    devices = device_slots(
        s, now=now, timeout_s=cfg.heartbeat_timeout_s, cpu_capacity=cfg.ranks_per_cpu_device
    )
    rows: dict[str, JobRow] = {}

    def spec(job_id: str) -> JobSpec:
        rows[job_id] = job = s.get_one(JobRow, job_id)
        return spec_of(job)

    queue = (admission.Waiting(i, functools.partial(spec, i)) for i in ids)
    ports = free_ports(s, cfg.master_port_base, cfg.master_port_span)
    placed: dict[str, Placement] = {}
    for decision in admission.admit(queue, devices, ports, held_for_restarts(s, devices)):
        job = rows[decision.job_id]
        if decision.placement is not None:
            placed[job.id] = place_job(s, job, spec_of(job), decision.placement, now=now)
        elif job.message != decision.reason:
            job.message = decision.reason
    return placed


def waiting_restarts(s: Session) -> list[JobRow]:
    """RESTARTING jobs whose old ranks have all stopped: the sweeper places them, in
    queue order, before any queued job (``admission``)."""
    query = (
        select(JobRow)
        .where(JobRow.state == lifecycle.RESTARTING)
        .order_by(JobRow.priority.desc(), JobRow.submitted_at_unix_s, JobRow.id)
    )
    return [j for j in s.scalars(query) if all(r.state == lifecycle.EXITED for r in j.ranks)]


def held_for_restarts(s: Session, devices: list[DeviceSlot]) -> set[admission.DeviceKey]:
    """The devices a waiting restart may use (its rank left out excluded): no queued job
    takes them while it waits."""
    held: set[admission.DeviceKey] = set()
    for job in waiting_restarts(s):
        excluded = exclusion.excluded_of(job)
        spec = exclusion.spec_without(spec_of(job), excluded)
        usable = exclusion.devices_without(devices, excluded)
        held |= {admission.key(d) for d in usable if suitable(spec, d)}
    return held


def enqueue(s: Session, job: JobRow, cfg: QueueConfig, *, now: float) -> Placement | None:
    """Add ``job`` (new, QUEUED) to the queue and run a pass: it is placed at once if it
    fits and nothing ahead of it waits for its devices (its placement is returned);
    else it waits, with a reason (None)."""
    s.add(job)
    s.flush()
    placed = admit_queued(s, cfg, now=now)
    if job.state != lifecycle.QUEUED:
        return placed.get(job.id)
    if not job.message:  # the pass stopped before it: nothing has room for the jobs ahead
        ahead = ahead_of(s, job)
        job.message = f"waiting behind {ahead:,} queued job{'s' if ahead != 1 else ''}"
    add_event(s, "job_queued", f"job {job.name} queued: {job.message}", job_id=job.id, now=now)
    return None
