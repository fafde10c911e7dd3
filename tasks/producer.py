"""The producer API: register recipients and enqueue notifications. Bad input fails here, loudly,
before anything is written."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any

import amqp.exceptions
import kombu.exceptions
import psycopg
import redis.exceptions
from sqlalchemy import Connection

from clarion import clock, faults, settings
from clarion import validation as check
from clarion.catalog.model import NotificationType
from clarion.db import ledger
from clarion.db.engine import clarion_search_path, engine, in_transaction
from clarion.drain import Drain
from clarion.errors import (
    ClarionError,
    InvalidField,
    InvalidTimezone,
    MissingVariables,
    UnknownRecipient,
    UnknownType,
)
from clarion.scheduling.zones import zone_names
from clarion.tasks import runtime
from clarion.tasks.publish import ROUTE, publish

log = logging.getLogger(__name__)

# What a broker that is down or unreachable raises from publish(); the rows are committed by then.
BROKER_ERRORS = (
    kombu.exceptions.KombuError,
    redis.exceptions.RedisError,
    amqp.exceptions.AMQPError,
    OSError,
)
ITEM_KEYS = frozenset({"user_id", "type_key", "event_id", "occurrence_key", "variables"})


@dataclass(frozen=True)
class Enqueued:
    request_id: int
    new: bool  # False: this occurrence was requested before; nothing new was written


def _zones() -> frozenset[str]:
    return zone_names()  # the pinned tzdata package's list, never the host's


def validate_timezone(zone: str, field: str = "timezone") -> str:
    """An IANA zone name such as Europe/Berlin; anything else is InvalidTimezone."""
    if not isinstance(zone, str) or zone not in _zones():
        raise InvalidTimezone(check.show(zone, 80) if not isinstance(zone, str) else zone, field)
    return zone


def checked_connection(value: object) -> Connection | None:
    if value is not None and not isinstance(value, Connection):
        raise InvalidField(
            "connection", f"must be a SQLAlchemy Connection, not {check.show(value)}"
        )
    return value


def checked_variables(value: object) -> dict[str, Any]:
    """Template variables checked against the configured caps (see clarion.validation.variables)."""
    s = settings.get()
    return check.variables(value, max_depth=s.variables_max_depth, max_bytes=s.variables_max_bytes)


def recipient_fields(
    user_id: object,
    *,
    timezone: object,
    locale: object,
    country: object,
    org_id: object,
    addresses: object,
    quiet_hours: object,
    workweek: object,
    subdivision: object,
    attributes: object = None,
) -> dict[str, Any]:
    """The checked columns of a recipient row (raises InvalidField naming the first bad one)."""
    start, end = check.quiet_hours(quiet_hours)
    return dict(
        user_id=check.text("user_id", user_id, max_bytes=check.USER_ID_BYTES),
        timezone=validate_timezone(timezone),  # type: ignore[arg-type]
        locale=check.locale(locale),
        country=check.country(country),
        org_id=check.optional_text("org_id", org_id, max_bytes=check.ORG_ID_BYTES),
        addresses=check.addresses(addresses),
        quiet_start=start,
        quiet_end=end,
        workweek=check.workweek(workweek),
        subdivision=check.subdivision(subdivision),
        attributes=check.attributes(attributes),
    )


def register_recipient(
    user_id: str,
    *,
    timezone: str,
    locale: str = "en",
    country: str | None = None,
    org_id: str | None = None,
    addresses: Mapping[str, str] | None = None,
    quiet_hours: tuple[str | time, str | time] | None = None,
    workweek: list[int] | None = None,
    subdivision: str | None = None,
    attributes: Mapping[str, str | int | bool] | None = None,
    connection: Connection | None = None,
) -> None:
    """Create or update a recipient. The time zone must be an IANA name (e.g. Europe/Berlin);
    quiet_hours is a daily local window such as ("22:00", "07:00"); workweek lists working weekdays
    (Monday=0) when they differ from the recipient's country; subdivision is an ISO 3166-2 region
    code for regional holidays (e.g. "BY"); addresses maps a channel to the recipient's address on
    it (checked per channel, see clarion.validation.addresses); attributes are the app's own
    fields (text, integer or boolean values) that a broadcast's segment can filter on: given, they
    replace those stored ({} clears them); None keeps them."""
    fields = recipient_fields(
        user_id,
        timezone=timezone,
        locale=locale,
        country=country,
        org_id=org_id,
        addresses=addresses,
        quiet_hours=quiet_hours,
        workweek=workweek,
        subdivision=subdivision,
        attributes=attributes,
    )
    in_transaction(
        checked_connection(connection),
        lambda conn: ledger.upsert_recipient(conn, **fields, now=clock.now()),
    )


def build_request(
    user_id: object, type_key: object, event_id: object, occurrence_key: object, variables: object
) -> ledger.NewRequest:
    """Check one notify() call; returns the request row to write (nothing is written here).
    The arguments are the caller's, unchecked (notify_many passes whatever an item holds)."""
    ntype = checked_type(type_key)
    user_text = check.text("user_id", user_id, max_bytes=check.USER_ID_BYTES)
    key = check.occurrence_key(event_id, occurrence_key)
    plain = checked_type_variables(ntype, variables)
    return ledger.NewRequest(user_text, ntype.key, key, ntype.lane, ntype.version, plain)


