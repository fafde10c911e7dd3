"""A ledger with history: the hot statements on a ledger that has lived for months, against the
same statements on a fresh one, in one run.

    .venv/bin/python bench/history.py [--deliveries 2000000] [--batch 100] [--rounds 30]

Three phases on one database, the same statements through clarion's own functions (db/ledger.py,
db/claims.py, db/due.py, db/activity.py) and its engine (prepared statements, as a worker runs them):

  fresh     a migrated ledger with a few thousand deliveries of ordinary traffic, ANALYZEd while
            small (as autovacuum does early in a deployment's life)
  stale     right after a bulk load of --deliveries rows of history (sent, delivered, opened,
            bounced, failed, suppressed; receipts for those that got one, inbox items, decisions,
            series), autovacuum off on the loaded tables so its ANALYZE cannot run first: the
            statistics are the fresh phase's (migration 0027's per-table settings only help once
            autovacuum runs; this is the window before it)
  analyzed  the same ledger after ANALYZE

Per round: route (insert requests, resolve them, insert their deliveries claimed: the route
task's three statements in one transaction), claim (pending deliveries by key), mark sent
(mark_sent_many, the group commit of sends) over --batch rows each; tick (the due probe and both
lanes' takes: what a beat tick runs) and explain (one recipient's requests with their history)
per call. Prints the median µs per row (tick and explain: per call), the ratios to fresh, and the
plan of mark_sent_many in each phase.

The history is written by INSERT … SELECT generate_series: about 1 M deliveries a minute here.
Services: CLARION_DATABASE_URL, else the embedded PostgreSQL in .clarion/bench-history. A fresh
database per run, dropped at the end (--keep keeps it).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from sqlalchemy import Connection, text

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("CLARION_WEBHOOK_SECRET", "bench-history-secret")

from bench.common import say, start_services, table, with_database  # noqa: E402
from clarion.db import activity, claims, ledger  # noqa: E402
from clarion.db.due import what_is_due  # noqa: E402
from clarion.db.engine import engine, migrate, one_off_engine  # noqa: E402

LANES = ("transactional", "activation")
HISTORY_TABLES = ("requests", "deliveries", "receipts", "inbox_items", "decisions", "series")
STEPS = ("route", "claim", "mark sent", "tick", "explain")
PER_CALL = {"tick", "explain"}

# The finished states of history and their shares (per 100 deliveries).
STATES = (
    ("delivered", 45),
    ("sent", 25),
    ("opened", 15),
    ("bounced", 5),
    ("failed", 5),
    ("suppressed", 5),
)


def _state_case(column: str) -> str:
    """A CASE over `column` % 100 giving STATES in their shares."""
    arms, upto = [], 0
    for state, share in STATES:
        upto += share
        arms.append(f"WHEN {column} % 100 < {upto} THEN '{state}'")
    return "CASE " + " ".join(arms) + " END"


def load_history(url: str, deliveries: int, users: int) -> dict[str, float]:
    """Write `deliveries` rows of finished history (and what goes with them) for `users`
    recipients; returns seconds per table. Requests: 4 of 5 get one channel (webhook), 1 of 5
    two (webhook and email), so requests = deliveries / 1.2 (ids above the fresh phase's, the
    identity moved past them after)."""
    n_requests = int(deliveries / 1.2)
    took: dict[str, float] = {}
    with engine(url).begin() as conn:
        base = conn.execute(text("SELECT coalesce(max(id), 0) + 1000 FROM requests")).scalar_one()
        dbase = conn.execute(
            text("SELECT coalesce(max(id), 0) + 1000 FROM deliveries")
        ).scalar_one()
    statements = {
        "requests": f"""
            INSERT INTO requests (user_id, id, type_key, occurrence_key, lane, template_version,
                variables, locale, state, created_at, routed_at) OVERRIDING SYSTEM VALUE
            SELECT 'u' || (g % :users), {base} + g, CASE WHEN g % 3 = 0 THEN 'digest' ELSE 'receipt' END,
                'event:h' || g, CASE WHEN g % 4 = 0 THEN 'activation' ELSE 'transactional' END, 1,
                jsonb_build_object('order', g), 'en', 'routed',
                now() - make_interval(secs => 15552000.0 * (:n - g) / :n),
                now() - make_interval(secs => 15552000.0 * (:n - g) / :n)
            FROM generate_series(1, :n) g""",
        "deliveries": f"""
            INSERT INTO deliveries (user_id, id, request_id, type_key, occurrence_key, channel,
                one_platform, lane, state, not_before, attempts, platform, provider_message_id,
                created_at, updated_at, sent_at) OVERRIDING SYSTEM VALUE
            SELECT r.user_id, {dbase} + row_number() OVER (), r.id, r.type_key, r.occurrence_key,
                c.channel, false, r.lane, s.state, r.created_at, 1,
                CASE WHEN s.state NOT IN ('failed', 'suppressed') THEN c.channel END,
                CASE WHEN s.state NOT IN ('failed', 'suppressed') THEN 'm' || c.channel || r.id END,
                r.created_at, r.created_at + interval '2 seconds',
                CASE WHEN s.state NOT IN ('failed', 'suppressed') THEN r.created_at + interval '1 second' END
            FROM requests r
            CROSS JOIN LATERAL (VALUES ('webhook'), ('email')) AS c(channel)
            CROSS JOIN LATERAL (SELECT {_state_case("(r.id * 7 + length(c.channel))")} AS state) s
            WHERE r.id >= {base} AND (c.channel = 'webhook' OR r.id % 5 = 0)""",
        "receipts": f"""
            INSERT INTO receipts (user_id, delivery_id, channel, event, provider_message_id,
                outcome, occurred_at, received_at, platform)
            SELECT user_id, id, channel, state, provider_message_id, 'applied',
                sent_at + interval '3 seconds', sent_at + interval '4 seconds', platform
            FROM deliveries WHERE id >= {dbase} AND state IN ('delivered', 'opened', 'bounced')""",
        "inbox_items": f"""
            INSERT INTO inbox_items (user_id, delivery_id, type_key, title, rev, created_rev,
                wxid, created_at, updated_at, read_at)
            SELECT user_id, id, type_key, 'Your order', id, id, 1, created_at, created_at,
                CASE WHEN id % 3 = 0 THEN NULL ELSE created_at + interval '1 hour' END
            FROM deliveries WHERE id >= {dbase} AND channel = 'webhook' AND id % 4 = 0""",
        "decisions": f"""
            INSERT INTO decisions (user_id, request_id, delivery_id, channel, gate, outcome,
                reason, detail, decided_at)
            SELECT user_id, request_id, id, channel, 'suppression', 'suppress', 'bounced', '',
                created_at
            FROM deliveries WHERE id >= {dbase} AND state = 'suppressed'""",
        "series": """
            INSERT INTO series (user_id, series_key, type_key, anchor_local, zone, every,
                calendar_policy, variables, state, next_n, next_due_at, created_at, updated_at)
            SELECT 'u' || g, 'weekly', 'digest', '2026-01-05 09:00', 'UTC', '7d', 'send', '{}',
                CASE WHEN g % 10 = 0 THEN 'ended' ELSE 'active' END, 20,
                CASE WHEN g % 10 = 0 THEN NULL ELSE now() + make_interval(days => 1 + g % 6) END,
                now() - interval '180 days', now()
            FROM generate_series(0, :users - 1) g WHERE g % 2 = 0
            ON CONFLICT DO NOTHING""",
    }
    for name, sql in statements.items():
        began = time.perf_counter()
        with engine(url).begin() as conn:
            conn.execute(text(sql), {"n": n_requests, "users": users})
        took[name] = time.perf_counter() - began
    with engine(url).begin() as conn:
        for name in ("requests", "deliveries"):
            top = conn.execute(text(f"SELECT max(id) + 1 FROM {name}")).scalar_one()
            conn.execute(text(f"ALTER TABLE {name} ALTER COLUMN id RESTART WITH {top}"))
    return took


class Traffic:
    """The statements of ordinary traffic, as the route task, a deliver task and the tick run them."""

    def __init__(self, url: str, users: int, batch: int) -> None:
        self.url, self.users, self.batch = url, users, batch
        self.seq = 0

    def _requests(self, conn: Connection, now: datetime) -> list[ledger.NewDelivery]:
        rows = []
        for _ in range(self.batch):
            self.seq += 1
            user = f"u{random.randrange(self.users)}"
            rows.append(
                ledger.NewRequest(
                    user, "receipt", f"event:t{uuid.uuid4().hex}", "transactional", 1, {"o": 1}
                )
            )
        ids = ledger.insert_requests(conn, rows, now=now, due_at=now + timedelta(seconds=30))
        resolved = ledger.resolve_requests(
            conn, [(r.user_id, i) for r, (i, _) in zip(rows, ids, strict=True)], now=now
        )
        return [
            ledger.NewDelivery(
                r.user_id, r.id, r.type_key, r.occurrence_key, "webhook", False, r.lane
            )
            for r in resolved
        ]

    def route(self, token: str | None) -> list[tuple[str, int]]:
        """The route task's statements; deliveries inserted claimed under `token` (or pending)."""
        now = datetime.now(UTC)
        with engine(self.url).begin() as conn:
            news = self._requests(conn, now)
            claim = (token, 60.0) if token else None
            made = ledger.insert_deliveries(
                conn, news, now=now, due_at=now + timedelta(seconds=30), claim=claim
            )
        return [(d.user_id, d.id) for d in made]

    def claim(self, keys: list[tuple[str, int]], token: str) -> int:
        with engine(self.url).begin() as conn:
            got = claims.claim_deliveries(
                conn, keys, token=token, now=datetime.now(UTC), lease=60.0, max_attempts=5
            )
        return len(got)

    def mark_sent(self, keys: list[tuple[str, int]], token: str) -> int:
        now = datetime.now(UTC)
        marks = [claims.SentMark(k, "webhook", f"m{k[1]}", now) for k in keys]
        with engine(self.url).begin() as conn:
            return len(claims.mark_sent_many(conn, marks, token=token))

    def tick(self) -> None:
        now = datetime.now(UTC)
        with engine(self.url).begin() as conn:
            what_is_due(conn, now=now, lanes=LANES)
            for lane in LANES:
                budget = {"lane": lane, "now": now, "again": 30.0, "cap": 300.0, "limit": 5000}
                ledger.take_due_requests(conn, **budget)  # type: ignore[arg-type]
                claims.take_due_deliveries(conn, **budget)  # type: ignore[arg-type]

    def explain(self) -> int:
        with engine(self.url).connect() as conn:
            rows = activity.requests_of(
                conn,
                f"u{random.randrange(self.users)}",
                type_key=None,
                since=datetime.now(UTC) - timedelta(days=30),
                limit=50,
            )
        return len(rows)


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


