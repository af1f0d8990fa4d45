"""Alembic's script directory for the coordinator's schema (``hetero.coordinator.schema``).

New revision after a change to ``models``: ``hetero-coord db revision -m "what changed"``
writes one into ``versions/`` from the difference; read it, then bump ``SCHEMA_VERSION``
in it and in ``models`` (a coordinator older than Alembic reads that number).
"""
