"""Named statements on the outbound events: endpoints, what is ready to send, and its outcome.

The events themselves are written by the triggers of migration 0023, in the transaction of the
change they report; nothing here writes an event. One send row per (endpoint, event) is pending
until the endpoint answers 2xx. What may be sent now is a pending row that is due, not leased, and
the oldest pending one of its stream for this endpoint: a later event of a delivery is never sent
before an earlier one was taken (ordering per delivery, docs/guides/outbound-events.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text


@dataclass(frozen=True)
class Endpoint:
    id: int
    url: str
    kinds: tuple[str, ...]
    description: str
    secret: str
    previous_secret: str | None
    previous_until: datetime | None
    enabled: bool
    disabled_reason: str
    failing_since: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Endpoint:
        values = dict(row)
        values["kinds"] = tuple(values["kinds"])
        return cls(**values)

    def signing_secrets(self, now: datetime) -> tuple[str, ...]:
        """The secrets to sign with now: the current one, and the previous one in its overlap."""
        if self.previous_secret and self.previous_until and now < self.previous_until:
            return (self.secret, self.previous_secret)
        return (self.secret,)


@dataclass(frozen=True)
class ReadySend:
    """A send claimed for one attempt, with what its event says."""

    endpoint_id: int
    event_id: int
    user_id: str
    attempts: int
    kind: str
    stream: str
    request_id: int | None
    delivery_id: int | None
    channel: str | None
    type_key: str | None
    occurrence_key: str | None
    data: dict[str, Any]
    created_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> ReadySend:
        return cls(**dict(row))


_ENDPOINT = (
    "id, url, kinds, description, secret, previous_secret, previous_until, enabled, "
    "disabled_reason, failing_since, created_at, updated_at"
)
_CREATE = text(
    "INSERT INTO webhook_endpoints (url, kinds, description, secret, created_at, updated_at) "
    f"VALUES (:url, :kinds, :description, :secret, :now, :now) RETURNING {_ENDPOINT}"
)
_LIST = text(f"SELECT {_ENDPOINT} FROM webhook_endpoints ORDER BY id")
_ONE = text(f"SELECT {_ENDPOINT} FROM webhook_endpoints WHERE id = :id")
_DELETE = text("DELETE FROM webhook_endpoints WHERE id = :id RETURNING id")
_CHANGE = text(
    "UPDATE webhook_endpoints SET url = coalesce(:url, url), kinds = coalesce(:kinds, kinds), "
    "description = coalesce(:description, description), updated_at = :now "
    f"WHERE id = :id RETURNING {_ENDPOINT}"
)
_ROTATE = text(
    "UPDATE webhook_endpoints SET previous_secret = secret, previous_until = :until, "
    f"secret = :secret, updated_at = :now WHERE id = :id RETURNING {_ENDPOINT}"
)
_ENABLE = text(
    "UPDATE webhook_endpoints SET enabled = true, disabled_reason = '', failing_since = NULL, "
    f"updated_at = :now WHERE id = :id RETURNING {_ENDPOINT}"
)
# Conditional: of two dispatchers seeing the day pass, one disables (and alerts).
_DISABLE = text(
    "UPDATE webhook_endpoints SET enabled = false, disabled_reason = :reason, updated_at = :now "
    f"WHERE id = :id AND enabled RETURNING {_ENDPOINT}"
)
_FAILING = text(
    "UPDATE webhook_endpoints SET failing_since = coalesce(failing_since, :now) "
    "WHERE id = :id RETURNING failing_since"
)
_HEALTHY = text(
    "UPDATE webhook_endpoints SET failing_since = NULL WHERE id = :id AND failing_since IS NOT NULL"
)

# The heads of this endpoint's streams that are due and free, oldest first; leased in one
# statement (SKIP LOCKED: a second dispatcher takes other rows, or none).
_CLAIM = text(
    """
    WITH ready AS (
        SELECT s.endpoint_id, s.event_id FROM outbound_sends s
        WHERE s.endpoint_id = :endpoint AND s.state = 'pending' AND s.next_at <= :now
          AND (s.lease_until IS NULL OR s.lease_until <= :now)
          AND NOT EXISTS (
              SELECT 1 FROM outbound_sends p
              WHERE p.endpoint_id = s.endpoint_id AND p.stream = s.stream
                AND p.state = 'pending' AND p.event_id < s.event_id)
        ORDER BY s.event_id LIMIT :limit FOR UPDATE OF s SKIP LOCKED
    ), leased AS (
        UPDATE outbound_sends s SET lease_until = :lease_until FROM ready
        WHERE s.endpoint_id = ready.endpoint_id AND s.event_id = ready.event_id
        RETURNING s.endpoint_id, s.event_id, s.user_id, s.attempts
    )
    SELECT l.endpoint_id, l.event_id, l.user_id, l.attempts, e.kind, e.stream, e.request_id,
        e.delivery_id, e.channel, e.type_key, e.occurrence_key, e.data, e.created_at
    FROM leased l JOIN outbound_events e ON e.user_id = l.user_id AND e.id = l.event_id
    ORDER BY l.event_id
    """
)
_DELIVERED = text(
    "UPDATE outbound_sends SET state = 'delivered', delivered_at = :now, lease_until = NULL, "
    "attempts = attempts + 1, last_error = '' "
    "WHERE endpoint_id = :endpoint AND event_id = ANY(CAST(:events AS bigint[])) "
    "AND state = 'pending'"
)
_FAILED = text(
    "UPDATE outbound_sends SET next_at = :next_at, lease_until = NULL, "
    "attempts = attempts + 1, last_error = :error "
    "WHERE endpoint_id = :endpoint AND event_id = :event AND state = 'pending'"
)
_RELEASE = text(
    "UPDATE outbound_sends SET lease_until = NULL "
    "WHERE endpoint_id = :endpoint AND event_id = ANY(CAST(:events AS bigint[])) "
    "AND state = 'pending'"
)
_REPLAY = text(
    "UPDATE outbound_sends SET state = 'pending', next_at = :now, lease_until = NULL, "
    "delivered_at = NULL WHERE endpoint_id = ANY(CAST(:endpoints AS bigint[])) "
    "AND created_at >= :since"
)
# One endpoint's turns to post (CLARION_EVENTS_PARALLEL of them): transaction-scoped advisory
# locks, held by a transaction the dispatch round keeps open on a connection of its own, so a
# process that dies gives its turn back with it, and behind pgbouncer in transaction mode the lock
# lives and ends on the one server connection the open transaction pins.
TURNS = 0x0C1A0E00  # the first lock's class id; turn n uses TURNS + n, with the endpoint's id
_TAKE_TURN = text(
    "SELECT pg_try_advisory_xact_lock(:turn, CAST(:endpoint % 2147483647 AS integer))"
)
_PENDING = text(
    "SELECT endpoint_id, count(*) FROM outbound_sends WHERE state = 'pending' GROUP BY endpoint_id"
)


def create_endpoint(
    conn: Connection,
    *,
    url: str,
    kinds: Sequence[str],
    secret: str,
    description: str,
    now: datetime,
) -> Endpoint:
    params = {
        "url": url,
        "kinds": list(kinds),
        "secret": secret,
        "description": description,
        "now": now,
    }
    return Endpoint.from_row(conn.execute(_CREATE, params).mappings().one())


def endpoints(conn: Connection) -> list[Endpoint]:
    return [Endpoint.from_row(r) for r in conn.execute(_LIST).mappings()]


def endpoint(conn: Connection, endpoint_id: int) -> Endpoint | None:
    row = conn.execute(_ONE, {"id": endpoint_id}).mappings().first()
    return Endpoint.from_row(row) if row else None


def delete_endpoint(conn: Connection, endpoint_id: int) -> bool:
    """False when there was none; its pending sends go with it."""
    return conn.execute(_DELETE, {"id": endpoint_id}).first() is not None


def change_endpoint(
    conn: Connection,
    endpoint_id: int,
    *,
    now: datetime,
    url: str | None = None,
    kinds: Sequence[str] | None = None,
    description: str | None = None,
) -> Endpoint | None:
    """Change what is given (None keeps it); None when there is no such endpoint."""
    params = {
        "id": endpoint_id,
        "url": url,
        "kinds": list(kinds) if kinds is not None else None,
        "description": description,
        "now": now,
    }
    row = conn.execute(_CHANGE, params).mappings().first()
    return Endpoint.from_row(row) if row else None


def rotate_secret(
    conn: Connection, endpoint_id: int, *, secret: str, until: datetime, now: datetime
) -> Endpoint | None:
    """The new secret signs from now; the old one too, until `until`."""
    params = {"id": endpoint_id, "secret": secret, "until": until, "now": now}
    row = conn.execute(_ROTATE, params).mappings().first()
    return Endpoint.from_row(row) if row else None


def enable(conn: Connection, endpoint_id: int, *, now: datetime) -> Endpoint | None:
    """Enabled, its failure streak forgotten: its waiting events go out again."""
    row = conn.execute(_ENABLE, {"id": endpoint_id, "now": now}).mappings().first()
    return Endpoint.from_row(row) if row else None


def disable(conn: Connection, endpoint_id: int, *, reason: str, now: datetime) -> Endpoint | None:
    """The endpoint just disabled, or None when it was not enabled (another process did it)."""
    params = {"id": endpoint_id, "reason": reason[:500], "now": now}
    row = conn.execute(_DISABLE, params).mappings().first()
    return Endpoint.from_row(row) if row else None


def note_failure(conn: Connection, endpoint_id: int, *, now: datetime) -> datetime | None:
    """Since when the endpoint fails (now, if this is the first failure of a streak)."""
    value = conn.execute(_FAILING, {"id": endpoint_id, "now": now}).scalar()
    return value if isinstance(value, datetime) else None


def note_success(conn: Connection, endpoint_id: int) -> None:
    conn.execute(_HEALTHY, {"id": endpoint_id})


def claim_ready(
    conn: Connection, endpoint_id: int, *, now: datetime, lease_until: datetime, limit: int
) -> list[ReadySend]:
    """Lease up to `limit` sends that may go now (the head of each stream), oldest first."""
    params = {"endpoint": endpoint_id, "now": now, "lease_until": lease_until, "limit": limit}
    return [ReadySend.from_row(r) for r in conn.execute(_CLAIM, params).mappings()]


def mark_delivered(
    conn: Connection, endpoint_id: int, event_ids: Sequence[int], *, now: datetime
) -> None:
    """The endpoint took these (2xx): one statement for a round's batch."""
    if event_ids:
        conn.execute(_DELIVERED, {"endpoint": endpoint_id, "events": list(event_ids), "now": now})


