"""Alembic's script directory for the coordinator's schema (``hetero.coordinator.schema``).

A change to ``models`` comes with a revision in ``versions/``: the next number, its
``down_revision`` the current head, written by hand like ``0002`` and ``0003`` or generated from
the difference between the models and the revisions so far::

    from alembic import command
    from hetero.coordinator.database import connect
    from hetero.coordinator.schema import alembic_config

    with connect("sqlite://").begin() as conn:
        config = alembic_config(conn)
        command.upgrade(config, "head")  # the tables the revisions so far build
        command.revision(config, "what changed", autogenerate=True, rev_id="0004")

The revision also sets the ``schema_version`` row to the new ``models.SCHEMA_VERSION``
(a coordinator older than Alembic reads that number). ``tests/integration/test_database.py``
checks, on SQLite and PostgreSQL, that replaying every revision gives the models' tables.
"""
