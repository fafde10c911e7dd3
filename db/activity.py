"""What happened to a recipient's notifications, as typed records: the one query module behind
`clarion explain`, `GET /v1/requests/{id}` and the support staff's activity page (web/activity.py).

Per request: the request itself, the gate decisions (with their reasons), the deliveries per
channel (every settled attempt with its outcome, the last error, when the current attempt started
and since when a lost answer may have sent), the provider receipts, the incidents and the outbound events about it. `find_users`
answers the page's search: by user id, by request id or by the app's event id (optionally within
one user), or by address — an address is matched through its keyed hash (clarion/hashing.py) on
the suppression list, which keeps an erased recipient's entries, and in plain on the recipients'
own addresses.

Why one module: the CLI and the page must never disagree about what happened, so neither has SQL
of its own. Read-only: nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from clarion import hashing, settings

MAX_MATCHES = 50


@dataclass(frozen=True)
class Decision:
    decided_at: datetime
    gate: str
    outcome: str
    reason: str
    channel: str | None
    detail: str


@dataclass(frozen=True)
class Attempt:
    """One settled attempt of a delivery (delivery_attempts, migration 0028)."""

    attempt: int
    outcome: str  # db.schema.ATTEMPT_OUTCOMES
    at: datetime
    platform: str | None
    error: str


@dataclass(frozen=True)
class Delivery:
    id: int
    channel: str
    state: str
    attempts: int
    sent_at: datetime | None
    platform: str | None
    last_error: str | None
    not_before: datetime | None
    next_attempt_at: datetime | None  # pending: when it is tried next; claimed: its lease's end
    created_at: datetime
    send_started_at: datetime | None  # the current attempt reached the provider call
    maybe_sent_at: datetime | None  # an attempt may have sent from then on (its answer was lost)
    history: list[Attempt] = field(default_factory=list)  # every settled attempt, in order


@dataclass(frozen=True)
class Receipt:
    delivery_id: int | None
    received_at: datetime
    occurred_at: datetime
    channel: str
    event: str
    outcome: str
    detail: str


@dataclass(frozen=True)
class Incident:
    delivery_id: int | None
    channel: str
    kind: str
    detail: str
    created_at: datetime


@dataclass(frozen=True)
class OutboundEvent:
    id: str  # its webhook-id
    sequence: int
    kind: str
    delivery_id: int | None
    channel: str | None
    created_at: datetime
    taken: int  # endpoints that answered 2xx
    pending: int  # endpoints still owed it


@dataclass(frozen=True)
class RequestHistory:
    id: int
    user_id: str
    type_key: str
    occurrence_key: str
    state: str
    created_at: datetime
    routed_at: datetime | None
    due_at: datetime | None
    decisions: list[Decision]
    deliveries: list[Delivery]
    receipts: list[Receipt]
    incidents: list[Incident]
    events: list[OutboundEvent]

    @property
    def event_id(self) -> str | None:
        """The app's event id, when the occurrence key is one (`event:<id>`)."""
        key = self.occurrence_key
        return key[len("event:") :] if key.startswith("event:") else None


@dataclass(frozen=True)
class Suppression:
    channel: str
    address: str  # `hmac:…` once the recipient was erased
    reason: str
    detail: str
    created_at: datetime


@dataclass(frozen=True)
class Match:
    """A recipient a search found, and the requests of theirs it named (none: all of them)."""

    user_id: str
    timezone: str
    request_ids: tuple[int, ...]
    erased: bool


