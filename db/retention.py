"""Named statements of retention (tasks/retention.py): each removes at most :batch old rows of one
kind and returns how many, never a row still open, claimed or unknown.

The dedup key is the request row (unique per user, type and occurrence), so what is kept decides
what can be sent again:
- A request goes only when resolved (`routed`), older than the horizon, with no delivery still
  pending, claimed or unknown, and not an occurrence of a series still active or paused (snooze
  can recreate an occurrence of a live series; the tick and snooze never touch an ended or
  cancelled one). Its deliveries (with their attempts) and decisions go with it, in the same
  statement (a decision is never removed while its request is kept: "why didn't she get it?"
  still has its answer).
- So an event id is deduplicated for the retention horizon (CLARION_RETENTION_DAYS): every retry
  inside clarion (republish, redelivery, takeover) is bounded by minutes, and a late task whose
  request is gone finds nothing to do; a producer that sends the same event id again after the
  horizon gets a new notification.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, TextClause, text

_OPEN_DELIVERY = "('pending', 'claimed', 'unknown')"  # may still send, or may have sent

_REQUESTS = text(
    f"""
    WITH doomed AS (
        SELECT r.user_id, r.id FROM requests r
        WHERE r.state = 'routed' AND r.created_at < :horizon
          AND NOT EXISTS (
              SELECT 1 FROM deliveries d WHERE d.user_id = r.user_id AND d.request_id = r.id
                AND d.state IN {_OPEN_DELIVERY})
          AND NOT (r.occurrence_key LIKE 'series:%' AND EXISTS (
              SELECT 1 FROM series s WHERE s.user_id = r.user_id
                AND s.state IN ('active', 'paused')
                AND r.occurrence_key LIKE 'series:' || s.id || ':%'))
        LIMIT :batch FOR UPDATE OF r SKIP LOCKED
    ), gone_deliveries AS (
        DELETE FROM deliveries d USING doomed
        WHERE d.user_id = doomed.user_id AND d.request_id = doomed.id
    ), gone_attempts AS (
        DELETE FROM delivery_attempts a USING doomed
        WHERE a.user_id = doomed.user_id AND a.request_id = doomed.id
    ), gone_decisions AS (
        DELETE FROM decisions c USING doomed
        WHERE c.user_id = doomed.user_id AND c.request_id = doomed.id
    )
    DELETE FROM requests r USING doomed WHERE r.user_id = doomed.user_id AND r.id = doomed.id
    """
)


def _by(table: str, condition: str) -> TextClause:
    """Delete up to :batch rows of `table` matching `condition` (rows others hold are skipped)."""
    return text(
        f"""
        DELETE FROM {table} t USING (
            SELECT tableoid, ctid FROM {table} WHERE {condition}
            LIMIT :batch FOR UPDATE SKIP LOCKED) k
        WHERE t.tableoid = k.tableoid AND t.ctid = k.ctid
        """
    )


# kind -> (statement, which horizon: "keep" = CLARION_RETENTION_DAYS, "inbox", or "now")
STATEMENTS: dict[str, tuple[TextClause, str]] = {
    "requests": (_REQUESTS, "keep"),
    "receipts": (_by("receipts", "received_at < :horizon"), "keep"),
    "interactions": (_by("interactions", "created_at < :horizon"), "keep"),
    "inbox_items": (_by("inbox_items", "created_at < :horizon"), "inbox"),
    "alerts": (_by("alerts", "cleared_at IS NOT NULL AND cleared_at < :horizon"), "keep"),
    "collapse_groups": (_by("collapse_groups", "window_until < :horizon"), "keep"),
    "collapse_refreshes": (
        _by("collapse_refreshes", "due_at IS NULL AND window_until < :horizon"),
        "keep",
    ),
    "activation_windows": (_by("activation_windows", "until < :horizon"), "keep"),
    "fatigue_counters": (_by("fatigue_counters", "expires_at < :horizon"), "now"),
    "api_idempotency": (_by("api_idempotency", "expires_at < :horizon"), "now"),
    # outbound events (migration 0023): what every endpoint took; an event some endpoint has not
    # taken stays (a disabled endpoint's, waiting for an operator), and so does its send row
    "outbound_sends": (
        _by("outbound_sends", "state = 'delivered' AND created_at < :horizon"),
        "keep",
    ),
    "outbound_events": (
        _by(
            "outbound_events",
            "created_at < :horizon AND NOT EXISTS (SELECT 1 FROM outbound_sends s "
            "WHERE s.user_id = outbound_events.user_id AND s.event_id = outbound_events.id)",
        ),
        "keep",
    ),
}


def remove_batch(conn: Connection, kind: str, *, horizon: datetime, batch: int) -> int:
    """Remove up to `batch` rows of `kind` older than `horizon`; how many went."""
    statement, _ = STATEMENTS[kind]
    return int(conn.execute(statement, {"horizon": horizon, "batch": batch}).rowcount or 0)
