"""Store functions for heartbeats and telemetry: liveness in bulk, one row per
(node, device, bucket of ``TelemetryPolicy.period_s``), kept for ``retention_s``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import BindParameter, Float, bindparam, case, delete, func, insert, select, update
from sqlalchemy.orm import Session

from hetero.coordinator.models import NodeRow, TelemetryRow
from hetero.coordinator.store.nodes import heard_from
from hetero.coordinator.store.rows import table


@dataclass(frozen=True)
class TelemetryPolicy:
    """Downsampling and retention of telemetry, in seconds."""

    period_s: float = 10.0
    retention_s: float = 24 * 3600.0


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
    nodes, telemetry = table(NodeRow), table(TelemetryRow)
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
            heard_from(s, node, alive[node_id])
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
