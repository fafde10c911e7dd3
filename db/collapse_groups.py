"""Named statements for the collapse gate (gates/collapse.py): the open groups of many recipients,
for the snapshot, the claim that leads or joins a group (one conditional upsert: of concurrent
claimers, the database picks the leader), and a follower's count on its group.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from clarion.db.ledger import THESE_USERS
from clarion.rows import CollapseGroup

_COLLAPSES = text(
    "SELECT user_id, collapse_key, leader_id, window_until, count FROM collapse_groups "
    f"{THESE_USERS} WHERE window_until > :now"
)


def open_groups(conn: Connection, params: Mapping[str, Any]) -> list[CollapseGroup]:
    """The open groups of `params["users"]` at `params["now"]`."""
    return [CollapseGroup.from_row(r) for r in conn.execute(_COLLAPSES, params)]


_CLAIM_COLLAPSE = text(
    """
    INSERT INTO collapse_groups AS g (user_id, collapse_key, leader_id, window_until, count)
    VALUES (:user_id, :key, :request_id, :until, 1)
    ON CONFLICT (user_id, collapse_key) DO UPDATE SET
        leader_id = CASE WHEN g.window_until > :now THEN g.leader_id ELSE excluded.leader_id END,
        count = CASE WHEN g.window_until > :now THEN g.count + 1 ELSE 1 END,
        window_until = CASE WHEN g.window_until > :now THEN g.window_until ELSE excluded.window_until END
    RETURNING user_id, collapse_key, leader_id, window_until, count
    """
)


def claim_collapse(
    conn: Connection, user_id: str, *, key: str, request_id: int, now: datetime, until: datetime
) -> CollapseGroup:
    """Join or lead the collapse group; returns the group (its leader, window end, members so far)."""
    row = conn.execute(
        _CLAIM_COLLAPSE,
        {"user_id": user_id, "key": key, "request_id": request_id, "now": now, "until": until},
    ).one()
    return CollapseGroup.from_row(row)


_JOIN_COLLAPSE = text(
    """
    WITH g AS (
        UPDATE collapse_groups SET count = count + 1
        WHERE user_id = :user_id AND collapse_key = :key AND window_until > :now
        RETURNING user_id, collapse_key, leader_id, window_until, count
    )
    INSERT INTO collapse_refreshes AS r (user_id, leader_id, collapse_key, count, window_until, due_at)
    SELECT user_id, leader_id, collapse_key, count, window_until, CAST(:due AS timestamptz) FROM g
    ON CONFLICT (user_id, leader_id) DO UPDATE SET
        count = GREATEST(r.count, excluded.count), due_at = LEAST(r.due_at, excluded.due_at)
    """
)


def join_collapse(
    conn: Connection, user_id: str, *, key: str, now: datetime, refresh_at: datetime | None = None
) -> None:
    """Count a collapsed follower on its group (the leader's "and N more"), and owe the leader's
    message an update no later than `refresh_at` (default: now). Followers only bring the update
    forward, never push it back, so many followers make one update (tasks.refresh)."""
    conn.execute(
        _JOIN_COLLAPSE,
        {"user_id": user_id, "key": key, "now": now, "due": refresh_at or now},
    )
