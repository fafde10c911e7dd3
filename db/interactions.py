"""Named statements for button answers: look up the delivery, answer it once, record the click."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

# A collapse leader's variables carry its group's count (db.refresh), so the message an answer
# re-renders keeps showing it.
_TARGET = text(
    """
    SELECT d.user_id, d.id, d.state, d.channel, d.platform, d.type_key, d.occurrence_key, d.answer,
           d.provider_message_id, r.template_version,
           r.variables || COALESCE(
               (SELECT jsonb_build_object('collapsed_count', c.count,
                                          'collapse_open', c.due_at IS NOT NULL)
                FROM collapse_refreshes c
                WHERE c.user_id = d.user_id AND c.leader_id = d.request_id),
               '{}'::jsonb) AS variables,
           r.locale, rc.addresses
    FROM deliveries d
    JOIN requests r ON r.user_id = d.user_id AND r.id = d.request_id
    JOIN recipients rc ON rc.user_id = d.user_id
    WHERE d.user_id = :user_id AND d.id = :id
    """
)


def interaction_target(conn: Connection, user_id: str, delivery_id: int) -> dict[str, Any] | None:
    """The delivery a button names, with what validating a click needs; None if there is none."""
    row = conn.execute(_TARGET, {"user_id": user_id, "id": delivery_id}).mappings().first()
    return dict(row) if row else None


_ANSWER = text(
    """
    UPDATE deliveries SET state = 'answered', answer = :answer, answered_at = :now, answered_by = :by,
        updated_at = :now
    WHERE user_id = :user_id AND id = :id AND state IN ('sent', 'delivered', 'opened', 'read', 'clicked')
    RETURNING id
    """
)
_RECORDED = text("SELECT answer FROM deliveries WHERE user_id = :user_id AND id = :id")


def answer_once(
    conn: Connection, key: tuple[str, int], *, answer: str, by: str, now: datetime
) -> tuple[bool, str | None]:
    """First answer wins: (True, answer) if ours was recorded, else (False, the answer already there)."""
    params = {"user_id": key[0], "id": key[1], "answer": answer, "by": by, "now": now}
    if conn.execute(_ANSWER, params).first() is not None:
        return True, answer
    return False, conn.execute(_RECORDED, params).scalar()


_RECORD = text(
    """
    INSERT INTO interactions (user_id, delivery_id, platform, platform_user, answer, outcome, reason,
                              payload, created_at)
    VALUES (:user_id, :delivery_id, :platform, :platform_user, :answer, :outcome, :reason, :payload, :now)
    """
)


def _storable(text: str, limit: int) -> str:
    """Untrusted text as PostgreSQL text can hold it: cut, NUL and lone surrogates escaped."""
    return text[:limit].encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def record_interaction(
    conn: Connection,
    *,
    user_id: str,
    delivery_id: int | None,
    platform: str,
    platform_user: str,
    answer: str | None,
    outcome: str,
    reason: str,
    payload: str,
    now: datetime,
) -> None:
    conn.execute(
        _RECORD,
        {
            "user_id": user_id,
            "delivery_id": delivery_id,
            "platform": platform,
            "platform_user": _storable(platform_user, 200),
            "answer": answer,
            "outcome": outcome,
            "reason": reason,
            "payload": _storable(payload, 1000),
            "now": now,
        },
    )
