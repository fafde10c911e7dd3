"""Named statements for Idempotency-Key rows (web/api_ingest.py owns the semantics).

A row is inserted at the start of the transaction that writes the requests it answers for, and
filled with the answer before that transaction commits: other transactions never see a row
without its answer. A second request under the same key blocks on the first one's insert until it
commits (then reads the answer) or rolls back (then takes the key itself)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text


@dataclass(frozen=True)
class Stored:
    """The first answer given under a key, and what the request it answered looked like."""

    fingerprint: str
    status: int
    response: str  # the body as sent, so a replay is byte for byte the first answer


# An expired row is taken over in place, so a key can be used again after its retention.
_CLAIM = text(
    """
    INSERT INTO api_idempotency AS i (api_key_id, key, fingerprint, created_at, expires_at)
    VALUES (:api_key_id, :key, :fingerprint, :now, :expires_at)
    ON CONFLICT (api_key_id, key) DO UPDATE
        SET fingerprint = excluded.fingerprint, status = NULL, response = NULL,
            created_at = excluded.created_at, expires_at = excluded.expires_at
        WHERE i.expires_at <= excluded.created_at
    RETURNING true
    """
)
_STORED = text(
    "SELECT fingerprint, status, response FROM api_idempotency "
    "WHERE api_key_id = :api_key_id AND key = :key AND expires_at > :now"
)
_ANSWER = text(
    "UPDATE api_idempotency SET status = :status, response = :response "
    "WHERE api_key_id = :api_key_id AND key = :key"
)
_PURGE = text(
    """
    DELETE FROM api_idempotency i USING (
        SELECT api_key_id, key FROM api_idempotency WHERE expires_at <= :now
        ORDER BY expires_at LIMIT :limit FOR UPDATE SKIP LOCKED) old
    WHERE i.api_key_id = old.api_key_id AND i.key = old.key
    """
)
_POSTPONE = text(
    """
    UPDATE requests r SET due_at = :due_at
    FROM unnest(CAST(:users AS text[]), CAST(:ids AS bigint[])) AS k(user_id, id)
    WHERE r.user_id = k.user_id AND r.id = k.id AND r.state = 'pending'
    """
)


def claim(
    conn: Connection,
    api_key_id: int,
    key: str,
    *,
    fingerprint: str,
    now: datetime,
    expires_at: datetime,
) -> Stored | None:
    """Take the key for this transaction (None), or return the answer stored under it.

    Blocks while another transaction holds the key. The loop covers the one case where neither
    happens: the stored row expired and was purged between the two statements."""
    params = dict(
        api_key_id=api_key_id, key=key, fingerprint=fingerprint, now=now, expires_at=expires_at
    )
    for _ in range(3):
        if conn.execute(_CLAIM, params).first() is not None:
            return None
        row = conn.execute(_STORED, params).mappings().first()
        if row is not None and row["status"] is not None:
            return Stored(row["fingerprint"], row["status"], row["response"])
    raise RuntimeError(f"idempotency key {key!r} neither claimed nor stored")  # pragma: no cover


def answer(conn: Connection, api_key_id: int, key: str, *, status: int, response: str) -> None:
    """Store the answer of the request that claimed the key (same transaction)."""
    conn.execute(
        _ANSWER, {"api_key_id": api_key_id, "key": key, "status": status, "response": response}
    )


def purge(conn: Connection, *, now: datetime, limit: int = 100) -> int:
    """Delete up to `limit` expired rows (rows other transactions hold are skipped)."""
    return conn.execute(_PURGE, {"now": now, "limit": limit}).rowcount


def postpone(conn: Connection, keys: Iterable[tuple[str, int]], *, due_at: datetime) -> None:
    """Give outbox rows written in this transaction the stray window notify() gives its own
    commits: the caller publishes them after commit, and the tick only if that publish is lost."""
    keys = list(keys)
    if keys:
        conn.execute(
            _POSTPONE,
            {"users": [k[0] for k in keys], "ids": [k[1] for k in keys], "due_at": due_at},
        )
