"""Named statements for chat surfaces: who a platform's user id is in clarion."""

from __future__ import annotations

from sqlalchemy import Connection, text

# Rare (a chat user opening clarion's App Home or preferences card), so a scan of recipients is
# acceptable; an expression index on addresses->>'slack' would make it a lookup.
_USER_FOR_ADDRESS = text(
    "SELECT user_id FROM recipients WHERE addresses ->> :platform = :address ORDER BY user_id LIMIT 2"
)


def user_for_address(conn: Connection, platform: str, address: str) -> str | None:
    """The recipient whose `platform` address is `address`; None if nobody, or if it is ambiguous."""
    found = (
        conn.execute(_USER_FOR_ADDRESS, {"platform": platform, "address": address}).scalars().all()
    )
    return found[0] if len(found) == 1 else None
