"""The in-memory state's durable copy: write operations, and the load at start.

A change to the state (``state``) is made on the event loop, which then hands the
writer (``writer``) operations holding the changed rows' values, taken at once: the
objects go on changing on the loop while the writer's thread writes, so it never reads
them. Each operation writes its rows by primary key (an update, else an insert: one
statement on any database SQLAlchemy speaks), so writing a row twice, or a newer
version after an older one, leaves the newest; operations are applied in the order
they were put.

``load`` reads the state back: every node, every job not finished and those finished
within ``state.KEEP_FINISHED_S``, each job's ranks, newest plan, the current attempt's
recent complete intervals and newest events, and what every job's stored log lines
weigh (``logcaps``). Each job's spec is parsed once, here.
It is the coordinator's recovery: what it read is all it knows when it starts serving.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session

from hetero.coordinator import attach, lifecycle, wire
from hetero.coordinator.models import (
    DeviceRow,
    EventRow,
    JobRow,
    NodeRow,
    PlanRow,
    RankRow,
    TelemetryRow,
)
from hetero.coordinator.state import (
    JOB_EVENTS,
    KEEP_FINISHED_S,
    ClusterState,
    Device,
    Event,
    Job,
    Node,
    Plan,
    Rank,
)
from hetero.coordinator.store.intervals import interval_steps, latest_interval
from hetero.coordinator.wire import interval_message

Values = Mapping[str, Any]


def _table(model: type[Any]) -> Table:
    return cast(Table, model.__table__)


def _save(s: Session, table: Table, values: Values) -> None:
    """The row of ``values`` written by primary key: updated if it is there, else added."""
    key = [c.name for c in table.primary_key.columns]
    where = [table.c[k] == values[k] for k in key]
    rest = {k: v for k, v in values.items() if k not in key}
    if s.connection().execute(update(table).where(*where).values(rest)).rowcount:
        return
    s.connection().execute(insert(table).values(dict(values)))


# ---- operations ------------------------------------------------------------------------


@dataclass(frozen=True)
class SaveNode:
    """A node's row, and with ``devices`` its devices' rows replacing those it had."""

    values: Values
    devices: tuple[Values, ...] | None = None

    def apply(self, s: Session) -> None:
        _save(s, _table(NodeRow), self.values)
        if self.devices is not None:
            devices = _table(DeviceRow)
            node_id = self.values["id"]
            s.connection().execute(delete(devices).where(devices.c.node_id == node_id))
            if self.devices:
                rows = [{**d, "node_id": node_id} for d in self.devices]
                s.connection().execute(insert(devices), rows)


@dataclass(frozen=True)
class SaveJob:
    """A job's row, and with ``ranks`` its ranks' rows replacing those it had."""

    values: Values
    ranks: tuple[Values, ...] | None = None

    def apply(self, s: Session) -> None:
        _save(s, _table(JobRow), self.values)
        if self.ranks is not None:
            ranks = _table(RankRow)
            job_id = self.values["id"]
            s.connection().execute(delete(ranks).where(ranks.c.job_id == job_id))
            if self.ranks:
                rows = [{**r, "job_id": job_id} for r in self.ranks]
                s.connection().execute(insert(ranks), rows)


@dataclass(frozen=True)
class AddRows:
    """New rows of one table: plans, events, interval statistics, telemetry, log lines."""

    model: type[Any]
    rows: tuple[Values, ...]

    def apply(self, s: Session) -> None:
        if self.rows:
            s.connection().execute(insert(_table(self.model)), [dict(r) for r in self.rows])


@dataclass(frozen=True)
class DropTelemetry:
    """The telemetry of ``nodes`` older than bucket ``oldest`` (their retention), a node
    at a time: each delete an index range on ``(node_id, bucket)``."""

    nodes: tuple[str, ...]
    oldest: int

    def apply(self, s: Session) -> None:
        if not self.nodes:
            return
        t = _table(TelemetryRow)
        statement = delete(t).where(t.c.node_id == bindparam("node"), t.c.bucket < self.oldest)
        s.connection().execute(statement, [{"node": n} for n in self.nodes])


@dataclass(frozen=True)
class Liveness:
    """Nodes' last heartbeats (Unix s), by node id, in one statement."""

    heard: Mapping[str, float]

    def apply(self, s: Session) -> None:
        if not self.heard:
            return
        t = _table(NodeRow)
        statement = (
            update(t)
            .where(t.c.id == bindparam("node"))
            .values(last_heartbeat_unix_s=bindparam("heard"))
        )
        rows = [{"node": n, "heard": at} for n, at in self.heard.items()]
        s.connection().execute(statement, rows)


class Call:
    """Work of the caller's own in the writer's transaction (pruning); ``result`` holds
    what ``fn`` returned once it is committed."""

    def __init__(self, fn: Callable[[Session], Any]) -> None:
        self.fn = fn
        self.result: Any = None

    def apply(self, s: Session) -> None:
        self.result = self.fn(s)


