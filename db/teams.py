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
from datetime import datetime

from sqlalchemy import Connection, text

_REFERENCE = text(
    "SELECT addresses->>'teams_conversation' FROM recipients "
    "WHERE user_id = :user_id AND addresses->>'teams' = :teams_user"
)


def conversation_reference(conn: Connection, user_id: str, teams_user: str) -> str | None:
    """The stored conversation reference (JSON) of this recipient, if their Teams id still matches."""
    return conn.execute(_REFERENCE, {"user_id": user_id, "teams_user": teams_user}).scalar()


_REMEMBER = text(
    """
    UPDATE recipients
    SET addresses = addresses || jsonb_build_object('teams_conversation', CAST(:reference AS text)),
        updated_at = :now
    WHERE addresses @> CAST(:match AS jsonb)
      AND addresses->>'teams_conversation' IS DISTINCT FROM CAST(:reference AS text)
    RETURNING user_id
    """
)


def remember_conversation(conn: Connection, teams_user: str, reference: str, *, now: datetime) -> list[str]:
    """Store `reference` on every recipient with this Teams id; returns the ones that changed."""
    params = {"match": json.dumps({"teams": teams_user}), "reference": reference, "now": now}
    return [row[0] for row in conn.execute(_REMEMBER, params)]


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
