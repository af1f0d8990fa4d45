"""The schema of schema_version 3, the last before Alembic.

A database that a coordinator of that version created is stamped at this revision
(``hetero.coordinator.schema``); the tables here are exactly those it created.

Revision ID: 0001
Revises: -
Create Date: 2026-11-26 14:57:41.035716
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("time_unix_s", sa.Float(), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("node_id", sa.String(length=32), nullable=True),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_job_id"), ["job_id"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("spec_yaml", sa.Text(), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("global_batch", sa.Integer(), nullable=False),
        sa.Column("world_size", sa.Integer(), nullable=False),
        sa.Column("min_batch", sa.Integer(), nullable=False),
        sa.Column("rebalance_interval", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(length=8), nullable=False),
        sa.Column("master_addr", sa.String(length=255), nullable=False),
        sa.Column("master_port", sa.Integer(), nullable=False),
        sa.Column("submitted_at_unix_s", sa.Float(), nullable=False),
        sa.Column("finished_at_unix_s", sa.Float(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("restarts", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.Integer(), nullable=False),
        sa.Column("total_steps", sa.Integer(), nullable=True),
        sa.Column("max_restarts", sa.Integer(), nullable=False),
        sa.Column("attempt_first_plan", sa.Integer(), nullable=False),
        sa.Column("restarting_since_unix_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_jobs_submitted_at_unix_s"), ["submitted_at_unix_s"], unique=False
        )

    op.create_table(
        "nodes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("address", sa.String(length=255), nullable=False),
        sa.Column("agent_endpoint", sa.String(length=255), nullable=False),
        sa.Column("agent_version", sa.String(length=64), nullable=False),
        sa.Column("registered_at_unix_s", sa.Float(), nullable=False),
        sa.Column("last_heartbeat_unix_s", sa.Float(), nullable=False),
        sa.Column("draining", sa.Boolean(), nullable=False),
        sa.Column("down", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "schema_version",
        sa.Column("version", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("version"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("matmul_tflops", sa.Float(), nullable=True),
        sa.Column("memory_bandwidth_bytes_per_s", sa.Float(), nullable=True),
        sa.Column("host_to_device_bytes_per_s", sa.Float(), nullable=True),
        sa.Column("device_to_host_bytes_per_s", sa.Float(), nullable=True),
        sa.Column("memory_bytes", sa.Integer(), nullable=True),
        sa.Column("compute_score", sa.Float(), nullable=False),
        sa.Column("emulated_slowdown", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("node_id", "index"),
    )
    op.create_table(
        "interval_stats",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("end_step", sa.Integer(), nullable=False),
        sa.Column("plan_version", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("compute_s", sa.Float(), nullable=False),
        sa.Column("step_s", sa.Float(), nullable=False),
        sa.Column("peak_memory_bytes", sa.Integer(), nullable=True),
        sa.Column("data_s", sa.Float(), nullable=True),
        sa.Column("comm_wait_s", sa.Float(), nullable=True),
        sa.Column("forward_s", sa.Float(), nullable=True),
        sa.Column("backward_s", sa.Float(), nullable=True),
        sa.Column("optimizer_s", sa.Float(), nullable=True),
        sa.Column("loss_sum", sa.Float(), nullable=True),
        sa.Column("samples", sa.Integer(), nullable=True),
        sa.Column("received_at_unix_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("interval_stats", schema=None) as batch_op:
        batch_op.create_index("ix_interval_stats_job_step", ["job_id", "end_step"], unique=False)

    op.create_table(
        "log_lines",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("stream", sa.String(length=8), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("time_unix_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("log_lines", schema=None) as batch_op:
        batch_op.create_index("ix_log_lines_job_id", ["job_id", "id"], unique=False)

    op.create_table(
        "plans",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("apply_at_step", sa.Integer(), nullable=False),
        sa.Column("batches", sa.Text(), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("predicted_step_s", sa.Float(), nullable=True),
        sa.Column("created_at_unix_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("job_id", "version"),
    )
    op.create_table(
        "ranks",
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=False),
        sa.Column("device_kind", sa.String(length=16), nullable=False),
        sa.Column("device_name", sa.String(length=255), nullable=False),
        sa.Column("local_rank", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("emulated_slowdown", sa.Float(), nullable=False),
        sa.Column("effective_score", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
        ),
        sa.PrimaryKeyConstraint("job_id", "rank"),
    )
    with op.batch_alter_table("ranks", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ranks_node_id"), ["node_id"], unique=False)

    op.create_table(
        "telemetry",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(length=32), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=True),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("time_unix_s", sa.Float(), nullable=False),
        sa.Column("utilization_percent", sa.Float(), nullable=True),
        sa.Column("memory_used_bytes", sa.Integer(), nullable=True),
        sa.Column("memory_total_bytes", sa.Integer(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("throttle_reasons", sa.String(length=255), nullable=True),
        sa.Column("cpu_percent", sa.Float(), nullable=True),
        sa.Column("ram_used_bytes", sa.Integer(), nullable=True),
        sa.Column("ram_total_bytes", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["node_id"], ["nodes.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_node_bucket", ["node_id", "bucket"], unique=False)
    op.execute("INSERT INTO schema_version (version) VALUES (3)")


def downgrade() -> None:
    with op.batch_alter_table("telemetry", schema=None) as batch_op:
        batch_op.drop_index("ix_telemetry_node_bucket")

    op.drop_table("telemetry")
    with op.batch_alter_table("ranks", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ranks_node_id"))

    op.drop_table("ranks")
    op.drop_table("plans")
    with op.batch_alter_table("log_lines", schema=None) as batch_op:
        batch_op.drop_index("ix_log_lines_job_id")

    op.drop_table("log_lines")
    with op.batch_alter_table("interval_stats", schema=None) as batch_op:
        batch_op.drop_index("ix_interval_stats_job_step")

    op.drop_table("interval_stats")
    op.drop_table("devices")
    op.drop_table("schema_version")
    op.drop_table("nodes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_submitted_at_unix_s"))
        batch_op.drop_index(batch_op.f("ix_jobs_state"))

    op.drop_table("jobs")
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_job_id"))

    op.drop_table("events")
