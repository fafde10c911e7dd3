"""A plan made on a small table does not go on reading it whole once it grew (db/statistics.py).

The hazard, shown first: `resolve_requests` prepared on a connection while `requests` held a few
hundred rows settles on a generic plan that scans the table; after a broadcast-sized insert the
same prepared statement reads every row for one key. Beat's look (`Refresher.look`) finds the
table grown past its statistics and analyzes it; the statement, on the same connection, then finds
its row by index. A quiet ledger is not analyzed, and the look says nothing."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

import pytest
from psycopg import ClientCursor
from sqlalchemy import text

from clarion import settings
from clarion.db import ledger
from clarion.db.engine import engine
from clarion.db.statistics import Refresher, grown
from tests.support.prepared import numbered

pytestmark = pytest.mark.integration
T = TypeVar("T")

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
INSERT = """
    INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,
        locale, created_at, due_at)
    SELECT :tag || g, 'receipt', :tag || g, 'transactional', 1, '{}', 'en', :now, :now
    FROM generate_series(1, :n) g
    RETURNING user_id, id
"""


def _insert(tag: str, n: int) -> list[tuple[str, int]]:
    with engine().begin() as conn:
        return [(u, i) for u, i in conn.execute(text(INSERT), {"tag": tag, "n": n, "now": NOW})]


def _eventually(check: Callable[[], T | None], what: str) -> T:
    """`check`'s first answer that is not None, asked every 0.1 s for up to 10 s (backends report
    their counts to the server's cumulative statistics within about a second of going idle)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if (found := check()) is not None:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not in pg_stat_user_tables after 10 s")


def _wait_grown(schema: str) -> list[str]:
    """The tables `grown` lists, once it lists requests (or a partition of it)."""

    def tables() -> list[str] | None:
        with engine().connect() as conn:
            found = [g.table for g in grown(conn, schema)]
        return found if any(t == "requests" or t.startswith("requests_p") for t in found) else None

    return _eventually(tables, "requests grown")


def _counted(schema: str, changed: int) -> None:
    """Wait until the server's statistics counted `changed` more rows written since the last
    ANALYZE of requests (its partitions summed)."""

    def enough() -> bool | None:
        with engine().connect() as conn:
            n = conn.execute(
                text(
                    "SELECT sum(n_mod_since_analyze) FROM pg_stat_user_tables "
                    "WHERE schemaname IN (:s, :p) "
                    "AND (relname = 'requests' OR relname LIKE 'requests\\_p%')"
                ),
                {"s": schema, "p": schema + "_partitions"},
            ).scalar_one()
        return True if n is not None and n >= changed else None

    _eventually(enough, "the churn counted")


class Prepared:
    """`resolve_requests` prepared once on one connection, as a worker's connection holds it."""

    def __init__(self) -> None:
        sql, self.names = numbered(ledger._RESOLVE_REQUESTS.text)
        self.params = ", ".join(["%s"] * len(self.names))
        self.conn = engine().connect()
        raw = self.conn.connection.dbapi_connection
        assert raw is not None
        # auto-committed, and each run resolves a key of its own: psycopg deallocates every
        # prepared statement of a connection that sees a ROLLBACK
        raw.autocommit = True
        self.cur = ClientCursor(raw)  # type: ignore[call-overload]
        self.cur.execute("PREPARE resolve_plan AS " + sql, prepare=False)

    def _args(self, key: tuple[str, int]) -> list[object]:
        values = {"users": [key[0]], "ids": [key[1]], "now": NOW}
        return [values[n] for n in self.names]

    def run(self, key: tuple[str, int]) -> None:
        self.cur.execute(f"EXECUTE resolve_plan({self.params})", self._args(key))

    def plan(self, key: tuple[str, int]) -> str:
        self.cur.execute(
            f"EXPLAIN (ANALYZE, TIMING OFF) EXECUTE resolve_plan({self.params})",
            self._args(key),
        )
        plan = "\n".join(r[0] for r in self.cur.fetchall())
        return plan

    def close(self) -> None:
        self.cur.execute("DEALLOCATE resolve_plan")
        self.conn.close()


