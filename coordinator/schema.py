"""The coordinator's schema under Alembic: created, recognised, upgraded.

A coordinator upgrades its database to this version's head when it opens it,
instead of refusing until an operator runs a command: it is the only writer of
its database, every revision so far only adds or widens, and a coordinator that
refused could do nothing but wait for that command. ``hetero-coord db upgrade``
does the same without serving, for an operator who upgrades (and backs up)
before starting the new version.

- An empty database gets ``models``' tables at once (``create_all``) and is
  stamped at head, as Alembic advises: replaying every revision would give the
  same tables (a test checks that) more slowly.
- A database written before Alembic carries ``schema_version`` 3 or 4 and no
  ``alembic_version``: it has the tables of revision ``BASELINE`` (3) or ``0002``
  (4), is stamped so (``PRE_ALEMBIC``), then upgraded.
- A database at a revision this coordinator does not know (written by a newer
  hetero), or at an older pre-Alembic version, is refused in one line.

Revisions keep the ``schema_version`` row at ``models.SCHEMA_VERSION``, so a
coordinator older than Alembic refuses an upgraded database instead of misreading it.
"""

from __future__ import annotations

import logging
from pathlib import Path

# Alembic logs INFO lines as it is imported ("setup plugin ...") and each time it
# opens a context ("Context impl ..."): they would fill every start's log. The
# upgrades themselves are logged here.
logging.getLogger("alembic").setLevel(logging.WARNING)

from alembic import command  # noqa: E402
from alembic.config import Config  # noqa: E402
from alembic.runtime.migration import MigrationContext  # noqa: E402
from alembic.script import ScriptDirectory  # noqa: E402
from sqlalchemy import Connection, Engine, insert, inspect, select  # noqa: E402

from hetero.coordinator.database import DatabaseError  # noqa: E402
from hetero.coordinator.dburl import masked  # noqa: E402
from hetero.coordinator.models import SCHEMA_VERSION, Base, SchemaVersion  # noqa: E402

log = logging.getLogger("hetero.coordinator.schema")

#: The revision whose tables are those of ``schema_version`` 3, the last schema
#: before Alembic.
BASELINE = "0001"
#: The ``schema_version`` of ``BASELINE``.
BASELINE_SCHEMA_VERSION = 3
#: The revision whose tables are those a coordinator older than Alembic created, by
#: its ``schema_version``.
PRE_ALEMBIC = {BASELINE_SCHEMA_VERSION: BASELINE, 4: "0002"}
MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for this package's migrations, run on ``connection``."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head() -> str:
    """The newest revision this coordinator knows."""
    found = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert found is not None, "the migrations have no head revision"
    return str(found)


def current_revision(engine: Engine) -> str | None:
    """The database's Alembic revision; None for one without (empty, or pre-Alembic)."""
    with engine.connect() as conn:
        found = MigrationContext.configure(conn).get_current_revision()
    return None if found is None else str(found)


def upgrade_to_head(engine: Engine) -> None:
    """Create, or upgrade to head, the schema in ``engine``'s database, in one
    transaction; ``DatabaseError`` (one line) for one it cannot upgrade."""
    url = masked(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        tables = set(inspect(conn).get_table_names())
        config = alembic_config(conn)
        if not tables:
            Base.metadata.create_all(conn)
            conn.execute(insert(SchemaVersion).values(version=SCHEMA_VERSION))
            command.stamp(config, "head")
            return
        if "alembic_version" not in tables:
            _stamp_pre_alembic(conn, config, tables, url)
        have = MigrationContext.configure(conn).get_current_revision()
        scripts = ScriptDirectory.from_config(config)
        newest = scripts.get_current_head()
        if have == newest:
            return
        if have is None or have not in {s.revision for s in scripts.walk_revisions()}:
            raise DatabaseError(
                f"database {url} is at schema revision {have}, which this coordinator "
                f"(head {newest}) does not know: it was written by a newer hetero"
            )
        log.info("upgrading database %s from schema revision %s to %s", url, have, newest)
        command.upgrade(config, "head")


def _stamp_pre_alembic(conn: Connection, config: Config, tables: set[str], url: str) -> None:
    if SchemaVersion.__tablename__ not in tables:
        raise DatabaseError(
            f"database {url} is not a hetero coordinator database (no schema_version table)"
        )
    found = list(conn.scalars(select(SchemaVersion.version)).all())
    if len(found) != 1 or found[0] not in PRE_ALEMBIC:
        have = ", ".join(str(v) for v in found) or "none"
        raise DatabaseError(
            f"database {url} has schema version {have}, which this coordinator cannot "
            f"upgrade (it upgrades {BASELINE_SCHEMA_VERSION} and later): use a new --state-dir/--db"
        )
    command.stamp(config, PRE_ALEMBIC[found[0]])
