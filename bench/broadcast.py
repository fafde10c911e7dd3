"""Broadcast fan-out: recipients requested per second and peak memory, against notify_many.

    .venv/bin/python bench/broadcast.py [--sizes 10000,100000,1000000]

For each size N, N recipients in one topic (written with INSERT ... SELECT: setup, not measured),
then, each in a fresh process (so its peak RSS is its own) and from an empty requests table:

  baseline  what an app would write without broadcasts: read the topic's members 500 at a time
            (keyset) and notify_many() each 500 (validation, one transaction, route publish).
  clarion   broadcast() then the fan-out task's own loop, fan_out(), in-process: chunks of
            CLARION_BROADCAST_CHUNK recipients, one INSERT ... SELECT each, the cursor in the same
            commit, route publish after it.

Each measured process first does what a running worker has done already (reads the catalog, opens
a database and a broker connection, loads Celery's result backend); the clock starts after that. Both publish their route tasks to the broker (nothing consumes them); the queue is emptied between
runs. Printed per size: recipients requested per second, the ratio, each run's peak RSS, and the
time of the whole fan-out. Checked: each run requested exactly N.

Services: CLARION_DATABASE_URL and CLARION_REDIS_URL when set, else the embedded ones in
.clarion/bench-broadcast. A fresh database per run, dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(ROOT))
os.environ["CLARION_CATALOG"] = str(ROOT / "tests" / "catalog_broadcasts.yaml")

from sqlalchemy import text  # noqa: E402

from bench.common import say, start_services, table, with_database  # noqa: E402

TOPIC = "bench"
CHUNK = 500  # the baseline's notify_many batch


def child(which: str) -> None:
    """One measured run in this process; prints {"seconds", "requested", "rss_mb"} as JSON."""
    from clarion import notify_many, settings
    from clarion.db import broadcasts as store
    from clarion.db.engine import engine
    from clarion.tasks import runtime
    from clarion.tasks.app import app, use_broker
    from clarion.tasks.broadcasts import broadcast, fan_out
    from clarion.tasks.publish import ROUTE

    # as in a running worker, for both: the catalog read, a pooled connection open, the broker's
    # connection made, Celery's backend loaded and the lane's queue declared (a cold process paid
    # ~0.1 s importing psycopg inside the first call, which at 10,000 recipients was a third of
    # clarion's time)
    runtime.loaded()
    with engine().connect() as conn:
        conn.execute(text("SELECT 1"))
    use_broker(settings.get().urls()[2])
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=1)
    assert app.backend is not None  # Celery loads its result backend at the first send_task
    # and has declared its lane's queue (kombu declares a queue at a process's first publish to
    # it: ~4 ms, once), here with an empty route batch, which routes nothing
    newsletter = runtime.catalog().get("newsletter")
    assert newsletter is not None
    app.send_task(ROUTE, args=[[], []], queue=newsletter.lane)

    started = time.perf_counter()
    if which == "clarion":
        made = broadcast("newsletter", {"topic": TOPIC}, {"issue": "bench"})
        requested = fan_out(made.id, seconds=1e9)
    else:
        requested, after = 0, ""
        audience = store.Audience(TOPIC)
        while True:
            with engine().connect() as conn:
                users = store.members(conn, audience, after=after, limit=CHUNK)
            if not users:
                break
            notify_many(
                {
                    "user_id": u,
                    "type_key": "newsletter",
                    "event_id": "bench-baseline",
                    "variables": {"issue": "bench"},
                }
                for u in users
            )
            requested += len(users)
            after = users[-1]
    seconds = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "requested": requested, "rss_mb": rss}))


def setup(url: str, size: int) -> None:
    from clarion.db.engine import engine

    with engine(url).begin() as conn:
        conn.execute(text("TRUNCATE topic_members, topics, recipients CASCADE"))
        conn.execute(
            text(
                """
                INSERT INTO recipients (user_id, timezone, locale, country, addresses, created_at,
                                        updated_at)
                SELECT 'u' || lpad(g::text, 8, '0'), 'America/New_York', 'en', 'US', '{}', now(),
                       now()
                FROM generate_series(1, :n) g
                """
            ),
            {"n": size},
        )
        conn.execute(text("INSERT INTO topics (key, created_at) VALUES (:t, now())"), {"t": TOPIC})
        conn.execute(
            text(
                "INSERT INTO topic_members (user_id, topic_key, created_at) "
                "SELECT user_id, :t, now() FROM recipients"
            ),
            {"t": TOPIC},
        )
    with engine(url).connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE recipients, topic_members"))


def reset(url: str, redis_url: str) -> None:
    """An empty ledger and broker between runs: each starts from the same state."""
    import redis

    from clarion.db.engine import engine

    with engine(url).begin() as conn:
        conn.execute(text("TRUNCATE requests, broadcasts, broadcast_waves CASCADE"))
    redis.Redis.from_url(redis_url).flushdb()


def run(which: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", which],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"{which} run failed:\n{out.stderr[-3000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--child", choices=["clarion", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    admin_url, handle = start_services("broadcast")
    redis_url = os.environ.get("CLARION_REDIS_URL") or handle.redis_url
    name = f"clarion_bench_broadcast_{uuid.uuid4().hex[:8]}"
    url = with_database(admin_url, name)
    from clarion.db.engine import dispose_all, migrate, one_off_engine

    admin = one_off_engine(admin_url)
    env = {
        **os.environ,
        "CLARION_DATABASE_URL": url,
        "CLARION_REDIS_URL": redis_url,
        "CLARION_WEBHOOK_SECRET": os.environ.get("CLARION_WEBHOOK_SECRET", uuid.uuid4().hex),
    }
    rows, began = [], time.perf_counter()
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        migrate(url)
        for size in sizes:
            say(f"{size:,} recipients: setting up")
            setup(url, size)
            got = {}
            for which in ("baseline", "clarion"):
                reset(url, redis_url)
                got[which] = run(which, env)
                if got[which]["requested"] != size:
                    raise SystemExit(f"{which} requested {got[which]['requested']}, not {size}")
                say(
                    f"  {which:8} {size / got[which]['seconds']:>10,.0f} recipients/s  "
                    f"{got[which]['seconds']:7.1f} s  peak RSS {got[which]['rss_mb']:.0f} MB"
                )
            base, ours = got["baseline"], got["clarion"]
            rows.append(
                [
                    f"{size:,}",
                    f"{size / base['seconds']:,.0f}",
                    f"{size / ours['seconds']:,.0f}",
                    f"{base['seconds'] / ours['seconds']:.2f}x",
                    f"{base['rss_mb']:.0f}",
                    f"{ours['rss_mb']:.0f}",
                    f"{ours['seconds']:.1f}",
                ]
            )
    finally:
        dispose_all()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if handle is not None:
            handle.stop()
    say("")
    say(
        table(
            [
                "recipients",
                "baseline/s",
                "clarion/s",
                "ratio",
                "baseline RSS MB",
                "clarion RSS MB",
                "clarion s",
            ],
            rows,
        )
    )
    say(f"\n(whole run {time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
