"""Timers that count only the recipient's working time: a local daily window (e.g. 09:00–17:00,
or the whole day) on the working days of their calendar (scheduling.calendars: workweek, weekend
and public holidays). "10 working minutes" from Friday 16:55 in Berlin is Monday 09:05.

Pure: time is a parameter. Durations inside a window are real elapsed time (a window that spans a
DST change is an hour shorter or longer on the wall clock's day, as the recipient lives it).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from clarion.scheduling.calendars import WorkCalendar, is_working_day
from clarion.scheduling.recurrence import to_utc
from clarion.scheduling.zones import load_zone

MAX_DAYS = 3700  # ten years without a working minute is a calendar bug, not a wait


def _clock(text: str) -> time | None:
    """'HH:MM' as a time; '24:00' is None (the end of the day)."""
    if text == "24:00":
        return None
    hours, minutes = text.split(":")
    return time(int(hours), int(minutes))


def window_bounds(day: date, window: tuple[str, str], zone: str) -> tuple[datetime, datetime]:
    """The window's start and end on local `day`, as UTC instants."""
    opens, closes = _clock(window[0]), _clock(window[1])
    start = to_utc(datetime.combine(day, opens or time(0)), zone)
    if closes is None:
        return start, to_utc(datetime.combine(day + timedelta(days=1), time(0)), zone)
    return start, to_utc(datetime.combine(day, closes), zone)


def add_working_time(
    start: datetime,
    seconds: float,
    *,
    calendar: WorkCalendar,
    zone: str,
    window: tuple[str, str] = ("00:00", "24:00"),
) -> datetime:
    """The instant at which `seconds` of working time have passed since `start` (aware, UTC).
    Raises ValueError when no working time is found within MAX_DAYS."""
    if seconds <= 0:
        return start.astimezone(UTC)
    remaining = timedelta(seconds=seconds)
    current = start.astimezone(UTC)
    day = current.astimezone(load_zone(zone)).date()
    for _ in range(MAX_DAYS):
        if is_working_day(calendar, day):
            opens, closes = window_bounds(day, window, zone)
            at = max(current, opens)
            if at < closes:
                if remaining <= closes - at:
                    return at + remaining
                remaining -= closes - at
        day += timedelta(days=1)
        current = max(current, to_utc(datetime.combine(day, time(0)), zone))
    raise ValueError(f"no working time within {MAX_DAYS} days of {start.isoformat()}")
