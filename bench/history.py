"""A ledger with history: the hot statements on a ledger that has lived for months, against the
same statements on a fresh one, in one run.

    .venv/bin/python bench/history.py [--deliveries 2000000] [--batch 100] [--rounds 30]
        [--home /tmp/history-bench] [--chunk 250000] [--jobs 2] [--checkpoint]
        [--shared-buffers 6GB] [--keep]

Two ledgers on one server, the same statements on both through clarion's own functions
(db/ledger.py, db/claims.py, db/due.py, db/activity.py) and its engine (prepared statements, as a
worker runs them): a fresh one, and one that gets the history. Both start as a migrated ledger with a few thousand
deliveries of ordinary traffic, ANALYZEd while small (as autovacuum does early in a deployment's
life). Three phases, in each the two ledgers' rounds alternating (so the host's load drift falls on
both alike; the first phase, before the load, shows the A/A spread):

  before    both ledgers as they started
  stale     right after a bulk load of --deliveries rows of history (sent, delivered, opened,
            bounced, failed, suppressed; receipts for those that got one, inbox items, decisions,
            series), autovacuum off on the loaded tables so its ANALYZE cannot run first: the
            statistics are from before the load (migration 0027's per-table settings only help
            once autovacuum runs; this is the window before it). The run checks it: the tables'
            analyze and vacuum counts (manual and auto) and pg_class.reltuples are the same
            before the load and after the stale phase (it says so, or says STALE PHASE NOT
            STALE).
  analyzed  the same ledger after VACUUM (ANALYZE): what autovacuum leaves once it caught up

Per round: route (insert requests, resolve them, insert their deliveries claimed: the route
task's three statements in one transaction), claim (pending deliveries by key), mark sent
(mark_sent_many, the group commit of sends) over --batch rows each; tick (the due probe and both
lanes' takes: what a beat tick runs) per call; explain (one recipient's last 30 days, as `clarion
explain`) and the activity page (web/activity.py: its search by user id, by request id and by
event id, then the histories it shows) per request shown. Prints the median µs per row, the
ratios to fresh, and the plan of mark_sent_many in each phase.

The history is written straight from generate_series, oldest first, every table's row a function
of the request's number (no join of one growing table to another), in transactions of --chunk
requests on --jobs connections, with session_replication_role = replica in those transactions:
no per-row foreign-key check or trigger (the rows are consistent by construction), every index
and CHECK kept: 20 M deliveries and their rows in 39 min on this host under load
(bench/RESULTS.md). On its own server (--home, or .clarion/bench-history) the bench spaces
checkpoints (max_wal_size 8GB, checkpoint_timeout 30min) and sizes shared_buffers as for a
database server (--shared-buffers, a quarter of RAM; a restart) for all three phases; with
CLARION_DATABASE_URL it changes no server setting. --checkpoint: a CHECKPOINT after the load,
before the stale phase (statistics untouched), so that phase does not also pay the load's writes.
Fresh databases per run, dropped at the end (--keep keeps them).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from sqlalchemy import Connection, text

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("CLARION_WEBHOOK_SECRET", "bench-history-secret")

from bench.common import say, table, with_database  # noqa: E402
from clarion.db import activity, claims, ledger  # noqa: E402
from clarion.db.due import what_is_due  # noqa: E402
from clarion.db.engine import engine, migrate, one_off_engine  # noqa: E402

LANES = ("transactional", "activation")
HISTORY_TABLES = ("requests", "deliveries", "receipts", "inbox_items", "decisions", "series")
STEPS = (
    "route",
    "  insert requests",
    "  resolve",
    "  insert deliveries",
    "claim",
    "mark sent",
    "tick",
    "explain",
    "activity: user",
    "activity: request id",
    "activity: event id",
)

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


# One row per delivery of history, from g (the request's number, 1..n): everything a table of
# history needs is a function of g, so each table is written straight from generate_series in
# chunks of g, none reading another (no join of a growing table, no quadratic foreign-key plan).
# 4 of 5 requests get one channel (webhook), 1 of 5 two (webhook and email): the delivery ids are
# dbase + 2g (+ 1 for email).
def _delivery_rows(base: int, dbase: int) -> str:
    state = _state_case(f"(({base} + g) * 7 + length(c.channel))")
    return f"""(
        SELECT g, c.channel, 'u' || (g % :users) AS user_id, {base} + g AS request_id,
            {dbase} + 2 * g + c.k AS id,
            CASE WHEN g % 3 = 0 THEN 'digest' ELSE 'receipt' END AS type_key,
            'event:h' || g AS occurrence_key,
            CASE WHEN g % 4 = 0 THEN 'activation' ELSE 'transactional' END AS lane,
            now() - make_interval(secs => 15552000.0 * (:n - g) / :n) AS created_at,
            {state} AS state
        FROM generate_series(:lo, :hi) g
        CROSS JOIN (VALUES ('webhook', 0), ('email', 1)) AS c(channel, k)
        WHERE c.k = 0 OR g % 5 = 0) d"""


def history_statements(base: int, dbase: int) -> dict[str, str]:
    """The INSERT of each table of history for the requests numbered :lo..:hi of :n."""
    rows = _delivery_rows(base, dbase)
    sent = "d.state NOT IN ('failed', 'suppressed')"
    return {
        "requests": f"""
            INSERT INTO requests (user_id, id, type_key, occurrence_key, lane, template_version,
                variables, locale, state, created_at, routed_at) OVERRIDING SYSTEM VALUE
            SELECT 'u' || (g % :users), {base} + g,
                CASE WHEN g % 3 = 0 THEN 'digest' ELSE 'receipt' END, 'event:h' || g,
                CASE WHEN g % 4 = 0 THEN 'activation' ELSE 'transactional' END, 1,
                jsonb_build_object('order', g), 'en', 'routed',
                now() - make_interval(secs => 15552000.0 * (:n - g) / :n),
                now() - make_interval(secs => 15552000.0 * (:n - g) / :n)
            FROM generate_series(:lo, :hi) g""",
        "deliveries": f"""
            INSERT INTO deliveries (user_id, id, request_id, type_key, occurrence_key, channel,
                one_platform, lane, state, not_before, attempts, platform, provider_message_id,
                created_at, updated_at, sent_at) OVERRIDING SYSTEM VALUE
            SELECT d.user_id, d.id, d.request_id, d.type_key, d.occurrence_key, d.channel, false,
                d.lane, d.state, d.created_at, 1,
                CASE WHEN {sent} THEN d.channel END,
                CASE WHEN {sent} THEN 'm' || d.channel || d.request_id END,
                d.created_at, d.created_at + interval '2 seconds',
                CASE WHEN {sent} THEN d.created_at + interval '1 second' END
            FROM {rows}""",
        "receipts": f"""
            INSERT INTO receipts (user_id, delivery_id, channel, event, provider_message_id,
                outcome, occurred_at, received_at, platform)
            SELECT d.user_id, d.id, d.channel, d.state, 'm' || d.channel || d.request_id,
                'applied', d.created_at + interval '4 seconds', d.created_at + interval '5 seconds',
                d.channel
            FROM {rows} WHERE d.state IN ('delivered', 'opened', 'bounced')""",
        "inbox_items": f"""
            INSERT INTO inbox_items (user_id, delivery_id, type_key, title, rev, created_rev,
                wxid, created_at, updated_at, read_at)
            SELECT d.user_id, d.id, d.type_key, 'Your order', d.id, d.id, 1, d.created_at,
                d.created_at,
                CASE WHEN d.id % 3 = 0 THEN NULL ELSE d.created_at + interval '1 hour' END
            FROM {rows} WHERE d.channel = 'webhook' AND d.id % 4 = 0""",
        "decisions": f"""
            INSERT INTO decisions (user_id, request_id, delivery_id, channel, gate, outcome,
                reason, detail, decided_at)
            SELECT d.user_id, d.request_id, d.id, d.channel, 'suppression', 'suppress',
                'bounced', '', d.created_at
            FROM {rows} WHERE d.state = 'suppressed'""",
    }


SERIES = """
    INSERT INTO series (user_id, series_key, type_key, anchor_local, zone, every,
        calendar_policy, variables, state, next_n, next_due_at, created_at, updated_at)
    SELECT 'u' || g, 'weekly', 'digest', '2026-01-05 09:00', 'UTC', '7d', 'send', '{}',
        CASE WHEN g % 10 = 0 THEN 'ended' ELSE 'active' END, 20,
        CASE WHEN g % 10 = 0 THEN NULL ELSE now() + make_interval(days => 1 + g % 6) END,
        now() - interval '180 days', now()
    FROM generate_series(0, :users - 1) g WHERE g % 2 = 0
    ON CONFLICT DO NOTHING"""


def load_history(
    url: str, deliveries: int, users: int, chunk: int = 500_000, jobs: int = 2
) -> tuple[dict[str, float], int]:
    """Write `deliveries` rows of finished history (and what goes with them) for `users`
    recipients, oldest first, in transactions of `chunk` requests on `jobs` connections at once;
    returns the seconds spent per table (summed over the connections) and the id of request 0.

    Requests = deliveries / 1.2, ids above the fresh phase's (the identities are moved past them
    after). Each chunk's transaction runs with session_replication_role = replica: the foreign
    keys' and the triggers' per-row work is skipped (the rows are made consistent by
    construction: a chunk writes its requests before their deliveries, and the recipients exist),
    the constraints' CHECKs and every index are kept. Nothing here updates the statistics: no
    ANALYZE, no VACUUM, no index build (pg_class.reltuples stays the fresh phase's)."""
    n_requests = int(deliveries / 1.2)
    with engine(url).begin() as conn:
        base = conn.execute(text("SELECT coalesce(max(id), 0) + 1000 FROM requests")).scalar_one()
        dbase = conn.execute(
            text("SELECT coalesce(max(id), 0) + 1000 FROM deliveries")
        ).scalar_one()
    statements = history_statements(base, dbase)
    took: dict[str, float] = dict.fromkeys([*statements, "series"], 0.0)
    chunks = [(lo, min(lo + chunk - 1, n_requests)) for lo in range(1, n_requests + 1, chunk)]
    done = [0]
    lock = threading.Lock()
    began = time.perf_counter()

    def write(lo: int, hi: int) -> None:
        params = {"n": n_requests, "users": users, "lo": lo, "hi": hi}
        with engine(url).begin() as conn:
            conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(text("SET LOCAL synchronous_commit = off"))
            for name, sql in statements.items():
                start = time.perf_counter()
                conn.execute(text(sql), params)
                with lock:
                    took[name] += time.perf_counter() - start
        with lock:
            done[0] += hi - lo + 1
            say(
                f"  {done[0]:,} of {n_requests:,} requests of history written, "
                f"{time.perf_counter() - began:.0f} s"
            )

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for future in [pool.submit(write, lo, hi) for lo, hi in chunks]:
            future.result()
    start = time.perf_counter()
    with engine(url).begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text(SERIES), {"users": users})
        for name, top in (
            ("requests", base + n_requests + 1),
            ("deliveries", dbase + 2 * n_requests + 2),
        ):
            conn.execute(text(f"ALTER TABLE {name} ALTER COLUMN id RESTART WITH {top}"))
    took["series"] = time.perf_counter() - start
    return took, base


