"""Named statements for the suppression list as operators see it: list it, lift an entry (audited).

The gates read the list through db/gating.py; the receipt and keyword paths write it there too.
Lifting is by address, for everyone who has it, in one statement (DELETE … RETURNING feeding the audit INSERT), so an entry is never gone
without its audit row, nor audited without being gone."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

from clarion import hashing, settings


@dataclass(frozen=True)
class Suppression:
    user_id: str
    channel: str
    address: str
    reason: str
    detail: str
    created_at: datetime


@dataclass(frozen=True)
class Lift:
    id: int
    user_id: str | None
    channel: str
    address: str
    reason: str
    detail: str
    suppressed_at: datetime
    lifted_by: str
    lifted_at: datetime
    why: str


_MATCH = """
    (CAST(:user_id AS text) IS NULL OR user_id = :user_id)
    AND (CAST(:channel AS text) IS NULL OR channel = :channel)
    AND (CAST(:address AS text) IS NULL OR address = :address)
"""
_LIST = text(
    f"SELECT user_id, channel, address, reason, detail, created_at FROM suppressions "
    f"WHERE {_MATCH} ORDER BY created_at DESC, user_id, channel, address LIMIT :limit"
)
_LIFTS = text(
    f"SELECT id, user_id, channel, address, reason, detail, suppressed_at, lifted_by, lifted_at, "
    f"why FROM suppression_lifts WHERE {_MATCH} ORDER BY lifted_at DESC, id DESC LIMIT :limit"
)
# By address, whoever the entries were recorded for (an erased recipient's too: same hash); with a
# user, only if that user has one. Index suppressions_address.
_LIFT = text(
    """
    WITH lifted AS (
        DELETE FROM suppressions
        WHERE channel = :channel AND address_hash = :address_hash
          AND (CAST(:user_id AS text) IS NULL OR EXISTS (
              SELECT 1 FROM suppressions
              WHERE user_id = :user_id AND channel = :channel AND address_hash = :address_hash))
        RETURNING user_id, channel, address, reason, detail, created_at
    )
    INSERT INTO suppression_lifts
        (user_id, channel, address, reason, detail, suppressed_at, lifted_by, lifted_at, why)
    SELECT user_id, channel, address, reason, detail, created_at, :by, :now, :why FROM lifted
    RETURNING id, user_id, channel, address, reason, detail, suppressed_at, lifted_by, lifted_at,
              why
    """
)


def _filters(
    user_id: str | None, channel: str | None, address: str | None, limit: int
) -> dict[str, object]:
    return {"user_id": user_id, "channel": channel, "address": address, "limit": limit}


def list_suppressions(
    conn: Connection,
    *,
    user_id: str | None = None,
    channel: str | None = None,
    address: str | None = None,
    limit: int = 100,
) -> list[Suppression]:
    """Entries on the list matching every filter given, newest first."""
    params = _filters(user_id, channel, address, limit)
    return [Suppression(**r) for r in conn.execute(_LIST, params).mappings()]


def list_lifts(
    conn: Connection,
    *,
    user_id: str | None = None,
    channel: str | None = None,
    address: str | None = None,
    limit: int = 100,
) -> list[Lift]:
    """Lifted entries matching every filter given, most recently lifted first."""
    params = _filters(user_id, channel, address, limit)
    return [Lift(**r) for r in conn.execute(_LIFTS, params).mappings()]


def lift(
    conn: Connection,
    *,
    user_id: str | None,
    channel: str,
    address: str,
    by: str,
    why: str,
    now: datetime,
) -> list[Lift]:
    """Take the address off the list for everyone (every entry of it, whoever it was recorded for)
    and record who lifted each, when and why. With `user_id`, only if that user has an entry for
    it. Empty if nothing matched (nothing is written then)."""
    key = hashing.address_key(settings.get())
    params = {
        "user_id": user_id,
        "channel": channel,
        "address_hash": hashing.hashed(key, channel, address),
        "by": by,
        "why": why,
        "now": now,
    }
    return [Lift(**row) for row in conn.execute(_LIFT, params).mappings()]