_REQUESTS = text(
    """
    SELECT user_id, id, type_key, occurrence_key, state, created_at, routed_at, due_at
    FROM requests
    WHERE user_id = :user_id AND (CAST(:type_key AS text) IS NULL OR type_key = :type_key)
      AND created_at >= :since
    ORDER BY created_at DESC, id DESC LIMIT :limit
    """
)
_REQUEST = text(
    "SELECT user_id, id, type_key, occurrence_key, state, created_at, routed_at, due_at "
    "FROM requests WHERE user_id = :user_id AND id = ANY(CAST(:ids AS bigint[])) "
    "ORDER BY created_at DESC, id DESC"
)
_DECISIONS = text(
    "SELECT request_id, decided_at, gate, outcome, reason, channel, detail FROM decisions "
    "WHERE user_id = :user_id AND request_id = ANY(CAST(:ids AS bigint[])) ORDER BY decided_at, id"
)
_RECEIPTS = text(
    "SELECT d.request_id, e.delivery_id, e.received_at, e.occurred_at, e.channel, e.event, "
    "e.outcome, e.detail FROM receipts e "
    "JOIN deliveries d ON d.user_id = e.user_id AND d.id = e.delivery_id "
    "WHERE e.user_id = :user_id AND d.request_id = ANY(CAST(:ids AS bigint[])) ORDER BY e.id"
)
# next_attempt_at: a pending row is tried once both its claim time (not_before) and the tick's
# republish time (due_at) have come; a claimed row again only if its holder lets the lease run out.
_DELIVERIES = text(
    "SELECT request_id, id, channel, state, attempts, sent_at, platform, last_error, not_before, "
    "CASE WHEN state = 'pending' THEN greatest(not_before, due_at) "
    "WHEN state = 'claimed' THEN lease_until END AS next_attempt_at, created_at, "
    "send_started_at, maybe_sent_at FROM deliveries "
    "WHERE user_id = :user_id AND request_id = ANY(CAST(:ids AS bigint[])) ORDER BY id"
)
_ATTEMPTS = text(
    "SELECT delivery_id, attempt, outcome, at, platform, error FROM delivery_attempts "
    "WHERE user_id = :user_id AND request_id = ANY(CAST(:ids AS bigint[])) ORDER BY id"
)
_INCIDENTS = text(
    "SELECT d.request_id, i.delivery_id, d.channel, i.kind, i.detail, i.created_at "
    "FROM incidents i JOIN deliveries d ON d.user_id = i.user_id AND d.id = i.delivery_id "
    "WHERE i.user_id = :user_id AND d.request_id = ANY(CAST(:ids AS bigint[])) ORDER BY i.id"
)
# The outbound events about these requests (migration 0023), with how many endpoints took each.
_EVENTS = text(
    """
    SELECT e.request_id, 'evt_' || e.id AS id, e.id AS sequence, e.kind, e.delivery_id,
        e.channel, e.created_at, c.taken, c.pending
    FROM outbound_events e CROSS JOIN LATERAL (
        -- per endpoint (a handful), by the sends' primary key
        SELECT count(*) FILTER (WHERE s.state = 'delivered') AS taken,
            count(*) FILTER (WHERE s.state = 'pending') AS pending
        FROM webhook_endpoints w JOIN outbound_sends s
            ON s.endpoint_id = w.id AND s.event_id = e.id) c
    WHERE e.user_id = :user_id AND e.request_id = ANY(CAST(:ids AS bigint[])) ORDER BY e.id
    """
)
_SUPPRESSIONS = text(
    "SELECT channel, address, reason, detail, created_at FROM suppressions "
    "WHERE user_id = :user_id ORDER BY created_at, channel, address"
)


def requests_of(
    conn: Connection, user_id: str, *, type_key: str | None, since: datetime, limit: int
) -> list[RequestHistory]:
    """A recipient's requests made since `since`, newest first, each with its whole history."""
    params = {"user_id": user_id, "type_key": type_key, "since": since, "limit": limit}
    return _with_history(
        conn, user_id, [dict(r) for r in conn.execute(_REQUESTS, params).mappings()]
    )


def requests_by_id(conn: Connection, user_id: str, ids: list[int]) -> list[RequestHistory]:
    """These requests of the recipient (those that exist), newest first, with their histories."""
    found = conn.execute(_REQUEST, {"user_id": user_id, "ids": ids}).mappings()
    return _with_history(conn, user_id, [dict(r) for r in found])


def request(conn: Connection, user_id: str, request_id: int) -> RequestHistory | None:
    """One request with its history, or None."""
    found = requests_by_id(conn, user_id, [request_id])
    return found[0] if found else None


def suppressions(conn: Connection, user_id: str) -> list[Suppression]:
    """The recipient's entries on the permanent suppression list."""
    return [Suppression(**r) for r in conn.execute(_SUPPRESSIONS, {"user_id": user_id}).mappings()]


