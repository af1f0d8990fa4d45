"""Store functions: every read and write of the coordinator's tables.

Each function takes a ``Session`` and never commits: the RPC handler that
opened the session owns the transaction, so one request is one transaction.
Times are Unix seconds passed in by the caller (the clock is injectable).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from hetero.coordinator import lifecycle
from hetero.coordinator.balancer import Batches, RankInterval
from hetero.coordinator.jobspec import JobSpec
from hetero.coordinator.models import (
    DeviceRow,
    EventRow,
    IntervalStatRow,
    JobRow,
    LogLineRow,
    NodeRow,
    PlanRow,
    RankRow,
    TelemetryRow,
)
from hetero.coordinator.placement import DeviceSlot, Placement, initial_plan
from hetero.errors import HeteroError


class NotFoundError(HeteroError):
    grpc_code = "NOT_FOUND"


@dataclass(frozen=True)
class TelemetryPolicy:
    """Downsampling and retention of telemetry, in seconds."""

    period_s: float = 10.0
    retention_s: float = 24 * 3600.0


# ---- nodes ---------------------------------------------------------------------


def register_node(
    s: Session,
    *,
    name: str,
    address: str,
    agent_endpoint: str,
    agent_version: str,
    devices: Sequence[DeviceRow],
    now: float,
) -> NodeRow:
    """Create the node, or refresh it (same id, devices replaced) if the name is known."""
    node = s.scalars(select(NodeRow).where(NodeRow.name == name)).one_or_none()
    if node is None:
        node = NodeRow(id=uuid.uuid4().hex[:12], name=name, registered_at_unix_s=now)
        s.add(node)
        add_event(s, "node_registered", f"node {name} registered", node_id=node.id, now=now)
    node.address = address
    node.agent_endpoint = agent_endpoint
    node.agent_version = agent_version
    node.last_heartbeat_unix_s = now
    node.devices.clear()
    s.flush()  # delete the old device rows before their (node, index) is reused
    node.devices.extend(devices)
    s.flush()
    return node


def get_node(s: Session, node_id: str) -> NodeRow:
    node = s.get(NodeRow, node_id)
    if node is None:
        raise NotFoundError(f"unknown node {node_id!r}: register first")
    return node


def list_nodes(s: Session) -> list[NodeRow]:
    return list(s.scalars(select(NodeRow).order_by(NodeRow.name)))


def find_node(s: Session, ref: str) -> NodeRow:
    """A node by id, else by name."""
    node = s.get(NodeRow, ref) or s.scalars(select(NodeRow).where(NodeRow.name == ref)).first()
    if node is None:
        raise NotFoundError(f"unknown node {ref!r} (neither an id nor a name)")
    return node


def set_draining(s: Session, ref: str, draining: bool, *, now: float) -> NodeRow:
    """Drain a node (no new ranks; running ones stay) or undo it. Idempotent."""
    node = find_node(s, ref)
    if node.draining != draining:
        node.draining = draining
        kind, what = ("node_drained", "drained") if draining else ("node_undrained", "undrained")
        add_event(s, kind, f"node {node.name} {what}", node_id=node.id, now=now)
    return node


def record_heartbeat(
    s: Session,
    node_id: str,
    samples: Iterable[TelemetryRow],
    *,
    now: float,
    policy: TelemetryPolicy,
) -> None:
    """Mark the node alive and keep ``samples`` (``device_index`` None = host).

    Each (device, bucket of ``period_s``) keeps one row holding its newest
    sample; rows older than ``retention_s`` are deleted.
    """
    node = get_node(s, node_id)
    node.last_heartbeat_unix_s = now
    bucket = int(now // policy.period_s)
    current = {
        row.device_index: row
        for row in s.scalars(
            select(TelemetryRow).where(
                TelemetryRow.node_id == node_id, TelemetryRow.bucket == bucket
            )
        )
    }
    for sample in samples:
        sample.node_id, sample.bucket, sample.time_unix_s = node_id, bucket, now
        old = current.get(sample.device_index)
        if old is not None:
            sample.id = old.id
            s.merge(sample)
        else:
            s.add(sample)
    oldest = int((now - policy.retention_s) // policy.period_s)
    s.execute(delete(TelemetryRow).where(TelemetryRow.bucket < oldest))


def latest_telemetry(s: Session, node_id: str) -> dict[int | None, TelemetryRow]:
    """The newest row per device (key None = host) of a node."""
    newest = s.scalar(select(func.max(TelemetryRow.bucket)).where(TelemetryRow.node_id == node_id))
    if newest is None:
        return {}
    rows = s.scalars(
        select(TelemetryRow).where(TelemetryRow.node_id == node_id, TelemetryRow.bucket == newest)
    )
    return {row.device_index: row for row in rows}


def is_healthy(node: NodeRow, now: float, timeout_s: float) -> bool:
    return bool(now - node.last_heartbeat_unix_s <= timeout_s)


def device_slots(s: Session, *, now: float, timeout_s: float) -> list[DeviceSlot]:
    """Every registered device with its node's health and its active ranks, for placement."""
    active = s.execute(
        select(RankRow.node_id, RankRow.device_index, func.count())
        .join(JobRow)
        .where(JobRow.state.not_in(lifecycle.FINISHED), RankRow.state != lifecycle.EXITED)
        .group_by(RankRow.node_id, RankRow.device_index)
    )
    busy = {(node_id, index): int(n) for node_id, index, n in active}
    return [
        DeviceSlot(
            node_id=node.id,
            node_name=node.name,
            node_address=node.address,
            index=d.index,
            kind=d.kind,
            name=d.name,
            compute_score=d.compute_score,
            memory_bytes=d.memory_bytes,
            emulated_slowdown=d.emulated_slowdown,
            healthy=is_healthy(node, now, timeout_s),
            draining=node.draining,
            ranks_running=busy.get((node.id, d.index), 0),
        )
        for node in list_nodes(s)
        for d in node.devices
    ]


