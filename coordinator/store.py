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

from sqlalchemy import (
    BindParameter,
    Float,
    Table,
    bindparam,
    case,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Session, selectinload

from hetero.coordinator import lifecycle
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
from hetero.coordinator.placement import DeviceSlot, InitialPlan, Placement, initial_plan
from hetero.core.balancer import Batches, RankInterval
from hetero.core.errors import HeteroError
from hetero.core.jobspec import JobSpec


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
    _heard_from(s, node, now)
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


def _heard_from(s: Session, node: NodeRow, now: float) -> None:
    if node.down:
        node.down = False
        add_event(s, "node_up", f"node {node.name} is back", node_id=node.id, now=now)


def silent_nodes(s: Session, *, since: float) -> list[NodeRow]:
    """Nodes not marked down whose last heartbeat is older than ``since`` (Unix s)."""
    query = select(NodeRow).where(NodeRow.last_heartbeat_unix_s < since, NodeRow.down.is_(False))
    return list(s.scalars(query.order_by(NodeRow.name)))


def mark_down(s: Session, node: NodeRow, silent_s: float, *, now: float) -> None:
    """Record that ``node`` missed its heartbeat timeout (one event per outage)."""
    node.down = True
    add_event(
        s,
        "node_down",
        f"node {node.name} down: silent for {silent_s:.1f} s",
        node_id=node.id,
        now=now,
    )


def _table(model: type[NodeRow] | type[TelemetryRow] | type[IntervalStatRow]) -> Table:
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
    values per sample (``device_index`` None = host). ``time_unix_s`` is when it
    arrived; ``sampled_at`` dates telemetry an agent buffered while the coordinator
    was unreachable (None = sampled on arrival). ``alive`` False: only the samples
    count, not the arrival (the ingest writes a closed bucket's sample up to a
    period after it arrived, when its node may have been marked down since)."""

    node_id: str
    time_unix_s: float
    telemetry: tuple[dict[str, object], ...]
    sampled_at: float | None = None
    alive: bool = True

    @property
    def sample_time(self) -> float:
        """When the telemetry was sampled: never later than its arrival."""
        return (
            self.time_unix_s if self.sampled_at is None else min(self.sampled_at, self.time_unix_s)
        )


def record_heartbeats(s: Session, beats: Sequence[Beat], *, policy: TelemetryPolicy) -> set[str]:
    """Mark each beat's node alive and keep its samples; return the node ids not known.

    A batch of many nodes' heartbeats is one transaction of a few bulk statements
    (the coordinator's ingest flushes them together: one transaction per heartbeat
    did not keep up with 1,000 agents). A node is alive as of its newest beat's
    arrival (never moved back), and a node marked down is up again (``node_up``).
    Telemetry is dated by its sample time (``Beat.sample_time``): each (node,
    device, bucket of ``period_s``) keeps one row holding its newest sample, a
    buffered sample never replaces a newer one of its bucket, and samples older
    than ``retention_s`` are dropped. A node's rows older than ``retention_s`` are
    deleted when its telemetry is written (a node that never reports again keeps at
    most one retention window of rows). A beat without samples only marks its node
    alive (the ingest writes liveness every flush, telemetry once its bucket closes).
    """
    if not beats:
        return set()
    ids = {b.node_id for b in beats}
    down_of = dict(s.execute(select(NodeRow.id, NodeRow.down).where(NodeRow.id.in_(ids))).all())
    known = set(down_of)
    newest: dict[tuple[str, int | None, int], dict[str, object]] = {}
    alive: dict[str, float] = {}
    ours = sorted(
        (b for b in beats if b.node_id in known), key=lambda b: (b.sample_time, b.time_unix_s)
    )
    for b in ours:
        if b.alive:
            alive[b.node_id] = max(b.time_unix_s, alive.get(b.node_id, b.time_unix_s))
        at = b.sample_time
        if b.time_unix_s - at > policy.retention_s:
            continue  # buffered for longer than telemetry is kept
        bucket = int(at // policy.period_s)
        for sample in b.telemetry:
            index = sample.get("device_index")
            key = (b.node_id, index if isinstance(index, int) else None, bucket)
            newest[key] = {
                **{c: sample.get(c) for c in _TELEMETRY_VALUES},
                "device_index": key[1],
                "node_id": b.node_id,
                "bucket": bucket,
                "time_unix_s": at,
            }
    # Core statements, each one executemany: the ORM's bulk paths cost several
    # times more CPU per row, and this runs for every agent every second.
    conn = s.connection()
    nodes, telemetry = _table(NodeRow), _table(TelemetryRow)
    if alive:
        # max(stored, t): two flushes (the ingest's and the sweeper's) may commit out of order.
        t: BindParameter[float] = bindparam("t", type_=Float)
        conn.execute(
            update(nodes)
            .where(nodes.c.id == bindparam("node"))
            .values(
                last_heartbeat_unix_s=case(
                    (nodes.c.last_heartbeat_unix_s > t, nodes.c.last_heartbeat_unix_s), else_=t
                )
            ),
            [{"node": node_id, "t": t_} for node_id, t_ in alive.items()],
        )
    for node_id in sorted(n for n in alive if down_of[n]):
        # Rare (once per outage): the ORM path, shared with recovery's bookkeeping.
        node = s.get(NodeRow, node_id)
        if node is not None:
            s.refresh(node, ["down"])
            _heard_from(s, node, alive[node_id])
    if newest:
        buckets = {key[2] for key in newest}
        existing = conn.execute(
            select(
                telemetry.c.id,
                telemetry.c.node_id,
                telemetry.c.device_index,
                telemetry.c.bucket,
                telemetry.c.time_unix_s,
            ).where(
                telemetry.c.node_id.in_({key[0] for key in newest}),
                telemetry.c.bucket.in_(buckets),
            )
        )
        rows = {(n, d, b_): (row_id, at) for row_id, n, d, b_, at in existing}
        updates = [
            {**v, "row": rows[k][0]}
            for k, v in newest.items()
            # A buffered sample never replaces a newer one of its bucket.
            if k in rows and not rows[k][1] > cast(float, v["time_unix_s"])
        ]
        inserts = [v for k, v in newest.items() if k not in rows]
        if updates:
            columns: dict[str, Any] = {c: bindparam(c) for c in updates[0] if c != "row"}
            conn.execute(
                update(telemetry).where(telemetry.c.id == bindparam("row")).values(columns),
                updates,
            )
        if inserts:
            conn.execute(insert(telemetry), inserts)
    if newest:
        arrived = max(b.time_unix_s for b in ours)
        oldest = int((arrived - policy.retention_s) // policy.period_s)
        conn.execute(
            delete(telemetry).where(
                telemetry.c.node_id == bindparam("node"), telemetry.c.bucket < oldest
            ),
            [{"node": node_id} for node_id in sorted({key[0] for key in newest})],
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
    """A rendezvous port for the next job or restart: consecutive attempts get different
    ports (a rank of the previous attempt may still hold its port)."""
    count = s.scalar(select(func.count()).select_from(JobRow)) or 0
    restarts = s.scalar(select(func.sum(JobRow.restarts))) or 0
    return base + (count + restarts) % span


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
        max_restarts=spec.max_restarts,
        attempt_first_plan=1,
    )
    job.ranks = _rank_rows(placement)
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


def _rank_rows(placement: Placement) -> list[RankRow]:
    return [
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
    attempt: int = 0,
    message: str = "",
) -> JobRow:
    """Record what an agent saw of one rank, then move the job along its lifecycle.

    A report about an earlier ``attempt`` (a rank of a placement the job has
    since left) changes nothing.
    """
    job = get_job(s, job_id)
    if attempt != job.restarts:
        return job
    row = next((r for r in job.ranks if r.rank == rank), None)
    if row is None or row.node_id != node_id:
        raise NotFoundError(f"job {job_id} has no rank {rank} on node {node_id}")
    row.state, row.exit_code = state, exit_code
    statuses = [_status(r, message if r.rank == rank else "") for r in job.ranks]
    apply_transition(
        s, job, lifecycle.job_state(job.state, statuses, job.restarts, job.max_restarts), now=now
    )
    return job


def _status(r: RankRow, message: str = "") -> lifecycle.RankStatus:
    return lifecycle.RankStatus(r.rank, r.state, r.exit_code, message)


def apply_transition(
    s: Session, job: JobRow, t: lifecycle.Transition, *, now: float, lost_node: str | None = None
) -> None:
    """Make ``t`` so: the job's state and message, its ranks' stop orders, an event.

    Ranks on ``lost_node`` (down) count as gone at once; the others are ordered to
    stop when the job fails or restarts (the survivors would block in a collective).
    """
    before = job.state
    if t.state == before:
        return
    job.state = t.state
    job.message = t.message or job.message
    if t.state in lifecycle.FINISHED:
        job.finished_at_unix_s = now
    if t.state in (lifecycle.FAILED, lifecycle.RESTARTING):
        for other in job.ranks:
            if other.node_id == lost_node:
                other.state = lifecycle.rank_state_when_node_lost(other.state)
            else:
                other.state = lifecycle.rank_state_after_cancel(other.state)
    if t.restart:
        job.restarting_since_unix_s = now
        add_event(s, "job_restarting", f"job {job.name} {t.message}", job_id=job.id, now=now)
        return
    text = f"job {job.name} {job.state.lower()}" + (f": {t.message}" if t.message else "")
    add_event(s, f"job_{job.state.lower()}", text, job_id=job.id, now=now)


def active_jobs_on_node(s: Session, node_id: str) -> list[JobRow]:
    """Unfinished jobs with a rank on ``node_id`` that may still be running there."""
    query = (
        select(JobRow)
        .join(RankRow)
        .where(
            RankRow.node_id == node_id,
            RankRow.state.in_(lifecycle.LIVE_RANK_STATES),
            JobRow.state.not_in(lifecycle.FINISHED),
        )
        .distinct()
        .order_by(JobRow.submitted_at_unix_s)
    )
    return list(s.scalars(query))


def lose_node(s: Session, node: NodeRow, *, now: float) -> None:
    """Every active job with ranks on ``node`` (down) restarts or fails; its ranks there are gone."""
    for job in active_jobs_on_node(s, node.id):
        on_node = [_status(r) for r in job.ranks if r.node_id == node.id]
        t = lifecycle.node_lost(job.state, node.name, on_node, job.restarts, job.max_restarts)
        apply_transition(s, job, t, now=now, lost_node=node.id)
        for r in job.ranks:  # a job already restarting or failed: nobody confirms these
            if r.node_id == node.id:
                r.state = lifecycle.rank_state_when_node_lost(r.state)


def restarting_jobs(s: Session) -> list[JobRow]:
    query = select(JobRow).where(JobRow.state == lifecycle.RESTARTING)
    return list(s.scalars(query.order_by(JobRow.submitted_at_unix_s)))


def replace_job(
    s: Session, job: JobRow, placement: Placement, plan: InitialPlan, *, now: float
) -> None:
    """Start the job's next attempt on ``placement``: new ranks, rendezvous and plan.

    ``restarts`` counts attempts placed after the first, so while the job is
    RESTARTING it still names the attempt whose ranks are being stopped.
    """
    job.restarts += 1
    job.ranks.clear()
    s.flush()  # delete the old rank rows before their (job, rank) is reused
    job.ranks.extend(_rank_rows(placement))
    job.world_size = len(placement.ranks)
    job.backend = placement.backend
    job.master_addr, job.master_port = placement.master_addr, placement.master_port
    job.state, job.restarting_since_unix_s = lifecycle.PENDING, None
    row = add_plan(s, job.id, plan.batches, 0, plan.policy, plan.reason, now=now)
    job.attempt_first_plan = row.version
    nodes = sorted({r.node.name for r in job.ranks})
    add_event(
        s,
        "job_restarted",
        f"job {job.name} attempt {job.restarts}: {job.world_size} ranks on {', '.join(nodes)}, "
        f"plan v{row.version} {row.batches}, resuming from its checkpoint",
        job_id=job.id,
        now=now,
    )


def fail_restart(s: Session, job: JobRow, reason: str, *, now: float) -> None:
    """A restart that cannot be placed ends the job."""
    apply_transition(s, job, lifecycle.Transition(lifecycle.FAILED, reason), now=now)


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
    ranks: Sequence[dict[str, Any]],
    *,
    now: float,
) -> None:
    """Store one interval's ``IntervalStatRow`` column values (one dict per rank) in a
    single statement."""
    if ranks:
        common = {
            "job_id": job.id,
            "end_step": end_step,
            "plan_version": plan_version,
            "received_at_unix_s": now,
        }
        s.connection().execute(
            insert(_table(IntervalStatRow)), [{**row, **common} for row in ranks]
        )
    job.last_step = max(job.last_step, end_step)
    s.flush()


def rank_interval(row: dict[str, Any]) -> RankInterval:
    """The balancer's view of one rank's ``IntervalStatRow`` column values."""
    return RankInterval(
        row["rank"],
        row["batch"],
        row["steps"],
        row["compute_s"],
        row["step_s"],
        row["peak_memory_bytes"],
    )


def complete_steps(s: Session, job: JobRow, limit: int) -> list[int]:
    """The newest ``limit`` end steps every rank of the current attempt reported, newest
    first (a restart resumes from a checkpoint: its steps repeat the old attempt's).

    Counting ranks per step over a job's whole history made every interval report
    slower the longer the job ran; the newest ``2 * limit`` steps (an index-only
    reverse scan) nearly always hold them, and only if not is the rest counted.
    """
    t = IntervalStatRow
    recent = list(
        s.scalars(
            select(t.end_step)
            .where(*_this_attempt(job))
            .distinct()
            .order_by(t.end_step.desc())
            .limit(2 * limit)
        )
    )
    if not recent:
        return []
    query = (
        select(t.end_step)
        .where(*_this_attempt(job))
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
    """The last ``window`` complete intervals (every rank reported) of the current
    attempt, oldest first."""
    return [ranks for _, ranks in interval_steps(s, job, window)]


def interval_steps(s: Session, job: JobRow, window: int) -> list[tuple[int, list[RankInterval]]]:
    """``interval_history`` with each interval's end step: (end step, ranks in rank
    order), oldest first."""
    steps = complete_steps(s, job, window)
    if not steps:
        return []
    # Columns, not ORM objects: this runs on every interval report of every job,
    # and building the objects was most of a report's CPU.
    t = IntervalStatRow
    rows = s.execute(
        select(t.end_step, t.rank, t.batch, t.steps, t.compute_s, t.step_s, t.peak_memory_bytes)
        .where(*_this_attempt(job), t.end_step.in_(steps))
        .order_by(t.end_step, t.rank, t.id.desc())
    )
    by_step: dict[int, dict[int, RankInterval]] = {}
    for end_step, rank, batch, n, compute_s, step_s, peak in rows:
        # A re-sent report leaves duplicates: the newest row (highest id) wins.
        by_step.setdefault(end_step, {}).setdefault(
            rank, RankInterval(rank, batch, n, compute_s, step_s, peak)
        )
    return [
        (step, [by_step[step][rank] for rank in sorted(by_step[step])]) for step in sorted(by_step)
    ]


def _this_attempt(job: JobRow) -> tuple[Any, ...]:
    """Interval rows of the job's current placement (earlier ones had other ranks)."""
    return (
        IntervalStatRow.job_id == job.id,
        IntervalStatRow.plan_version >= job.attempt_first_plan,
    )


def latest_interval(s: Session, job: JobRow) -> list[IntervalStatRow]:
    """The newest complete interval's rows of the current attempt (one per rank, rank
    order); [] before any."""
    steps = complete_steps(s, job, 1)
    if not steps:
        return []
    step = steps[0]
    return _newest_per_rank(
        s.scalars(
            select(IntervalStatRow).where(*_this_attempt(job), IntervalStatRow.end_step == step)
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
    """One row per rank from the newest report of a step.

    A re-sent report leaves duplicates: the newest row (highest id) wins. A step
    run again after a restart (resumed from an older checkpoint, perhaps with
    fewer ranks) keeps only the newest report's plan version, so ranks of two
    placements never mix.
    """
    rows = list(rows)
    if not rows:
        return []
    version = max(rows, key=lambda r: r.id).plan_version
    newest: dict[int, IntervalStatRow] = {}
    for row in rows:
        if row.plan_version != version:
            continue
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
