"""Interval statistics carry the spread of the input pipeline's seconds per sample
(schema_version 11).

``input_cv`` of ``interval_stats``, nullable: rows written before, and ranks without
DataLoader workers, have none.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("interval_stats", sa.Column("input_cv", sa.Float(), nullable=True))
    op.execute("UPDATE schema_version SET version = 11")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 10")
    with op.batch_alter_table("interval_stats") as batch_op:
        batch_op.drop_column("input_cv")
