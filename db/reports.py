"""Named read-only queries for `clarion stats`, the demo and explain."""

from __future__ import annotations

from sqlalchemy import Connection, text

_REQUESTS = text("SELECT lane, state, count(*) FROM requests GROUP BY 1, 2 ORDER BY 1, 2")
_DELIVERIES = text("SELECT lane, channel, state, count(*) FROM deliveries GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
_DECISIONS = text("SELECT gate, outcome, reason, count(*) FROM decisions GROUP BY 1, 2, 3 ORDER BY 4 DESC")
_INCIDENTS = text("SELECT kind, count(*) FROM incidents GROUP BY 1 ORDER BY 1")
_UNSETTLED = text("SELECT count(*) FROM deliveries WHERE state IN ('pending', 'claimed')")
_SENT = text("SELECT count(*) FROM deliveries WHERE state IN ('sent', 'delivered', 'read', 'answered')")
_PENDING_REQUESTS = text("SELECT count(*) FROM requests WHERE state = 'pending'")


def request_counts(conn: Connection) -> list[tuple]:
    """(lane, state, count) over all requests."""
    return [tuple(r) for r in conn.execute(_REQUESTS)]


def delivery_counts(conn: Connection) -> list[tuple]:
    """(lane, channel, state, count) over all deliveries."""
    return [tuple(r) for r in conn.execute(_DELIVERIES)]


def decision_counts(conn: Connection) -> list[tuple]:
    """(gate, outcome, reason, count) over all recorded non-deliveries, most frequent first."""
    return [tuple(r) for r in conn.execute(_DECISIONS)]


def incident_counts(conn: Connection) -> list[tuple]:
    return [tuple(r) for r in conn.execute(_INCIDENTS)]


def progress(conn: Connection) -> tuple[int, int, int]:
    """(requests not yet routed, deliveries not yet settled, deliveries sent)."""
    return (conn.execute(_PENDING_REQUESTS).scalar_one(), conn.execute(_UNSETTLED).scalar_one(),
            conn.execute(_SENT).scalar_one())
