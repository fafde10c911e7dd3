"""Arming a recurring series: check the call, write the series once per key.

Series identity: the series key (the caller's, else `type:anchor:every`) names one series per
recipient. Arming a key again with the same options changes nothing (`new=False`), so a retried
call is harmless. Arming it with different options — another calendar policy, count, until,
variables, zone, or a different type under an explicit key — raises SeriesConflict naming the
series already armed, and writes nothing. The options are deliberately *not* folded into the
default key: two series differing only in calendar policy would both fire at the same anchored
times, two nudges per occurrence under different occurrence keys that no constraint would stop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from clarion import clock
from clarion import validation as check
from clarion.db import ledger
from clarion.db import series as store
from clarion.db.engine import in_transaction
from clarion.errors import (
    InvalidField,
    MissingVariables,
    SeriesConflict,
    UnknownRecipient,
    UnknownType,
)
from clarion.rows import Recipient
from clarion.scheduling.calendars import POLICIES, WorkCalendar, calendar_for
from clarion.scheduling.recurrence import due_at, parse_every
from clarion.scheduling.zones import load_zone
from clarion.tasks import runtime
from clarion.tasks.producer import checked_connection, checked_variables

UNIT_DAYS = {"days": 1, "weeks": 7, "months": 31, "working_days": 1.4}
MAX_INTERVAL_DAYS = 3660
MAX_COUNT = 100_000  # occurrences in one series (a daily series for 270 years)
# What makes two arms of one key the same series (the columns compared on a repeat).
IDENTITY = (
    "type_key",
    "anchor_local",
    "zone",
    "every",
    "max_count",
    "until",
    "calendar_policy",
    "variables",
)


@dataclass(frozen=True)
class Armed:
    series_id: int
    new: bool
    first_due_at: datetime


def row_calendar(row: Mapping[str, Any]) -> WorkCalendar:
    """The calendar of a row that carries a recipient's calendar columns (a due series)."""
    return calendar_for(
        workweek=row.get("workweek"),
        country=row.get("country"),
        subdivision=row.get("subdivision"),
        zone=row["timezone"],
    )


def recipient_calendar(recipient: Recipient) -> WorkCalendar:
    return calendar_for(
        workweek=recipient.workweek,
        country=recipient.country,
        subdivision=recipient.subdivision,
        zone=recipient.timezone,
    )


def series_calendar(conn: Connection, row: Mapping[str, Any]) -> WorkCalendar | None:
    """The recipient's calendar when the interval counts working days (else none is needed)."""
    if parse_every(row["every"]).unit != "working_days":
        return None
    return recipient_calendar(ledger.recipients(conn, [row["user_id"]])[row["user_id"]])


def _local_anchor(anchor: datetime | str, zone: str) -> datetime:
    if isinstance(anchor, str):
        check.text("anchor", anchor, max_bytes=64)
        try:
            anchor = datetime.fromisoformat(anchor)
        except ValueError as exc:
            raise InvalidField(
                "anchor",
                f"must be an ISO date-time like 2026-12-07T09:00, not {check.show(anchor)}",
            ) from exc
    if not isinstance(anchor, datetime):
        raise InvalidField(
            "anchor", f"must be a datetime or an ISO date-time text, not {check.show(anchor)}"
        )
    if anchor.tzinfo is not None:  # an instant: take its wall time in the recipient's zone
        try:
            anchor = (
                check.aware_datetime("anchor", anchor)
                .astimezone(load_zone(zone))
                .replace(tzinfo=None)
            )
        except (OverflowError, ValueError) as exc:
            raise InvalidField("anchor", "is out of range in the recipient's time zone") from exc
    return anchor.replace(microsecond=0)


def _every(every: object) -> str:
    every = check.text("every", every, max_bytes=32)
    try:
        interval = parse_every(every)
    except ValueError as exc:
        raise InvalidField("every", str(exc)) from exc
    if interval.count * UNIT_DAYS[interval.unit] > MAX_INTERVAL_DAYS:
        raise InvalidField("every", f"{every!r} is longer than ten years")
    return every


