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
from clarion.rows import OpenWindow

_WINDOWS = text(
    f"SELECT user_id, until, type_key FROM activation_windows {THESE_USERS} WHERE until > :now"
)


def open_windows(conn: Connection, params: Mapping[str, Any]) -> list[OpenWindow]:
    """The open windows of `params["users"]` at `params["now"]`."""
    return [OpenWindow.from_row(r) for r in conn.execute(_WINDOWS, params)]


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
_WINDOW = text("SELECT user_id, until, type_key FROM activation_windows WHERE user_id = :user_id")


def claim_window(
    conn: Connection,
    user_id: str,
    *,
    request_id: int,
    type_key: str,
    now: datetime,
    until: datetime,
) -> OpenWindow | None:
    """Open the recipient's activation window; None if we did, else the open one."""
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
    return OpenWindow.from_row(conn.execute(_WINDOW, {"user_id": user_id}).one())