# ---- jobs ----------------------------------------------------------------------


def next_master_port(s: Session, base: int, span: int) -> int:
    """A rendezvous port for the next job: consecutive jobs get different ports."""
    count = s.scalar(select(func.count()).select_from(JobRow)) or 0
    return base + count % span


def create_job(
    s: Session, spec: JobSpec, spec_yaml: str, placement: Placement, *, now: float
) -> JobRow:
    job = JobRow(
        id=uuid.uuid4().hex[:12],
        name=spec.name,
        state=lifecycle.PENDING,
        spec_yaml=spec_yaml,
        policy=spec.policy,
        global_batch=spec.global_batch,
        world_size=spec.world_size,
        min_batch=spec.min_batch,
        rebalance_interval=spec.rebalance_interval,
        backend=placement.backend,
        master_addr=placement.master_addr,
        master_port=placement.master_port,
        submitted_at_unix_s=now,
        message="",
        restarts=0,
        last_step=0,
        total_steps=spec.steps,
    )
    job.ranks = [
        RankRow(
            rank=r.rank,
            node_id=r.device.node_id,
            device_index=r.device.index,
            device_kind=r.device.kind,
            device_name=r.device.name,
            local_rank=r.local_rank,
            state=lifecycle.ASSIGNED,
            emulated_slowdown=r.emulated_slowdown,
            effective_score=r.effective_score,
        )
        for r in placement.ranks
    ]
    s.add(job)
    s.flush()
    first = initial_plan(spec, placement)
    add_plan(s, job.id, first.batches, 0, first.policy, first.reason, now=now)
    emulated = " (emulated slowdown)" if placement.emulated else ""
    add_event(
        s,
        "job_submitted",
        f"job {spec.name} placed on {spec.world_size} ranks, {placement.backend}{emulated}",
        job_id=job.id,
        now=now,
    )
    return job


def get_job(s: Session, job_id: str) -> JobRow:
    job = s.get(JobRow, job_id)
    if job is None:
        raise NotFoundError(f"unknown job {job_id!r}")
    return job


def list_jobs(s: Session, states: Sequence[str] = (), limit: int = 100) -> list[JobRow]:
    query = select(JobRow).order_by(JobRow.submitted_at_unix_s.desc(), JobRow.id).limit(limit)
    if states:
        query = query.where(JobRow.state.in_(states))
    return list(s.scalars(query))


