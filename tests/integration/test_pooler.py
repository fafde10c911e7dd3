"""CLARION_DATABASE_POOLER=transaction (db/engine.py): behind a transaction pooler clarion prepares
nothing and takes its search_path from the server, refusing a connection without it. The whole
tiers run through Debian's pgbouncer with TEST_CLARION_POOLER=pgbouncer (tests/conftest.py)."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from clarion.db.engine import engine, one_off_engine
from clarion.errors import ConfigurationError
from clarion.tasks import notify, register_recipient
from tests.support.environment import with_database
from tests.support.pipeline import configure

pytestmark = pytest.mark.integration


def test_a_pooled_connection_without_clarions_search_path_is_refused(
    clarion_env, unmigrated_database, monkeypatch
):
    configure(monkeypatch, database_url=unmigrated_database, database_pooler="transaction")
    with pytest.raises(ConfigurationError, match=r'ALTER ROLE "\w+" SET search_path = "clarion"'):
        engine()


def test_a_pooled_connection_uses_the_servers_search_path_and_prepares_nothing(
    clarion_env, services, monkeypatch
):
    name = clarion_env.database_url.rsplit("/", 1)[1].split("?")[0]
    with one_off_engine(services.database_url).connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{name}" SET search_path = "clarion"'))
    configure(
        monkeypatch,
        database_url=with_database(services.database_url, name),
        database_pooler="transaction",
    )
    register_recipient("u1", timezone="UTC")
    for n in range(12):  # past psycopg's own threshold of 5 runs: still nothing prepared
        assert notify("u1", "receipt", event_id=f"e{n}", variables={"order": str(n)}).new
    with engine().connect() as conn:
        assert conn.connection.dbapi_connection.prepare_threshold is None
        prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements")).scalar_one()
        assert conn.execute(text("SELECT count(*) FROM requests")).scalar_one() == 12
    assert prepared == 0