def checked_type(type_key: object) -> NotificationType:
    """The catalog's type of that key (a newer catalog's, mid-deploy); else UnknownType."""
    key_text = check.text("type_key", type_key, max_bytes=check.TYPE_KEY_BYTES)
    ntype = runtime.catalog().get(key_text) or runtime.catalog_now().get(key_text)
    if ntype is None:
        raise UnknownType(key_text, runtime.catalog().name)
    return ntype


def checked_type_variables(ntype: NotificationType, variables: object) -> dict[str, Any]:
    """Template variables checked (checked_variables), none of the type's required ones missing."""
    plain = checked_variables(variables)
    if missing := ntype.missing(plain):
        raise MissingVariables(ntype.key, missing)
    return plain


def notify(
    user_id: str,
    type_key: str,
    *,
    event_id: str | None = None,
    occurrence_key: str | None = None,
    variables: Mapping[str, Any] | None = None,
    connection: Connection | None = None,
) -> Enqueued:
    """Request one notification. Returns the request id and whether it is new.

    With `connection=`, the request is written in the caller's transaction (an outbox row) and
    routed by the next beat tick after the caller commits; otherwise it is committed and
    published at once. Bad input raises an InvalidRequest naming the field and writes nothing;
    once the row is committed, nothing raises (a broker that is down is logged, and the beat
    tick publishes the request later)."""
    row = build_request(user_id, type_key, event_id, occurrence_key, variables)
    return _enqueue([row], checked_connection(connection))[0]


def notify_many(
    items: Iterable[Mapping[str, Any]], *, connection: Connection | None = None
) -> list[Enqueued]:
    """notify() for many requests in one transaction; all are validated before any is written.
    Each item is a mapping with notify()'s argument names (user_id, type_key, event_id,
    occurrence_key, variables); an error says which item (`items[3]`) in a note."""
    return _enqueue(checked_requests(items), checked_connection(connection))


def checked_requests(items: Iterable[Mapping[str, Any]]) -> list[ledger.NewRequest]:
    """notify_many()'s checks: the request rows to write (nothing is written here)."""
    rows = []
    for index, item in enumerate(_items(items)):
        try:
            rows.append(
                build_request(
                    item.get("user_id"),
                    item.get("type_key"),
                    item.get("event_id"),
                    item.get("occurrence_key"),
                    item.get("variables"),
                )
            )
        except ClarionError as exc:
            exc.add_note(f"in items[{index}]")
            raise
    return rows


