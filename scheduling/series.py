"""What a beat tick does with one due series: pure, given the series, its calendar and `now`.

Occurrence n is due at anchor + n × interval in the series' zone (scheduling.recurrence). When
several occurrences have elapsed (beat was down, or the anchor is in the past), those older than
the grace window are `missed`, and of those inside it only the latest is sent: never a burst.
At most MAX_MISSED_ROWS missed occurrences are recorded one by one per series and tick; older ones
are counted in one more row, whose text says how many and why. A missed occurrence's text names its
cause: due before the series was armed (the anchor is in the past), or the tick came too late.

On a non-working day the series' calendar policy decides: `skip`, `send`, or `next_working_day`,
which moves it to the next working day at the same wall time. A moved occurrence that lands on a
day which already has an occurrence of the same series is `merged` into it, never sent again: into
that day's own occurrence if it has one, else into the first occurrence moved onto that day (a
daily series' Friday holiday, Saturday and Sunday all land on Monday 09:00, which has its own).

The series advances whatever happens to the occurrence (opted out, blocked by a gate): its
liveness depends on the series being active, not on any occurrence being eligible.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from clarion.scheduling.calendars import WorkCalendar, adjust
from clarion.scheduling.recurrence import (
    Every,
    due_at,
    first_due_after,
    local_occurrence,
    parse_every,
    to_utc,
)
from clarion.scheduling.zones import load_zone

MAX_MISSED_ROWS = 50  # missed occurrences recorded one by one per tick; older ones are counted

Action = Literal["send", "missed", "skipped", "moved", "merged"]
MergeKind = Literal["own", "moved"]  # into that day's own occurrence / the first one moved there


@dataclass(frozen=True)
class Occurrence:
    n: int
    due_at: datetime  # UTC, as scheduled
    action: Action
    send_at: datetime | None = None  # for send/moved/merged: when it (or its target) goes out
    reason: str = ""  # why not sent as scheduled: the non-working day, or why it was missed
    merged_into: int | None = None  # for merged: the occurrence number it joins
    merge_kind: MergeKind | None = None


@dataclass(frozen=True)
class TickPlan:
    occurrences: tuple[Occurrence, ...]
    next_n: int
    next_due_at: datetime | None  # None when the series has ended
    ended: bool


def series_every(row: dict[str, Any]) -> Every:
    return parse_every(row["every"])


def wall(at: datetime, zone: str) -> str:
    """An instant as the recipient's wall clock shows it: "Sat 2026-12-05 09:00"."""
    return at.astimezone(load_zone(zone)).strftime("%a %Y-%m-%d %H:%M")


def describe(occ: Occurrence, zone: str) -> str:
    """One line on what the calendar did: "moved from Sat 2026-12-05 09:00 to Mon 2026-12-07 09:00
    (weekend (US: Sat–Sun))", "… merged into #n, that day's own occurrence", or the reason."""
    if occ.action not in ("moved", "merged") or occ.send_at is None:
        return occ.reason
    text = f"moved from {wall(occ.due_at, zone)} to {wall(occ.send_at, zone)} ({occ.reason})"
    if occ.action == "merged":
        whose = "that day's own occurrence" if occ.merge_kind == "own" else "moved there first"
        text += f"; merged into occurrence {occ.merged_into} ({whose}): not sent again"
    return text


def plan_tick(
    row: dict[str, Any], calendar: WorkCalendar, *, now: datetime, grace: timedelta
) -> TickPlan:
    """The occurrences to record now for a due series, and where the series goes next."""
    every = series_every(row)
    anchor, zone, first = row["anchor_local"], row["zone"], row["next_n"]
    cal = calendar if every.unit == "working_days" else None
    if due_at(anchor, zone, every, first, cal) <= now < due_at(anchor, zone, every, first + 1, cal):
        last = first  # the usual tick: one occurrence fell due since the last (due_at is cached)
    else:
        last = first_due_after(anchor, zone, every, now, cal) - 1
    if row.get("max_count") is not None:
        last = min(last, row["max_count"] - 1)
    until = row.get("until")
    while last >= first and until is not None and due_at(anchor, zone, every, last, cal) > until:
        last -= 1
    occurrences: list[Occurrence] = []
    if last >= first:
        sendable = now - due_at(anchor, zone, every, last, cal) <= grace
        start = max(first, last - MAX_MISSED_ROWS + 1)
        if start > first:
            occurrences.append(_counted(row, every, cal, first, start - 1, now=now, grace=grace))
        for n in range(start, last + 1):
            due = due_at(anchor, zone, every, n, cal)
            if n == last and sendable:
                occurrences.append(_on_calendar(row, calendar, every, n, due))
            else:
                occurrences.append(
                    Occurrence(n, due, "missed", reason=_missed(row, due, now, grace))
                )
    next_n = max(first, last + 1)
    ended = row.get("max_count") is not None and next_n >= row["max_count"]
    next_due = None if ended else due_at(anchor, zone, every, next_n, cal)
    if next_due is not None and until is not None and next_due > until:
        ended, next_due = True, None
    return TickPlan(tuple(occurrences), next_n, next_due, ended)


