"""Named read-only queries for `clarion stats`, the demo and explain."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

_REQUESTS = text("SELECT lane, state, count(*) FROM requests GROUP BY 1, 2 ORDER BY 1, 2")
_DELIVERIES = text(
    "SELECT lane, channel, state, count(*) FROM deliveries GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
)
_DECISIONS = text(
    "SELECT gate, outcome, reason, count(*) FROM decisions GROUP BY 1, 2, 3 ORDER BY 4 DESC"
)
_INCIDENTS = text("SELECT kind, count(*) FROM incidents GROUP BY 1 ORDER BY 1")
_DIGESTS = text(
    "SELECT digest_type, state, count(*), sum(count), min(due_at) FILTER (WHERE state <> 'closed')"
    " FROM digests GROUP BY 1, 2 ORDER BY 1, 2"
)
_ESCALATIONS = text(
    "SELECT type_key, state, CASE WHEN state = 'waiting' THEN next_step END, count(*),"
    " min(due_at) FILTER (WHERE state = 'waiting') FROM escalations GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
)
_UNSETTLED = text("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'claimed')")
_SENT = text(
    "SELECT count(*) FROM deliveries WHERE state IN ('sent', 'delivered', 'opened', 'read', 'clicked', 'answered', 'bounced', 'undelivered')"
)
_PENDING_REQUESTS = text("SELECT count(*) FROM requests WHERE state = 'pending'")


def request_counts(conn: Connection) -> list[tuple[str, str, int]]:
    """(lane, state, count) over all requests."""
    return [(lane, state, n) for lane, state, n in conn.execute(_REQUESTS)]


def delivery_counts(conn: Connection) -> list[tuple[str, str, str, int]]:
    """(lane, channel, state, count) over all deliveries."""
    return [(lane, ch, state, n) for lane, ch, state, n in conn.execute(_DELIVERIES)]


def decision_counts(conn: Connection) -> list[tuple[str, str, str, int]]:
    """(gate, outcome, reason, count) over all recorded non-deliveries, most frequent first."""
    return [(gate, out, reason, n) for gate, out, reason, n in conn.execute(_DECISIONS)]


def incident_counts(conn: Connection) -> list[tuple[str, int]]:
    return [(kind, n) for kind, n in conn.execute(_INCIDENTS)]


def _at(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else ""


def digest_counts(conn: Connection) -> list[tuple[str, str, int, int, str]]:
    """(digest type, state, windows, items buffered, earliest close of those not closed)."""
    return [(t, s, n, items, _at(due)) for t, s, n, items, due in conn.execute(_DIGESTS)]


def escalation_counts(conn: Connection) -> list[tuple[str, str, int | str, int, str]]:
    """(type, state, the step a waiting chain's timer is for, chains, earliest timer)."""
    return [
        (t, s, "" if step is None else step, n, _at(due))
        for t, s, step, n, due in conn.execute(_ESCALATIONS)
    ]


def progress(conn: Connection) -> tuple[int, int, int]:
    """(requests not yet routed, deliveries not yet settled, deliveries sent)."""
    return (
        conn.execute(_PENDING_REQUESTS).scalar_one(),
        conn.execute(_UNSETTLED).scalar_one(),
        conn.execute(_SENT).scalar_one(),
    )


_EXPLAIN_REQUESTS = text(
    """
    SELECT id, type_key, occurrence_key, state, created_at, routed_at, due_at FROM requests
    WHERE user_id = :user_id AND (CAST(:type_key AS text) IS NULL OR type_key = :type_key)
      AND created_at >= :since
    ORDER BY created_at DESC, id DESC LIMIT :limit
    """
)
_EXPLAIN_DECISIONS = text(
    "SELECT request_id, decided_at, gate, outcome, reason, channel, detail FROM decisions "
    "WHERE user_id = :user_id AND request_id = ANY(CAST(:ids AS bigint[])) ORDER BY decided_at, id"
)
_EXPLAIN_RECEIPTS = text(
    "SELECT d.request_id, e.received_at, e.channel, e.event, e.outcome, e.detail FROM receipts e "
    "JOIN deliveries d ON d.user_id = e.user_id AND d.id = e.delivery_id "
    "WHERE e.user_id = :user_id AND d.request_id = ANY(CAST(:ids AS bigint[])) ORDER BY e.id"
)
# next_attempt_at: a pending row is tried once both its claim time (not_before) and the tick's
# republish time (due_at) have come; a claimed row again only if its holder lets the lease run out.
_EXPLAIN_DELIVERIES = text(
    "SELECT request_id, channel, state, attempts, sent_at, platform, last_error, not_before, "
    "CASE WHEN state = 'pending' THEN greatest(not_before, due_at) "
    "WHEN state = 'claimed' THEN lease_until END AS next_attempt_at FROM deliveries "
    "WHERE user_id = :user_id AND request_id = ANY(CAST(:ids AS bigint[])) ORDER BY id"
)
_EXPLAIN_INCIDENTS = text(
    "SELECT d.request_id, d.channel, i.kind, i.detail, i.created_at FROM incidents i "
    "JOIN deliveries d ON d.user_id = i.user_id AND d.id = i.delivery_id "
    "WHERE i.user_id = :user_id AND d.request_id = ANY(CAST(:ids AS bigint[])) ORDER BY i.id"
)

# The outbound events about these requests (migration 0023), with how many endpoints took each.
_EXPLAIN_EVENTS = text(
    """
    SELECT e.request_id, 'evt_' || e.id AS id, e.id AS sequence, e.kind, e.delivery_id,
        e.channel, e.created_at, c.taken, c.pending
    FROM outbound_events e CROSS JOIN LATERAL (
        -- per endpoint (a handful), by the sends' primary key
        SELECT count(*) FILTER (WHERE s.state = 'delivered') AS taken,
            count(*) FILTER (WHERE s.state = 'pending') AS pending
        FROM webhook_endpoints w JOIN outbound_sends s
            ON s.endpoint_id = w.id AND s.event_id = e.id) c
    WHERE e.user_id = :user_id AND e.request_id = ANY(CAST(:ids AS bigint[])) ORDER BY e.id
    """
)


def explain_rows(
    conn: Connection, user_id: str, *, type_key: str | None, since: datetime, limit: int
) -> list[dict[str, Any]]:
    """A recipient's requests, newest first, each with its decisions, deliveries, receipts and
    incidents (deliveries carry next_attempt_at: when a pending or claimed one is tried next)."""
    params = {"user_id": user_id, "type_key": type_key, "since": since, "limit": limit}
    requests = [dict(r) for r in conn.execute(_EXPLAIN_REQUESTS, params).mappings()]
    return _with_history(conn, user_id, requests)


_REQUEST = text(
    "SELECT id, type_key, occurrence_key, state, created_at, routed_at, due_at FROM requests "
    "WHERE user_id = :user_id AND id = :id"
)


def request_row(conn: Connection, user_id: str, request_id: int) -> dict[str, Any] | None:
    """One request with its decisions, deliveries, receipts, incidents and outbound events
    (explain_rows' shape), or None."""
    found = conn.execute(_REQUEST, {"user_id": user_id, "id": request_id}).mappings().first()
    return _with_history(conn, user_id, [dict(found)])[0] if found else None


def _with_history(
    conn: Connection, user_id: str, requests: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    ids = [r["id"] for r in requests]
    by_id = {r["id"]: {**r, "decisions": [], "deliveries": []} for r in requests}
    for row in conn.execute(_EXPLAIN_DECISIONS, {"user_id": user_id, "ids": ids}).mappings():
        by_id[row["request_id"]]["decisions"].append(dict(row))
    for row in conn.execute(_EXPLAIN_DELIVERIES, {"user_id": user_id, "ids": ids}).mappings():
        by_id[row["request_id"]]["deliveries"].append(dict(row))
    for key in by_id.values():
        key["receipts"] = []
        key["incidents"] = []
        key["events"] = []
    for row in conn.execute(_EXPLAIN_RECEIPTS, {"user_id": user_id, "ids": ids}).mappings():
        by_id[row["request_id"]]["receipts"].append(dict(row))
    for row in conn.execute(_EXPLAIN_INCIDENTS, {"user_id": user_id, "ids": ids}).mappings():
        by_id[row["request_id"]]["incidents"].append(dict(row))
    for row in conn.execute(_EXPLAIN_EVENTS, {"user_id": user_id, "ids": ids}).mappings():
        by_id[row["request_id"]]["events"].append(dict(row))
    return [by_id[i] for i in ids]


_SUPPRESSIONS = text(
    "SELECT channel, address, reason, detail, created_at FROM suppressions "
    "WHERE user_id = :user_id ORDER BY created_at, channel, address"
)


def suppression_rows(conn: Connection, user_id: str) -> list[dict[str, Any]]:
    """The recipient's entries on the permanent suppression list."""
    return [dict(r) for r in conn.execute(_SUPPRESSIONS, {"user_id": user_id}).mappings()]


_OPEN_DELIVERIES = text(
    """
    SELECT lane, channel, state, count(*) FROM deliveries WHERE due_at IS NOT NULL
    GROUP BY 1, 2, 3
    UNION ALL
    SELECT lane, channel, state, count(*) FROM deliveries WHERE state = 'unknown' GROUP BY 1, 2, 3
    """
)


def open_deliveries(conn: Connection) -> list[tuple[str, str, str, int]]:
    """(lane, channel, state, count) for deliveries still open: pending, claimed (through the due
    index) and held unknown (through its partial index) — never a scan of everything sent."""
    return [(lane, ch, state, n) for lane, ch, state, n in conn.execute(_OPEN_DELIVERIES)]


_OLDEST_DUE = {
    kind: text(
        f"SELECT min(due_at) FROM {kind} WHERE lane = :lane AND due_at IS NOT NULL "
        "AND due_at <= :now"
    )
    for kind in ("requests", "deliveries")
}


def oldest_due(conn: Connection, now: datetime) -> list[tuple[str, str, float]]:
    """(kind, lane, seconds) the oldest row due for work has waited; 0 when nothing is overdue.
    Each is one read of the first entry of a (lane, due_at) index."""
    out: list[tuple[str, str, float]] = []
    for kind, query in _OLDEST_DUE.items():
        for lane in ("transactional", "activation"):
            due = conn.execute(query, {"lane": lane, "now": now}).scalar()
            out.append((kind, lane, (now - due).total_seconds() if due else 0.0))
    return out