# ---- row values from the state (taken on the event loop) -------------------------------


def node_values(node: Node) -> dict[str, Any]:
    return {
        "id": node.id,
        "name": node.name,
        "address": node.address,
        "agent_endpoint": node.agent_endpoint,
        "agent_version": node.agent_version,
        "registered_at_unix_s": node.registered_at_unix_s,
        "last_heartbeat_unix_s": node.last_heartbeat_unix_s,
        "draining": node.draining,
        "down": node.down,
        "host_profile": wire.host_profile_text(node.host_profile),
    }


def save_node(node: Node, *, devices: bool = False) -> SaveNode:
    """The operation that writes ``node`` as it is now (with its devices if ``devices``)."""
    rows = tuple(dataclasses.asdict(d) for d in node.devices) if devices else None
    return SaveNode(node_values(node), rows)


def job_values(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "spec_yaml": job.spec_yaml,
        "policy": job.policy,
        "global_batch": job.global_batch,
        "world_size": job.world_size,
        "min_batch": job.min_batch,
        "rebalance_interval": job.rebalance_interval,
        "backend": job.backend,
        "master_addr": job.master_addr,
        "master_port": job.master_port,
        "submitted_at_unix_s": job.submitted_at_unix_s,
        "finished_at_unix_s": job.finished_at_unix_s,
        "message": job.message,
        "restarts": job.restarts,
        "last_step": job.last_step,
        "total_steps": job.total_steps,
        "max_restarts": job.max_restarts,
        "attempt_first_plan": job.attempt_first_plan,
        "restarting_since_unix_s": job.restarting_since_unix_s,
        "priority": job.priority,
        "owner": job.owner,
        "excluded": job.excluded,
        "exclusion_restarts": job.exclusion_restarts,
    }


def save_job(job: Job, *, ranks: bool = True) -> SaveJob:
    """The operation that writes ``job`` as it is now (with its ranks if ``ranks``)."""
    # An attached job's ranks are on no node: its spec's ``attached:`` section keeps them.
    rows = tuple(dataclasses.asdict(r) for r in job.ranks) if ranks and not job.launcher else None
    return SaveJob(job_values(job), rows)


def add_plan(job_id: str, plan: Plan) -> AddRows:
    values = {
        "job_id": job_id,
        "version": plan.version,
        "apply_at_step": plan.apply_at_step,
        "batches": ",".join(str(b) for b in plan.batches),
        "policy": plan.policy,
        "reason": plan.reason,
        "predicted_step_s": plan.predicted_step_s,
        "created_at_unix_s": plan.created_at_unix_s,
    }
    return AddRows(PlanRow, (values,))


def add_events(events: Iterable[Event]) -> AddRows:
    return AddRows(EventRow, tuple(dataclasses.asdict(e) for e in events))


# ---- the load at start -----------------------------------------------------------------


def load(s: Session, *, now: float, history: int) -> ClusterState:
    """The state as the database holds it (see the module doc); ``history`` complete
    intervals of each placed job's current attempt (what straggler detection and the
    balancer read: ``reports.HISTORY``)."""
    count = s.scalar(select(func.count()).select_from(JobRow)) or 0
    restarts = s.scalar(select(func.sum(JobRow.restarts))) or 0
    newest_event = s.scalar(select(func.max(EventRow.id))) or 0
    state = ClusterState(next_event_id=newest_event + 1, port_cursor=count + restarts)
    devices: dict[str, list[Device]] = {}
    for d in s.scalars(select(DeviceRow).order_by(DeviceRow.node_id, DeviceRow.index)):
        devices.setdefault(d.node_id, []).append(_device(d))
    for n in s.scalars(select(NodeRow)):
        state.add_node(
            Node(
                id=n.id,
                name=n.name,
                address=n.address,
                agent_endpoint=n.agent_endpoint,
                agent_version=n.agent_version,
                registered_at_unix_s=n.registered_at_unix_s,
                last_heartbeat_unix_s=n.last_heartbeat_unix_s,
                draining=n.draining,
                down=n.down,
                devices=tuple(devices.get(n.id, ())),
                host_profile=wire.host_profile_of(n.host_profile),
            )
        )
    kept = or_(
        JobRow.state.not_in(lifecycle.FINISHED),
        JobRow.finished_at_unix_s >= now - KEEP_FINISHED_S,
    )
    order = (JobRow.submitted_at_unix_s, JobRow.id)
    rows = list(s.scalars(select(JobRow).where(kept).order_by(*order)))
    ids = [r.id for r in rows]
    ranks = _ranks_of(s, ids)
    plans = _newest_plans(s, ids)
    events = _recent_events(s, ids)
    for row in rows:
        job = _job(row, ranks.get(row.id, []), plans.get(row.id), events.get(row.id, []), now)
        if job.placed:
            steps = interval_steps(s, row, history)
            job.history = deque(((step, tuple(rs)) for step, rs in steps), maxlen=history)
            newest = latest_interval(s, row)
            job.latest = interval_message(row.id, newest) if newest else None
        state.add_job(job)
    charged = select(JobRow.id, JobRow.owner, JobRow.log_bytes).where(JobRow.log_bytes > 0)
    for job_id, owner, stored in s.execute(charged):
        state.logs.load(job_id, owner, stored)
    return state


