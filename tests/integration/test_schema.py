"""The migrations and db/schema.py describe the same database, and downgrade cleanly."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from db.engine import engine, migrate
from db.schema import metadata

pytestmark = pytest.mark.integration


def test_migrated_database_matches_the_schema_module(clarion_env):
    with engine().connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diffs == []


def test_migrations_go_down_and_up_again(clarion_env):
    engine().dispose()
    migrate(revision="base", down=True)
    with engine().connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata)  # tables gone
    migrate()
    with engine().connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), metadata) == []