def cancel_job(s: Session, job_id: str, *, now: float) -> JobRow:
    job = get_job(s, job_id)
    if job.state == lifecycle.CANCELLED:
        return job
    lifecycle.check_cancellable(job_id, job.state)
    for rank in job.ranks:
        rank.state = lifecycle.rank_state_after_cancel(rank.state)
    job.state, job.finished_at_unix_s, job.message = lifecycle.CANCELLED, now, "cancelled by user"
    add_event(s, "job_cancelled", f"job {job.name} cancelled", job_id=job_id, now=now)
    return job


def set_rank_status(
    s: Session,
    job_id: str,
    rank: int,
    *,
    node_id: str,
    state: str,
    exit_code: int | None,
    now: float,
) -> JobRow:
    """Record what an agent saw of one rank, then move the job along its lifecycle."""
    job = get_job(s, job_id)
    row = next((r for r in job.ranks if r.rank == rank), None)
    if row is None or row.node_id != node_id:
        raise NotFoundError(f"job {job_id} has no rank {rank} on node {node_id}")
    row.state, row.exit_code = state, exit_code
    before = job.state
    statuses = [lifecycle.RankStatus(r.rank, r.state, r.exit_code) for r in job.ranks]
    job.state, message = lifecycle.job_state(job.state, statuses)
    if job.state != before:
        job.message = message or job.message
        if job.state in lifecycle.FINISHED:
            job.finished_at_unix_s = now
        if job.state == lifecycle.FAILED:
            # The survivors would block in a collective until its timeout: stop them.
            for other in job.ranks:
                other.state = lifecycle.rank_state_after_cancel(other.state)
        text = f"job {job.name} {job.state.lower()}" + (f": {message}" if message else "")
        add_event(s, f"job_{job.state.lower()}", text, job_id=job_id, now=now)
    return job


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


# ---- plans and interval statistics -----------------------------------------------


def add_plan(
    s: Session,
    job_id: str,
    batches: Batches,
    apply_at_step: int,
    policy: str,
    reason: str,
    *,
    predicted_step_s: float | None = None,
    now: float,
) -> PlanRow:
    latest = s.scalar(select(func.max(PlanRow.version)).where(PlanRow.job_id == job_id))
    plan = PlanRow(
        job_id=job_id,
        version=(latest or 0) + 1,
        apply_at_step=apply_at_step,
        batches=",".join(str(b) for b in batches),
        policy=policy,
        reason=reason,
        predicted_step_s=predicted_step_s,
        created_at_unix_s=now,
    )
    s.add(plan)
    s.flush()
    return plan


def latest_plan(s: Session, job_id: str) -> PlanRow:
    plan = s.scalars(
        select(PlanRow).where(PlanRow.job_id == job_id).order_by(PlanRow.version.desc()).limit(1)
    ).first()
    if plan is None:
        raise NotFoundError(f"job {job_id!r} has no plan")
    return plan


def plan_batches(plan: PlanRow) -> Batches:
    return tuple(int(b) for b in plan.batches.split(",")) if plan.batches else ()


def add_interval(
    s: Session,
    job: JobRow,
    end_step: int,
    plan_version: int,
    ranks: Sequence[IntervalStatRow],
    *,
    now: float,
) -> None:
    for row in ranks:
        row.job_id, row.end_step, row.plan_version, row.received_at_unix_s = (
            job.id,
            end_step,
            plan_version,
            now,
        )
        s.add(row)
    job.last_step = max(job.last_step, end_step)
    s.flush()


