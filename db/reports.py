"""Named read-only queries for `clarion stats` and the demo (a request's whole history, for
`clarion explain`, the API and the activity page, is db/activity.py)."""

from __future__ import annotations

from datetime import datetime

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