def measure(traffic: Traffic, rounds: int) -> dict[str, float]:
    """Median µs per row (tick, explain: per call) of each step over `rounds` rounds."""
    samples: dict[str, list[float]] = {step: [] for step in STEPS}
    b = traffic.batch
    for _ in range(rounds):
        token = str(uuid.uuid4())
        took, routed = timed(partial(traffic.route, token))
        samples["route"].append(took / b)
        pending = traffic.route(None)
        token2 = str(uuid.uuid4())
        took, n = timed(partial(traffic.claim, pending, token2))
        assert n == len(pending) == b, (n, len(pending))
        samples["claim"].append(took / b)
        took, n = timed(partial(traffic.mark_sent, routed, token))  # type: ignore[arg-type]
        assert n == b, n
        samples["mark sent"].append(took / b)
        traffic.mark_sent(pending, token2)
        samples["tick"].append(timed(traffic.tick)[0])
        samples["explain"].append(timed(traffic.explain)[0])
    return {step: statistics.median(v) * 1e6 for step, v in samples.items()}


def mark_sent_plan(url: str, traffic: Traffic) -> str:
    """mark_sent_many's plan (EXPLAIN ANALYZE, rolled back) for --batch claimed rows: the nodes'
    first lines, the scan of deliveries with its buffers."""
    token = str(uuid.uuid4())
    keys = traffic.route(token)
    now = datetime.now(UTC)
    params = {
        "users": [k[0] for k in keys],
        "ids": [k[1] for k in keys],
        "platforms": ["webhook"] * len(keys),
        "message_ids": [f"m{k[1]}" for k in keys],
        "sent_at": [now] * len(keys),
        "token": token,
    }
    sql = "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) " + str(claims._MARK_SENT_MANY.text)
    with engine(url).connect() as conn, conn.begin() as tx:
        lines = [r[0] for r in conn.execute(text(sql), params)]
        tx.rollback()
    traffic.mark_sent(keys, token)
    keep = [
        line.strip()
        for line in lines
        if "Scan" in line or "Join" in line or "Nested" in line or "Buffers" in line
    ]
    return "; ".join(keep[:6])