def test_a_plan_made_on_a_small_table_finds_rows_by_key_once_the_grown_table_is_analyzed(
    clarion_env, caplog
):
    schema = settings.get().schema
    small = _insert("r", 300)
    prepared = Prepared()
    try:
        for key in small[:8]:  # five custom plans, then PostgreSQL settles on the generic one
            prepared.run(key)
        _insert("b", 20_000)  # a broadcast's requests: the statistics still say ~nothing
        stale = prepared.plan(small[10])
        scanned = re.search(r"Seq Scan on requests r .*\(actual rows=(\d+)", stale)
        assert scanned and int(scanned.group(1)) > 20_000, stale  # every row, for one key

        assert "requests" in _wait_grown(schema)
        caplog.set_level(logging.INFO, logger="clarion.db.statistics")
        refresher = Refresher(engine(), schema)
        assert any(".requests" in t for t in refresher.look())
        assert refresher._running is not None
        refresher._running.join(30)

        fresh = prepared.plan(small[11])
        assert re.search(r"Index Scan using requests_\w+ on requests", fresh), fresh
        assert "Seq Scan on requests" not in fresh, fresh
        assert "(actual rows=1 loops=1)" in fresh, fresh
    finally:
        prepared.close()
    refreshed = [r for r in caplog.records if r.getMessage() == "statistics refreshed"]
    assert any(".requests" in getattr(r, "table", "") for r in refreshed), caplog.text


def test_a_quiet_ledger_is_not_analyzed_and_the_look_says_nothing(clarion_env, caplog):
    """Nor one that churns without growing: rows written and deleted again are autovacuum's."""
    schema = settings.get().schema
    _insert("q", 6000)  # past MIN_ROWS in each of up to four partitions
    _wait_grown(schema)
    refresher = Refresher(engine(), schema)
    refresher.look()
    assert refresher._running is not None
    refresher._running.join(30)
    churn = _insert("c", 6000)
    with engine().begin() as conn:
        conn.execute(
            text("DELETE FROM requests WHERE user_id = ANY(:users)"),
            {"users": [u for u, _ in churn]},
        )
    _counted(schema, 12_000)
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    with engine().connect() as conn:
        assert grown(conn, schema) == []
    assert refresher.look() == []
    assert caplog.records == []


def _analyzed(table: str) -> int:
    with engine().connect() as conn:
        count = conn.execute(
            text(
                "SELECT sum(analyze_count) FROM pg_stat_user_tables "
                "WHERE relname = :t OR relname LIKE :t || '\\_p%'"  # the table, or its partitions
            ),
            {"t": table},
        ).scalar_one()
    return int(count)


def test_beat_looks_with_the_tick_every_few_seconds_and_analyzes_a_grown_table(
    clarion_env, tmp_path
):
    from clarion.tasks.app import app
    from clarion.tasks.beat import STATISTICS_EVERY, Scheduler

    class Recording(Scheduler):
        def apply_async(self, entry, producer=None, advance=True, **kwargs):
            pass  # nothing is sent to a broker

    beat = Recording(app, schedule_filename=str(tmp_path / "schedule"), lazy=True)
    beat.setup_schedule()
    tick = beat.schedule["tick"]
    before = _analyzed("requests")
    _insert("t", 6000)
    _wait_grown(settings.get().schema)
    beat.apply_entry(tick)
    refresher = beat._statistics
    assert refresher is not None and refresher._running is not None
    refresher._running.join(30)
    first = _analyzed("requests")
    assert first > before

    _insert("u", 13_000)  # grown again, but the next look is STATISTICS_EVERY after the last
    _wait_grown(settings.get().schema)
    beat._statistics_looked = time.monotonic()  # as if it had just looked
    beat.apply_entry(tick)
    assert refresher._running.is_alive() is False
    assert _analyzed("requests") == first
    beat._statistics_looked -= STATISTICS_EVERY  # the interval has passed
    beat.apply_entry(tick)
    refresher._running.join(30)
    assert _analyzed("requests") > first
