"""Tick: one beat tick with many active series and 1,000 due, against a scan of every series per tick.

    cd /work/main && .venv/bin/python bench/tick.py [--series 1000000] [--due 1000] [--reps 5]
        [--scan-reps N] [--partitions N]

Series rows go straight into the `series` table (INSERT ... SELECT FROM generate_series), over 10,000
recipients, in three stages (10 %, 30 % and 100 % of --series); the same --due series (spread through
the first stage; zones, intervals, types, calendar policies and recipients mixed, each due at its own
second of the hour before now) are due at every stage, every other one is due between an hour and 30
days from now. After each stage: VACUUM ANALYZE series (what autovacuum would do after a bulk load),
then, side by side at the same fixed `now`:

  clarion   tasks.series.fire_due_series(limit=--due): take_due_series (the partial index series_due,
            FOR UPDATE SKIP LOCKED, then joined with their recipients' calendars and locales) +
            plan_tick per series, then per batch (25, 50, then 100 series: tasks.series.FIRST_BATCH)
            one statement that advances them (found by ctid) and inserts their occurrence requests
            and decisions, sent pipelined (PostgreSQL writes one batch while Python plans the next).
  scan      what Celery's default and database schedulers do each tick: read every active series
            (the same columns), decide in Python which are due (next_due_at <= now, earliest first,
            at most --due), then the very same rest of fire_due_series for those (take_due_series
            is swapped for the scan; everything after it is clarion's code).

Each tick runs in a transaction that is rolled back, so the same series stay due (and with the
due-time memo emptied, as a real tick finds it for its due series); --reps repetitions, median.
Both paths must fire exactly --due series. At the largest stage the tick is also timed with
limit 100 / 300 / 1000 (it should grow with the number due), and taken apart by step, and EXPLAIN
(ANALYZE, BUFFERS) of the due query is printed.

With --partitions N the database is migrated with `migrate(partitions=N)` (hash partitions by
user_id, db/partitioning.py): the same tick over N partitions.

Services: CLARION_DATABASE_URL when set, else the embedded PostgreSQL in .clarion/bench-tick (started
here and stopped at the end if started here). A fresh database is created, migrated and dropped.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [
    p for p in sys.path if Path(p or ".").resolve() != HERE
]  # bench/ must not shadow packages
sys.path.insert(0, str(ROOT))

os.environ["CLARION_CATALOG"] = str(ROOT / "tests" / "catalog_gates.yaml")

from sqlalchemy import text  # noqa: E402

from clarion import settings  # noqa: E402

settings.reset()

import clarion.tasks.series as tseries  # noqa: E402
from bench.common import say, start_services, table, with_database  # noqa: E402
from clarion.db import meta  # noqa: E402
from clarion.db import series as store  # noqa: E402
from clarion.db.engine import dispose_all, engine, migrate, one_off_engine  # noqa: E402
from clarion.scheduling import recurrence, zones  # noqa: E402

RECIPIENTS = 10_000
ZONES = [
    "America/New_York",
    "America/Los_Angeles",
    "Europe/London",
    "Europe/Berlin",
    "Asia/Jerusalem",
    "Asia/Dubai",
    "Asia/Kolkata",
    "Asia/Tokyo",
    "Australia/Sydney",
    "UTC",
]
COUNTRIES = ["US", None, "GB", "DE", None, None, "IN", None, "AU", None]  # one per zone above
EVERY = ["1d", "1w", "2w", "1mo", "1d", "1w", "1wd", "1d"]
POLICIES = ["send", "skip", "next_working_day"]


def sql_array(values) -> str:
    return "ARRAY[" + ", ".join("NULL" if v is None else f"'{v}'" for v in values) + "]::text[]"


# --- data -------------------------------------------------------------------------------------


def insert_recipients(conn, now: datetime) -> None:
    conn.execute(
        text(
            f"""
        INSERT INTO recipients (user_id, timezone, country, org_id, addresses, created_at, updated_at)
        SELECT 'u' || lpad(g::text, 5, '0'), ({sql_array(ZONES)})[1 + g % {len(ZONES)}],
               ({sql_array(COUNTRIES)})[1 + g % {len(ZONES)}], 'org' || (g % 200), '{{}}'::jsonb, :now, :now
        FROM generate_series(0, {RECIPIENTS - 1}) g
        """
        ),
        {"now": now},
    )


def insert_series(
    conn, first: int, last: int, *, due_every: int, due_upto: int, now: datetime
) -> None:
    """Series first..last (1-based); g <= due_upto with g % due_every == 0 are due in the hour
    before now (each at its own second: as many anchors as due series), the others between 1 hour
    and 30 days after it. Occurrence 0 is at next_due_at (anchor_local is
    its wall time in the recipient's zone), so the tick's own arithmetic agrees with next_due_at."""
    conn.execute(
        text(
            f"""
        INSERT INTO series (user_id, series_key, type_key, anchor_local, zone, every, calendar_policy,
                            variables, state, next_n, next_due_at, created_at, updated_at)
        SELECT user_id, 'bench:' || g, type_key, due AT TIME ZONE zone, zone, every, policy,
               CASE WHEN type_key = 'tip' THEN '{{"n": 1}}'::jsonb ELSE '{{}}'::jsonb END,
               'active', 0, due, :now, :now
        FROM (
            SELECT g, 'u' || lpad((g % {RECIPIENTS})::text, 5, '0') AS user_id,
                   ({sql_array(ZONES)})[1 + (g % {RECIPIENTS}) % {len(ZONES)}] AS zone,
                   (ARRAY['weekly_one_on_one', 'stalled_plan', 'tip'])[1 + g % 3] AS type_key,
                   ({sql_array(EVERY)})[1 + g % {len(EVERY)}] AS every,
                   ({sql_array(POLICIES)})[1 + (g / 7) % 3] AS policy,
                   CASE WHEN g <= {due_upto} AND g % {due_every} = 0
                        THEN CAST(:now AS timestamptz) - make_interval(secs => 1 + g % 3557)
                        ELSE CAST(:now AS timestamptz) + make_interval(secs => 3600 + (g::bigint * 7919) % 2592000)
                   END AS due
            FROM generate_series({first}, {last}) g
        ) x
        """
        ),
        {"now": now},
    )


def mixing_step(most: int) -> int:
    """The step between due series, at most `most`: prime to 2, 3, 5 and 7, so that the due ones
    take every zone, interval, type and policy of insert_series (which go by g modulo 3, 7, 8 and
    10); a step of 100 would make them all America/New_York and daily."""
    return next((d for d in range(most, 1, -1) if math.gcd(d, 210) == 1), 1)


def grow_to(
    url: str, have: int, target: int, *, due: int, stage1: int, now: datetime, chunk: int = 100_000
) -> None:
    due_every = mixing_step(max(1, stage1 // due))
    due_upto = due_every * due
    eng = engine(url)
    with eng.connect() as conn:
        superuser = bool(
            conn.execute(text("SELECT usesuper FROM pg_user WHERE usename = current_user")).scalar()
        )
    t0 = time.perf_counter()
    for first in range(have + 1, target + 1, chunk):
        last = min(target, first + chunk - 1)
        with eng.begin() as conn:
            if superuser:  # the loader's rows name known recipients: skip the per-row FK trigger
                conn.execute(text("SET LOCAL session_replication_role = replica"))
            insert_series(conn, first, last, due_every=due_every, due_upto=due_upto, now=now)
        rate = (last - have) / (time.perf_counter() - t0)
        say(f"    inserted series {last:>9,} / {target:,}  ({rate:,.0f} rows/s)")
    t1 = time.perf_counter()
    with one_off_engine(url).connect() as conn:  # autocommit: VACUUM cannot run in a transaction
        conn.execute(text("VACUUM ANALYZE series"))
        conn.execute(text("VACUUM ANALYZE recipients"))
    say(f"    VACUUM ANALYZE series: {time.perf_counter() - t1:.1f} s")


# --- the two ticks ----------------------------------------------------------------------------

_SCAN = text(
    "SELECT CAST(ctid AS text) AS ctid, user_id, id, series_key, type_key, anchor_local, zone, every, max_count, until, calendar_policy, "
    "variables, next_n, next_due_at FROM series WHERE state = 'active'"
)


_CALENDAR_KEYS = ("user_id", "timezone", "locale", "country", "workweek", "subdivision")
_CALENDARS = text(
    f"SELECT {', '.join(_CALENDAR_KEYS)} FROM recipients WHERE user_id = ANY(CAST(:users AS text[]))"
)


class ScanStats:
    def __init__(self) -> None:
        self.rows = 0
        self.seconds = 0.0


def scan_due(stats: ScanStats):
    """take_due_series, the way a scan-based scheduler does it: every active series, filtered in Python."""

    def take(conn, *, now, limit, tzdata):
        t0 = time.perf_counter()
        result = conn.execute(_SCAN)
        keys = list(result.keys())
        due, rows = [], 0
        for row in result:
            rows += 1
            if row[13] <= now:  # next_due_at
                due.append(dict(zip(keys, row, strict=True)))
        due.sort(key=lambda r: r["next_due_at"])
        due = due[:limit]
        calendars = {  # what clarion's due query joins: its recipients, in a second query
            row[0]: dict(zip(_CALENDAR_KEYS, row, strict=True))
            for row in conn.execute(_CALENDARS, {"users": list({r["user_id"] for r in due})})
        }
        stats.rows, stats.seconds = rows, time.perf_counter() - t0
        return [{**r, **calendars[r["user_id"]]} for r in due]

    return take


def backend_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of a local PostgreSQL backend, from /proc; None when not visible."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() != "postgres":
            return None
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


CPU: list[float | None] = []  # CPU seconds of each one_tick: this process + its PostgreSQL backend


def one_tick(
    url: str, *, now: datetime, limit: int, scan: ScanStats | None = None
) -> tuple[float, int]:
    """One fire_due_series in a rolled-back transaction; (seconds, series fired).

    The due_at memo is emptied first: the same series are due at every repetition here, but a
    real tick's due series were last planned a day or more ago, thousands of ticks back."""
    recurrence.due_at.cache_clear()
    original = store.take_due_series
    if scan is not None:
        store.take_due_series = scan_due(scan)
    try:
        with engine(url).connect() as conn:
            pid: int = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            conn.rollback()
            trans = conn.begin()
            try:
                cpu, server = time.process_time(), backend_cpu(pid)
                t0 = time.perf_counter()
                fired = tseries.fire_due_series(conn, now=now, limit=limit).series
                elapsed = time.perf_counter() - t0
                cpu, after = time.process_time() - cpu, backend_cpu(pid)
                CPU.append(None if server is None or after is None else cpu + after - server)
            finally:
                trans.rollback()
    finally:
        store.take_due_series = original
    return elapsed, fired


def breakdown(url: str, *, now: datetime, limit: int) -> dict[str, tuple[float, int]]:
    """Where one clarion tick's time goes: each step of fire_due_series, timed by wrapping it."""
    spent: dict[str, list] = {}
    targets = [
        (store, "take_due_series", "take_due_series (the due query, with recipients)"),
        (tseries, "row_calendar", "row_calendar (per series)"),
        (tseries, "plan_tick", "plan_tick (per series, pure)"),
        (
            store,
            "fire_occurrences",
            "fire_occurrences (advance + requests + decisions, 1 statement)",
        ),
    ]
    originals = []
    for module, attr, label in targets:
        fn = getattr(module, attr)
        originals.append((module, attr, fn))
        spent[label] = [0.0, 0]

        def timed(*a, _fn=fn, _label=label, **kw):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **kw)
            finally:
                spent[_label][0] += time.perf_counter() - t0
                spent[_label][1] += 1

        setattr(module, attr, timed)
    try:
        total, fired = one_tick(url, now=now, limit=limit)
    finally:
        for module, attr, fn in originals:
            setattr(module, attr, fn)
    result = {k: (v[0], v[1]) for k, v in spent.items()}
    result["(rest: loops, catalog, waiting for the pipelined writes)"] = (
        total - sum(v[0] for v in spent.values()),
        0,
    )
    result["total"] = (total, fired)
    return result


