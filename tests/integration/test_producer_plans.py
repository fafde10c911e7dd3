"""The producer's recipient look-up (ledger.recipient_locales, once per notify_many chunk) as a
prepared statement plans it once PostgreSQL settles on the generic plan, on a recipients table
whose statistics were never gathered (a fresh deployment): one index probe per id. Joined the
other way round, the generic plan estimated one live recipient and ten ids and read every id for
every recipient (161 ms for 500 ids against 1,000 recipients; bench/RESULTS.md). Measured by
EXPLAIN ANALYZE of the statement as sent (PREPARE … EXECUTE), rolled back."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from psycopg import ClientCursor
from sqlalchemy import text

from clarion.db import ledger
from clarion.db.engine import engine

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _generic_plan(sql: str, users: object, *more: object) -> str:
    prepared = sql.replace(":users", "$1").replace(":rows", "$1")
    prepared = prepared.replace(":due_at", "$2").replace(":now", "$3")
    args = [users, *more]
    marks = ", ".join(["%s"] * len(args))
    with engine().connect() as conn, conn.begin() as tx:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        cur = ClientCursor(raw)  # type: ignore[call-overload]
        cur.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cur.execute("PREPARE locales_plan AS " + prepared)
        cur.execute(f"EXPLAIN (ANALYZE, TIMING OFF) EXECUTE locales_plan({marks})", args)
        plan = "\n".join(r[0] for r in cur.fetchall())
        cur.execute("DEALLOCATE locales_plan")
        tx.rollback()
    return plan


def _recipients() -> None:
    with engine().begin() as conn:
        conn.execute(
            text(
                "INSERT INTO recipients (user_id, timezone, created_at, updated_at) "
                "SELECT 'u' || g, 'UTC', :now, :now FROM generate_series(1, 1000) g"
            ),
            {"now": NOW},
        )
        conn.execute(
            text("UPDATE recipients SET erased_at = :now WHERE user_id = 'u2'"), {"now": NOW}
        )


def _probes_each_id(plan: str) -> None:
    assert re.search(r"Index Scan using recipients_pkey\w* on recipients", plan), plan
    assert "Seq Scan on recipients" not in plan, plan
    assert "Join Filter" not in plan, plan
    # one row read per id: none but the erased one is filtered out (partitioned: per partition)
    removed = [int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan)]
    assert sum(removed) <= 1, plan


def test_recipient_locales_probes_each_id_under_a_generic_plan(clarion_env):
    _recipients()
    users = [f"u{i}" for i in range(1, 501)]
    _probes_each_id(_generic_plan(ledger._LOCALES.text, users))
    with engine().begin() as conn:
        found = ledger.recipient_locales(conn, [*users, "nobody", "u1"])
    assert set(found) == set(users) - {"u2"}


def test_grouped_ingest_probes_each_recipient_under_a_generic_plan(clarion_env):
    """The ingest door's one statement (ledger.insert_grouped_requests: the recipients' check,
    their locales and the INSERT) looks its recipients up the same way."""
    _recipients()
    rows = [
        {"n": n, "g": n, "u": f"u{n + 1}", "t": "receipt", "o": f"event:{n}", "l": "transactional"}
        | {"v": 1, "vars": {}}
        for n in range(500)
    ]
    plan = _generic_plan(ledger._INSERT_GROUPED.text, json.dumps(rows), NOW, NOW)
    _probes_each_id(plan)
