"""Plans on a ledger whose statistics are stale (issue 29, migration 0027): deliveries analyzed
while small and mostly pending, then a bulk load of sent history before ANALYZE runs again.
mark_sent_many, as a prepared statement plans it (generic), must still find each row by its
primary key, never probe deliveries_one_send by user_id and read the recipient's sent rows.
Measured by EXPLAIN ANALYZE of the statement as sent (PREPARE … EXECUTE), rolled back."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

import pytest
from psycopg import ClientCursor
from sqlalchemy import text

from clarion.db import claims
from clarion.db.engine import engine
from tests.support.prepared import numbered

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
USERS = 4000  # analyzed with fewer rows than recipients: "a row per recipient" in the statistics


def _ledger_analyzed_small_then_grown(token: str) -> list[tuple[str, int]]:
    """2,300 pending deliveries and 300 sent, ANALYZE; then 20,000 sent and 100 claimed under
    `token` (no ANALYZE: autovacuum has not come round yet). Returns the claimed rows' keys."""
    insert = """
        WITH r AS (
            INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,
                variables, locale, state, created_at)
            SELECT 'u' || (g % :users), 'receipt', :tag || g, 'transactional', 1, '{}', 'en',
                'routed', :now FROM generate_series(1, :n) g
            RETURNING user_id, id, type_key, occurrence_key)
        INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel,
            one_platform, lane, state, not_before, created_at, updated_at, platform,
            claim_token, lease_until)
        SELECT user_id, id, type_key, occurrence_key, 'webhook', false, 'transactional', :state,
            :now, :now, :now, CASE WHEN :state = 'sent' THEN 'webhook' END,
            CASE WHEN :state = 'claimed' THEN CAST(:token AS uuid) END,
            CASE WHEN :state = 'claimed' THEN CAST(:now AS timestamptz) END
        FROM r RETURNING user_id, id
    """
    with engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO recipients (user_id, timezone, created_at, updated_at) "
                "SELECT 'u' || g, 'UTC', :now, :now FROM generate_series(0, :n - 1) g"
            ),
            {"now": NOW, "n": USERS},
        )
        params = {"now": NOW, "users": USERS, "token": token}
        conn.execute(text(insert), {**params, "tag": "p", "n": 2300, "state": "pending"})
        conn.execute(text(insert), {**params, "tag": "q", "n": 300, "state": "sent"})
    with engine().connect() as conn:
        conn.execute(text("COMMIT"))
        conn.execute(text("ANALYZE requests, deliveries"))
    with engine().begin() as conn:
        conn.execute(text(insert), {**params, "tag": "s", "n": 20_000, "state": "sent"})
        keys = conn.execute(text(insert), {**params, "tag": "c", "n": 100, "state": "claimed"})
        return [(u, i) for u, i in keys]


def _generic_plan(sql: str, values: dict[str, object]) -> str:
    """EXPLAIN ANALYZE of `sql` (named parameters) prepared and run with a generic plan, as a
    prepared statement runs once PostgreSQL settles on one; rolled back."""
    prepared, names = numbered(sql)
    with engine().connect() as conn, conn.begin() as tx:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = ClientCursor(raw)  # type: ignore[call-overload]
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE history_plan AS " + prepared)
        args = ", ".join(["%s"] * len(names))
        cur.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE history_plan({args})",
            [values[n] for n in names],
        )
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("DEALLOCATE history_plan")
        tx.rollback()
    return plan


def test_mark_sent_many_finds_rows_by_key_on_stale_statistics(clarion_env):
    token = str(uuid.uuid4())
    keys = _ledger_analyzed_small_then_grown(token)
    with engine().connect() as conn:  # the statistics are the small table's
        reltuples = conn.execute(
            text("SELECT reltuples FROM pg_class WHERE oid = 'deliveries'::regclass")
        ).scalar_one()
    assert reltuples < 3000
    plan = _generic_plan(
        claims._MARK_SENT_MANY.text,
        {
            "users": [k[0] for k in keys],
            "ids": [k[1] for k in keys],
            "platforms": ["webhook"] * len(keys),
            "message_ids": [f"m{k[1]}" for k in keys],
            "sent_at": [NOW] * len(keys),
            "token": token,
        },
    )
    assert "Update on deliveries" in plan and "(actual rows=100 loops=1)" in plan, plan
    assert "deliveries_one_send" not in plan, plan
    assert re.search(r"Index Scan (using|on) deliveries_pkey", plan), plan
    # no row read but the one keyed (partitioned: a TID probe of another partition may find a row
    # there and drop it by tableoid)
    assert all(int(n) <= 1 for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)), plan