class Traffic:
    """The statements of ordinary traffic, as the route task, a deliver task and the tick run them."""

    def __init__(self, url: str, users: int, batch: int) -> None:
        self.url, self.users, self.batch = url, users, batch
        self.seq = 0
        # (user id, request id, event id) of the traffic's requests
        self.made: list[tuple[str, int, str]] = []
        self.history: tuple[int, int] | None = None  # (base, n) of the history's request ids
        self.split: dict[str, float] = {}  # the last route's statements, seconds each

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
        began = time.perf_counter()
        ids = ledger.insert_requests(conn, rows, now=now, due_at=now + timedelta(seconds=30))
        self.split["  insert requests"] = time.perf_counter() - began
        self.made.extend(
            (r.user_id, i, r.occurrence_key.removeprefix("event:"))
            for r, (i, _) in zip(rows, ids, strict=True)
        )
        began = time.perf_counter()
        resolved = ledger.resolve_requests(
            conn, [(r.user_id, i) for r, (i, _) in zip(rows, ids, strict=True)], now=now
        )
        self.split["  resolve"] = time.perf_counter() - began
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
            began = time.perf_counter()
            made = ledger.insert_deliveries(
                conn, news, now=now, due_at=now + timedelta(seconds=30), claim=claim
            )
        self.split["  insert deliveries"] = time.perf_counter() - began  # and the commit
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
                self._some_request()[0],
                type_key=None,
                since=datetime.now(UTC) - timedelta(days=30),
                limit=50,
            )
        return len(rows)

    def _some_request(self) -> tuple[str, int, str]:
        """A request (user id, id, event id) to look up: one of the history's once loaded, else
        one of the traffic's."""
        if self.history is None:
            return random.choice(self.made)
        base, n = self.history
        g = random.randint(1, n)
        return f"u{g % self.users}", base + g, f"h{g}"

    def _page(self, **search: object) -> int:
        """The activity page's search and what it shows of each match (web/activity.py)."""
        with engine(self.url).connect() as conn:
            matches = activity.find_users(conn, **search)  # type: ignore[arg-type]
            shown = 0
            for match in matches:
                if match.request_ids:
                    found = activity.requests_by_id(conn, match.user_id, list(match.request_ids))
                else:
                    found = activity.requests_of(
                        conn,
                        match.user_id,
                        type_key=None,
                        since=datetime.now(UTC) - timedelta(days=90),
                        limit=50,
                    )
                shown += len(found)
        return shown

    def by_user(self) -> int:
        return self._page(user_id=self._some_request()[0])

    def by_request_id(self) -> int:
        shown = self._page(request_id=self._some_request()[1])
        assert shown == 1, shown
        return shown

    def by_event_id(self) -> int:
        shown = self._page(event_id=self._some_request()[2])
        assert shown == 1, shown
        return shown


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    began = time.perf_counter()
    out = fn()
    return time.perf_counter() - began, out


