"""Named statements for topics: named lists of recipients that a broadcast can address.

A member row is per recipient (its key leads with user_id). Joining or leaving twice changes
nothing and is not an error: the counts returned say what changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, text

_ENSURE_TOPIC = text(
    "INSERT INTO topics (key, created_at) VALUES (:topic, :now) ON CONFLICT (key) DO NOTHING"
)

# Only registered, not erased recipients join; the caller has checked that every id is one.
_JOIN = text(
    """
    INSERT INTO topic_members (user_id, topic_key, created_at)
    SELECT r.user_id, :topic, :now FROM recipients r
    JOIN unnest(CAST(:users AS text[])) AS these(user_id) USING (user_id)
    WHERE r.erased_at IS NULL
    ON CONFLICT (user_id, topic_key) DO NOTHING
    """
)

_LEAVE = text(
    """
    DELETE FROM topic_members m USING unnest(CAST(:users AS text[])) AS these(user_id)
    WHERE m.user_id = these.user_id AND m.topic_key = :topic
    """
)

_EXISTS = text("SELECT EXISTS (SELECT 1 FROM topics WHERE key = :topic)")


def join(conn: Connection, topic: str, user_ids: Sequence[str], *, now: datetime) -> int:
    """Add recipients to a topic (created on first use); how many were not members already."""
    conn.execute(_ENSURE_TOPIC, {"topic": topic, "now": now})
    result = conn.execute(_JOIN, {"topic": topic, "users": list(user_ids), "now": now})
    return result.rowcount


def leave(conn: Connection, topic: str, user_ids: Sequence[str]) -> int:
    """Remove recipients from a topic; how many were members."""
    return conn.execute(_LEAVE, {"topic": topic, "users": list(user_ids)}).rowcount


def exists(conn: Connection, topic: str) -> bool:
    """True once anybody has ever joined the topic (a topic outlives its last member)."""
    return bool(conn.execute(_EXISTS, {"topic": topic}).scalar())
