"""Statistics that keep up with a table growing faster than autovacuum looks at it.

PostgreSQL plans a prepared statement for all its runs (a generic plan, chosen after five custom
ones) from the sizes of its tables at that moment, and keeps the plan until a table's statistics
change. A plan made while a table was small may read it whole: on a fresh ledger, the
transactional lane's `resolve_requests`, planned on a few hundred requests, read every request
once a broadcast had written 50,000 of them (0.5 ms a statement became 17; receipts beside the
campaign 3.6-4.9x their idle p95 instead of ~1.6x; bench/RESULTS.md, "Lanes under a campaign").
Autovacuum re-analyzes a ledger table after 2% of it changed (migration 0027), but it looks only
every `autovacuum_naptime` (a minute by default), and not at all where it is off.

So beat looks every few seconds (`STATISTICS_EVERY`; one read of pg_stat_user_tables) for tables
of clarion's schema (and its partitions') that hold more than twice the live rows they held at
their last ANALYZE (and at least MIN_ROWS), and analyzes them, on a thread of its own. New
statistics invalidate every plan made on the table, in every connection, and each is made again
at the table's size now. A growing table is analyzed at each doubling, about log2(rows) times in
its life, so no plan runs on a table more than about twice the size it was made for. A table
that churns without growing (rows inserted and deleted, or updated) is autovacuum's alone:
analyzing it here every few seconds would only make every connection plan again.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from clarion.db.partitioning import SUFFIX

log = logging.getLogger(__name__)

MIN_ROWS = 1000  # live rows a table holds before beat refreshes its statistics at all
LOCK_TIMEOUT_MS = 1000  # an ANALYZE waits this long for a lock (a VACUUM running): next look

_GROWN = text(
    """
    SELECT s.schemaname, s.relname, greatest(c.reltuples, 0)::bigint, s.n_live_tup
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname IN (:schema, :partitions)
      AND s.n_live_tup >= greatest(2 * c.reltuples::bigint, :least)
    ORDER BY s.schemaname, s.relname
    """
)


@dataclass(frozen=True)
class Grown:
    """A table that holds more than twice the rows it held when its statistics were taken."""

    schema: str
    table: str
    rows_then: int  # at its last ANALYZE (0: never analyzed, or empty then)
    rows_now: int  # live rows, as the server's cumulative statistics count them


def grown(conn: Connection, schema: str, least: int = MIN_ROWS) -> list[Grown]:
    """The tables of `schema` (and of its partitions' schema) holding more than twice the live
    rows they held at their last ANALYZE, and at least `least`."""
    params = {"schema": schema, "partitions": schema + SUFFIX, "least": least}
    return [Grown(s, t, int(then), int(n)) for s, t, then, n in conn.execute(_GROWN, params)]


def analyze(conn: Connection, schema: str, table: str) -> None:
    """ANALYZE one table in the caller's transaction, waiting at most LOCK_TIMEOUT_MS for its lock
    (SET LOCAL: the pooled connection goes back without the setting)."""
    conn.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
    quoted = conn.dialect.identifier_preparer.quote
    conn.execute(text(f"ANALYZE {quoted(schema)}.{quoted(table)}"))


class Refresher:
    """Looks for grown tables and analyzes them on a thread of its own, one round at a time (a
    round still running when the next look comes is not doubled)."""

    def __init__(self, engine: Engine, schema: str) -> None:
        self.engine = engine
        self.schema = schema
        self._running: threading.Thread | None = None

    def look(self) -> list[str]:
        """The tables found grown, as schema.table (their ANALYZE started); [] while a round is
        running."""
        if self._running is not None and self._running.is_alive():
            return []
        with self.engine.connect() as conn:
            found = grown(conn, self.schema)
        if found:
            self._running = threading.Thread(
                target=self._refresh, args=(found,), name="clarion-statistics", daemon=True
            )
            self._running.start()
        return [f"{g.schema}.{g.table}" for g in found]

    def _refresh(self, found: list[Grown]) -> None:
        for g in found:
            table = f"{g.schema}.{g.table}"
            try:
                with self.engine.begin() as conn:
                    analyze(conn, g.schema, g.table)
            except Exception as exc:  # noqa: BLE001 - a lock held, no privilege: the next look
                log.warning(
                    "statistics not refreshed: %s",
                    exc,
                    extra={"action": "statistics_not_refreshed", "table": table},
                )
                continue
            log.info(
                "statistics refreshed",
                extra={
                    "action": "statistics_refreshed",
                    "table": table,
                    "rows_then": g.rows_then,
                    "rows_now": g.rows_now,
                },
            )
