"""Stored log lines are weighed in bytes (schema_version 10).

``cost_bytes`` of ``log_lines``: what each line is charged against the log caps
(``logcaps.line_cost``); ``log_bytes`` of ``jobs``: the sum over the job's lines.
Both 0 for what was stored before: those lines count against no cap, and age out
with their retention (``log_keep_days``), so no upgrade rewrites the log table.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: A 64-bit integer on PostgreSQL (``models.Int64``).
_INT64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.add_column(
        "log_lines", sa.Column("cost_bytes", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("jobs", sa.Column("log_bytes", _INT64, nullable=False, server_default="0"))
    op.execute("UPDATE schema_version SET version = 10")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 9")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("log_bytes")
    with op.batch_alter_table("log_lines") as batch_op:
        batch_op.drop_column("cost_bytes")
