"""Named statements for `clarion redrive`: find failed (or unknown) deliveries and put them back to
pending, as the same rows.

A redriven delivery keeps its identity — user, type, occurrence and channel, hence its idempotency
key — so a provider that dedups sees the same key, and the partial unique indexes still allow at
most one send per occurrence: if another delivery of the occurrence was sent meanwhile, the
redriven one would lose the claim later, so such rows are not redriven at all. Pending is not a
sending state, so putting a row back never conflicts with `deliveries_one_send`. Keys lead with
user_id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

Key = tuple[str, int]
REDRIVABLE_STATES = ("failed", "unknown")


@dataclass(frozen=True)
class Redrivable:
    """A delivery that could be re-queued, with why it stopped."""

    user_id: str
    id: int
    request_id: int
    type_key: str
    occurrence_key: str
    channel: str
    state: str
    reason: str  # the reason of its latest `deliver` decision, or '' if it has none
    attempts: int
    stopped_at: datetime  # when it reached that state (updated_at)
    last_error: str | None


# Another delivery of the same occurrence that holds or used the right to send (the partial unique
# indexes' predicates, written as literal SQL): re-queueing this one could only lose the claim.
_SENT_ELSEWHERE = """
    EXISTS (SELECT 1 FROM deliveries o
            WHERE o.user_id = d.user_id AND o.type_key = d.type_key AND o.occurrence_key = d.occurrence_key
              AND o.id <> d.id AND o.state IN ('claimed', 'sent', 'delivered', 'opened', 'read', 'clicked', 'answered', 'bounced', 'undelivered')
              AND (o.channel = d.channel OR (o.one_platform AND d.one_platform)))
"""

# The latest delivery decision's reason; filters with a NULL parameter match everything.
_MATCHING = f"""
    FROM deliveries d
    LEFT JOIN LATERAL (
        SELECT x.reason FROM decisions x
        WHERE x.user_id = d.user_id AND x.request_id = d.request_id AND x.delivery_id = d.id
          AND x.gate = 'deliver'
        ORDER BY x.decided_at DESC, x.id DESC LIMIT 1) why ON true
    WHERE d.state = ANY(CAST(:states AS text[]))
      AND (CAST(:type_key AS text) IS NULL OR d.type_key = CAST(:type_key AS text))
      AND (CAST(:reason AS text) IS NULL OR coalesce(why.reason, '') = CAST(:reason AS text))
      AND (CAST(:since AS timestamptz) IS NULL OR d.updated_at >= CAST(:since AS timestamptz))
      AND (CAST(:until AS timestamptz) IS NULL OR d.updated_at < CAST(:until AS timestamptz))
      AND NOT {_SENT_ELSEWHERE}
"""

_FIND = text(
    f"""
    SELECT d.user_id, d.id, d.request_id, d.type_key, d.occurrence_key, d.channel, d.state,
           coalesce(why.reason, '') AS reason, d.attempts, d.updated_at AS stopped_at, d.last_error
    {_MATCHING}
    ORDER BY d.updated_at, d.user_id, d.id
    LIMIT :limit
    """
)


def find_redrivable(
    conn: Connection,
    *,
    states: Sequence[str],
    type_key: str | None = None,
    reason: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int = 1000,
) -> list[Redrivable]:
    """Deliveries in one of `states` matching the filters, oldest first (what a dry run shows);
    never one whose occurrence another delivery already sent (or is sending)."""
    params = {
        "states": list(states),
        "type_key": type_key,
        "reason": reason,
        "since": since,
        "until": until,
        "limit": limit,
    }
    return [Redrivable(**r) for r in conn.execute(_FIND, params).mappings()]


_REQUEUE = text(
    f"""
    UPDATE deliveries d
    SET state = 'pending', attempts = 0, not_before = :now, due_at = :now, last_error = NULL,
        claim_token = NULL, lease_until = NULL, taken_over = false, updated_at = :now, rounds = 0,
        -- the operator chose to send again: an unknown earlier outcome no longer holds it back
        maybe_sent_at = NULL, send_started_at = NULL
    FROM unnest(CAST(:users AS text[]), CAST(:ids AS bigint[])) AS k(user_id, id)
    WHERE d.user_id = k.user_id AND d.id = k.id AND d.state = ANY(CAST(:states AS text[]))
      AND NOT {_SENT_ELSEWHERE}
    RETURNING d.user_id, d.id
    """
)


def requeue(
    conn: Connection, keys: Iterable[Key], *, states: Sequence[str], now: datetime
) -> set[Key]:
    """Put deliveries back to pending, due now, with attempts and error cleared — only those still in
    one of `states` (a row that changed meanwhile is left alone). Returns the keys re-queued."""
    users, ids = [], []
    for user_id, id_ in keys:
        users.append(user_id)
        ids.append(id_)
    if not users:
        return set()
    rows = conn.execute(_REQUEUE, {"users": users, "ids": ids, "states": list(states), "now": now})
    return {(r[0], r[1]) for r in rows}
