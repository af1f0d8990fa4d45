"""A node keeps its host's profile: the data disk's read and the links to other nodes
beside the CPUs and the network to the coordinator (schema_version 9).

``host_profile`` of ``nodes``, text (the ``hetero.v1.HostProfile`` message as protobuf
JSON), "" for the nodes registered before.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("nodes", sa.Column("host_profile", sa.Text(), nullable=False, server_default=""))
    op.execute("UPDATE schema_version SET version = 9")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 8")
    with op.batch_alter_table("nodes") as batch_op:
        batch_op.drop_column("host_profile")