def _missed(row: dict[str, Any], due: datetime, now: datetime, grace: timedelta) -> str:
    armed = row.get("created_at")
    if armed is not None and due < armed:
        return (
            f"missed: due before the series was armed at {armed.isoformat(timespec='seconds')} "
            f"(the anchor {row['anchor_local'].isoformat(timespec='minutes')} is in the past)"
        )
    if now - due > grace:
        return (
            f"missed: the tick came {_span(now - due)} after it was due, past the "
            f"{_span(grace)} grace window (beat or the control-lane workers were not running)"
        )
    return (
        "missed: superseded by a later occurrence inside the grace window (only the latest is sent)"
    )


def _counted(
    row: dict[str, Any],
    every: Every,
    cal: WorkCalendar | None,
    first: int,
    last: int,
    *,
    now: datetime,
    grace: timedelta,
) -> Occurrence:
    """One row standing for occurrences first..last, which are not recorded one by one."""
    anchor, zone = row["anchor_local"], row["zone"]
    armed = row.get("created_at")
    before = 0
    if armed is not None:
        before = first_due_after(anchor, zone, every, armed - timedelta(microseconds=1), cal)
        before = max(0, min(before, last + 1) - first)
    causes = []
    if before:
        causes.append(f"{before} due before the series was armed (the anchor is in the past)")
    if last + 1 - first - before:
        causes.append(
            f"{last + 1 - first - before} fell due while the tick did not run (past the "
            f"{_span(grace)} grace window)"
        )
    reason = (
        f"missed: this row stands for occurrences {first}..{last} ({last + 1 - first}), counted "
        f"rather than recorded one by one (at most {MAX_MISSED_ROWS} missed rows per series and "
        f"tick): {'; '.join(causes)}"
    )
    return Occurrence(last, due_at(anchor, zone, every, last, cal), "missed", reason=reason)


def _span(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    if minutes < 120:
        return f"{minutes} min"
    hours = minutes // 60
    return f"{hours} h" if hours < 48 else f"{hours // 24} days"


def on_calendar(row: dict[str, Any], calendar: WorkCalendar, n: int) -> Occurrence:
    """What the series' calendar policy does with occurrence n (assumed sendable)."""
    every = series_every(row)
    cal = calendar if every.unit == "working_days" else None
    return _on_calendar(
        row, calendar, every, n, due_at(row["anchor_local"], row["zone"], every, n, cal)
    )


def _on_calendar(
    row: dict[str, Any], calendar: WorkCalendar, every: Every, n: int, due: datetime
) -> Occurrence:
    anchor, zone, policy = row["anchor_local"], row["zone"], row["calendar_policy"]
    cal = calendar if every.unit == "working_days" else None
    local = local_occurrence(anchor, every, n, cal)
    moved, reason = adjust(calendar, local, policy)
    if moved is None:
        return Occurrence(n, due, "skipped", reason=reason or "non-working day")
    if moved == local:
        return Occurrence(n, due, "send", due)
    send_at, why = to_utc(moved, zone), reason or "non-working day"
    target = _merge_target(row, calendar, n, moved)
    if target is None:
        return Occurrence(n, due, "moved", send_at, why)
    return Occurrence(n, due, "merged", send_at, why, merged_into=target[0], merge_kind=target[1])


def _merge_target(
    row: dict[str, Any], calendar: WorkCalendar, n: int, landing: datetime
) -> tuple[int, MergeKind] | None:
    """The occurrence a moved occurrence n joins on its landing day, if that day has one.

    First that day's own occurrence (on a working day, so sent as scheduled, and within the
    series' count and until); else the earliest occurrence before n moved onto the same day.
    Both searches step one occurrence at a time: a run of non-working days is short."""
    every = series_every(row)
    anchor, policy = row["anchor_local"], row["calendar_policy"]
    cal = calendar if every.unit == "working_days" else None
    k = n + 1
    while local_occurrence(anchor, every, k, cal).date() < landing.date():
        k += 1
    own = local_occurrence(anchor, every, k, cal)
    if own.date() == landing.date() and _within(row, every, cal, k):
        return k, "own"
    j = n
    while j > 0 and adjust(calendar, local_occurrence(anchor, every, j - 1, cal), policy)[0] == (
        landing
    ):
        j -= 1
    return (j, "moved") if j < n else None


def _within(row: dict[str, Any], every: Every, cal: WorkCalendar | None, k: int) -> bool:
    if row.get("max_count") is not None and k >= row["max_count"]:
        return False
    until = row.get("until")
    return until is None or due_at(row["anchor_local"], row["zone"], every, k, cal) <= until


def preview(
    row: dict[str, Any], calendar: WorkCalendar, *, start: datetime, end: datetime, limit: int = 500
) -> list[tuple[int, datetime, datetime, Occurrence]]:
    """Occurrences due in [start, end): (n, due UTC, local wall time, what the calendar does).

    A merge into an occurrence moved before `start` is shown as the tick would record it, assuming
    that one was sent as planned (the tick checks the ledger)."""
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
        out.append((n, due, local_occurrence(anchor, every, n, cal), on_calendar(row, calendar, n)))
        n += 1
    return out
