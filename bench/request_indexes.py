"""What migration 0028's search indexes (requests_id, requests_occurrence) cost a request insert.

    cd /work/main && .venv/bin/python bench/request_indexes.py [--rows 5000] [--rounds 6]

Two databases on one server, migrated alike with --base requests (100,000, 1,000 recipients), the
second with the two indexes dropped. Each round inserts --rows requests in one statement (as
notify_many and the batch door do) into each, alternating who goes first, in a transaction rolled
back (so each round starts from the same tables). Prints the median µs per row and the ratio.
Services: CLARION_DATABASE_URL, else the embedded PostgreSQL in .clarion/bench-request-indexes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import say, start_services, table, with_database  # noqa: E402
from clarion.db.engine import engine, migrate, one_off_engine  # noqa: E402

INSERT = """
    INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,
        locale, state, created_at)
    SELECT 'u' || (g % 1000), 'receipt', 'event:' || :tag || '-' || g, 'transactional', 1, '{}',
        'en', 'routed', now() FROM generate_series(1, :n) g"""
MODES = ("with", "without")


def one_round(url: str, n: int) -> float:
    """µs per inserted row, in a transaction rolled back."""
    with engine(url).connect() as conn, conn.begin() as tx:
        began = time.perf_counter()
        conn.execute(text(INSERT), {"n": n, "tag": uuid.uuid4().hex[:8]})
        took = time.perf_counter() - began
        tx.rollback()
    return took / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5000, help="rows per statement (5000)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each (6)")
    parser.add_argument("--base", type=int, default=100_000, help="rows already there (100000)")
    args = parser.parse_args()
    load = " ".join(f"{v:.2f}" for v in os.getloadavg())
    admin_url, handle = start_services("request-indexes")
    names = {m: f"clarion_bench_indexes_{m}_{uuid.uuid4().hex[:8]}" for m in MODES}
    urls = {m: with_database(admin_url, name) for m, name in names.items()}
    admin = one_off_engine(admin_url)
    try:
        for mode, url in urls.items():
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{names[mode]}"'))
            migrate(url)
            with engine(url).begin() as conn:
                if mode == "without":
                    conn.execute(text("DROP INDEX requests_id"))
                    conn.execute(text("DROP INDEX requests_occurrence"))
                conn.execute(
                    text(
                        "INSERT INTO recipients (user_id, timezone, created_at, updated_at) "
                        "SELECT 'u' || g, 'UTC', now(), now() FROM generate_series(0, 999) g"
                    )
                )
                conn.execute(text(INSERT), {"n": args.base, "tag": "base"})
                conn.execute(text("ANALYZE requests"))
            one_round(url, args.rows)  # warm-up
        results: dict[str, list[float]] = {m: [] for m in MODES}
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                results[mode].append(one_round(urls[mode], args.rows))
        med = {m: statistics.median(v) for m, v in results.items()}
        say(
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {args.rows} rows per statement over "
            f"{args.base} rows, {args.rounds} rounds; load average at start {load}, at end "
            + " ".join(f"{v:.2f}" for v in os.getloadavg())
        )
        say(
            table(
                ["insert", "with indexes", "without", "with/without"],
                [
                    [
                        "µs per row (median)",
                        f"{med['with']:.1f}",
                        f"{med['without']:.1f}",
                        f"{med['with'] / med['without']:.2f}",
                    ]
                ],
            )
        )
    finally:
        for mode, url in urls.items():
            engine(url).dispose()
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{names[mode]}" WITH (FORCE)'))
        if handle is not None:
            handle.stop()


if __name__ == "__main__":
    main()
