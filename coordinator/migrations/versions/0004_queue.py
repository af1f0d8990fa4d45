"""Jobs have a queue priority and an owner (schema_version 6).

``priority`` orders the queue (higher first); ``owner`` names the credential that
submitted the job, which ``jobs_per_user`` counts. Existing jobs get priority 0
and owner "" (the server defaults), so they count against no credential.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN: SQLite takes a NOT NULL column that has a default.
    op.add_column("jobs", sa.Column("priority", sa.Integer(), server_default="0", nullable=False))
    op.add_column(
        "jobs", sa.Column("owner", sa.String(length=255), server_default="", nullable=False)
    )
    op.execute("UPDATE schema_version SET version = 6")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 5")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("owner")
        batch_op.drop_column("priority")
