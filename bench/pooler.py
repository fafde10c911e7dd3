"""The request path (notify_many, 10 requests a call) through Debian's pgbouncer in transaction
mode (CLARION_DATABASE_POOLER=transaction) against direct connections to the same PostgreSQL,
in the same run: calls per second with 1 and 8 producer threads, and the ratio
(docs/beyond-one-machine.md). Needs `make hosts-deps` (pgbouncer) and root (it runs pgbouncer as
the server's user).

    .venv/bin/python bench/pooler.py [--calls 300]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import text  # noqa: E402

from bench.common import say, start_services, table, with_database  # noqa: E402
from clarion import settings  # noqa: E402
from clarion.db.engine import dispose_all, migrate, one_off_engine  # noqa: E402
from clarion.tasks import notify_many, register_recipient  # noqa: E402
from tests.support.environment import CATALOG  # noqa: E402
from tests.support.pgbouncer import PgBouncer  # noqa: E402

USERS = 100


def _use(url: str, redis: str, pooled: bool) -> None:
    for key in [k for k in os.environ if k.startswith("CLARION_")]:
        del os.environ[key]
    os.environ |= {
        "CLARION_DATABASE_URL": url,
        "CLARION_REDIS_URL": redis,
        "CLARION_CATALOG": str(CATALOG),
        "CLARION_HOME": str(ROOT / ".clarion" / "bench-pooler"),
        "CLARION_WEBHOOK_SECRET": "bench-secret",
    }
    if pooled:
        os.environ["CLARION_DATABASE_POOLER"] = "transaction"
    settings.reset()
    dispose_all()


def _calls_per_second(threads: int, calls: int, tag: str) -> float:
    def produce(t: int) -> None:
        for c in range(calls):
            notify_many(
                [
                    dict(
                        user_id=f"u{(t * 7 + c + i) % USERS}",
                        type_key="receipt",
                        event_id=f"{tag}-{t}-{c}-{i}",
                        variables={"order": "1"},
                    )
                    for i in range(10)
                ]
            )

    workers = [threading.Thread(target=produce, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return threads * calls / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per thread")
    args = parser.parse_args()
    server, handle = start_services("pooler")
    redis = handle.redis_url if handle else os.environ["CLARION_REDIS_URL"]
    name = f"bench_pooler_{uuid.uuid4().hex[:8]}"
    admin = one_off_engine(server)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        conn.execute(text(f'ALTER DATABASE "{name}" SET search_path = "clarion"'))
    try:
        with PgBouncer(ROOT / ".clarion" / "bench-pgbouncer", server) as bouncer:
            direct, pooled = with_database(server, name), bouncer.url(name)
            _use(direct, redis, pooled=False)
            migrate(direct)
            for u in range(USERS):
                register_recipient(f"u{u}", timezone="UTC")
            rows = []
            for threads in (1, 8):
                figures = []
                for url, is_pooled in ((direct, False), (pooled, True)):
                    _use(url, redis, is_pooled)
                    tag = f"{threads}-{'p' if is_pooled else 'd'}"
                    _calls_per_second(threads, 20, "warm-" + tag)
                    figures.append(_calls_per_second(threads, args.calls, tag))
                rows.append(
                    [
                        f"{threads} thread(s)",
                        f"{figures[0]:.0f}",
                        f"{figures[1]:.0f}",
                        f"{figures[1] / figures[0]:.2f}",
                    ]
                )
            dispose_all()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if handle:
            handle.stop()
    say("notify_many calls/s (10 requests each), direct vs through pgbouncer (transaction mode)")
    say(table(["producers", "direct", "pgbouncer", "pgbouncer/direct"], rows))


if __name__ == "__main__":
    main()
