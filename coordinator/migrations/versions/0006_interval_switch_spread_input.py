"""Interval statistics carry a plan change's cost, the steps' spread and the input
pipeline's seconds per batch (schema_version 8).

``switch_s``, ``busy_cv`` and ``input_s`` of ``interval_stats``, nullable: rows
written before, and ranks that did not measure one, have none.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("switch_s", "busy_cv", "input_s")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("interval_stats", sa.Column(name, sa.Float(), nullable=True))
    op.execute("UPDATE schema_version SET version = 8")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 7")
    with op.batch_alter_table("interval_stats") as batch_op:
        for name in reversed(COLUMNS):
            batch_op.drop_column(name)
