"""The naive baseline of bench/throughput.py: check-then-send-then-record, no unique constraint.

Each process takes its work items and, per item, does what hand-written senders usually do:

    SELECT 1 FROM naive_sent WHERE key = ...     -- "was it sent?"
    if absent: POST the webhook                   -- same signed payload as clarion's adapter
               INSERT INTO naive_sent (key, ...)  -- autocommit, no unique constraint

Two processes given the same occurrence (a redelivered message, a duplicated event) can both
pass the SELECT before either INSERTs: that is the duplicate the receiver counts.
"""

from __future__ import annotations

import time

import psycopg
import urllib3

from clarion.adapters.webhook import to_request
from clarion.records import Message, idempotency_key

TYPE_KEY = "receipt"
CHANNEL = "webhook"

SCHEMA = """
CREATE TABLE naive_sent (key text NOT NULL, user_id text NOT NULL, occurrence_key text NOT NULL,
                         sent_at timestamptz NOT NULL DEFAULT now());
CREATE INDEX naive_sent_key ON naive_sent (key);  -- an index, but not a unique one
"""


def work(
    conninfo: str,
    url: str,
    secret: str,
    items: list[tuple[str, str, int]],
    barrier,
    cpu=None,
    slot: int = 0,
) -> None:
    """Process `items` ((user_id, occurrence_key, order) each) after every process is ready;
    the CPU seconds the loop took go to `cpu[slot]` (a shared array), if given."""
    conn = psycopg.connect(conninfo, autocommit=True)
    http = urllib3.PoolManager(maxsize=1, retries=False, timeout=urllib3.Timeout(total=10))
    barrier.wait()
    start = time.process_time()
    for user_id, occurrence_key, order in items:
        key = idempotency_key(user_id, TYPE_KEY, occurrence_key, CHANNEL)
        if conn.execute("SELECT 1 FROM naive_sent WHERE key = %s", (key,)).fetchone() is not None:
            continue
        response = post(http, url, secret, user_id, occurrence_key, order)
        if response.status >= 500:
            continue  # a real sender would retry later; the receiver never fails here
        conn.execute(
            "INSERT INTO naive_sent (key, user_id, occurrence_key) VALUES (%s, %s, %s)",
            (key, user_id, occurrence_key),
        )
    if cpu is not None:
        cpu[slot] = time.process_time() - start
    conn.close()


def post(
    http: urllib3.PoolManager, url: str, secret: str, user_id: str, occurrence_key: str, order: int
) -> urllib3.BaseHTTPResponse:
    """The webhook POST clarion's adapter would make for this occurrence (the same signed body)."""
    message = Message(
        delivery_id=0,
        user_id=user_id,
        type_key=TYPE_KEY,
        occurrence_key=occurrence_key,
        channel=CHANNEL,
        content={"title": f"Receipt {order}", "body": f"Thanks for order {order}."},
    )
    headers, body = to_request(message, secret, time.time())
    return http.request("POST", url, body=body, headers=headers)
