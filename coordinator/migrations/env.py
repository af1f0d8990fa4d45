"""Alembic's environment: migrations run on the connection ``schema`` passes in
(``config.attributes["connection"]``), inside that connection's transaction."""

from __future__ import annotations

from alembic import context

from hetero.coordinator.models import Base

connection = context.config.attributes["connection"]
# render_as_batch: SQLite alters a table by copying it, which Alembic's batch mode does.
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
