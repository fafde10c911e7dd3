"""Recurring series: arm, pause, resume, cancel, snooze one occurrence; and the tick step that
turns due occurrences into requests."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

from sqlalchemy import Connection

from clarion import clock, settings
from clarion import validation as check
from clarion.errors import (
    InvalidField,
    MissingVariables,
    UnknownRecipient,
    UnknownType,
)
from db import ledger
from db import series as store
from db.engine import engine
from scheduling.calendars import WorkCalendar, calendar_for
from scheduling.recurrence import due_at, first_due_after, parse_every
from scheduling.series import plan_tick
from tasks import runtime
from tasks.producer import checked_connection, checked_variables

log = logging.getLogger(__name__)
POLICIES = ("skip", "next_working_day", "send")
UNIT_DAYS = {"days": 1, "weeks": 7, "months": 31, "working_days": 1.4}
MAX_INTERVAL_DAYS = 3660
T = TypeVar("T")
MAX_COUNT = 100_000  # occurrences in one series (a daily series for 270 years)


@dataclass(frozen=True)
class Armed:
    series_id: int
    new: bool
    first_due_at: datetime


def recipient_calendar(recipient: Mapping[str, Any]) -> WorkCalendar:
    return calendar_for(
        workweek=recipient.get("workweek"),
        country=recipient.get("country"),
        subdivision=recipient.get("subdivision"),
        zone=recipient["timezone"],
    )


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
                .astimezone(ZoneInfo(zone))
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
    ntype = runtime.catalog().get(type_key)
    if ntype is None:
        raise UnknownType(type_key)
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
    zone = recipient["timezone"]
    local = _local_anchor(anchor, zone)
    return {
        "user_id": user_id,
        "type_key": type_key,
        "anchor_local": local,
        "zone": zone,
        "every": every,
        "max_count": count,
        "until": until,
        "calendar_policy": calendar_policy,
        "variables": variables,
        "next_n": 0,
        "recipient": recipient,
    }


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

    `anchor` is a local wall time (naive) in the recipient's zone; arming the same series_key twice
    changes nothing. An anchor in the past catches up without a burst (see scheduling.series)."""
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
                row["anchor_local"], row["zone"], parse_every(row["every"]), 0, _cal(conn, row)
            )
        except (OverflowError, ValueError) as exc:
            raise InvalidField("anchor", f"cannot be scheduled: {exc}") from exc
        series_id, new = store.insert_series(
            conn, series_key=key, next_due_at=first, now=clock.now(), **row
        )
        return Armed(series_id, new, first)

    if connection is not None:
        return write(connection)
    with engine().begin() as conn:
        return write(conn)


def _cal(conn: Connection, row: dict[str, Any]) -> WorkCalendar | None:
    if parse_every(row["every"]).unit != "working_days":
        return None
    return recipient_calendar(ledger.recipients(conn, [row["user_id"]])[row["user_id"]])


def _in_transaction(connection: Connection | None, work: Callable[[Connection], T]) -> T:
    """Run `work` in the caller's transaction, or in a new one of its own."""
    if connection is not None:
        return work(connection)
    with engine().begin() as conn:
        return work(conn)


def _transition(
    user_id: str,
    series_id: int,
    from_states: tuple[str, ...],
    to_state: str,
    *,
    connection: Connection | None = None,
) -> bool:
    user_id, series_id = _series_key(user_id, series_id)
    now = clock.now()

    def apply(conn: Connection) -> bool:
        next_n = next_due = None
        if to_state == "active":
            row = store.get_series(conn, (user_id, series_id))
            if row is None:
                return False
            # resume from now on: occurrences that fell due while paused are not fired late
            every, cal = parse_every(row["every"]), _cal(conn, row)
            next_n = max(
                row["next_n"], first_due_after(row["anchor_local"], row["zone"], every, now, cal)
            )
            next_due = due_at(row["anchor_local"], row["zone"], every, next_n, cal)
        moved = store.set_series_state(
            conn,
            (user_id, series_id),
            from_states=from_states,
            to_state=to_state,
            next_due_at=next_due,
            next_n=next_n,
            now=now,
        )
        if moved and to_state == "cancelled":
            _drop_held_occurrences(conn, (user_id, series_id), now)
        return moved

    return _in_transaction(connection, apply)


def _drop_held_occurrences(conn: Connection, key: tuple[str, int], now: datetime) -> None:
    """A cancelled series sends nothing more: not even an occurrence a snooze created early."""
    dropped = store.drop_unrouted_occurrences(conn, key, now=now)
    ledger.insert_decisions(
        conn,
        [
            ledger.Decision(
                key[0],
                request_id,
                "series",
                "suppress",
                "series_cancelled",
                f"series {key[1]} was cancelled",
            )
            for request_id in dropped
        ],
        now=now,
    )


def _series_key(user_id: object, series_id: object) -> tuple[str, int]:
    """The (user, series id) every series call names, checked before any SQL runs."""
    return (
        check.text("user_id", user_id, max_bytes=check.USER_ID_BYTES),
        check.positive_int("series_id", series_id, maximum=2**63 - 1),
    )


