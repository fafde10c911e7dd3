"""When a digest window closes: a fixed time after its first item, or the next local wall time."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

from clarion.scheduling.zones import load_zone


def window_due(
    opened_at: datetime, zone: str, *, every: timedelta | None, daily: time | None
) -> datetime:
    """The close of a window opened at `opened_at`: `opened_at + every`, or the first `daily` wall
    time in `zone` strictly after it (a wall time a DST change skips is read in the offset before
    the change, so it lands an hour later, never twice)."""
    if every is not None:
        return opened_at + every
    if daily is None:
        raise ValueError("a digest window needs `every` or `daily`")
    local = opened_at.astimezone(load_zone(zone))
    for days in range(3):
        wall = datetime.combine(local.date() + timedelta(days=days), daily, tzinfo=local.tzinfo)
        due = wall.astimezone(UTC)
        if due > opened_at:
            return due
    raise AssertionError("unreachable: a day later is always after")