def one_round(traffic: Traffic, samples: dict[str, list[float]]) -> None:
    """One round of every step, its times appended to `samples` (µs per row, see measure)."""
    b = traffic.batch
    token = str(uuid.uuid4())
    took, routed = timed(partial(traffic.route, token))
    samples["route"].append(took / b)
    for step, seconds in traffic.split.items():
        samples[step].append(seconds / b)
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
    took, n = timed(traffic.explain)
    samples["explain"].append(took / max(1, n))  # type: ignore[call-overload]
    took, n = timed(traffic.by_user)
    samples["activity: user"].append(took / max(1, n))  # type: ignore[call-overload]
    samples["activity: request id"].append(timed(traffic.by_request_id)[0])
    samples["activity: event id"].append(timed(traffic.by_event_id)[0])


def measure(*traffics: Traffic, rounds: int) -> list[dict[str, float]]:
    """Median µs per row of each step over `rounds` rounds, per ledger (tick: per call; explain
    and the activity page: per request shown). With two ledgers their rounds alternate (and which
    goes first alternates too), so a change in the host's load falls on both alike."""
    samples: list[dict[str, list[float]]] = [{step: [] for step in STEPS} for _ in traffics]
    for r in range(rounds):
        order = range(len(traffics)) if r % 2 == 0 else reversed(range(len(traffics)))
        for i in order:
            one_round(traffics[i], samples[i])
    return [{step: statistics.median(v) * 1e6 for step, v in got.items()} for got in samples]


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


