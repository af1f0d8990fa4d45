"""Alembic's script directory for the coordinator's schema (``hetero.coordinator.schema``).

A change to ``models`` comes with a revision in ``versions/``: the next number, its
``down_revision`` the current head, written by hand like ``0002`` or generated from
the difference against a database at head::

    from alembic import command
    from sqlalchemy import create_engine
    from hetero.coordinator.database import open_database
    from hetero.coordinator.schema import alembic_config

    engine = open_database("sqlite:////tmp/head.db")   # the schema at head, from before the change
    with engine.begin() as conn:
        command.revision(alembic_config(conn), "what changed", autogenerate=True, rev_id="0003")

The revision also sets the ``schema_version`` row to the new ``models.SCHEMA_VERSION``
(a coordinator older than Alembic reads that number). ``tests/integration/test_database.py``
checks, on SQLite and PostgreSQL, that replaying every revision gives the models' tables.
"""
