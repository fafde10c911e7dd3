"""Recurring series: pause, resume, cancel, snooze one occurrence; the tick step that turns due
occurrences into requests; and the tz database check that keeps every worker on one tz release.
Arming lives in tasks.arming (re-exported here)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import Connection

from clarion import clock, faults, metrics, settings
from clarion import validation as check
from clarion.catalog.model import Catalog
from clarion.db import ledger, meta
from clarion.db import series as store
from clarion.db.engine import engine, in_transaction
from clarion.errors import InvalidField, UnknownType
from clarion.scheduling import zones
from clarion.scheduling.recurrence import due_at, first_due_after, parse_every
from clarion.scheduling.series import Occurrence, describe, plan_tick
from clarion.tasks import runtime
from clarion.tasks.arming import (  # noqa: F401  (the series API in one place)
    MAX_COUNT,
    Armed,
    arm_series,
    recipient_calendar,
    row_calendar,
    series_calendar,
    validate,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


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
            every, cal = parse_every(row["every"]), series_calendar(conn, row)
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

    return in_transaction(connection, apply)


def _drop_held_occurrences(conn: Connection, key: tuple[str, int], now: datetime) -> None:
    """A cancelled series sends nothing more: not even an occurrence a snooze created early."""
    dropped = store.drop_unrouted_occurrences(conn, key, now=now)
    decisions = [
        ledger.Decision(
            key[0],
            request_id,
            "series",
            "suppress",
            "series_cancelled",
            f"series {key[1]} was cancelled",
        )
        for request_id in dropped
    ]
    ledger.insert_decisions(conn, decisions, now=now)
    metrics.count_decisions((d.gate, d.outcome, d.reason) for d in decisions)


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
            row["anchor_local"],
            row["zone"],
            parse_every(row["every"]),
            n,
            series_calendar(conn, row),
        )
        if row["until"] is not None and own > row["until"]:
            return False
        if n >= row["next_n"] and until <= own:
            return True  # its own schedule already holds it that long: nothing to write
        ntype = runtime.catalog().get(row["type_key"])
        if ntype is None:
            raise UnknownType(row["type_key"], runtime.catalog().name)
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

    return in_transaction(connection, hold)


def tz_database_problem(conn: Connection) -> str | None:
    """Why this process must not compute times against this database, or None: the tz release
    recorded at migration must be the one installed here (scheduling.zones)."""
    recorded = meta.get(conn, meta.TZDATA)
    if recorded == zones.TZ_DATABASE:
        return None
    if recorded is None:
        return "the database records no tz database release: run `clarion migrate`"
    return (
        f"this install computes times with tz database {zones.describe()} but the database was "
        f"migrated with {recorded}: install the tzdata release {recorded}, or run `clarion "
        f"migrate` from this install to move the whole deployment to {zones.TZ_DATABASE}"
    )


# Due series per write, pipelined: PostgreSQL writes one batch while the next is planned. The first
# is small, so that PostgreSQL starts writing early; each next one is at most twice the last, up to
# MAX_BATCH. Planning and sending a series costs Python about as much as writing it costs PostgreSQL
# (~25 us each), so a batch larger than the one being written would leave PostgreSQL waiting for it:
# 25/100 against 50/400 was 37.5 against 40.4 ms per tick of 1,000 due (bench/tick.py's data).
FIRST_BATCH, MAX_BATCH = 25, 100
_STATES = {"send": "pending", "moved": "deferred"}  # the rest are recorded resolved ("routed")


class Fired(NamedTuple):
    """What fire_due_series did: the number of due series it advanced, and the (gate, outcome,
    reason) of the decisions it recorded (missed, skipped, moved, merged occurrences), for the
    caller to count once its transaction has committed (metrics.count_decisions)."""

    series: int
    decisions: list[tuple[str, str, str]]


def tick_series(*, now: datetime, limit: int = 1000) -> int:
    """The beat tick's series step in a transaction of its own: fire_due_series, commit, then
    count its decisions (a commit that fails counts nothing). The number of series advanced."""
    with engine().begin() as conn:
        fired = fire_due_series(conn, now=now, limit=limit)
        faults.hit("tick.before_commit")
    metrics.count_decisions(fired.decisions)
    return fired.series


def fire_due_series(conn: Connection, *, now: datetime, limit: int = 1000) -> Fired:
    """The tick step: record due occurrences as requests and advance each due series once, in the
    caller's transaction (tick_series runs it in one of its own and counts the decisions).

    Fires nothing while this process's tz database differs from the deployment's (one error log
    per tick): its due times would not be the ones every other worker computes. A few statements
    whatever the number due: the due series with their recipients, then one write per
    batch (see FIRST_BATCH), plus one per batch where a merge must be checked against the ledger.
    The tz check is part of the due query; only a tick that finds nothing due asks why."""
    due = store.take_due_series(conn, now=now, limit=limit, tzdata=zones.TZ_DATABASE)
    if not due:
        if problem := tz_database_problem(conn):
            log.error(problem, extra={"action": "series_tz_database_mismatch"})
        return Fired(0, [])
    grace = timedelta(seconds=settings.get().series_grace)
    catalog = runtime.catalog()
    written = []
    with store.pipelined(conn):
        for batch in _batches(due):
            advances, planned = _plan(batch, now=now, grace=grace)
            planned = _confirm_merges(conn, planned)
            occurrences = [_occurrence(catalog, s, occ, now) for s, occ in planned]
            written.append(store.fire_occurrences(conn, advances, occurrences, now=now))
    decisions = [(g, o, r) for cursor in written if cursor is not None for g, o, r in cursor]
    return Fired(len(due), decisions)


def _batches(due: Sequence[T]) -> Iterator[Sequence[T]]:
    start, size = 0, FIRST_BATCH
    while start < len(due):
        yield due[start : start + size]
        start, size = start + size, min(2 * size, MAX_BATCH)


def _plan(
    due: Sequence[dict[str, Any]],
    *,
    now: datetime,
    grace: timedelta,
) -> tuple[list[store.Advance], list[tuple[dict[str, Any], Occurrence]]]:
    """Where each due series goes next, and the occurrences to record for it (each due row
    carries its recipient's calendar: take_due_series)."""
    planned: list[tuple[dict[str, Any], Occurrence]] = []
    advances: list[store.Advance] = []
    for s in due:
        try:
            tick = plan_tick(s, row_calendar(s), now=now, grace=grace)
        except (OverflowError, ValueError):
            # one series whose time cannot be computed must not stop every other series: end it
            log.exception(
                "series cannot be scheduled; ending it",
                extra={"action": "series_failed", "series": (s["user_id"], s["id"])},
            )
            advances.append(
                store.Advance(s["user_id"], s["id"], s["ctid"], s["next_n"], None, True)
            )
            continue
        planned += [(s, occ) for occ in tick.occurrences]
        advances.append(
            store.Advance(
                s["user_id"], s["id"], s["ctid"], tick.next_n, tick.next_due_at, tick.ended
            )
        )
    return advances, planned


def _occurrence_key(series_id: int, n: int) -> str:
    return f"series:{series_id}:{n}"


def _confirm_merges(
    conn: Connection, planned: list[tuple[dict[str, Any], Occurrence]]
) -> list[tuple[dict[str, Any], Occurrence]]:
    """A merge into an occurrence moved by an earlier tick stands only if that one is still held
    to be sent (it may have been missed while beat was down, or dropped): then it joins the
    earliest of those still held, else it is sent itself, moved. A merge into that day's own
    occurrence needs no check: that one is still in the future."""
    wanted = [
        (s["user_id"], s["type_key"], _occurrence_key(s["id"], j))
        for s, occ in planned
        if occ.merge_kind == "moved" and occ.merged_into is not None
        for j in range(occ.merged_into, occ.n)
    ]
    held = store.deferred_occurrences(conn, wanted)
    out = []
    for s, occ in planned:
        if occ.merge_kind == "moved" and occ.merged_into is not None:
            into = next(
                (
                    j
                    for j in range(occ.merged_into, occ.n)
                    if (s["user_id"], s["type_key"], _occurrence_key(s["id"], j)) in held
                ),
                None,
            )
            occ = (
                replace(occ, merged_into=into)
                if into is not None
                else replace(occ, action="moved", merged_into=None, merge_kind=None)
            )
        out.append((s, occ))
    return out


def _occurrence(
    catalog: Catalog,
    s: dict[str, Any],
    occ: Occurrence,
    now: datetime,
) -> store.NewOccurrence:
    """The request to record for occurrence `occ` of series `s`, in its recipient's locale (the
    due query joins it, so the requests_pin_locale trigger has nothing to do)."""
    ntype = catalog.get(s["type_key"])
    state = _STATES.get(occ.action, "routed")
    return store.NewOccurrence(
        user_id=s["user_id"],
        series_id=s["id"],
        occurrence_key=_occurrence_key(s["id"], occ.n),
        lane=ntype.lane if ntype else "activation",
        template_version=ntype.version if ntype else 0,
        state=state,
        due_at={"pending": now, "deferred": occ.send_at}.get(state),
        decision=None if occ.action == "send" else _decision(s, occ),
        locale=s["locale"],
    )


_DECIDED = {  # action -> (gate, outcome, reason)
    "missed": ("schedule", "suppress", "missed"),
    "skipped": ("calendar", "suppress", "non_working_day"),
    "moved": ("calendar", "defer", "non_working_day"),
    "merged": ("calendar", "collapse", "merged"),
}


def _decision(s: dict[str, Any], occ: Occurrence) -> tuple[str, str, str, str]:
    """Why an occurrence was not sent as scheduled (gate, outcome, reason, detail): missed,
    skipped, moved (from when to when), or merged into another occurrence of the series (which)."""
    gate, outcome, reason = _DECIDED[occ.action]
    detail = describe(occ, s["zone"])
    if occ.action == "merged":
        detail += f" (request {_occurrence_key(s['id'], occ.merged_into or 0)})"
    return gate, outcome, reason, detail