def blocks(url: str) -> tuple[int, int]:
    """(blocks read from outside shared_buffers, blocks found in it) by the database so far."""
    time.sleep(1.5)  # backends report their counts at most once a second
    with engine(url).connect() as conn:
        read, hit = conn.execute(
            text(
                "SELECT blks_read, blks_hit FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
        ).one()
    return int(read), int(hit)


def measured(fresh: Traffic, traffic: Traffic, rounds: int, url: str) -> list[dict[str, float]]:
    """measure() of both ledgers, and the history database's block reads during it, said."""
    before = blocks(url)
    got = measure(fresh, traffic, rounds=rounds)
    read, hit = (b - a for a, b in zip(before, blocks(url), strict=True))
    say(f"  history database: {read:,} blocks read outside shared_buffers, {hit:,} hit")
    return got


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


def statistics_taken(url: str) -> dict[str, tuple[int, int, float]]:
    """Per history table: how many times analyzed and vacuumed (by hand or autovacuum), and
    pg_class.reltuples: the load must change none of them for the stale phase to be stale."""
    with engine(url).connect() as conn:
        rows = conn.execute(
            text(
                "SELECT s.relname, s.analyze_count + s.autoanalyze_count, "
                "s.vacuum_count + s.autovacuum_count, c.reltuples FROM pg_stat_user_tables s "
                "JOIN pg_class c ON c.oid = s.relid WHERE s.relname = ANY(:t)"
            ),
            {"t": list(HISTORY_TABLES)},
        )
        return {r[0]: (int(r[1]), int(r[2]), float(r[3])) for r in rows}


def autovacuum(url: str, on: bool) -> None:
    with engine(url).begin() as conn:
        for name in HISTORY_TABLES:
            if on:
                conn.execute(text(f"ALTER TABLE {name} RESET (autovacuum_enabled)"))
            else:
                conn.execute(text(f"ALTER TABLE {name} SET (autovacuum_enabled = false)"))


def quarter_of_memory() -> str:
    """shared_buffers as the usual advice sizes it for a database server: a quarter of RAM."""
    return f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') // 4 // 2**20}MB"


def size_server(admin_url: str, pgdata: Path, shared_buffers: str | None) -> str:
    """Checkpoints spaced for a load of tens of GB, and shared_buffers set (a restart) on our own
    embedded server; returns the shared_buffers it runs with."""
    admin = one_off_engine(admin_url)
    with admin.connect() as conn:
        conn.execute(text("ALTER SYSTEM SET max_wal_size = '8GB'"))
        conn.execute(text("ALTER SYSTEM SET checkpoint_timeout = '30min'"))
        conn.execute(text("SELECT pg_reload_conf()"))
        if shared_buffers:
            conn.execute(text(f"ALTER SYSTEM SET shared_buffers = '{shared_buffers}'"))
        running = conn.execute(text("SHOW shared_buffers")).scalar_one()
    if shared_buffers and running != shared_buffers:
        pg_ctl(pgdata, "-w", "-m", "fast", "restart")
        with admin.connect() as conn:
            running = conn.execute(text("SHOW shared_buffers")).scalar_one()
    return str(running)


def pg_ctl(pgdata: Path, *args: str) -> None:
    import pgserver

    user = "pgserver" if os.geteuid() == 0 else None  # pgserver runs the server as it when root
    pgserver.pg_ctl(list(args), pgdata=pgdata, user=user)  # type: ignore[attr-defined]


def new_ledger(url: str, users: int, batch: int) -> Traffic:
    """A migrated ledger with `users` recipients and a few thousand deliveries of ordinary
    traffic, ANALYZEd while small with a backlog pending (as autovacuum does early in a
    deployment's life), the backlog then sent."""
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
    traffic = Traffic(url, users, batch)
    measure(traffic, rounds=3)  # a few hundred rows of ordinary traffic
    backlog = [traffic.route(None) for _ in range(20)]
    with engine(url).begin() as conn:
        conn.execute(text("ANALYZE"))
    for keys in backlog:
        token = str(uuid.uuid4())
        traffic.claim(keys, token)
        traffic.mark_sent(keys, token)
    return traffic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deliveries", type=int, default=2_000_000, help="history rows (2M)")
    parser.add_argument("--users", type=int, default=None, help="recipients (deliveries / 50)")
    parser.add_argument("--batch", type=int, default=100, help="rows per statement (100)")
    parser.add_argument("--rounds", type=int, default=30, help="rounds per phase (30)")
    parser.add_argument("--keep", action="store_true", help="keep the databases")
    parser.add_argument("--chunk", type=int, default=250_000, help="requests per load transaction")
    parser.add_argument("--jobs", type=int, default=2, help="connections loading at once (2)")
    parser.add_argument(
        "--checkpoint",
        action="store_true",
        help="CHECKPOINT after the load, before the stale phase (no statistics change): the "
        "stale phase then measures the statements without the load's pending writes",
    )
    parser.add_argument(
        "--shared-buffers",
        default=quarter_of_memory(),
        help="our own server's shared_buffers, set before the run (a quarter of RAM: %(default)s;"
        " '' keeps the server's own)",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=ROOT / ".clarion" / "bench-history",
        help="the embedded services' folder (.clarion/bench-history)",
    )
    args = parser.parse_args(argv)
    users = args.users or max(1000, args.deliveries // 50)
    random.seed(29)
    own = not os.environ.get("CLARION_DATABASE_URL")
    handle = None
    if own:
        from clarion.db.embedded import ensure_running

        handle = ensure_running(args.home.resolve())
        admin_url = handle.database_url
        buffers = size_server(admin_url, args.home.resolve() / "pg", args.shared_buffers)
    else:
        admin_url = os.environ["CLARION_DATABASE_URL"]
        with one_off_engine(admin_url).connect() as conn:
            buffers = conn.execute(text("SHOW shared_buffers")).scalar_one()
    tag = uuid.uuid4().hex[:8]
    names = {"history": f"clarion_bench_history_{tag}", "fresh": f"clarion_bench_fresh_{tag}"}
    url, fresh_url = (with_database(admin_url, n) for n in names.values())
    admin = one_off_engine(admin_url)
    results: dict[str, list[dict[str, float]]] = {}
    plans: dict[str, str] = {}
    try:
        with admin.connect() as conn:
            for name in names.values():
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        say(f"shared_buffers {buffers}; a fresh ledger beside the one that gets the history")
        traffic, fresh = (
            new_ledger(url, users, args.batch),
            new_ledger(fresh_url, users, args.batch),
        )
        results["before the load"] = measured(fresh, traffic, args.rounds, url)
        plans["fresh"] = mark_sent_plan(fresh_url, fresh)
        say(f"before the load: {stats_state(url)}")

        autovacuum(url, on=False)  # waits for a running autovacuum of these tables to end
        time.sleep(2)  # its counts reported
        before = statistics_taken(url)
        began = time.perf_counter()
        took, base = load_history(url, args.deliveries, users, chunk=args.chunk, jobs=args.jobs)
        traffic.history = base, int(args.deliveries / 1.2)
        say(
            f"history of {args.deliveries:,} deliveries for {users:,} recipients loaded in "
            f"{time.perf_counter() - began:.0f} s ("
            + ", ".join(f"{k} {v:.0f} s" for k, v in took.items())
            + ")"
        )
        if args.checkpoint:
            began = time.perf_counter()
            with admin.connect() as conn:
                conn.execute(text("CHECKPOINT"))
            say(f"CHECKPOINT after the load: {time.perf_counter() - began:.0f} s")
        say(f"stale: {stats_state(url)}")
        results["stale"] = measured(fresh, traffic, args.rounds, url)
        plans["stale"] = mark_sent_plan(url, traffic)
        after = statistics_taken(url)
        if after != before:  # said, not raised: the load's figures are still worth printing
            say(f"STALE PHASE NOT STALE: statistics taken during it: {before} -> {after}")
        else:
            say(
                "stale phase checked: no ANALYZE or VACUUM (by hand or autovacuum) of "
                + ", ".join(HISTORY_TABLES)
                + " from before the load to the end of the stale phase (pg_stat_user_tables), "
                "pg_class.reltuples still from before the load: "
                + ", ".join(f"{t} {int(after[t][2]):,}" for t in HISTORY_TABLES)
            )
        autovacuum(url, on=True)

        began = time.perf_counter()
        with engine(url).connect() as conn:  # what autovacuum does once it catches up
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                text(f"VACUUM (ANALYZE) {', '.join(HISTORY_TABLES)}")
            )
            conn.execute(text("ANALYZE"))
        say(f"analyzed: {stats_state(url)} (VACUUM ANALYZE {time.perf_counter() - began:.0f} s)")
        results["analyzed"] = measured(fresh, traffic, args.rounds, url)
        plans["analyzed"] = mark_sent_plan(url, traffic)
        with engine(url).connect() as conn:
            counts = {
                t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
                for t in ("requests", "deliveries", "receipts", "inbox_items", "series")
            }
    finally:
        for u in (url, fresh_url):
            engine(u).dispose()
        if not args.keep:
            with admin.connect() as conn:
                for name in names.values():
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if handle is not None:
            handle.stop()
            pgdata = args.home.resolve() / "pg"
            if handle.process is not None and (pgdata / "postmaster.pid").exists():
                pg_ctl(pgdata, "-w", "-m", "fast", "stop")  # pgserver lost a restarted server
    say(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; shared_buffers {buffers}; rows: "
        + ", ".join(f"{t} {n:,}" for t, n in counts.items())
        + f"; {args.batch} rows per statement, {args.rounds} rounds per phase, the fresh "
        "ledger's rounds alternating with the history's; median µs per row (tick: per call; "
        "explain, activity: per request shown)"
    )
    rows = []
    for step in STEPS:
        row = [step]
        for phase in ("before the load", "stale", "analyzed"):
            f, h = (got[step] for got in results[phase])
            row += [f"{f:.0f}", f"{h:.0f}", f"{h / f:.2f}"]
        rows.append(row)
    heads = ["step"]
    for phase in ("before", "stale", "analyzed"):
        heads += ["fresh", phase, "ratio"]
    say(table(heads, rows))
    for phase, plan in plans.items():
        say(f"mark_sent_many, {phase}: {plan}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