def mark_failed(
    conn: Connection, endpoint_id: int, event_id: int, *, next_at: datetime, error: str
) -> None:
    params = {"endpoint": endpoint_id, "event": event_id, "next_at": next_at, "error": error[:500]}
    conn.execute(_FAILED, params)


def release(conn: Connection, endpoint_id: int, event_ids: Sequence[int]) -> None:
    """Give back leases not attempted (the round stopped at a failure): no attempt counted."""
    if event_ids:
        conn.execute(_RELEASE, {"endpoint": endpoint_id, "events": list(event_ids)})


def replay(conn: Connection, endpoint_ids: Sequence[int], *, since: datetime, now: datetime) -> int:
    """Send again every event since `since` to these endpoints (delivered ones too: the same
    webhook-id, so a receiver drops what it has). The number of sends made pending."""
    params = {"endpoints": list(endpoint_ids), "since": since, "now": now}
    return conn.execute(_REPLAY, params).rowcount


def pending_counts(conn: Connection) -> dict[int, int]:
    return {int(r[0]): int(r[1]) for r in conn.execute(_PENDING)}


def take_turn(conn: Connection, endpoint_id: int, *, turns: int) -> int | None:
    """One of the endpoint's `turns` to post, held until `conn`'s transaction ends (keep it open
    for the round, then roll it back); None when every turn is taken (other processes are
    posting to it)."""
    for turn in range(turns):
        params = {"turn": TURNS + turn, "endpoint": endpoint_id}
        if conn.execute(_TAKE_TURN, params).scalar():
            return turn
    return None
