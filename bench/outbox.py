"""Outbox: what migration 0023's triggers cost the statements of the sending path, in one run.

    cd /work/main && .venv/bin/python bench/outbox.py [--rows 5000] [--rounds 6] [--partitions N]

The statements that write events, as the pipeline issues them, each over --rows rows in one
statement (a route or deliver batch is up to CLARION_BATCH_SIZE rows; the group commit of "sent"
up to CLARION_SENT_FLUSH_ROWS): insert requests, insert their deliveries, claim them (an UPDATE
that writes no event), mark them sent, mark them delivered. Three set-ups, alternated round by
round on the same database so the machine's load falls on all of them alike:

  off       the outbox triggers disabled (ALTER TABLE ... DISABLE TRIGGER): the code before 0023
  idle      triggers on, no endpoint registered: each statement pays one trigger call and the
            check "does any endpoint want these kinds?" (and PostgreSQL its transition tables)
  endpoint  one endpoint wanting every kind: each change also writes its event and send rows

Each round runs in a transaction that is rolled back. Prints the median µs per row of each step and
the ratios idle/off and endpoint/off. Services: CLARION_DATABASE_URL, else the embedded PostgreSQL
in .clarion/bench-outbox.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection, text

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import say, start_services, table, with_database  # noqa: E402
from clarion.db.engine import engine, migrate, one_off_engine  # noqa: E402

TRIGGERS = (
    ("requests", "requests_outbound"),
    ("deliveries", "deliveries_outbound_insert"),
    ("deliveries", "deliveries_outbound_update"),
)
STEPS = {
    "insert requests": """
        INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,
            variables, locale, state, created_at)
        SELECT 'u' || (g % 100), 'receipt', 'event:' || :tag || '-' || g, 'transactional', 1,
            '{}', 'en', 'routed', now() FROM generate_series(1, :n) g""",
    "insert deliveries": """
        INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel,
            one_platform, lane, not_before, created_at, updated_at)
        SELECT user_id, id, type_key, occurrence_key, 'webhook', false, lane, now(), now(), now()
        FROM requests WHERE occurrence_key LIKE 'event:' || :tag || '-%'""",
    "claim": """
        UPDATE deliveries SET state = 'claimed', claim_token = gen_random_uuid(),
            lease_until = now() + interval '1 minute', attempts = attempts + 1
        WHERE occurrence_key LIKE 'event:' || :tag || '-%'""",
    "mark sent": """
        UPDATE deliveries SET state = 'sent', platform = 'webhook', sent_at = now(),
            claim_token = NULL, lease_until = NULL
        WHERE occurrence_key LIKE 'event:' || :tag || '-%'""",
    "mark delivered": """
        UPDATE deliveries SET state = 'delivered', updated_at = now()
        WHERE occurrence_key LIKE 'event:' || :tag || '-%'""",
}


def setup(conn: Connection, mode: str) -> None:
    verb = "DISABLE" if mode == "off" else "ENABLE"
    for table_name, trigger in TRIGGERS:
        conn.execute(text(f"ALTER TABLE {table_name} {verb} TRIGGER {trigger}"))
    if mode == "endpoint":
        conn.execute(
            text(
                "INSERT INTO webhook_endpoints (url, kinds, secret, created_at, updated_at) "
                "VALUES ('http://127.0.0.1:9/', ARRAY['request.accepted', 'delivery.sent', "
                "'delivery.delivered'], 'whsec_x', now(), now())"
            )
        )


def one_round(url: str, mode: str, n: int) -> dict[str, float]:
    """µs per row of each step under `mode`, in a transaction rolled back."""
    timings = {}
    with engine(url).connect() as conn, conn.begin() as tx:
        setup(conn, mode)
        tag = uuid.uuid4().hex[:8]
        for step, sql in STEPS.items():
            began = time.perf_counter()
            conn.execute(text(sql), {"n": n, "tag": tag})
            timings[step] = (time.perf_counter() - began) / n * 1e6
        events = conn.execute(text("SELECT count(*) FROM outbound_events")).scalar_one()
        expected = 3 * n if mode == "endpoint" else 0
        assert events == expected, f"{mode}: {events} events, expected {expected}"
        tx.rollback()
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=5000, help="rows per statement (5000)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds of each set-up (6)")
    parser.add_argument("--partitions", type=int, default=None)
    args = parser.parse_args()
    admin_url, handle = start_services("outbox")
    name = f"clarion_bench_outbox_{uuid.uuid4().hex[:8]}"
    url = with_database(admin_url, name)
    admin = one_off_engine(admin_url)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        migrate(url, partitions=args.partitions)
        with engine(url).begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO recipients (user_id, timezone, created_at, updated_at) "
                    "SELECT 'u' || g, 'UTC', now(), now() FROM generate_series(0, 99) g"
                )
            )
        modes = ("off", "idle", "endpoint")
        one_round(url, "endpoint", args.rows)  # warm-up
        results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes[r % 3 :] + modes[: r % 3]:  # rotate who goes first
                results[mode].append(one_round(url, mode, args.rows))
        say(
            f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {args.rows} rows per statement, "
            f"{args.rounds} rounds, partitions {args.partitions or 'none'}; median µs per row"
        )
        rows = []
        for step in [*STEPS, "total"]:
            med = {
                m: statistics.median(
                    sum(t.values()) if step == "total" else t[step] for t in results[m]
                )
                for m in modes
            }
            rows.append(
                [
                    step,
                    *(f"{med[m]:.1f}" for m in modes),
                    f"{med['idle'] / med['off']:.2f}",
                    f"{med['endpoint'] / med['off']:.2f}",
                ]
            )
        say(table(["step", *modes, "idle/off", "endpoint/off"], rows))
    finally:
        engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        if handle is not None:
            handle.stop()


if __name__ == "__main__":
    main()
