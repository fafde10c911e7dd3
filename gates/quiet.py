"""Quiet hours and allowed-hours windows in the recipient's own zone. Pure: `now` is a parameter."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

from clarion.scheduling.zones import load_zone


def _at(day: date, at: time, zone: ZoneInfo, after: datetime) -> datetime:
    """The first instant after `after` showing `at` on `day` in `zone`.

    A wall time inside a spring-forward gap moves forward by the gap (02:30 on a 02:00→03:00 night
    is 03:30). In an autumn fold the first pass is used, unless `after` is already past it (a
    window ending in the repeated hour, seen from its second pass): then the second pass."""
    for fold in (0, 1):
        instant = datetime.combine(day, at, tzinfo=zone).replace(fold=fold).astimezone(UTC)
        if instant > after.astimezone(UTC):  # compare in UTC: same-zone comparison ignores fold
            break
    return instant.astimezone(zone)


def quiet_until(start: time | None, end: time | None, zone: str, now: datetime) -> datetime | None:
    """If `now` falls in the daily quiet window [start, end) local time, when it ends; else None.

    A window with start > end crosses midnight (22:00–07:00). start == end means no window."""
    if start is None or end is None or start == end:
        return None
    tz = load_zone(zone)
    local = now.astimezone(tz)
    t = local.time().replace(tzinfo=None)
    if start < end:
        return _at(local.date(), end, tz, now) if start <= t < end else None
    if t >= start:
        return _at(local.date() + timedelta(days=1), end, tz, now)
    if t < end:
        return _at(local.date(), end, tz, now)
    return None


def outside_hours_until(opens: time, closes: time, zone: str, now: datetime) -> datetime | None:
    """If `now` is outside the allowed daily hours [opens, closes), when they next open; else None."""
    return quiet_until(closes, opens, zone, now)


def parse_time(value: str) -> time:
    hours, minutes = value.split(":")
    return time(int(hours), int(minutes))
