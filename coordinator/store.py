"""Store functions: every read and write of the coordinator's tables.

Each function takes a ``Session`` and never commits: the RPC handler that
opened the session owns the transaction, so one request is one transaction.
Times are Unix seconds passed in by the caller (the clock is injectable).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, insert, select, update
from sqlalchemy.orm import Session, selectinload

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
    """Every node with its devices loaded (one query for all, not one per node)."""
    query = select(NodeRow).options(selectinload(NodeRow.devices)).order_by(NodeRow.name)
    return list(s.scalars(query))


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


def _table(model: type[NodeRow] | type[TelemetryRow]) -> Table:
    return cast(Table, model.__table__)


#: The measured columns of ``TelemetryRow``; a beat's samples may give any subset.
_TELEMETRY_VALUES = tuple(
    c.name
    for c in TelemetryRow.__table__.columns
    if c.name not in ("id", "node_id", "device_index", "bucket", "time_unix_s")
)


@dataclass(frozen=True)
class Beat:
    """One heartbeat as received: ``telemetry`` holds one dict of ``TelemetryRow`` column
    values per sample (``device_index`` None = host)."""

    node_id: str
    time_unix_s: float
    telemetry: tuple[dict[str, object], ...]


def record_heartbeats(s: Session, beats: Sequence[Beat], *, policy: TelemetryPolicy) -> set[str]:
    """Mark each beat's node alive and keep its samples; return the node ids not known.

    A batch of many nodes' heartbeats is one transaction of a few bulk statements
    (the coordinator's ingest flushes them together: one transaction per heartbeat
    did not keep up with 1,000 agents). Each (node, device, bucket of ``period_s``)
    keeps one row holding its newest sample; a node's rows older than
    ``retention_s`` are deleted when it reports (a node that never reports again
    keeps at most one retention window of rows).
    """
    if not beats:
        return set()
    ids = {b.node_id for b in beats}
    known = set(s.scalars(select(NodeRow.id).where(NodeRow.id.in_(ids))))
    newest: dict[tuple[str, int | None, int], dict[str, object]] = {}
    alive: dict[str, float] = {}
    for b in sorted((b for b in beats if b.node_id in known), key=lambda b: b.time_unix_s):
        alive[b.node_id] = b.time_unix_s
        bucket = int(b.time_unix_s // policy.period_s)
        for sample in b.telemetry:
            index = sample.get("device_index")
            key = (b.node_id, index if isinstance(index, int) else None, bucket)
            newest[key] = {
                **{c: sample.get(c) for c in _TELEMETRY_VALUES},
                "device_index": key[1],
                "node_id": b.node_id,
                "bucket": bucket,
                "time_unix_s": b.time_unix_s,
            }
    # Core statements, each one executemany: the ORM's bulk paths cost several
    # times more CPU per row, and this runs for every agent every second.
    conn = s.connection()
    nodes, telemetry = _table(NodeRow), _table(TelemetryRow)
    if alive:
        conn.execute(
            update(nodes)
            .where(nodes.c.id == bindparam("node"))
            .values(last_heartbeat_unix_s=bindparam("t")),
            [{"node": node_id, "t": t} for node_id, t in alive.items()],
        )
    if newest:
        buckets = {key[2] for key in newest}
        existing = conn.execute(
            select(
                telemetry.c.id, telemetry.c.node_id, telemetry.c.device_index, telemetry.c.bucket
            ).where(telemetry.c.node_id.in_(alive), telemetry.c.bucket.in_(buckets))
        )
        row_ids = {(n, d, b): row_id for row_id, n, d, b in existing}
        updates = [{**v, "row": row_ids[k]} for k, v in newest.items() if k in row_ids]
        inserts = [v for k, v in newest.items() if k not in row_ids]
        if updates:
            columns: dict[str, Any] = {c: bindparam(c) for c in updates[0] if c != "row"}
            conn.execute(
                update(telemetry).where(telemetry.c.id == bindparam("row")).values(columns),
                updates,
            )
        if inserts:
            conn.execute(insert(telemetry), inserts)
    if alive:
        oldest = int((max(alive.values()) - policy.retention_s) // policy.period_s)
        conn.execute(
            delete(telemetry).where(
                telemetry.c.node_id == bindparam("node"), telemetry.c.bucket < oldest
            ),
            [{"node": node_id} for node_id in alive],
        )
    return ids - known


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


def complete_steps(s: Session, job: JobRow, limit: int) -> list[int]:
    """The newest ``limit`` end steps every rank reported, newest first.

    Counting ranks per step over a job's whole history made every interval report
    slower the longer the job ran; the newest ``2 * limit`` steps (an index-only
    reverse scan) nearly always hold them, and only if not is the rest counted.
    """
    t = IntervalStatRow
    recent = list(
        s.scalars(
            select(t.end_step)
            .where(t.job_id == job.id)
            .distinct()
            .order_by(t.end_step.desc())
            .limit(2 * limit)
        )
    )
    if not recent:
        return []
    query = (
        select(t.end_step)
        .where(t.job_id == job.id)
        .group_by(t.end_step)
        .having(func.count(func.distinct(t.rank)) == job.world_size)
        .order_by(t.end_step.desc())
        .limit(limit)
    )
    if len(recent) == 2 * limit:
        steps = list(s.scalars(query.where(t.end_step >= recent[-1])))
        if len(steps) == limit:
            return steps
    return list(s.scalars(query))


def interval_history(s: Session, job: JobRow, window: int) -> list[list[RankInterval]]:
    """The last ``window`` complete intervals (every rank reported), oldest first."""
    steps = complete_steps(s, job, window)
    if not steps:
        return []
    # Columns, not ORM objects: this runs on every interval report of every job,
    # and building the objects was most of a report's CPU.
    t = IntervalStatRow
    rows = s.execute(
        select(t.end_step, t.rank, t.batch, t.steps, t.compute_s, t.step_s, t.peak_memory_bytes)
        .where(t.job_id == job.id, t.end_step.in_(steps))
        .order_by(t.end_step, t.rank, t.id.desc())
    )
    by_step: dict[int, dict[int, RankInterval]] = {}
    for end_step, rank, batch, n, compute_s, step_s, peak in rows:
        # A re-sent report leaves duplicates: the newest row (highest id) wins.
        by_step.setdefault(end_step, {}).setdefault(
            rank, RankInterval(rank, batch, n, compute_s, step_s, peak)
        )
    return [[by_step[step][rank] for rank in sorted(by_step[step])] for step in sorted(by_step)]


def latest_interval(s: Session, job: JobRow) -> list[IntervalStatRow]:
    """The newest complete interval's rows (one per rank, rank order); [] before any."""
    steps = complete_steps(s, job, 1)
    if not steps:
        return []
    step = steps[0]
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