def interval_history(s: Session, job: JobRow, window: int) -> list[list[RankInterval]]:
    """The last ``window`` complete intervals (every rank reported), oldest first."""
    steps = list(
        s.scalars(
            select(IntervalStatRow.end_step)
            .where(IntervalStatRow.job_id == job.id)
            .group_by(IntervalStatRow.end_step)
            .having(func.count(func.distinct(IntervalStatRow.rank)) == job.world_size)
            .order_by(IntervalStatRow.end_step.desc())
            .limit(window)
        )
    )
    if not steps:
        return []
    # Columns, not ORM rows: this runs on every stats report, and building a full
    # row object per row was about a third of its time (1.6 -> 1.1 ms for 33 intervals).
    t = IntervalStatRow
    rows = s.execute(
        select(t.end_step, t.rank, t.batch, t.steps, t.compute_s, t.step_s, t.peak_memory_bytes)
        .where(t.job_id == job.id, t.end_step.in_(steps))
        .order_by(t.end_step, t.rank, t.id.desc())
    )
    by_step: dict[int, dict[int, RankInterval]] = {}
    for end_step, rank, batch, n, compute_s, step_s, peak_bytes in rows:
        # A re-sent report leaves duplicates: the newest row (highest id) wins.
        by_step.setdefault(end_step, {}).setdefault(
            rank, RankInterval(rank, batch, n, compute_s, step_s, peak_bytes)
        )
    return [[by_step[step][rank] for rank in sorted(by_step[step])] for step in sorted(by_step)]


def latest_interval(s: Session, job: JobRow) -> list[IntervalStatRow]:
    """The newest complete interval's rows (one per rank, rank order); [] before any."""
    step = s.scalar(
        select(IntervalStatRow.end_step)
        .where(IntervalStatRow.job_id == job.id)
        .group_by(IntervalStatRow.end_step)
        .having(func.count(func.distinct(IntervalStatRow.rank)) == job.world_size)
        .order_by(IntervalStatRow.end_step.desc())
        .limit(1)
    )
    if step is None:
        return []
    return _newest_per_rank(
        s.scalars(
            select(IntervalStatRow).where(
                IntervalStatRow.job_id == job.id, IntervalStatRow.end_step == step
            )
        )
    )


def job_intervals(
    s: Session, job_id: str, limit: int, after_step: int | None = None
) -> list[list[IntervalStatRow]]:
    """Intervals oldest first, each its rows in rank order: the newest ``limit``, or
    with ``after_step`` the oldest ``limit`` whose end_step is greater."""
    query = (
        select(IntervalStatRow.end_step)
        .where(IntervalStatRow.job_id == job_id)
        .group_by(IntervalStatRow.end_step)
    )
    if after_step is None:
        query = query.order_by(IntervalStatRow.end_step.desc())
    else:
        query = query.where(IntervalStatRow.end_step > after_step)
        query = query.order_by(IntervalStatRow.end_step)
    steps = sorted(s.scalars(query.limit(limit)))
    if not steps:
        return []
    rows = s.scalars(
        select(IntervalStatRow).where(
            IntervalStatRow.job_id == job_id, IntervalStatRow.end_step.in_(steps)
        )
    )
    by_step: dict[int, list[IntervalStatRow]] = {}
    for row in rows:
        by_step.setdefault(row.end_step, []).append(row)
    return [_newest_per_rank(by_step[step]) for step in steps]


def _newest_per_rank(rows: Iterable[IntervalStatRow]) -> list[IntervalStatRow]:
    # A re-sent report leaves duplicates: the newest row (highest id) wins.
    newest: dict[int, IntervalStatRow] = {}
    for row in rows:
        if row.rank not in newest or row.id > newest[row.rank].id:
            newest[row.rank] = row
    return [newest[rank] for rank in sorted(newest)]


def job_plans(s: Session, job_id: str) -> list[PlanRow]:
    query = select(PlanRow).where(PlanRow.job_id == job_id).order_by(PlanRow.version)
    return list(s.scalars(query))


# ---- events and logs -------------------------------------------------------------


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


def append_logs(s: Session, job_id: str, lines: Iterable[LogLineRow]) -> None:
    get_job(s, job_id)
    for line in lines:
        line.job_id = job_id
        s.add(line)


def job_logs(s: Session, job_id: str, after_seq: int, limit: int) -> list[LogLineRow]:
    get_job(s, job_id)
    query = (
        select(LogLineRow)
        .where(LogLineRow.job_id == job_id, LogLineRow.id > after_seq)
        .order_by(LogLineRow.id)
        .limit(limit)
    )
    return list(s.scalars(query))
