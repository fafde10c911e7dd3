"""What a beat tick does with one due series: pure, given the series, its calendar and `now`.

Occurrence n is due at anchor + n × interval in the series' zone (scheduling.recurrence). When
several occurrences have elapsed (beat was down, or the anchor is in the past), those older than
the grace window are `missed`, and of those inside it only the latest is sent: never a burst.
The series advances whatever happens to the occurrence (opted out, blocked by a gate): its
liveness depends on the series being active, not on any occurrence being eligible.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from scheduling.calendars import WorkCalendar, adjust
from scheduling.recurrence import (
    Every,
    due_at,
    first_due_after,
    local_occurrence,
    parse_every,
    to_utc,
)

MAX_MISSED_ROWS = 50  # missed occurrences recorded one by one per tick; older ones are counted

Action = Literal["send", "missed", "skipped", "moved"]


@dataclass(frozen=True)
class Occurrence:
    n: int
    due_at: datetime  # UTC, as scheduled
    action: Action
    send_at: datetime | None = None  # for send/moved: when it should go out
    reason: str = ""


@dataclass(frozen=True)
class TickPlan:
    occurrences: tuple[Occurrence, ...]
    next_n: int
    next_due_at: datetime | None  # None when the series has ended
    ended: bool


def series_every(row: dict[str, Any]) -> Every:
    return parse_every(row["every"])


def plan_tick(
    row: dict[str, Any], calendar: WorkCalendar, *, now: datetime, grace: timedelta
) -> TickPlan:
    """The occurrences to record now for a due series, and where the series goes next."""
    every = series_every(row)
    anchor, zone, first = row["anchor_local"], row["zone"], row["next_n"]
    cal = calendar if every.unit == "working_days" else None
    last = first_due_after(anchor, zone, every, now, cal) - 1
    if row.get("max_count") is not None:
        last = min(last, row["max_count"] - 1)
    until = row.get("until")
    while last >= first and until is not None and due_at(anchor, zone, every, last, cal) > until:
        last -= 1
    occurrences: list[Occurrence] = []
    if last >= first:
        newest = due_at(anchor, zone, every, last, cal)
        sendable = now - newest <= grace
        start = max(first, last - MAX_MISSED_ROWS + 1)
        if start > first:
            occurrences.append(
                Occurrence(
                    start - 1,
                    due_at(anchor, zone, every, start - 1, cal),
                    "missed",
                    reason=f"missed: beat did not run in time (with {start - 1 - first} "
                    "earlier occurrences)",
                )
            )
        for n in range(start, last + 1):
            due = due_at(anchor, zone, every, n, cal)
            if n == last and sendable:
                occurrences.append(_on_calendar(anchor, every, n, due, zone, calendar, row, cal))
            else:
                why = (
                    "older than the grace window"
                    if now - due > grace
                    else "superseded by a later occurrence"
                )
                occurrences.append(Occurrence(n, due, "missed", reason=f"missed: {why}"))
    next_n = max(first, last + 1)
    ended = row.get("max_count") is not None and next_n >= row["max_count"]
    next_due = None if ended else due_at(anchor, zone, every, next_n, cal)
    if next_due is not None and until is not None and next_due > until:
        ended, next_due = True, None
    return TickPlan(tuple(occurrences), next_n, next_due, ended)


def _on_calendar(
    anchor: datetime,
    every: Every,
    n: int,
    due: datetime,
    zone: str,
    calendar: WorkCalendar,
    row: dict[str, Any],
    cal: WorkCalendar | None,
) -> Occurrence:
    local = local_occurrence(anchor, every, n, cal)
    moved, reason = adjust(calendar, local, row["calendar_policy"])
    if moved is None:
        return Occurrence(n, due, "skipped", reason=reason or "non-working day")
    if moved != local:
        return Occurrence(
            n, due, "moved", to_utc(moved, zone), reason or "moved to the next working day"
        )
    return Occurrence(n, due, "send", due)


def preview(
    row: dict[str, Any], calendar: WorkCalendar, *, start: datetime, end: datetime, limit: int = 500
) -> list[tuple[int, datetime, datetime, Occurrence]]:
    """Occurrences due in [start, end): (n, due UTC, local wall time, what the calendar does)."""
    every = series_every(row)
    anchor, zone = row["anchor_local"], row["zone"]
    cal = calendar if every.unit == "working_days" else None
    n = max(
        row.get("next_n", 0),
        first_due_after(anchor, zone, every, start - timedelta(microseconds=1), cal),
    )
    out: list[tuple[int, datetime, datetime, Occurrence]] = []
    while len(out) < limit:
        if row.get("max_count") is not None and n >= row["max_count"]:
            break
        due = due_at(anchor, zone, every, n, cal)
        if due >= end or (row.get("until") is not None and due > row["until"]):
            break
        out.append(
            (
                n,
                due,
                local_occurrence(anchor, every, n, cal),
                _on_calendar(anchor, every, n, due, zone, calendar, row, cal),
            )
        )
        n += 1
    return out