def explain(url: str, now: datetime, limit: int) -> tuple[list[str], list[str], list[str]]:
    """EXPLAIN (ANALYZE) of the due query as the tick sends it (through psycopg), once with the
    plan PostgreSQL makes for this `now` and once with the generic plan it may switch to after
    psycopg prepared the statement (five executions); and EXPLAIN of the scan."""
    params = {"now": now, "limit": limit, "tzdata_key": meta.TZDATA, "tzdata": zones.TZ_DATABASE}
    plans = []
    with engine(url).connect() as conn:
        raw = conn.connection.dbapi_connection
        for generic in (False, True):
            trans = conn.begin()
            try:
                if generic:
                    conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
                sql = "EXPLAIN (ANALYZE, BUFFERS) " + store._TAKE_DUE
                plans.append([r[0] for r in raw.execute(sql, params)])  # type: ignore[union-attr]
            finally:
                trans.rollback()
        scan = [r[0] for r in conn.execute(text("EXPLAIN " + _SCAN.text))]
        conn.rollback()
    return plans[0], scan, plans[1]


# --- report -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--series", type=int, default=1_000_000, help="active series at the last stage"
    )
    parser.add_argument("--due", type=int, default=1_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--partitions", type=int, default=None, help="hash-partition the tables by user_id"
    )
    parser.add_argument(
        "--scan-reps", type=int, default=None, help="repetitions of the scan (default --reps)"
    )
    args = parser.parse_args()
    scan_reps = args.scan_reps or args.reps
    stages = sorted(
        {max(args.due, args.series // 10), max(args.due, 3 * args.series // 10), args.series}
    )
    began = time.perf_counter()

    admin_url, handle = start_services("tick")
    name = f"clarion_bench_tick_{uuid.uuid4().hex[:8]}"
    url = with_database(admin_url, name)
    admin = one_off_engine(admin_url)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        say(f"database {name}: migrating")
        migrate(url, partitions=args.partitions)
        now = datetime.now(UTC).replace(microsecond=0)
        say(
            f"now = {now.isoformat()}; {RECIPIENTS:,} recipients; stages {', '.join(f'{s:,}' for s in stages)} "
            f"series, {args.due:,} due at each"
        )
        with engine(url).begin() as conn:
            insert_recipients(conn, now)
        rows, have = [], 0
        for stage in stages:
            say(f"stage {stage:,} series")
            grow_to(url, have, stage, due=args.due, stage1=stages[0], now=now)
            have = stage
            one_tick(
                url, now=now, limit=args.due
            )  # warm-up (zones, holidays, catalog, prepared statements)
            clarion, scan, scan_rows, scan_read, cpu_c, cpu_s = [], [], 0, [], [], []  # type: ignore[var-annotated]
            for rep in range(max(args.reps, scan_reps)):
                ran = []
                order = (
                    ("clarion", "scan") if rep % 2 == 0 else ("scan", "clarion")
                )  # alternate, against drift
                for which in order:
                    if which == "clarion" and rep < args.reps:
                        seconds, fired = one_tick(url, now=now, limit=args.due)
                        clarion.append(seconds)
                        cpu_c.append(CPU[-1])
                    elif which == "scan" and rep < scan_reps:
                        stats = ScanStats()
                        seconds, fired = one_tick(url, now=now, limit=args.due, scan=stats)
                        scan.append(seconds)
                        cpu_s.append(CPU[-1])
                        scan_rows, scan_read = stats.rows, scan_read + [stats.seconds]
                    else:
                        continue
                    if fired != args.due:
                        raise SystemExit(f"{which} fired {fired} series, expected {args.due}")
                    ran.append(f"{which} {1e3 * seconds:8.1f} ms")
                say(f"  rep {rep + 1}: " + "   ".join(ran))
            rows.append(
                (
                    stage,
                    statistics.median(clarion),
                    min(clarion),
                    max(clarion),
                    statistics.median(scan),
                    min(scan),
                    max(scan),
                    statistics.median(scan_read),
                    scan_rows,
                    statistics.median(
                        s / c for s, c in zip(scan, clarion, strict=False)
                    ),  # same rep, side by side
                    None
                    if None in cpu_c + cpu_s
                    else (statistics.median(cpu_c), statistics.median(cpu_s)),  # type: ignore[type-var]
                )
            )

        say(f"limits at {stages[-1]:,} series")
        limits = []
        for limit in sorted({max(1, args.due // 10), max(1, 3 * args.due // 10), args.due}):
            walls, cpus = [], []
            for _ in range(args.reps):
                walls.append(one_tick(url, now=now, limit=limit)[0])
                cpus.append(CPU[-1])
            limits.append(
                (limit, statistics.median(walls), None if None in cpus else statistics.median(cpus))  # type: ignore[type-var]
            )
        parts = breakdown(url, now=now, limit=args.due)
        due_plan, scan_plan, generic_plan = explain(url, now, args.due)

        print()
        print(
            f"Tick: {args.due:,} due, fired in a rolled-back transaction; median of {args.reps} (scan: {scan_reps}); "
            "ratio = scan / clarion, per repetition"
        )
        base_c, base_s = rows[0][1], rows[0][4]
        print(
            table(
                [
                    "active series",
                    "clarion ms",
                    "range",
                    "vs first",
                    "scan ms",
                    "range",
                    "of which reading",
                    "rows read",
                    "vs first",
                    "scan / clarion",
                    "cpu ms clarion",
                    "cpu ms scan",
                ],
                [
                    [
                        f"{n:,}",
                        f"{1e3 * c:.0f}",
                        f"{1e3 * cl:.0f}–{1e3 * ch:.0f}",
                        f"{c / base_c:.2f}x",
                        f"{1e3 * s:,.0f}",
                        f"{1e3 * sl:,.0f}–{1e3 * sh:,.0f}",
                        f"{1e3 * r:,.0f}",
                        f"{k:,}",
                        f"{s / base_s:.2f}x",
                        f"{ratio:.1f}x",
                        "n/a" if cpu is None else f"{1e3 * cpu[0]:.0f}",  # type: ignore[operator]
                        "n/a" if cpu is None else f"{1e3 * cpu[1]:,.0f}",  # type: ignore[operator]
                    ]
                    for n, c, cl, ch, s, sl, sh, r, k, ratio, cpu in rows
                ],
            )
        )
        n, c, s_, ratio = rows[-1][0], rows[-1][1], rows[-1][4], rows[-1][9]
        print(
            f"At {n:,} series: clarion {1e3 * c:.0f} ms (target <= 50 ms: {'yes' if c <= 0.05 else 'NO'}), "
            f"scan {1e3 * s_:,.0f} ms, scan / clarion {ratio:.0f}x (target >= 100x: "
            f"{'yes' if ratio >= 100 else 'NO'})"
        )
        print(
            'ms are wall time of one tick; "of which reading": the scan\'s SELECT and Python filter; cpu ms: '
            "this process + its PostgreSQL backend (from /proc, 10 ms resolution), median."
        )
        print()
        print(f"Clarion tick by number due (limit), at {stages[-1]:,} series")
        print(
            table(
                ["due fired", "tick ms", "ms per series", "cpu ms", "cpu ms per series"],
                [
                    [
                        f"{n:,}",
                        f"{1e3 * t:.0f}",
                        f"{1e3 * t / n:.2f}",
                        "n/a" if c is None else f"{1e3 * c:.0f}",
                        "n/a" if c is None else f"{1e3 * c / n:.2f}",
                    ]
                    for n, t, c in limits
                ],
            )
        )
        print()
        print(
            f"Where one clarion tick goes ({args.due:,} due, {stages[-1]:,} series, one instrumented tick)"
        )
        total = parts["total"][0]
        print(
            table(
                ["step", "calls", "ms", "share"],
                [
                    [k, str(n) if n else "", f"{1e3 * s:.0f}", f"{100 * s / total:.0f} %"]
                    for k, (s, n) in parts.items()
                ],
            )
        )
        print()
        print("EXPLAIN (ANALYZE, BUFFERS) of the due query (db/series.py _TAKE_DUE):")
        print("\n".join("  " + line for line in due_plan))
        print(
            "The same with a generic plan (plan_cache_mode = force_generic_plan, as a prepared statement):"
        )
        print("\n".join("  " + line for line in generic_plan))
        print("EXPLAIN of the scan:")
        print("\n".join("  " + line for line in scan_plan))
        print(f"\ntotal run time {time.perf_counter() - began:.0f} s")
    finally:
        dispose_all()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        if handle is not None:
            handle.stop()


if __name__ == "__main__":
    main()