def _with_history(
    conn: Connection, user_id: str, requests: list[dict[str, Any]]
) -> list[RequestHistory]:
    ids = [r["id"] for r in requests]
    parts: dict[int, dict[str, list[Any]]] = {
        i: {"decisions": [], "deliveries": [], "receipts": [], "incidents": [], "events": []}
        for i in ids
    }
    if ids:
        params = {"user_id": user_id, "ids": ids}
        for name, query, record in (
            ("decisions", _DECISIONS, Decision),
            ("deliveries", _DELIVERIES, Delivery),
            ("receipts", _RECEIPTS, Receipt),
            ("incidents", _INCIDENTS, Incident),
            ("events", _EVENTS, OutboundEvent),
        ):
            for row in conn.execute(query, params).mappings():
                values = dict(row)
                parts[values.pop("request_id")][name].append(record(**values))
        tried: dict[int, list[Attempt]] = {}
        for row in conn.execute(_ATTEMPTS, params).mappings():
            values = dict(row)
            tried.setdefault(values.pop("delivery_id"), []).append(Attempt(**values))
        for part in parts.values():
            for d in part["deliveries"]:
                d.history.extend(tried.get(d.id, []))
    return [RequestHistory(**{**r, **parts[r["id"]]}) for r in requests]


# --- the page's search -----------------------------------------------------------------------

_RECIPIENT = text(
    "SELECT user_id, timezone, erased_at IS NOT NULL AS erased FROM recipients "
    "WHERE user_id = ANY(CAST(:users AS text[])) ORDER BY user_id"
)
# Without a user id these probe requests_id / requests_occurrence (migration 0028; the table's
# keys lead with user_id); with it, the primary or occurrence key. Bounded by the LIMIT either way.
_BY_REQUEST_ID = text(
    "SELECT user_id, id FROM requests WHERE id = :id "
    "AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id) LIMIT :limit"
)
_BY_EVENT_ID = text(
    "SELECT user_id, id FROM requests WHERE occurrence_key = :key "
    "AND (CAST(:user_id AS text) IS NULL OR user_id = :user_id) ORDER BY user_id, id LIMIT :limit"
)
# By the address's keyed hash, per channel (index suppressions_address): an erased recipient's
# entries hold nothing else of the address.
_BY_HASH = text(
    "SELECT DISTINCT user_id FROM suppressions "
    "WHERE channel = :channel AND address_hash = :hash LIMIT :limit"
)
# The recipients' own addresses, per channel; sms through its expression index (recipients_sms).
_BY_ADDRESS = {
    "sms": text("SELECT user_id FROM recipients WHERE addresses ->> 'sms' = :address LIMIT :limit"),
    "other": text(
        "SELECT user_id FROM recipients WHERE addresses ->> :channel = :address LIMIT :limit"
    ),
}
ADDRESS_CHANNELS = ("email", "sms", "push", "webhook", "slack", "teams")


def find_users(
    conn: Connection,
    *,
    user_id: str | None = None,
    request_id: int | None = None,
    event_id: str | None = None,
    address: str | None = None,
) -> list[Match]:
    """The recipients a search names, each with the requests it named (empty: show them all).
    A user id alone names that user; with a request id or event id it narrows those to the user."""
    named: dict[str, list[int]] = {}
    limit = {"limit": MAX_MATCHES}
    if request_id is not None:
        for row in conn.execute(_BY_REQUEST_ID, {"id": request_id, "user_id": user_id, **limit}):
            named.setdefault(row.user_id, []).append(row.id)
    if event_id is not None:
        found = conn.execute(
            _BY_EVENT_ID, {"key": f"event:{event_id}", "user_id": user_id, **limit}
        )
        for row in found:
            named.setdefault(row.user_id, []).append(row.id)
    if address is not None:
        for user in users_with_address(conn, address):
            if user_id is None or user == user_id:
                named.setdefault(user, [])
    if user_id is not None and request_id is None and event_id is None and address is None:
        named[user_id] = []
    rows = conn.execute(_RECIPIENT, {"users": sorted(named)}).mappings()
    return [
        Match(r["user_id"], r["timezone"], tuple(sorted(named[r["user_id"]])), r["erased"])
        for r in rows
    ]


def users_with_address(conn: Connection, address: str) -> list[str]:
    """Recipients that have `address` on any channel, or had it suppressed (through its keyed
    hash, so an erased recipient's entry is found without the table holding the address)."""
    key = hashing.address_key(settings.get())
    users: set[str] = set()
    for channel in ADDRESS_CHANNELS:
        hashed = hashing.hashed(key, channel, address)
        params = {"channel": channel, "hash": hashed, "address": address, "limit": MAX_MATCHES}
        users.update(r.user_id for r in conn.execute(_BY_HASH, params))
        plain = _BY_ADDRESS["sms" if channel == "sms" else "other"]
        users.update(r.user_id for r in conn.execute(plain, params))
    return sorted(users)
