"""The hash-partitioned layout (db/partitioning.py): built by `migrate(partitions=N)` with the rows,
names and identity positions kept, idempotent, and the tick's queries stay per partition."""

from __future__ import annotations

import importlib.util
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from clarion import db
from clarion.db import ledger, meta, partitioning
from clarion.db import series as store
from clarion.db.engine import engine, migrate
from clarion.db.schema import metadata
from clarion.errors import ConfigurationError
from clarion.scheduling import zones

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
PARTS = 4


def _partitioned(clarion_env) -> None:
    """This test's database on the partitioned layout (already so under TEST_CLARION_PARTITIONS)."""
    engine().dispose()
    migrate(clarion_env.database_url, partitions=PARTS)


def _load(users: int = 400, series: int = 8000, requests: int = 60_000) -> None:
    """Recipients and series, a few due now, the rest later; requests and deliveries, a few dozen
    due; then ANALYZE, as autovacuum would, so the planner sees tables of this size (on tables of
    a few thousand rows a hash join over every partition is cheaper, and PostgreSQL rightly takes
    it)."""
    with engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO recipients (user_id, timezone, created_at, updated_at) "
                "SELECT 'u' || g, 'UTC', :now, :now FROM generate_series(1, :n) g"
            ),
            {"now": NOW, "n": users},
        )
        conn.execute(
            text(
                """
                INSERT INTO series (user_id, series_key, type_key, anchor_local, zone, every,
                    calendar_policy, variables, state, next_n, next_due_at, created_at, updated_at)
                SELECT 'u' || (1 + g % :users), 's' || g, 'nudge', CAST(:now AS timestamp), 'UTC',
                    '1d', 'send', '{}', 'active', 0,
                    CASE WHEN g % 200 = 0 THEN CAST(:now AS timestamptz) - interval '1 minute'
                         ELSE CAST(:now AS timestamptz) + make_interval(secs => g) END, :now, :now
                FROM generate_series(1, :n) g
                """
            ),
            {"now": NOW, "n": series, "users": users},
        )
        conn.execute(
            text(
                """
                INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,
                                      variables, state, due_at, created_at)
                SELECT 'u' || (1 + g % :users), 'nudge', 'e' || g, 'activation', 1, '{}',
                    CASE WHEN g % 3000 = 0 THEN 'pending' ELSE 'routed' END,
                    CASE WHEN g % 3000 = 0 THEN CAST(:now AS timestamptz) END, :now
                FROM generate_series(1, :n) g
                """
            ),
            {"now": NOW, "n": requests, "users": users},
        )
        conn.execute(
            text(
                """
                INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel,
                    one_platform, lane, state, not_before, due_at, created_at, updated_at)
                SELECT user_id, id, type_key, occurrence_key, 'slack', true, lane,
                    CASE WHEN id % 3000 = 7 THEN 'pending' ELSE 'failed' END, :now,
                    CASE WHEN id % 3000 = 7 THEN CAST(:now AS timestamptz) END, :now, :now
                FROM requests
                """
            ),
            {"now": NOW},
        )
    with engine().connect() as conn:
        conn.execute(text("COMMIT"))
        conn.execute(text("ANALYZE"))


def _plan(conn, sql: str, params: dict | None = None, *, generic: bool = False) -> str:
    if (
        generic
    ):  # the ledger's statements are prepared on first use: PostgreSQL may plan generically
        conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
    return "\n".join(r[0] for r in conn.execute(text("EXPLAIN " + sql), params or {}))


def test_migrate_partitions_every_per_recipient_table_and_keeps_its_rows(clarion_env):
    with engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO recipients (user_id, timezone, locale, created_at, updated_at) "
                "VALUES ('ann', 'UTC', 'de-AT', :now, :now)"
            ),
            {"now": NOW},
        )
        first = conn.execute(
            text(
                "INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,"
                " variables, created_at) VALUES ('ann', 'nudge', 'e1', 'activation', 1, '{}', :now)"
                " RETURNING id"
            ),
            {"now": NOW},
        ).scalar_one()
    _partitioned(clarion_env)
    with engine().begin() as conn:
        counts = partitioning.partition_counts(conn)
        assert counts == {t: PARTS for t in partitioning.PARTITIONED}
        assert conn.execute(text("SELECT id FROM requests WHERE user_id = 'ann'")).scalar() == first
        second = conn.execute(
            text(
                "INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,"
                " variables, created_at) VALUES ('ann', 'nudge', 'e2', 'activation', 1, '{}', :now)"
                " RETURNING id"
            ),
            {"now": NOW},
        ).scalar_one()
        assert second > first  # the identity sequence went on from where it was
        locale = text("SELECT locale FROM requests WHERE user_id = 'ann' AND id = :id")
        # the trigger that pins the recipient's locale on a new request came along
        assert conn.execute(locale, {"id": second}).scalar_one() == "de-AT"
        dup = conn.execute(  # the occurrence key still holds, across the partitioned table
            text(
                "INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,"
                " variables, created_at) VALUES ('ann', 'nudge', 'e1', 'activation', 1, '{}', :now)"
                " ON CONFLICT (user_id, type_key, occurrence_key) DO NOTHING RETURNING id"
            ),
            {"now": NOW},
        ).first()
        assert dup is None
        names = {r[0] for r in conn.execute(text("SELECT conname FROM pg_constraint"))}
        for table in partitioning.PARTITIONED:  # every key and foreign key kept its name
            for constraint in metadata.tables[table].constraints:
                if constraint.name and not constraint.name.endswith("_check"):
                    assert constraint.name in names, constraint.name
    assert migrate(clarion_env.database_url, partitions=PARTS) == []  # again: nothing to do
    with pytest.raises(ConfigurationError, match="already partitioned with \\[4\\]"):
        migrate(clarion_env.database_url, partitions=8)


