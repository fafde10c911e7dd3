"""Named statements for API keys (web/api_auth.py decides; these only read and write rows).

A key is not a recipient's: the table leads with its own id (see migration 0010)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, RowMapping, text


@dataclass(frozen=True)
class ApiKey:
    id: int
    prefix: str
    name: str
    secret_sha256: str
    scopes: tuple[str, ...]
    rate_limit: int
    rate_window: int
    created_at: datetime
    revoked_at: datetime | None
    last_used_at: datetime | None
    expires_at: datetime | None

    @classmethod
    def from_row(cls, row: RowMapping) -> ApiKey:
        return cls(**{**dict(row), "scopes": tuple(row["scopes"])})


_COLUMNS = (
    "id, prefix, name, secret_sha256, scopes, rate_limit, rate_window, created_at, revoked_at, "
    "last_used_at, expires_at"
)

_INSERT = text(
    f"""
    INSERT INTO api_keys
        (prefix, name, secret_sha256, scopes, rate_limit, rate_window, created_at, expires_at)
    VALUES (:prefix, :name, :secret_sha256, CAST(:scopes AS text[]), :rate_limit, :rate_window, :now,
            :expires_at)
    RETURNING {_COLUMNS}
    """
)
_BY_PREFIX = text(f"SELECT {_COLUMNS} FROM api_keys WHERE prefix = :prefix")
_ALL = text(f"SELECT {_COLUMNS} FROM api_keys ORDER BY id")
_REVOKE = text(
    f"""
    UPDATE api_keys SET revoked_at = :now WHERE prefix = :prefix AND revoked_at IS NULL
    RETURNING {_COLUMNS}
    """
)
# At most one write a minute per key, whichever process sees the key first: the others find the
# row fresh and write nothing (an UPDATE matching no row writes no tuple and no WAL).
_TOUCH = text(
    """
    UPDATE api_keys SET last_used_at = :now
    WHERE id = :id AND (last_used_at IS NULL OR last_used_at <= :now - interval '1 minute')
    """
)
TOUCH_EVERY_SECONDS = 60


def insert_key(
    conn: Connection,
    *,
    prefix: str,
    name: str,
    secret_sha256: str,
    scopes: list[str],
    rate_limit: int,
    rate_window: int,
    now: datetime,
    expires_at: datetime | None = None,
) -> ApiKey:
    """Store a new key (its hash only)."""
    params = dict(
        prefix=prefix,
        name=name,
        secret_sha256=secret_sha256,
        scopes=scopes,
        rate_limit=rate_limit,
        rate_window=rate_window,
        now=now,
        expires_at=expires_at,
    )
    return ApiKey.from_row(conn.execute(_INSERT, params).mappings().one())


def find_key(conn: Connection, prefix: str) -> ApiKey | None:
    """The key with this public prefix, revoked or not."""
    row = conn.execute(_BY_PREFIX, {"prefix": prefix}).mappings().first()
    return None if row is None else ApiKey.from_row(row)


def all_keys(conn: Connection) -> list[ApiKey]:
    return [ApiKey.from_row(r) for r in conn.execute(_ALL).mappings()]


def revoke_key(conn: Connection, prefix: str, *, now: datetime) -> ApiKey | None:
    """Revoke a live key; None if there is no such key or it was revoked already."""
    row = conn.execute(_REVOKE, {"prefix": prefix, "now": now}).mappings().first()
    return None if row is None else ApiKey.from_row(row)


def touch_key(conn: Connection, key_id: int, *, now: datetime) -> bool:
    """Record that the key was used at `now`, unless it was recorded less than a minute before;
    True if this call wrote it."""
    return conn.execute(_TOUCH, {"id": key_id, "now": now}).rowcount == 1
