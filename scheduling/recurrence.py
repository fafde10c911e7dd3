"""Anchored recurring series: occurrence n is due at anchor + n × interval, in local wall time.

A series has an anchor — a naive local wall time such as 2026-03-02 09:00 — and the recipient's IANA
zone. Occurrence n is computed from the anchor directly (never from the previous occurrence or from
"now", DESIGN.md invariant 6), in local wall time, and only then converted to UTC with the zone's
rules for that date: a weekly 09:00 stays at 09:00 local across DST, like the calendar invite it
mirrors. Pure: nothing here reads a clock; every instant returned is an aware UTC datetime, and the
only naive datetimes are local wall times, named `*_local` / `local`.

Units:
- days, weeks: add n × count days (× 7) to the local date; the wall time is kept.
- months: keep the anchor's day of month, clamped to the month's last day, counted from the anchor:
  Jan 31 + 1 month = Feb 28 (29), + 2 months = Mar 31.
- working_days: occurrence n is the (n × count)-th working day after the anchor's date in the
  recipient's calendar (scheduling.calendars), at the anchor's wall time. The anchor itself is
  occurrence 0 even on a non-working day: the person who armed the series chose that moment, and
  the type's calendar policy (skip / next working day / send) still decides what happens on it.

Wall times the zone does not have exactly once (both policies as in gates/quiet.py):
- GAP_POLICY, spring forward: a wall time that does not exist that day moves forward by the length of
  the gap — 02:30 on a 02:00→03:00 night is 03:30; the next occurrence is back at 02:30.
- FOLD_POLICY, autumn back: a wall time that happens twice uses the first occurrence (fold=0), e.g.
  01:30 EDT, not 01:30 EST, on 2026-11-01 in America/New_York.
"""

from __future__ import annotations

import calendar as _gregorian
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Final, Literal, get_args

from clarion.scheduling.calendars import (
    WorkCalendar,
    add_working_days,
    working_days_between,
)
from clarion.scheduling.zones import load_zone

Unit = Literal["days", "weeks", "months", "working_days"]
UNITS: tuple[Unit, ...] = get_args(Unit)

GAP_POLICY: Final = "forward"
"""A local time inside a spring-forward gap moves forward by the gap's length (02:30 -> 03:30)."""
FOLD_POLICY: Final = "first"
"""A local time inside an autumn fold is the first of its two instants (fold=0)."""

_SUFFIX: dict[Unit, str] = {"days": "d", "weeks": "w", "months": "mo", "working_days": "wd"}
_BY_SUFFIX: dict[str, Unit] = {suffix: unit for unit, suffix in _SUFFIX.items()}
_WORDS = {"daily": "1d", "weekly": "1w", "monthly": "1mo"}
_TEXT = re.compile(r"(\d+)\s*(wd|mo|d|w)")


@dataclass(frozen=True)
class Every:
    """An interval: `count` units. str(Every(2, "weeks")) == "2w", which parse_every reads back."""

    count: int
    unit: Unit

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unknown interval unit {self.unit!r}: use one of {', '.join(UNITS)}")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"an interval needs a whole count of at least 1, not {self.count!r}")

    def __str__(self) -> str:
        return f"{self.count}{_SUFFIX[self.unit]}"


def parse_every(text: str) -> Every:
    """Read "1d", "2w", "1mo", "3wd" (working days), "daily", "weekly" or "monthly"."""
    every = _parse_every(text) if isinstance(text, str) else None
    if every is None:
        raise ValueError(
            f"cannot read the interval {text!r}: write a count and a unit — d (days), w (weeks), "
            "mo (months) or wd (working days), e.g. 1d, 2w, 1mo, 3wd — or daily, weekly, monthly"
        )
    return every


@lru_cache(maxsize=1024)  # every tick reads the same few intervals, once or twice per due series
def _parse_every(text: str) -> Every | None:
    key = text.strip().lower()
    match = _TEXT.fullmatch(_WORDS.get(key, key))
    return None if match is None else Every(int(match[1]), _BY_SUFFIX[match[2]])


