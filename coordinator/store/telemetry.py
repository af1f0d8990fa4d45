"""Store functions for heartbeats and telemetry: liveness in bulk, one row per
(node, device, bucket of ``TelemetryPolicy.period_s``), kept for ``retention_s``."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from sqlalchemy import (
    BindParameter,
    Float,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from hetero.coordinator.models import NodeRow, TelemetryRow
from hetero.coordinator.store.nodes import heard_from
from hetero.coordinator.store.rows import table

T = TypeVar("T")


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
    down_of = _down_of(s, sorted(ids))
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
    telemetry = table(TelemetryRow)
    if alive:
        _mark_alive(conn, alive)
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
            _insert_telemetry(conn, inserts)
    if newest:
        arrived = max(b.time_unix_s for b in ours)
        oldest = int((arrived - policy.retention_s) // policy.period_s)
        _drop_older(conn, sorted({key[0] for key in newest}), oldest)
    return ids - known


# Each statement of a flush covers many rows on SQLite, never one row each. SQLite lets
# go of Python's interpreter lock for every step of a statement (an ``executemany`` is
# a step per row), and in the coordinator, whose event loop is busy, taking it back can
# wait a switch interval (5 ms) while the flush holds the database's write lock: a flush
# of 250 nodes held it 16 ms at the median and 89 ms at p99 under ``hetero-bench load``
# (15 ms alone), and every report queued behind it. The statements are written as SQL
# with ``?`` placeholders: SQLAlchemy's compiling of a statement of many rows costs
# more CPU than the steps it saves. Other databases keep SQLAlchemy's statements.

#: Bound parameters in one statement (SQLite before 3.32 allowed 999).
_PARAMS_PER_STATEMENT = 900


def _down_of(s: Session, ids: Sequence[str]) -> dict[str, bool]:
    """Whether each known node of ``ids`` is marked down (unknown ids left out)."""
    conn = s.connection()
    if conn.dialect.name != "sqlite":
        return dict(s.execute(select(NodeRow.id, NodeRow.down).where(NodeRow.id.in_(ids))).all())
    out: dict[str, bool] = {}
    for chunk in _chunks(ids, _PARAMS_PER_STATEMENT):
        marks = ", ".join("?" * len(chunk))
        found, down = conn.exec_driver_sql(
            f"SELECT count(*), coalesce(sum(down), 0) FROM nodes WHERE id IN ({marks})",
            tuple(chunk),
        ).one()
        if found == len(chunk) and not down:  # the steady state: one row, one step
            out.update(dict.fromkeys(chunk, False))
            continue
        rows = conn.exec_driver_sql(
            f"SELECT id, down FROM nodes WHERE id IN ({marks})", tuple(chunk)
        )
        out.update((node, bool(d)) for node, d in rows)
    return out


def _mark_alive(conn: Connection, alive: dict[str, float]) -> None:
    """Each node's last heartbeat moved up to its newest arrival: max(stored, t), since
    two flushes (the ingest's and the sweeper's) may commit out of order."""
    nodes = table(NodeRow)
    if conn.dialect.name != "sqlite":
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
        return
    for chunk in _chunks(sorted(alive.items()), _PARAMS_PER_STATEMENT // 2):
        rows = ", ".join(["(?, ?)"] * len(chunk))
        conn.exec_driver_sql(
            f"WITH arrived(id, t) AS (VALUES {rows}) "
            "UPDATE nodes SET last_heartbeat_unix_s = CASE "
            "WHEN nodes.last_heartbeat_unix_s > arrived.t THEN nodes.last_heartbeat_unix_s "
            "ELSE arrived.t END FROM arrived WHERE nodes.id = arrived.id",
            tuple(v for pair in chunk for v in pair),
        )


def _insert_telemetry(conn: Connection, rows: list[dict[str, object]]) -> None:
    telemetry = table(TelemetryRow)
    if conn.dialect.name != "sqlite":
        conn.execute(insert(telemetry), rows)
        return
    columns = list(rows[0])
    row_marks = "(" + ", ".join("?" * len(columns)) + ")"
    names = ", ".join(columns)
    for chunk in _chunks(rows, max(1, _PARAMS_PER_STATEMENT // len(columns))):
        conn.exec_driver_sql(
            f"INSERT INTO telemetry ({names}) VALUES {', '.join([row_marks] * len(chunk))}",
            tuple(row[c] for row in chunk for c in columns),
        )


def _drop_older(conn: Connection, nodes: Sequence[str], oldest: int) -> None:
    """Delete these nodes' telemetry of buckets before ``oldest``."""
    telemetry = table(TelemetryRow)
    if conn.dialect.name != "sqlite":
        conn.execute(
            delete(telemetry).where(
                telemetry.c.node_id == bindparam("node"), telemetry.c.bucket < oldest
            ),
            [{"node": node_id} for node_id in nodes],
        )
        return
    for chunk in _chunks(nodes, _PARAMS_PER_STATEMENT - 1):
        conn.exec_driver_sql(
            f"DELETE FROM telemetry WHERE bucket < ? AND node_id IN ({', '.join('?' * len(chunk))})",
            (oldest, *chunk),
        )


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def latest_telemetry(s: Session, node_id: str) -> dict[int | None, TelemetryRow]:
    """The newest row per device (key None = host) of a node."""
    newest = s.scalar(select(func.max(TelemetryRow.bucket)).where(TelemetryRow.node_id == node_id))
    if newest is None:
        return {}
    rows = s.scalars(
        select(TelemetryRow).where(TelemetryRow.node_id == node_id, TelemetryRow.bucket == newest)
    )
    return {row.device_index: row for row in rows}


def latest_telemetry_of(
    s: Session, node_ids: Sequence[str]
) -> dict[str, dict[int | None, TelemetryRow]]:
    """``latest_telemetry`` of each of ``node_ids`` (a node with none is left out), in one
    query per ``_PARAMS_PER_STATEMENT`` nodes: a cluster snapshot of 1,000 nodes asked
    two queries a node, a second of the coordinator's interpreter on a 2-core box."""
    out: dict[str, dict[int | None, TelemetryRow]] = {}
    for chunk in _chunks(sorted(set(node_ids)), _PARAMS_PER_STATEMENT):
        newest = (
            select(TelemetryRow.node_id, func.max(TelemetryRow.bucket).label("bucket"))
            .where(TelemetryRow.node_id.in_(chunk))
            .group_by(TelemetryRow.node_id)
            .subquery()
        )
        rows = s.scalars(
            select(TelemetryRow).join(
                newest,
                and_(
                    TelemetryRow.node_id == newest.c.node_id, TelemetryRow.bucket == newest.c.bucket
                ),
            )
        )
        for row in rows:
            out.setdefault(row.node_id, {})[row.device_index] = row
    return out