def stats_state(url: str) -> str:
    with engine(url).connect() as conn:
        row = conn.execute(
            text(
                "SELECT c.reltuples::bigint, s.n_live_tup, s.n_mod_since_analyze, "
                "coalesce(s.last_analyze, s.last_autoanalyze) FROM pg_class c "
                "JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE c.oid = 'deliveries'::regclass"
            )
        ).one()
    return (
        f"deliveries: reltuples {row[0]:,}, live {row[1]:,}, "
        f"changed since analyze {row[2]:,}, analyzed {row[3]:%H:%M:%S}"
        if row[3]
        else f"deliveries: reltuples {row[0]:,}, never analyzed"
    )


def autovacuum(url: str, on: bool) -> None:
    with engine(url).begin() as conn:
        for name in HISTORY_TABLES:
            if on:
                conn.execute(text(f"ALTER TABLE {name} RESET (autovacuum_enabled)"))
            else:
                conn.execute(text(f"ALTER TABLE {name} SET (autovacuum_enabled = false)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deliveries", type=int, default=2_000_000, help="history rows (2M)")
    parser.add_argument("--users", type=int, default=None, help="recipients (deliveries / 50)")
    parser.add_argument("--batch", type=int, default=100, help="rows per statement (100)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per phase (30)")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args(argv)
    users = args.users or max(1000, args.deliveries // 50)
    random.seed(29)
    admin_url, handle = start_services("history")
    name = f"clarion_bench_history_{uuid.uuid4().hex[:8]}"
    url = with_database(admin_url, name)
    admin = one_off_engine(admin_url)
    results: dict[str, dict[str, float]] = {}
    plans: dict[str, str] = {}
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        migrate(url)
        with engine(url).begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO recipients (user_id, timezone, addresses, created_at, updated_at) "
                    "SELECT 'u' || g, 'UTC', '{\"webhook\": \"https://example.test/h\"}', now(), now() "
                    "FROM generate_series(0, :n - 1) g"
                ),
                {"n": users},
            )
        traffic = Traffic(url, users, args.batch)
        measure(traffic, 3)  # a few hundred rows of ordinary traffic
        backlog = [traffic.route(None) for _ in range(20)]
        with engine(url).begin() as conn:
            conn.execute(text("ANALYZE"))  # analyzed while small, a backlog pending
        for keys in backlog:
            token = str(uuid.uuid4())
            traffic.claim(keys, token)
            traffic.mark_sent(keys, token)
        results["fresh"] = measure(traffic, args.rounds)
        plans["fresh"] = mark_sent_plan(url, traffic)
        say(f"fresh: {stats_state(url)}")

        autovacuum(url, on=False)
        began = time.perf_counter()
        took = load_history(url, args.deliveries, users)
        say(
            f"history of {args.deliveries:,} deliveries for {users:,} recipients loaded in "
            f"{time.perf_counter() - began:.0f} s ("
            + ", ".join(f"{k} {v:.0f} s" for k, v in took.items())
            + ")"
        )
        say(f"stale: {stats_state(url)}")
        results["stale"] = measure(traffic, args.rounds)
        plans["stale"] = mark_sent_plan(url, traffic)
        autovacuum(url, on=True)

        with engine(url).begin() as conn:
            conn.execute(text("ANALYZE"))
        say(f"analyzed: {stats_state(url)}")
        results["analyzed"] = measure(traffic, args.rounds)
        plans["analyzed"] = mark_sent_plan(url, traffic)
        with engine(url).connect() as conn:
            counts = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in ("requests", "deliveries", "receipts", "inbox_items", "series")
            }
    finally:
        engine(url).dispose()
        if not args.keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if handle is not None:
            handle.stop()
    say(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; rows: "
        + ", ".join(f"{t} {n:,}" for t, n in counts.items())
        + f"; {args.batch} rows per statement, {args.rounds} rounds; median µs per row "
        "(tick, explain: per call)"
    )
    fresh = results["fresh"]
    rows = [
        [
            step,
            f"{fresh[step]:.0f}",
            f"{results['stale'][step]:.0f}",
            f"{results['stale'][step] / fresh[step]:.2f}",
            f"{results['analyzed'][step]:.0f}",
            f"{results['analyzed'][step] / fresh[step]:.2f}",
        ]
        for step in STEPS
    ]
    say(table(["step", "fresh", "stale", "stale/fresh", "analyzed", "analyzed/fresh"], rows))
    for phase, plan in plans.items():
        say(f"mark_sent_many, {phase}: {plan}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
