"""Devices say whether their profile was suspect or shared (schema_version 4).

``suspect`` names the profile figures that exceeded the device's limits,
``shared_while_profiled`` and ``foreign_utilization_percent`` tell of other
processes on the device while its agent profiled it. Existing rows get "" and
false (the server defaults), the same as a device registered without them.

Databases that a coordinator of schema_version 4 created before Alembic have these
columns already and are stamped at this revision (``hetero.coordinator.schema``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (no batch copy of the table): SQLite takes a NOT NULL column
    # that has a default.
    op.add_column(
        "devices", sa.Column("suspect", sa.String(length=255), server_default="", nullable=False)
    )
    op.add_column(
        "devices",
        sa.Column("shared_while_profiled", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.add_column("devices", sa.Column("foreign_utilization_percent", sa.Float(), nullable=True))
    op.execute("UPDATE schema_version SET version = 4")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 3")
    with op.batch_alter_table("devices") as batch_op:
        batch_op.drop_column("foreign_utilization_percent")
        batch_op.drop_column("shared_while_profiled")
        batch_op.drop_column("suspect")