def _device(d: DeviceRow) -> Device:
    return Device(
        index=d.index,
        name=d.name,
        kind=d.kind,
        compute_score=d.compute_score,
        matmul_tflops=d.matmul_tflops,
        memory_bandwidth_bytes_per_s=d.memory_bandwidth_bytes_per_s,
        host_to_device_bytes_per_s=d.host_to_device_bytes_per_s,
        device_to_host_bytes_per_s=d.device_to_host_bytes_per_s,
        memory_bytes=d.memory_bytes,
        emulated_slowdown=d.emulated_slowdown,
        suspect=d.suspect or "",
        shared_while_profiled=bool(d.shared_while_profiled),
        foreign_utilization_percent=d.foreign_utilization_percent,
    )


def _job(
    row: JobRow, ranks: list[Rank], plan: Plan | None, events: Sequence[Event], now: float
) -> Job:
    spec, attached = attach.parse_stored(row.spec_yaml, source=f"job {row.id}")
    return Job(
        id=row.id,
        name=row.name,
        spec=spec,
        spec_yaml=row.spec_yaml,
        state=row.state,
        submitted_at_unix_s=row.submitted_at_unix_s,
        world_size=row.world_size,
        priority=row.priority,
        owner=row.owner,
        backend=row.backend,
        master_addr=row.master_addr,
        master_port=row.master_port,
        finished_at_unix_s=row.finished_at_unix_s,
        message=row.message,
        restarts=row.restarts,
        last_step=row.last_step,
        attempt_first_plan=row.attempt_first_plan,
        restarting_since_unix_s=row.restarting_since_unix_s,
        excluded=row.excluded,
        exclusion_restarts=row.exclusion_restarts,
        ranks=ranks if attached is None else attached.job_ranks(),
        launcher="" if attached is None else attached.shown,
        heard_at_unix_s=now,
        plan=plan,
        events=deque(events, maxlen=JOB_EVENTS),
        not_helping=next((e.message for e in reversed(events) if e.kind == NOT_HELPING), ""),
    )


#: The event kind that says why balancing does not beat equal batches for a job.
NOT_HELPING = "not-helping"

#: Ids per ``IN (...)`` of the load's queries (below every database's parameter limit).
_CHUNK = 500


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(ids), _CHUNK):
        yield ids[i : i + _CHUNK]


def _ranks_of(s: Session, ids: Sequence[str]) -> dict[str, list[Rank]]:
    out: dict[str, list[Rank]] = {}
    for chunk in _chunks(ids):
        query = select(RankRow).where(RankRow.job_id.in_(chunk)).order_by(RankRow.rank)
        for r in s.scalars(query):
            out.setdefault(r.job_id, []).append(
                Rank(
                    rank=r.rank,
                    node_id=r.node_id,
                    device_index=r.device_index,
                    device_kind=r.device_kind,
                    device_name=r.device_name,
                    local_rank=r.local_rank,
                    state=r.state,
                    exit_code=r.exit_code,
                    emulated_slowdown=r.emulated_slowdown,
                    effective_score=r.effective_score,
                )
            )
    return out


def _newest_plans(s: Session, ids: Sequence[str]) -> dict[str, Plan]:
    out: dict[str, Plan] = {}
    for chunk in _chunks(ids):
        newest = (
            select(PlanRow.job_id, func.max(PlanRow.version).label("version"))
            .where(PlanRow.job_id.in_(chunk))
            .group_by(PlanRow.job_id)
            .subquery()
        )
        query = select(PlanRow).join(
            newest, (PlanRow.job_id == newest.c.job_id) & (PlanRow.version == newest.c.version)
        )
        for p in s.scalars(query):
            out[p.job_id] = Plan(
                version=p.version,
                apply_at_step=p.apply_at_step,
                batches=tuple(int(b) for b in p.batches.split(",")) if p.batches else (),
                policy=p.policy,
                reason=p.reason,
                created_at_unix_s=p.created_at_unix_s,
                predicted_step_s=p.predicted_step_s,
            )
    return out


def _recent_events(s: Session, ids: Sequence[str]) -> dict[str, list[Event]]:
    """Each job's newest ``JOB_EVENTS`` events, oldest first."""
    out: dict[str, deque[Event]] = {}
    for chunk in _chunks(ids):
        query = select(EventRow).where(EventRow.job_id.in_(chunk)).order_by(EventRow.id)
        for e in s.scalars(query):
            assert e.job_id is not None
            out.setdefault(e.job_id, deque(maxlen=JOB_EVENTS)).append(
                Event(e.id, e.time_unix_s, e.kind, e.message, e.job_id, e.node_id)
            )
    return {job_id: list(events) for job_id, events in out.items()}