def _items(items: object) -> list[Mapping[str, Any]]:
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidField("items", f"must be a list of mappings, not {check.show(items)}")
    listed = list(items)
    for index, item in enumerate(listed):
        if not isinstance(item, Mapping):
            raise InvalidField(f"items[{index}]", f"must be a mapping, not {check.show(item)}")
        unknown = [check.show(k) for k in item if k not in ITEM_KEYS]
        if unknown:
            raise InvalidField(
                f"items[{index}]",
                f"unknown keys {', '.join(sorted(unknown))}; known: {', '.join(sorted(ITEM_KEYS))}",
            )
        for name in ("user_id", "type_key"):
            if name not in item:
                raise InvalidField(f"items[{index}].{name}", "is required")
    return listed


def _enqueue(rows: list[ledger.NewRequest], connection: Connection | None) -> list[Enqueued]:
    if not rows:
        return []
    now = clock.now()
    if connection is not None:
        with clarion_search_path(connection):
            return _insert(connection, rows, now=now, due_at=now)
    with engine().begin() as conn:
        result = _insert(
            conn, rows, now=now, due_at=now + timedelta(seconds=settings.get().stray_after)
        )
    faults.hit("notify.before_publish")
    publish_after_commit(
        [(r.user_id, e.request_id, r.lane) for r, e in zip(rows, result, strict=True) if e.new]
    )
    return result


def _publish_waiting(batches: list[list[tuple[str, int, str]]]) -> None:
    publish_after_commit([key for keys in batches for key in keys])


# A publish costs about a millisecond of CPU whatever its size (measured under bench/ingest.py):
# waiting 20 ms for more keys makes one message of many requests; routing waits 20 ms more.
_PUBLISHER: Drain[list[tuple[str, int, str]]] = Drain(
    "clarion-publish", _publish_waiting, linger=0.02
)


def publish_in_background(keys: list[tuple[str, int, str]]) -> None:
    """publish_after_commit on this process's publishing thread, everything waiting in one go: the
    caller (an HTTP request) does not wait for the broker. A process that dies first loses only
    the wake-up; the beat tick publishes the committed request at its due_at."""
    if keys:
        _PUBLISHER.put(keys)


def publishing_settled(timeout: float = 10.0) -> bool:
    """Wait until what publish_in_background was given is published (or failed and logged)."""
    return _PUBLISHER.settle(timeout)


def publish_after_commit(keys: list[tuple[str, int, str]]) -> None:
    """Wake the route task for committed requests (due_at = now + stray_after), so a broker that
    is down only delays them: the beat tick publishes them again. Never raise from here."""
    if not keys:
        return
    try:
        publish(ROUTE, keys, fail_fast=True)
    except BROKER_ERRORS as exc:
        log.warning(
            "broker unavailable; %d request(s) will be published by the beat tick: %s",
            len(keys),
            exc,
            extra={"action": "publish_failed", "requests": [k[1] for k in keys]},
        )


async def insert_grouped(
    conn: psycopg.AsyncConnection[Any],
    groups: Sequence[Sequence[ledger.NewRequest]],
    *,
    now: datetime,
    due_at: datetime,
) -> list[list[Enqueued] | UnknownRecipient]:
    """Many callers' checked rows (checked_requests) in one auto-committed statement on an
    AsyncConnection (the web's event loop), with the recipients' check in the same statement
    (ledger.insert_grouped_requests): each group's Enqueued, or the UnknownRecipient that refuses
    that group alone (it writes nothing). A repeated occurrence, in the table or in an earlier
    group, is `new: false`, as if the groups had come one by one."""
    made = await ledger.insert_grouped_requests(conn, groups, now=now, due_at=due_at)
    return [
        UnknownRecipient(group) if isinstance(group, str) else [Enqueued(*m) for m in group]
        for group in made
    ]


def _insert(conn: Connection, rows: list[ledger.NewRequest], *, now, due_at) -> list[Enqueued]:
    locales = ledger.recipient_locales(conn, (r.user_id for r in rows))
    unknown = [r.user_id for r in rows if r.user_id not in locales]
    if unknown:
        raise UnknownRecipient(unknown[0])
    created = ledger.insert_requests(conn, rows, now=now, due_at=due_at, locales=locales)
    return [Enqueued(i, new) for i, new in created]
