"""Named statements on the alerts table: open, clear, what is open, what the webhook still owes.

Opening is `INSERT ... ON CONFLICT DO NOTHING` on the partial unique index of open alerts, so two
evaluators (two beats) firing the same alert at once leave one row; the loser gets None.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text


@dataclass(frozen=True)
class Alert:
    id: int
    kind: str
    subject: str
    opened_at: datetime
    cleared_at: datetime | None
    value: float
    detail: str
    open_posted_at: datetime | None = None
    clear_posted_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Any) -> Alert:
        return cls(**dict(row))


_COLUMNS = (
    "id, kind, subject, opened_at, cleared_at, value, detail, open_posted_at, clear_posted_at"
)
_OPEN = text(
    "INSERT INTO alerts (kind, subject, opened_at, value, detail) "
    "VALUES (:kind, :subject, :now, :value, :detail) "
    "ON CONFLICT (kind, subject) WHERE cleared_at IS NULL DO NOTHING "
    f"RETURNING {_COLUMNS}"
)
_CLEAR = text(
    "UPDATE alerts SET cleared_at = :now "
    "WHERE kind = :kind AND subject = :subject AND cleared_at IS NULL "
    f"RETURNING {_COLUMNS}"
)
_OPEN_ONES = text(f"SELECT {_COLUMNS} FROM alerts WHERE cleared_at IS NULL ORDER BY opened_at, id")
_RECENT = text(
    f"SELECT {_COLUMNS} FROM alerts WHERE cleared_at IS NULL OR cleared_at >= :since "
    "ORDER BY opened_at DESC, id DESC LIMIT :limit"
)
# Through alerts_unposted; only rows that changed since :since, so a webhook configured later
# is not sent last month's alerts.
_UNPOSTED = text(
    f"SELECT {_COLUMNS} FROM alerts "
    "WHERE (open_posted_at IS NULL OR (cleared_at IS NOT NULL AND clear_posted_at IS NULL)) "
    "AND coalesce(cleared_at, opened_at) >= :since ORDER BY id LIMIT :limit"
)
_POSTED = {
    "fired": text("UPDATE alerts SET open_posted_at = :now WHERE id = :id"),
    "cleared": text("UPDATE alerts SET clear_posted_at = :now WHERE id = :id"),
}


def open_alert(
    conn: Connection, kind: str, subject: str, *, value: float, detail: str, now: datetime
) -> Alert | None:
    """The new open alert, or None if one is open for (kind, subject) already."""
    params = {"kind": kind, "subject": subject, "value": value, "detail": detail[:500], "now": now}
    row = conn.execute(_OPEN, params).mappings().first()
    return Alert.from_row(row) if row else None


def clear_alert(conn: Connection, kind: str, subject: str, *, now: datetime) -> Alert | None:
    """The alert just cleared, or None if none was open."""
    row = conn.execute(_CLEAR, {"kind": kind, "subject": subject, "now": now}).mappings().first()
    return Alert.from_row(row) if row else None


def open_alerts(conn: Connection) -> list[Alert]:
    return [Alert.from_row(r) for r in conn.execute(_OPEN_ONES).mappings()]


def recent(conn: Connection, *, since: datetime, limit: int = 20) -> list[Alert]:
    """Open alerts and those cleared since `since`, newest first (`clarion stats`)."""
    rows = conn.execute(_RECENT, {"since": since, "limit": limit}).mappings()
    return [Alert.from_row(r) for r in rows]


def unposted(conn: Connection, *, since: datetime, limit: int = 50) -> list[Alert]:
    """Alerts whose firing, or clearing, the webhook has not taken yet."""
    rows = conn.execute(_UNPOSTED, {"since": since, "limit": limit}).mappings()
    return [Alert.from_row(r) for r in rows]


def mark_posted(conn: Connection, alert_id: int, event: str, *, now: datetime) -> None:
    """event: fired | cleared."""
    conn.execute(_POSTED[event], {"id": alert_id, "now": now})