def local_occurrence(
    anchor_local: datetime, every: Every, n: int, calendar: WorkCalendar | None = None
) -> datetime:
    """The naive local wall time of occurrence n (n=0 is the anchor). `calendar` is required for
    working days and ignored otherwise."""
    _check_local(anchor_local, "anchor_local")
    if n < 0:
        raise ValueError(f"occurrence numbers start at 0, not {n}")
    steps = every.count * n
    if every.unit == "days":
        return anchor_local + timedelta(days=steps)
    if every.unit == "weeks":
        return anchor_local + timedelta(weeks=steps)
    if every.unit == "months":
        return _add_months(anchor_local, steps)
    if calendar is None:
        raise ValueError("an interval in working days needs the recipient's calendar")
    return datetime.combine(
        add_working_days(calendar, anchor_local.date(), steps), anchor_local.time()
    )


def to_utc(local: datetime, zone: str) -> datetime:
    """The UTC instant of a local wall time in `zone`, applying GAP_POLICY and FOLD_POLICY.

    With fold=0, zoneinfo reads a gap time with the offset from before the transition, which lands
    exactly the gap's length later on the wall clock, and a fold time as its first instant."""
    _check_local(local, "local")
    return local.replace(tzinfo=load_zone(zone), fold=0).astimezone(UTC)


@lru_cache(maxsize=16384)  # a tick asks for the same (series, n) up to six times (plan_tick)
def due_at(
    anchor_local: datetime, zone: str, every: Every, n: int, calendar: WorkCalendar | None = None
) -> datetime:
    """When occurrence n is due, in UTC. Pure, so memoised: every argument is immutable."""
    return to_utc(local_occurrence(anchor_local, every, n, calendar), zone)


def first_due_after(
    anchor_local: datetime,
    zone: str,
    every: Every,
    after: datetime,
    calendar: WorkCalendar | None = None,
) -> int:
    """The smallest n whose due_at is strictly later than `after` (an aware datetime).

    Estimates n from the local calendar distance between the anchor and `after`, then corrects by a
    step or two (due_at is strictly increasing in n), so a years-old series costs the same as a new one.
    """
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("after must be a timezone-aware datetime")
    after_local = after.astimezone(load_zone(zone)).replace(tzinfo=None)
    n = max(0, _steps_between(anchor_local, after_local, every, calendar))
    while n > 0 and due_at(anchor_local, zone, every, n - 1, calendar) > after:
        n -= 1
    while due_at(anchor_local, zone, every, n, calendar) <= after:
        n += 1
    return n


def _steps_between(
    anchor_local: datetime, later_local: datetime, every: Every, calendar: WorkCalendar | None
) -> int:
    """Whole intervals from the anchor to `later_local` in local time: an estimate, maybe off by one."""
    if every.unit in ("days", "weeks"):
        step = timedelta(days=every.count * (7 if every.unit == "weeks" else 1))
        return (later_local - anchor_local) // step
    if every.unit == "months":
        months = (
            (later_local.year - anchor_local.year) * 12 + later_local.month - anchor_local.month
        )
        return months // every.count
    if calendar is None:
        raise ValueError("an interval in working days needs the recipient's calendar")
    return working_days_between(calendar, anchor_local.date(), later_local.date()) // every.count


def _add_months(local: datetime, months: int) -> datetime:
    index = local.year * 12 + local.month - 1 + months
    year, month = divmod(index, 12)
    last_day = _gregorian.monthrange(year, month + 1)[1]
    return local.replace(year=year, month=month + 1, day=min(local.day, last_day))


def _check_local(value: datetime, name: str) -> None:
    if not isinstance(value, datetime):
        raise TypeError(f"{name} must be a datetime, not {type(value).__name__}")
    if value.tzinfo is not None:
        raise ValueError(f"{name} must be a naive local wall time; the zone is passed separately")
