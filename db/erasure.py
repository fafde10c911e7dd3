"""Named statements for erasure: remove one person's data, keep what once-only and suppression need.

One statement per table, run in one transaction by `erase()`; each touches only rows that still
hold something, so running it again changes nothing (and reports zeros), and it also scrubs what
arrived after a first run (a late receipt). docs/how-to/erasure.md lists, table by table,
what is kept and why; tests/integration/test_erasure.py scans every text, JSON and array column of
every table for the person's values afterwards.

Kept: user_id (the app's opaque id) everywhere, so the occurrence keys in requests and deliveries
still make a repeated event a no-op; the suppression list, with each address replaced by its keyed
hash (clarion/hashing.py), which the gate matches (db/gating.py); states, timestamps, gate reasons
and counters (no personal content) so `explain` can still say what happened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

_LOCK = text("SELECT erased_at FROM recipients WHERE user_id = :u FOR UPDATE")

# (table, statement): params :u (user id), :now
STATEMENTS: tuple[tuple[str, str], ...] = (
    (
        "recipients",
        """UPDATE recipients SET addresses = '{}'::jsonb, timezone = 'UTC', locale = 'en',
               country = NULL, org_id = NULL, quiet_start = NULL, quiet_end = NULL,
               workweek = NULL, subdivision = NULL, attributes = '{}'::jsonb,
               erased_at = COALESCE(erased_at, :now), updated_at = :now
           WHERE user_id = :u AND (erased_at IS NULL OR addresses <> '{}'::jsonb
               OR org_id IS NOT NULL OR country IS NOT NULL OR attributes <> '{}'::jsonb)""",
    ),
    (
        "requests",
        """UPDATE requests SET variables = '{}'::jsonb, locale = NULL,
               state = 'routed', due_at = NULL, routed_at = COALESCE(routed_at, :now)
           WHERE user_id = :u AND (variables <> '{}'::jsonb OR locale IS NOT NULL
               OR state <> 'routed' OR due_at IS NOT NULL)""",
    ),
    (
        "deliveries",
        """UPDATE deliveries SET last_error = NULL, answer = NULL, answered_by = NULL,
               provider_message_id = NULL, due_at = NULL,
               state = CASE WHEN state = 'pending' THEN 'suppressed' ELSE state END
           WHERE user_id = :u AND (last_error IS NOT NULL OR answer IS NOT NULL
               OR answered_by IS NOT NULL OR provider_message_id IS NOT NULL
               OR due_at IS NOT NULL OR state = 'pending')""",
    ),
    (
        "receipts",
        """UPDATE receipts SET address = NULL, detail = '', provider_message_id = NULL
           WHERE user_id = :u AND (address IS NOT NULL OR detail <> ''
               OR provider_message_id IS NOT NULL)""",
    ),
    ("decisions", "UPDATE decisions SET detail = '' WHERE user_id = :u AND detail <> ''"),
    ("incidents", "UPDATE incidents SET detail = '' WHERE user_id = :u AND detail <> ''"),
    (
        "delivery_attempts",
        "UPDATE delivery_attempts SET error = '' WHERE user_id = :u AND error <> ''",
    ),
    ("preferences", "DELETE FROM preferences WHERE user_id = :u"),
    ("activation_windows", "DELETE FROM activation_windows WHERE user_id = :u"),
    (
        "series",
        """UPDATE series SET variables = '{}'::jsonb, zone = 'UTC', next_due_at = NULL,
               state = CASE WHEN state IN ('active', 'paused') THEN 'cancelled' ELSE state END,
               updated_at = :now
           WHERE user_id = :u AND (variables <> '{}'::jsonb OR zone <> 'UTC'
               OR next_due_at IS NOT NULL OR state IN ('active', 'paused'))""",
    ),
    (
        "interactions",
        """UPDATE interactions SET platform_user = '', payload = '', answer = NULL
           WHERE user_id = :u AND (platform_user <> '' OR payload <> '' OR answer IS NOT NULL)""",
    ),
    ("inbox_items", "DELETE FROM inbox_items WHERE user_id = :u"),
    (
        "escalations",
        """UPDATE escalations SET acked_by = NULL, due_detail = '', due_at = NULL,
               state = CASE WHEN state = 'waiting' THEN 'finished' ELSE state END,
               updated_at = :now
           WHERE user_id = :u AND (acked_by IS NOT NULL OR due_detail <> ''
               OR state = 'waiting')""",
    ),
    (
        "digests",
        """UPDATE digests SET items = '[]'::jsonb,
               state = 'closed', closed_at = COALESCE(closed_at, :now)
           WHERE user_id = :u AND (items <> '[]'::jsonb OR state <> 'closed')""",
    ),
    ("collapse_refreshes", "DELETE FROM collapse_refreshes WHERE user_id = :u"),
    ("topic_members", "DELETE FROM topic_members WHERE user_id = :u"),  # off every audience
    # last: the events this erasure's own changes wrote are scrubbed too (a provider's error text,
    # a gate's or incident's detail); kinds, ids and states stay, as in the tables they report
    (
        "outbound_events",
        """UPDATE outbound_events SET data = data - 'detail' - 'error'
           WHERE user_id = :u AND (data ? 'detail' OR data ? 'error')""",
    ),
)

_PLAIN_SUPPRESSIONS = text(
    "SELECT channel, address FROM suppressions WHERE user_id = :u AND address NOT LIKE 'hmac:%' "
    "FOR UPDATE"
)
_HASH_SUPPRESSION = text(
    """
    INSERT INTO suppressions (user_id, channel, address, reason, detail, created_at, address_hash)
    SELECT user_id, channel, :hashed, reason, '', created_at, :hashed FROM suppressions
    WHERE user_id = :u AND channel = :channel AND address = :address
    ON CONFLICT (user_id, channel, address) DO NOTHING
    """
)
_DROP_PLAIN = text("DELETE FROM suppressions WHERE user_id = :u AND address NOT LIKE 'hmac:%'")
_CLEAR_HASHED_DETAIL = text(
    "UPDATE suppressions SET detail = '' WHERE user_id = :u AND address LIKE 'hmac:%' "
    "AND detail <> ''"
)


@dataclass(frozen=True)
class Erased:
    """What an erasure did: when the person was (first) erased, and rows changed per table."""

    user_id: str
    erased_at: datetime
    changed: dict[str, int]


def erase(
    conn: Connection, user_id: str, *, hashed: Callable[[str, str], str], now: datetime
) -> Erased | None:
    """Erase `user_id` in the caller's transaction; None if no such recipient was ever registered.
    `hashed(channel, address)` is the keyed hash a suppressed address is kept as."""
    found = conn.execute(_LOCK, {"u": user_id}).first()
    if found is None:
        return None
    params = {"u": user_id, "now": now}
    changed = {table: conn.execute(text(sql), params).rowcount for table, sql in STATEMENTS}
    plain = conn.execute(_PLAIN_SUPPRESSIONS, params).all()
    for channel, address in plain:
        conn.execute(
            _HASH_SUPPRESSION,
            {**params, "channel": channel, "address": address, "hashed": hashed(channel, address)},
        )
    conn.execute(_DROP_PLAIN, params)
    changed["suppressions"] = len(plain) + conn.execute(_CLEAR_HASHED_DETAIL, params).rowcount
    return Erased(user_id, found[0] or now, changed)