def _migration_0027():
    path = Path(db.__file__).parent / "migrations" / "versions" / "0027_history_statistics.py"
    spec = importlib.util.spec_from_file_location("migration_0027", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_partitions_keep_the_statistics_settings_of_migration_0027(clarion_env):
    """LIKE copies neither storage parameters nor column options: without carrying them over,
    each partition (the table autovacuum and the planner read) is back on PostgreSQL's defaults."""
    m = _migration_0027()
    autovacuum = sorted(o.replace(" ", "") for o in m.AUTOVACUUM.split(","))
    assert autovacuum and m.TABLES
    _partitioned(clarion_env)
    with engine().connect() as conn:
        rows = conn.execute(
            text(
                """
                SELECT p.relname, c.relname, c.reloptions, a.attoptions FROM pg_inherits i
                JOIN pg_class p ON p.oid = i.inhparent JOIN pg_class c ON c.oid = i.inhrelid
                JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = 'user_id'
                WHERE p.relname = ANY(:tables) AND c.relkind = 'r'
                """
            ),
            {"tables": list(m.TABLES)},
        ).all()
        parents = dict(
            conn.execute(
                text(
                    "SELECT c.relname, a.attoptions FROM pg_class c JOIN pg_attribute a "
                    "ON a.attrelid = c.oid AND a.attname = 'user_id' "
                    "WHERE c.relname = ANY(:tables) AND c.relkind = 'p'"
                ),
                {"tables": list(m.TABLES)},
            ).all()
        )
    assert sorted(parents) == sorted(m.TABLES)
    assert len(rows) == PARTS * len(m.TABLES)
    for parent, partition, reloptions, attoptions in rows:
        assert sorted(reloptions or []) == autovacuum, (parent, partition, reloptions)
        # only the planner options: some builds add entries of their own (Debian 15.20's pg_attver)
        assert partitioning.planner_options(attoptions) == ["n_distinct=-0.01"], (
            parent,
            partition,
            attoptions,
        )
    assert all(
        partitioning.planner_options(options) == ["n_distinct=-0.01"]
        for options in parents.values()
    ), parents


def test_every_unique_index_of_a_partitioned_table_holds_user_id(clarion_env):
    _partitioned(clarion_env)
    with engine().connect() as conn:
        rows = conn.execute(
            text(
                """
                SELECT c.relname, i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
                FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
                WHERE c.relkind = 'p' AND i.indisunique
                """
            )
        ).all()
    assert {r[0] for r in rows} == set(partitioning.PARTITIONED)
    for table, index, definition in rows:
        assert "(user_id" in definition, (table, index, definition)


def test_the_ticks_queries_stay_per_partition(clarion_env):
    _partitioned(clarion_env)
    _load()
    with engine().begin() as conn:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        due = {"now": NOW, "limit": 1000, "tzdata_key": meta.TZDATA, "tzdata": zones.TZ_DATABASE}
        for generic in (False, True):  # sent through psycopg itself: its placeholders
            if generic:
                conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
            plan = "\n".join(r[0] for r in raw.execute("EXPLAIN " + store._TAKE_DUE, due))
            # (clarion_meta, a few rows, is read once per statement for the tz check)
            assert "Seq Scan on series" not in plan, plan
            assert plan.count("Index Scan") >= PARTS, plan  # each partition's series_due, merged
        # one recipient's series: one partition only (pruned), by its primary key
        plan = _plan(conn, store._GET.text, {"user_id": "u7", "id": 7}, generic=True)
        assert "Seq Scan" not in plan and len(set(re.findall(r"series_p\d+", plan))) == 1, plan
        for table in ("requests", "deliveries"):
            stmt = ledger.due_statement(table).text
            params = {"now": NOW, "again": 30, "cap": 300, "lane": "activation", "limit": 5000}
            plan = _plan(conn, stmt, params, generic=True)
            assert "Seq Scan" not in plan, plan
    with engine().connect() as conn:  # the tick's one write statement, as it is sent
        conn.execute(text("SET plan_cache_mode = force_generic_plan"))
        raw = conn.connection.dbapi_connection
        assert raw is not None
        advance = store.Advance("u1", 1, "(0,1)", 1, NOW + timedelta(days=1), False)
        occurrence = store.NewOccurrence("u1", 1, "series:1:0", "activation", 1, "pending", NOW)
        params = store.fire_parameters([advance], [occurrence], now=NOW)
        plan = "\n".join(r[0] for r in raw.execute("EXPLAIN " + store._FIRE, params))
        assert "Seq Scan on series" not in plan and "Seq Scan on requests" not in plan, plan
        assert "Tid Scan on series_p0" in plan, plan  # where take_due_series found the row