def cancel_series(user_id: str, series_id: int, *, connection: Connection | None = None) -> bool:
    """End a series for good (e.g. the manager answered "stop"). False if it was not running.

    Occurrences already recorded but not yet routed (a snoozed one, say) are resolved unsent, with a
    `series_cancelled` decision. Pass `connection=` to do it inside the caller's transaction."""
    return _transition(user_id, series_id, ("active", "paused"), "cancelled", connection=connection)


def pause_series(user_id: str, series_id: int, *, connection: Connection | None = None) -> bool:
    return _transition(user_id, series_id, ("active",), "paused", connection=connection)


def resume_series(user_id: str, series_id: int, *, connection: Connection | None = None) -> bool:
    """Resume from the next occurrence after now; none of those due while paused fires late."""
    return _transition(user_id, series_id, ("paused",), "active", connection=connection)


def snooze_occurrence(
    user_id: str, series_id: int, n: int, until: datetime, *, connection: Connection | None = None
) -> bool:
    """Hold occurrence n until max(its own due time, `until`): a snooze never brings an occurrence
    forward, and the anchor does not move (the series continues as scheduled).

    Only an active series is touched (its row is locked, so a concurrent cancel either waits for
    this or wins and leaves nothing to hold). False if the series is not active, has no
    occurrence n (count or until reached), or occurrence n was already routed."""
    user_id, series_id = _series_key(user_id, series_id)
    if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n < MAX_COUNT):
        raise InvalidField("n", f"must be an occurrence number from 0 to {MAX_COUNT - 1}")
    until = check.aware_datetime("until", until)

    def hold(conn: Connection) -> bool:
        row = store.lock_active_series(conn, (user_id, series_id))
        if row is None or n < 0 or (row["max_count"] is not None and n >= row["max_count"]):
            return False
        own = due_at(
            row["anchor_local"], row["zone"], parse_every(row["every"]), n, _cal(conn, row)
        )
        if row["until"] is not None and own > row["until"]:
            return False
        if n >= row["next_n"] and until <= own:
            return True  # its own schedule already holds it that long: nothing to write
        ntype = runtime.catalog().get(row["type_key"])
        if ntype is None:
            raise UnknownType(row["type_key"])
        return (
            store.snooze_occurrence(
                conn,
                user_id=user_id,
                type_key=row["type_key"],
                occurrence_key=f"series:{series_id}:{n}",
                lane=ntype.lane,
                version=ntype.version,
                variables=row["variables"],
                until=max(own, until),
                now=clock.now(),
            )
            is not None
        )

    return _in_transaction(connection, hold)


def fire_due_series(conn: Connection, *, now: datetime, limit: int = 1000) -> int:
    """The tick step: record due occurrences as requests and advance each due series once."""
    due = store.take_due_series(conn, now=now, limit=limit)
    if not due:
        return 0
    catalog = runtime.catalog()
    recipients = ledger.recipients(conn, {r["user_id"] for r in due})
    grace = timedelta(seconds=settings.get().series_grace)
    rows: list[dict[str, Any]] = []
    decisions: list[ledger.Decision] = []
    advances: list[tuple[str, int, int, datetime | None, bool]] = []  # see store.advance_many
    for s in due:
        try:
            tick = plan_tick(s, recipient_calendar(recipients[s["user_id"]]), now=now, grace=grace)
        except (OverflowError, ValueError):
            # one series whose time cannot be computed must not stop every other series: end it
            log.exception(
                "series cannot be scheduled; ending it",
                extra={"action": "series_failed", "series": (s["user_id"], s["id"])},
            )
            advances.append((s["user_id"], s["id"], s["next_n"], None, True))
            continue
        ntype = catalog.get(s["type_key"])
        for occ in tick.occurrences:
            state = {"send": "pending", "moved": "deferred"}.get(occ.action, "routed")
            rows.append(
                {
                    "user_id": s["user_id"],
                    "type_key": s["type_key"],
                    "occurrence_key": f"series:{s['id']}:{occ.n}",
                    "lane": ntype.lane if ntype else "activation",
                    "template_version": ntype.version if ntype else 0,
                    "variables": s["variables"],
                    "state": state,
                    "due_at": occ.send_at
                    if state == "deferred"
                    else (now if state == "pending" else None),
                    "_occ": occ,
                }
            )
        advances.append((s["user_id"], s["id"], tick.next_n, tick.next_due_at, tick.ended))
    store.advance_many(conn, advances, now=now)
    created = store.insert_occurrences(conn, rows, now=now)
    for r in rows:
        occ = r["_occ"]
        if r["occurrence_key"] in created and occ.action in ("missed", "skipped", "moved"):
            gate = "schedule" if occ.action == "missed" else "calendar"
            outcome = "defer" if occ.action == "moved" else "suppress"
            reason = {"missed": "missed", "skipped": "non_working_day", "moved": "non_working_day"}[
                occ.action
            ]
            detail = occ.reason + (
                f"; sends {occ.send_at.isoformat()}" if occ.action == "moved" else ""
            )
            decisions.append(
                ledger.Decision(
                    r["user_id"], created[r["occurrence_key"]], gate, outcome, reason, detail
                )
            )
    ledger.insert_decisions(conn, decisions, now=now)
    return len(due)