def validate(
    conn: Connection,
    user_id: str,
    type_key: str,
    *,
    anchor: datetime | str,
    every: str,
    count: int | None,
    until: datetime | None,
    variables: Mapping[str, Any] | None,
    calendar_policy: str,
) -> dict[str, Any]:
    """Check an arm request; returns the series row to write (and to preview in a dry run).
    Everything but the recipient is checked before the first query."""
    type_key = check.text("type_key", type_key, max_bytes=check.TYPE_KEY_BYTES)
    ntype = runtime.catalog().get(type_key) or runtime.catalog_now().get(type_key)
    if ntype is None:
        raise UnknownType(type_key, runtime.catalog().name)
    user_id = check.text("user_id", user_id, max_bytes=check.USER_ID_BYTES)
    variables = checked_variables(variables)
    if missing := ntype.missing(variables):
        raise MissingVariables(type_key, missing)
    every = _every(every)
    if not isinstance(calendar_policy, str) or calendar_policy not in POLICIES:
        raise InvalidField(
            "calendar_policy",
            f"must be one of {', '.join(POLICIES)}, not {check.show(calendar_policy)}",
        )
    if count is not None:
        check.positive_int("count", count, maximum=MAX_COUNT)
    if until is not None:
        check.aware_datetime("until", until)
    if not isinstance(anchor, str | datetime):
        raise InvalidField(
            "anchor", f"must be a datetime or an ISO date-time text, not {check.show(anchor)}"
        )
    recipient = ledger.recipients(conn, [user_id]).get(user_id)
    if recipient is None:
        raise UnknownRecipient(user_id)
    zone = recipient.timezone
    return {
        "user_id": user_id,
        "type_key": type_key,
        "anchor_local": _local_anchor(anchor, zone),
        "zone": zone,
        "every": every,
        "max_count": count,
        "until": until,
        "calendar_policy": calendar_policy,
        "variables": variables,
        "next_n": 0,
        "recipient": recipient,
    }


def differences(armed: Mapping[str, Any], asked: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The identity options in which a series armed before differs from the one asked for."""
    # variables went through JSON on the way in: compare them the same way
    plain = {**asked, "variables": json.loads(json.dumps(asked["variables"]))}
    return {k: (armed[k], plain[k]) for k in IDENTITY if armed[k] != plain[k]}


def arm_series(
    user_id: str,
    type_key: str,
    *,
    anchor: datetime | str,
    every: str,
    count: int | None = None,
    until: datetime | None = None,
    variables: Mapping[str, Any] | None = None,
    calendar_policy: str = "send",
    series_key: str | None = None,
    connection: Connection | None = None,
) -> Armed:
    """Arm a series: occurrence n is due at anchor + n × every in the recipient's zone.

    `anchor` is a local wall time (naive) in the recipient's zone. Arming the same series_key twice
    with the same options changes nothing; with other options it raises SeriesConflict (see the
    module docstring). An anchor in the past catches up without a burst (see scheduling.series)."""
    series_key = check.optional_text("series_key", series_key, max_bytes=check.SERIES_KEY_BYTES)
    connection = checked_connection(connection)

    def write(conn: Connection) -> Armed:
        row = validate(
            conn,
            user_id,
            type_key,
            anchor=anchor,
            every=every,
            count=count,
            until=until,
            variables=variables,
            calendar_policy=calendar_policy,
        )
        row.pop("recipient")
        key = series_key or f"{row['type_key']}:{row['anchor_local'].isoformat()}:{row['every']}"
        try:
            first = due_at(
                row["anchor_local"],
                row["zone"],
                parse_every(row["every"]),
                0,
                series_calendar(conn, row),
            )
        except (OverflowError, ValueError) as exc:
            raise InvalidField("anchor", f"cannot be scheduled: {exc}") from exc
        series_id, existing = store.insert_series(
            conn, series_key=key, next_due_at=first, now=clock.now(), **row
        )
        if existing is not None and (changed := differences(existing, row)):
            raise SeriesConflict(series_id, key, changed)
        return Armed(series_id, existing is None, first)

    return in_transaction(connection, write)
