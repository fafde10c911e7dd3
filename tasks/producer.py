"""The producer API: register recipients and enqueue notifications. Bad input fails here, loudly,
before anything is written."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import time, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import available_timezones

from sqlalchemy import Connection

from clarion import clock, faults, settings
from clarion.errors import (
    InvalidOccurrence,
    InvalidRequest,
    InvalidTimezone,
    MissingVariables,
    UnknownRecipient,
    UnknownType,
)
from db import ledger
from db.engine import engine
from gates.quiet import parse_time
from tasks import runtime
from tasks.publish import ROUTE, publish


@dataclass(frozen=True)
class Enqueued:
    request_id: int
    new: bool  # False: this occurrence was requested before; nothing new was written


MAX_KEY = 512  # unique keys stay well inside PostgreSQL's index row limit


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > MAX_KEY:
        raise InvalidRequest(f"{name} must be a non-empty string of at most {MAX_KEY} characters without "
                             f"NUL, not {str(value)[:40]!r}")
    return value


@lru_cache(maxsize=1)
def _zones() -> frozenset[str]:
    return frozenset(available_timezones()) - {"Factory", "localtime", "posixrules"}


def validate_timezone(zone: str) -> str:
    """An IANA zone name such as Europe/Berlin; anything else is InvalidTimezone."""
    if not isinstance(zone, str) or zone not in _zones():
        raise InvalidTimezone(str(zone))
    return zone


def _quiet(value: str | time | None) -> time | None:
    if value is None or isinstance(value, time):
        return value
    try:
        return parse_time(value)
    except (ValueError, AttributeError) as exc:
        raise InvalidRequest(f"quiet hours must be 'HH:MM' times, not {value!r}") from exc


def register_recipient(user_id: str, *, timezone: str, locale: str = "en", country: str | None = None,
                       org_id: str | None = None, addresses: Mapping[str, str] | None = None,
                       quiet_hours: tuple[str | time, str | time] | None = None,
                       workweek: list[int] | None = None, subdivision: str | None = None,
                       connection: Connection | None = None) -> None:
    """Create or update a recipient. The time zone must be an IANA name (e.g. Europe/Berlin);
    quiet_hours is a daily local window such as ("22:00", "07:00"); workweek lists working weekdays
    (Monday=0) when they differ from the recipient's country; subdivision is an ISO 3166-2 region
    code for regional holidays (e.g. "BY")."""
    _text("user_id", user_id)
    validate_timezone(timezone)
    if country is not None and not (isinstance(country, str) and len(country) == 2 and country.isascii()
                                    and country.isalpha()):
        raise InvalidRequest(f"country must be an ISO 3166 alpha-2 code, not {country!r}")
    if quiet_hours is not None and (not isinstance(quiet_hours, tuple | list) or len(quiet_hours) != 2):
        raise InvalidRequest("quiet_hours must be a (start, end) pair")
    start, end = (_quiet(v) for v in (quiet_hours or (None, None)))
    if workweek is not None and (not workweek or not all(isinstance(d, int) and 0 <= d <= 6 for d in workweek)):
        raise InvalidRequest("workweek must list weekdays as integers 0 (Monday) to 6 (Sunday)")
    fields = dict(user_id=user_id, timezone=timezone, locale=locale,
                  country=country.upper() if country else None, org_id=org_id,
                  addresses=dict(addresses or {}), quiet_start=start, quiet_end=end,
                  workweek=sorted(set(workweek)) if workweek else None, subdivision=subdivision,
                  now=clock.now())
    if connection is not None:
        ledger.upsert_recipient(connection, **fields)
        return
    with engine().begin() as conn:
        ledger.upsert_recipient(conn, **fields)


def build_request(user_id: str, type_key: str, event_id: str | None, occurrence_key: str | None,
           variables: Mapping[str, Any] | None) -> ledger.NewRequest:
    ntype = runtime.catalog().get(type_key)
    if ntype is None:
        raise UnknownType(type_key)
    _text("user_id", user_id)
    if (event_id is None) == (occurrence_key is None):
        raise InvalidOccurrence("give exactly one of event_id or occurrence_key")
    if not isinstance(event_id if occurrence_key is None else occurrence_key, str):
        raise InvalidOccurrence("event_id / occurrence_key must be a non-empty string")
    key = occurrence_key if occurrence_key is not None else f"event:{event_id}"
    if key in ("", "event:") or "\x00" in key:
        raise InvalidOccurrence("event_id / occurrence_key must be a non-empty string without NUL")
    if len(key) > MAX_KEY:
        raise InvalidOccurrence(f"event_id / occurrence_key must be at most {MAX_KEY} characters")
    variables = dict(variables or {})
    missing = ntype.missing(variables)
    if missing:
        raise MissingVariables(type_key, missing)
    try:
        encoded = json.dumps(variables, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"variables must be JSON-serialisable (no NaN or Infinity): {exc}") from exc
    if "\\u0000" in encoded:
        raise InvalidRequest("variables must not contain NUL characters")
    return ledger.NewRequest(user_id, type_key, key, ntype.lane, ntype.version, variables)


def notify(user_id: str, type_key: str, *, event_id: str | None = None,
           occurrence_key: str | None = None, variables: Mapping[str, Any] | None = None,
           connection: Connection | None = None) -> Enqueued:
    """Request one notification. Returns the request id and whether it is new.

    With `connection=`, the request is written in the caller's transaction (an outbox row) and
    routed by the next beat tick after the caller commits; otherwise it is committed and
    published at once."""
    return notify_many([dict(user_id=user_id, type_key=type_key, event_id=event_id,
                             occurrence_key=occurrence_key, variables=variables)],
                       connection=connection)[0]


def notify_many(items: Iterable[Mapping[str, Any]], *, connection: Connection | None = None) -> list[Enqueued]:
    """notify() for many requests in one transaction; all are validated before any is written."""
    rows = [build_request(i["user_id"], i["type_key"], i.get("event_id"), i.get("occurrence_key"),
                   i.get("variables")) for i in items]
    if not rows:
        return []
    now = clock.now()
    if connection is not None:
        return _insert(connection, rows, now=now, due_at=now)
    with engine().begin() as conn:
        result = _insert(conn, rows, now=now, due_at=now + timedelta(seconds=settings.get().stray_after))
    faults.hit("notify.before_publish")
    publish(ROUTE, [(r.user_id, e.request_id, r.lane) for r, e in zip(rows, result, strict=True) if e.new])
    return result


def _insert(conn: Connection, rows: list[ledger.NewRequest], *, now, due_at) -> list[Enqueued]:
    known = ledger.recipients(conn, (r.user_id for r in rows))
    unknown = [r.user_id for r in rows if r.user_id not in known]
    if unknown:
        raise UnknownRecipient(unknown[0])
    return [Enqueued(i, new) for i, new in ledger.insert_requests(conn, rows, now=now, due_at=due_at)]
