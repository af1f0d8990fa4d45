"""Jobs remember the ranks the coordinator left out (schema_version 7).

``excluded`` lists them (JSON; "" for none) so that every later placement of the
job leaves them out too; ``exclusion_restarts`` counts the restarts made to leave
one out, which use none of the job's ``max_restarts``. Existing jobs get "" and 0.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("excluded", sa.Text(), server_default="", nullable=False))
    op.add_column(
        "jobs",
        sa.Column("exclusion_restarts", sa.Integer(), server_default="0", nullable=False),
    )
    op.execute("UPDATE schema_version SET version = 7")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 6")
    with op.batch_alter_table("jobs") as batch_op:
        batch_op.drop_column("exclusion_restarts")
        batch_op.drop_column("excluded")
