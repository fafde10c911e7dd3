"""Named statements for Microsoft Teams: conversation references and Teams user → recipient.

A recipient is addressed on Teams by `addresses["teams"]` = the Teams user id (`29:…`, the
`from.id` of that user's activities). `addresses["teams_conversation"]` holds the conversation
reference (a JSON string) captured when the user last talked to the bot; proactive sends need it.
Registering the recipient again keeps it while their Teams id stays the same (db.ledger's upsert).

The lookups by Teams user id read `addresses @> {"teams": id}`: a sequential scan of recipients
today, and ready for a GIN index on `addresses` (jsonb_path_ops) when one is added.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from sqlalchemy import Connection, text

_REFERENCE = text(
    "SELECT addresses->>'teams_conversation' FROM recipients "
    "WHERE user_id = :user_id AND addresses->>'teams' = :teams_user"
)


def conversation_reference(conn: Connection, user_id: str, teams_user: str) -> str | None:
    """The stored conversation reference (JSON) of this recipient, if their Teams id still matches."""
    return conn.execute(_REFERENCE, {"user_id": user_id, "teams_user": teams_user}).scalar()


@dataclass(frozen=True)
class Remembered:
    """What storing a conversation reference did, per recipient with that Teams id."""

    changed: list[str]  # a new reference stored
    refused: list[str]  # a reference from another origin, not allowed to replace theirs
    unchanged: list[str]  # already this reference

    @property
    def accepted(self) -> bool:
        """Some recipient has this reference now (so the sender really is reachable there)."""
        return bool(self.changed or self.unchanged)


_STORED = text(
    "SELECT user_id, addresses->>'teams_conversation' AS stored FROM recipients "
    "WHERE addresses @> CAST(:match AS jsonb) ORDER BY user_id FOR UPDATE"
)

_REMEMBER = text(
    """
    UPDATE recipients
    SET addresses = addresses || jsonb_build_object('teams_conversation', CAST(:reference AS text)),
        updated_at = :now
    WHERE user_id = :user_id AND addresses @> CAST(:match AS jsonb)
    """
)


def remember_conversation(
    conn: Connection,
    teams_user: str,
    reference: str,
    *,
    now: datetime,
    only_from: str | None = None,
) -> Remembered:
    """Store `reference` on every recipient with this Teams id. `only_from` (an origin, for an
    activity nobody authenticated): a stored reference is replaced only by one from that same
    origin (scheme, host, port of its serviceUrl); a first one is stored whatever its origin."""
    match = json.dumps({"teams": teams_user})
    changed, refused, unchanged = [], [], []
    for user_id, stored in conn.execute(_STORED, {"match": match}):
        if stored == reference:
            unchanged.append(user_id)
        elif stored is not None and only_from is not None and reference_origin(stored) != only_from:
            refused.append(user_id)
        else:
            conn.execute(
                _REMEMBER, {"user_id": user_id, "match": match, "reference": reference, "now": now}
            )
            changed.append(user_id)
    return Remembered(changed, refused, unchanged)


def reference_origin(reference: str | None) -> str | None:
    """The origin ("scheme://host:port") of a stored reference's serviceUrl; None if it has none."""
    try:
        data = json.loads(reference or "")
        return origin(data["serviceUrl"]) if isinstance(data, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


def origin(url: str) -> str | None:
    """scheme://host:port of a URL (the default port spelled out), lower-cased; None if not http(s)."""
    try:
        parts = urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"


_LIFT_DEACTIVATION = text(
    """
    DELETE FROM suppressions
    WHERE channel = 'teams' AND address = :teams_user AND reason = 'deactivated'
    """
)


def lift_deactivation(conn: Connection, teams_user: str) -> int:
    """A user who talks to the bot again (re-installed it) is reachable again: drop the
    'deactivated' suppression an earlier 403/404 put on their Teams address. Other reasons stay."""
    return conn.execute(_LIFT_DEACTIVATION, {"teams_user": teams_user}).rowcount


_USERS = text(
    "SELECT user_id FROM recipients WHERE addresses @> CAST(:match AS jsonb) ORDER BY user_id"
)


def users_for_teams_user(conn: Connection, teams_user: str) -> list[str]:
    """The clarion recipients whose Teams address is this Teams user id (normally one)."""
    return list(conn.execute(_USERS, {"match": json.dumps({"teams": teams_user})}).scalars())
