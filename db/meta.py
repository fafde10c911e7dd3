"""Named statements for clarion_meta: deployment-wide facts, such as the tz database release."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text

TZDATA = "tzdata"

_GET = text("SELECT value FROM clarion_meta WHERE key = :key")
_PUT = text(
    """
    WITH old AS (SELECT value FROM clarion_meta WHERE key = :key)
    INSERT INTO clarion_meta AS m (key, value, updated_at) VALUES (:key, :value, :now)
    ON CONFLICT (key) DO UPDATE SET value = :value, updated_at = :now
        WHERE m.value IS DISTINCT FROM :value
    RETURNING (SELECT value FROM old)
    """
)


def get(conn: Connection, key: str) -> str | None:
    """The recorded value, or None if nothing was recorded under `key`."""
    return conn.execute(_GET, {"key": key}).scalar()


def put(conn: Connection, key: str, value: str, *, now: datetime) -> tuple[bool, str | None]:
    """Record `value` under `key`: (changed, the value before). Recording the same value again
    writes nothing."""
    row = conn.execute(_PUT, {"key": key, "value": value, "now": now}).first()
    return (row is not None, row[0] if row is not None else value)
