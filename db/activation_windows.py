"""Named statements for the activation window gate (gates/activation_window.py): the open windows
of many recipients, for their snapshot, and the claim that opens one (one conditional upsert: of
concurrent claimers, the database picks the winner).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from clarion.db.ledger import THESE_USERS

_WINDOWS = text(
    f"SELECT user_id, until, type_key FROM activation_windows {THESE_USERS} WHERE until > :now"
)


def open_windows(conn: Connection, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    """(user_id, until, type_key) of the open windows of `params["users"]` at `params["now"]`."""
    return [tuple(r) for r in conn.execute(_WINDOWS, params)]


_CLAIM_WINDOW = text(
    """
    INSERT INTO activation_windows AS w (user_id, request_id, type_key, opened_at, until)
    VALUES (:user_id, :request_id, :type_key, :now, :until)
    ON CONFLICT (user_id) DO UPDATE
        SET request_id = excluded.request_id, type_key = excluded.type_key,
            opened_at = excluded.opened_at, until = excluded.until
        WHERE w.until <= excluded.opened_at
    RETURNING request_id
    """
)
_WINDOW = text("SELECT until, type_key FROM activation_windows WHERE user_id = :user_id")


def claim_window(
    conn: Connection,
    user_id: str,
    *,
    request_id: int,
    type_key: str,
    now: datetime,
    until: datetime,
) -> tuple[datetime, str] | None:
    """Open the recipient's activation window; None if we did, else (until, type) of the open one."""
    won = conn.execute(
        _CLAIM_WINDOW,
        {
            "user_id": user_id,
            "request_id": request_id,
            "type_key": type_key,
            "now": now,
            "until": until,
        },
    ).first()
    if won is not None:
        return None
    row = conn.execute(_WINDOW, {"user_id": user_id}).one()
    return row[0], row[1]
