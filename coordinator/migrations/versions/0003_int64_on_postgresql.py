"""Byte counts and the ids of the growing tables are 64-bit (schema_version 5).

PostgreSQL's INTEGER is 32-bit: a GPU's memory in bytes overflows it at once, and
the telemetry table's ids after a month of 1,000 nodes. SQLite's INTEGER is 64-bit
already, so there only the version changes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Nullable byte counts, by table.
BYTES = {
    "devices": ["memory_bytes"],
    "telemetry": ["memory_used_bytes", "memory_total_bytes", "ram_used_bytes", "ram_total_bytes"],
    "interval_stats": ["peak_memory_bytes"],
}
#: Tables whose autoincrement ids grow without bound.
GROWING = ["telemetry", "interval_stats", "events", "log_lines"]


def _widen(to: sa.types.TypeEngine[int], was: sa.types.TypeEngine[int], seq_as: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, columns in BYTES.items():
        for column in columns:
            op.alter_column(table, column, type_=to, existing_type=was, existing_nullable=True)
    for table in GROWING:
        op.alter_column(table, "id", type_=to, existing_type=was, existing_nullable=False)
        if op.get_bind().dialect.name == "postgresql":
            # The SERIAL column's sequence has a type (and maximum) of its own.
            op.execute(f"ALTER SEQUENCE {table}_id_seq AS {seq_as}")


def upgrade() -> None:
    _widen(sa.BigInteger(), sa.Integer(), "BIGINT")
    op.execute("UPDATE schema_version SET version = 5")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 4")
    _widen(sa.Integer(), sa.BigInteger(), "INTEGER")
