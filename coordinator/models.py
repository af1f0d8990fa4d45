"""The coordinator's tables (SQLAlchemy 2 declarative models).

Times are Unix seconds (``*_unix_s``, wall clock: they are timestamps, not
durations). Nullable telemetry columns mean "not available on this device".
Any change to these tables comes with an Alembic revision under ``migrations/``
(``schema`` applies them on open) that also bumps ``SCHEMA_VERSION``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

#: 2: nodes.draining, jobs.total_steps; interval_stats phase times, loss and samples.
#: 3: nodes.down; jobs.max_restarts, attempt_first_plan, restarting_since_unix_s (recovery).
#: 4: devices.suspect, shared_while_profiled, foreign_utilization_percent (the last
#: version before Alembic; revision 0002 adds them to a database of 3).
#: 5: byte counts and the ids of the growing tables are 64-bit on PostgreSQL (revision
#: 0003). From 3 on, ``migrations/`` holds every change and ``schema`` applies it.
#: 6: jobs.priority and jobs.owner (the queue; revision 0004).
#: 7: jobs.excluded and jobs.exclusion_restarts (ranks left out; revision 0005).
#: 10: log_lines.cost_bytes and jobs.log_bytes (byte caps on stored logs; revision 0008).
#: 11: interval_stats.input_cv (the input pipeline's spread; revision 0009).
SCHEMA_VERSION = 11

#: A 64-bit integer: PostgreSQL's INTEGER is 32-bit, and a GPU's memory in bytes (or
#: the telemetry table's ids after a month of 1,000 nodes) overflows it. SQLite's
#: INTEGER is 64-bit already, and only ``INTEGER PRIMARY KEY`` is its rowid.
Int64 = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    """One row: the schema version the database was created with."""

    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class NodeRow(Base):
    __tablename__ = "nodes"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    address: Mapped[str] = mapped_column(String(255))
    agent_endpoint: Mapped[str] = mapped_column(String(255), default="")
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    registered_at_unix_s: Mapped[float] = mapped_column(Float)
    last_heartbeat_unix_s: Mapped[float] = mapped_column(Float)
    #: Set by an operator: placement gives the node no new ranks.
    draining: Mapped[bool] = mapped_column(Boolean, default=False)
    #: Set by the coordinator's sweeper when the node missed its heartbeat timeout
    #: (so "node down" is one event, not one per sweep); cleared when it is heard again.
    down: Mapped[bool] = mapped_column(Boolean, default=False)
    #: The host's profile as its agent measured it at registration (``hetero.v1.HostProfile``
    #: as protobuf JSON: CPUs, network to the coordinator, the data disk's read, the links
    #: to other nodes); "" before its first registration with one.
    host_profile: Mapped[str] = mapped_column(Text, default="", server_default="")
    devices: Mapped[list[DeviceRow]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="DeviceRow.index"
    )


class DeviceRow(Base):
    """A device's static hardware profile, as measured by its agent."""

    __tablename__ = "devices"
    __table_args__ = (UniqueConstraint("node_id", "index"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(16))
    matmul_tflops: Mapped[float | None] = mapped_column(Float)
    memory_bandwidth_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    host_to_device_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    device_to_host_bytes_per_s: Mapped[float | None] = mapped_column(Float)
    memory_bytes: Mapped[int | None] = mapped_column(Int64)
    compute_score: Mapped[float] = mapped_column(Float)
    emulated_slowdown: Mapped[float] = mapped_column(Float, default=1.0)
    #: Comma-separated profile fields that exceeded the device's limits; "" = none.
    #: (The server defaults of the two are those revision 0002 gives the rows it adds
    #: them to, so a new database has the same columns as an upgraded one.)
    suspect: Mapped[str] = mapped_column(String(255), default="", server_default="")
    #: Other processes used the device while its agent profiled it.
    shared_while_profiled: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    #: Sustained use by other processes, percent; ``compute_score`` already reflects it.
    foreign_utilization_percent: Mapped[float | None] = mapped_column(Float)
    node: Mapped[NodeRow] = relationship(back_populates="devices")


class TelemetryRow(Base):
    """Downsampled telemetry: one row per (node, device, time bucket), holding the
    newest sample of its bucket. ``device_index`` is NULL for the host's own row."""

    __tablename__ = "telemetry"
    __table_args__ = (Index("ix_telemetry_node_bucket", "node_id", "bucket"),)
    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    device_index: Mapped[int | None] = mapped_column(Integer)
    bucket: Mapped[int] = mapped_column(Integer)
    time_unix_s: Mapped[float] = mapped_column(Float)
    utilization_percent: Mapped[float | None] = mapped_column(Float)
    memory_used_bytes: Mapped[int | None] = mapped_column(Int64)
    memory_total_bytes: Mapped[int | None] = mapped_column(Int64)
    temperature_c: Mapped[float | None] = mapped_column(Float)
    power_w: Mapped[float | None] = mapped_column(Float)
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    #: Comma-separated reason names; "" = not throttled; NULL = n/a.
    throttle_reasons: Mapped[str | None] = mapped_column(String(255))
    cpu_percent: Mapped[float | None] = mapped_column(Float)
    ram_used_bytes: Mapped[int | None] = mapped_column(Int64)
    ram_total_bytes: Mapped[int | None] = mapped_column(Int64)


class JobRow(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    #: A ``hetero.v1.JobState`` name without prefix: QUEUED, PENDING, RUNNING, ...
    state: Mapped[str] = mapped_column(String(16), index=True)
    spec_yaml: Mapped[str] = mapped_column(Text)
    policy: Mapped[str] = mapped_column(String(32))
    global_batch: Mapped[int] = mapped_column(Integer)
    world_size: Mapped[int] = mapped_column(Integer)
    min_batch: Mapped[int] = mapped_column(Integer, default=1)
    rebalance_interval: Mapped[int] = mapped_column(Integer)
    #: The three below are "", "" and 0 while the job is QUEUED (not placed yet).
    backend: Mapped[str] = mapped_column(String(8))
    master_addr: Mapped[str] = mapped_column(String(255))
    master_port: Mapped[int] = mapped_column(Integer)
    submitted_at_unix_s: Mapped[float] = mapped_column(Float, index=True)
    finished_at_unix_s: Mapped[float | None] = mapped_column(Float)
    message: Mapped[str] = mapped_column(Text, default="")
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    last_step: Mapped[int] = mapped_column(Integer, default=0)
    #: ``steps`` from the spec; NULL for a job that runs by epochs.
    total_steps: Mapped[int | None] = mapped_column(Integer)
    #: ``max_restarts`` from the spec: restarts allowed after a lost node or rank.
    max_restarts: Mapped[int] = mapped_column(Integer, default=0)
    #: First plan version of the current attempt: interval statistics reported with
    #: an older plan version belong to an earlier placement (other ranks, other devices).
    attempt_first_plan: Mapped[int] = mapped_column(Integer, default=1)
    #: When the job entered RESTARTING (its old ranks being stopped); NULL otherwise.
    restarting_since_unix_s: Mapped[float | None] = mapped_column(Float)
    #: Queue priority: higher is placed first (``admission``).
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The credential that submitted the job (``identity``), for ``jobs_per_user``;
    #: "" for jobs submitted before the queue.
    owner: Mapped[str] = mapped_column(String(255), default="", server_default="")
    #: Ranks the coordinator left out (``exclusion``): a JSON list of
    #: ``{"node_id", "device_index", "spec_rank"}``; "" for none.
    excluded: Mapped[str] = mapped_column(Text, default="", server_default="")
    #: Restarts the coordinator made to leave a rank out: they use none of ``max_restarts``.
    exclusion_restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: Bytes its stored log lines are charged (``logcaps``: the sum of their
    #: ``cost_bytes``), kept with each append and each pruning batch.
    log_bytes: Mapped[int] = mapped_column(Int64, default=0, server_default="0")
    ranks: Mapped[list[RankRow]] = relationship(
        back_populates="job", cascade="all, delete-orphan", order_by="RankRow.rank"
    )


class RankRow(Base):
    __tablename__ = "ranks"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.id"), index=True)
    device_index: Mapped[int] = mapped_column(Integer)
    device_kind: Mapped[str] = mapped_column(String(16))
    device_name: Mapped[str] = mapped_column(String(255))
    local_rank: Mapped[int] = mapped_column(Integer)
    #: A ``hetero.v1.RankState`` name without prefix: ASSIGNED, RUNNING, EXITED, STOPPING.
    state: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    emulated_slowdown: Mapped[float] = mapped_column(Float, default=1.0)
    #: Compute score with emulation applied, as the balancer saw it at placement.
    effective_score: Mapped[float] = mapped_column(Float)
    job: Mapped[JobRow] = relationship(back_populates="ranks")
    node: Mapped[NodeRow] = relationship()


class PlanRow(Base):
    __tablename__ = "plans"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    apply_at_step: Mapped[int] = mapped_column(Integer)
    #: Per-rank batch sizes, comma-separated in rank order.
    batches: Mapped[str] = mapped_column(Text)
    policy: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    predicted_step_s: Mapped[float | None] = mapped_column(Float)
    created_at_unix_s: Mapped[float] = mapped_column(Float)


class IntervalStatRow(Base):
    """One rank's statistics over one rebalance interval ending at ``end_step``."""

    __tablename__ = "interval_stats"
    __table_args__ = (Index("ix_interval_stats_job_step", "job_id", "end_step"),)
    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    end_step: Mapped[int] = mapped_column(Integer)
    plan_version: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    batch: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)
    compute_s: Mapped[float] = mapped_column(Float)
    step_s: Mapped[float] = mapped_column(Float)
    peak_memory_bytes: Mapped[int | None] = mapped_column(Int64)
    data_s: Mapped[float | None] = mapped_column(Float)
    comm_wait_s: Mapped[float | None] = mapped_column(Float)
    forward_s: Mapped[float | None] = mapped_column(Float)
    backward_s: Mapped[float | None] = mapped_column(Float)
    optimizer_s: Mapped[float | None] = mapped_column(Float)
    loss_sum: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int | None] = mapped_column(Integer)
    received_at_unix_s: Mapped[float] = mapped_column(Float)
    #: What a plan change cost the rank, the spread of its steps, its input
    #: pipeline's seconds per batch and their spread (``RankIntervalStats``); None
    #: where not measured.
    switch_s: Mapped[float | None] = mapped_column(Float)
    busy_cv: Mapped[float | None] = mapped_column(Float)
    input_s: Mapped[float | None] = mapped_column(Float)
    input_cv: Mapped[float | None] = mapped_column(Float)


class EventRow(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    time_unix_s: Mapped[float] = mapped_column(Float)
    job_id: Mapped[str | None] = mapped_column(String(32), index=True)
    node_id: Mapped[str | None] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)


class LogLineRow(Base):
    """A line a rank printed; ``id`` is the line's ``seq`` (increasing, also per job)."""

    __tablename__ = "log_lines"
    __table_args__ = (Index("ix_log_lines_job_id", "job_id", "id"),)
    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(8))
    text: Mapped[str] = mapped_column(Text)
    time_unix_s: Mapped[float] = mapped_column(Float)
    #: Bytes the line is charged against the log caps (``logcaps.line_cost``); 0 for
    #: lines stored before the caps.
    cost_bytes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
