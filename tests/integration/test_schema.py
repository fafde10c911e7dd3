"""The migrations and db/schema.py describe the same database, and downgrade cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from clarion import db
from clarion.db import partitioning
from clarion.db.engine import engine, migrate
from clarion.db.schema import SCHEMA_REVISION, metadata
from clarion.errors import ConfigurationError

pytestmark = pytest.mark.integration


def _ours(obj, name, type_, reflected, compare_to) -> bool:
    """On the partitioned layout PostgreSQL adds a foreign key per partition of the table referred
    to (clarion_partitions.requests_p0 …); SQLAlchemy reflects those beside the real one."""
    if type_ == "foreign_key_constraint" and reflected:
        return not (obj.referred_table.schema or "").endswith(partitioning.SUFFIX)
    return True


def schema_diffs(conn) -> list:
    """How the database differs from db/schema.py (on either layout)."""
    context = MigrationContext.configure(conn, opts={"include_object": _ours})
    return compare_metadata(context, metadata)


def test_migrated_database_matches_the_schema_module(clarion_env):
    with engine().connect() as conn:
        diffs = schema_diffs(conn)
    assert diffs == []


def test_migrations_go_down_and_up_again(clarion_env):
    engine().dispose()
    migrate(revision="base", down=True)
    with engine().connect() as conn:
        assert schema_diffs(conn)  # tables gone
    migrate()
    with engine().connect() as conn:
        assert schema_diffs(conn) == []


def test_the_schema_module_names_the_alembic_head():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(Path(db.__file__).parent / "migrations"))
    assert ScriptDirectory.from_config(config).get_current_head() == SCHEMA_REVISION


@pytest.mark.direct(
    "its own unmigrated database, which the pooler fixture has not given clarion's search_path"
)
def test_an_unmigrated_database_is_refused_with_what_to_do(unmigrated_database):
    with pytest.raises(ConfigurationError, match="not migrated.*run `clarion migrate`"):
        engine(unmigrated_database)
    migrate(unmigrated_database, "0005")
    with pytest.raises(ConfigurationError, match="at revision 0005.*needs revision"):
        engine(unmigrated_database)
