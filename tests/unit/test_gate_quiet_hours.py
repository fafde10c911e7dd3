"""gates/quiet.py: quiet hours and allowed hours in the recipient's own zone, across DST days.

`until` is the window end in local wall time (a spring-gap end moves forward by the gap, as
`gates.quiet._at` documents) and is always strictly after `now`.
"""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from clarion.gates.quiet import outside_hours_until, parse_time, quiet_until

LA, NY, BERLIN = "America/Los_Angeles", "America/New_York", "Europe/Berlin"
TOKYO, AUCKLAND, KOLKATA = "Asia/Tokyo", "Pacific/Auckland", "Asia/Kolkata"


def at(zone: str, wall: str, fold: int = 0) -> datetime:
    """A wall time in `zone` (fold=1: the second occurrence of an ambiguous time)."""
    return datetime.fromisoformat(wall).replace(tzinfo=ZoneInfo(zone), fold=fold)


def utc(wall: str) -> datetime:
    return datetime.fromisoformat(wall).replace(tzinfo=UTC)


def hm(value: str) -> time:
    hours, minutes = value.split(":")
    return time(int(hours), int(minutes))


def check(
    start: str | None, end: str | None, zone: str, now: datetime, expected: str | None
) -> None:
    until = quiet_until(start and hm(start), end and hm(end), zone, now)  # type: ignore[arg-type]
    if expected is None:
        assert until is None
        return
    assert until is not None
    assert until.astimezone(ZoneInfo(zone)).isoformat() == expected
    assert until > now


# --- windows, boundaries and zones -----------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "zone", "now", "expected"),
    [
        # inside one day, 13:00-15:00
        pytest.param(
            "13:00",
            "15:00",
            "UTC",
            at("UTC", "2026-06-15 14:00"),
            "2026-06-15T15:00:00+00:00",
            id="day-inside",
        ),
        pytest.param(
            "13:00",
            "15:00",
            "UTC",
            at("UTC", "2026-06-15 13:00"),
            "2026-06-15T15:00:00+00:00",
            id="day-exactly-at-start-is-quiet",
        ),
        pytest.param(
            "13:00",
            "15:00",
            "UTC",
            at("UTC", "2026-06-15 14:59:59"),
            "2026-06-15T15:00:00+00:00",
            id="day-last-second",
        ),
        pytest.param(
            "13:00",
            "15:00",
            "UTC",
            at("UTC", "2026-06-15 15:00"),
            None,
            id="day-exactly-at-end-is-not",
        ),
        pytest.param(
            "13:00", "15:00", "UTC", at("UTC", "2026-06-15 12:59"), None, id="day-just-before"
        ),
        pytest.param(
            "13:00", "15:00", "UTC", at("UTC", "2026-06-15 23:00"), None, id="day-late-evening"
        ),
        pytest.param(
            "13:00", "15:00", "UTC", at("UTC", "2026-06-15 02:00"), None, id="day-early-morning"
        ),
        # crossing midnight, 22:00-07:00
        pytest.param(
            "22:00",
            "07:00",
            "UTC",
            at("UTC", "2026-06-15 22:00"),
            "2026-06-16T07:00:00+00:00",
            id="night-exactly-at-start-ends-tomorrow",
        ),
        pytest.param(
            "22:00",
            "07:00",
            "UTC",
            at("UTC", "2026-06-15 23:30"),
            "2026-06-16T07:00:00+00:00",
            id="night-before-midnight",
        ),
        pytest.param(
            "22:00",
            "07:00",
            "UTC",
            at("UTC", "2026-06-16 00:00"),
            "2026-06-16T07:00:00+00:00",
            id="night-at-midnight",
        ),
        pytest.param(
            "22:00",
            "07:00",
            "UTC",
            at("UTC", "2026-06-16 06:59"),
            "2026-06-16T07:00:00+00:00",
            id="night-last-minute",
        ),
        pytest.param(
            "22:00",
            "07:00",
            "UTC",
            at("UTC", "2026-06-16 07:00"),
            None,
            id="night-exactly-at-end-is-not",
        ),
        pytest.param(
            "22:00", "07:00", "UTC", at("UTC", "2026-06-15 21:59"), None, id="night-just-before"
        ),
        pytest.param(
            "22:00", "07:00", "UTC", at("UTC", "2026-06-15 12:00"), None, id="night-at-noon"
        ),
        # no window
        pytest.param(
            "22:00",
            "22:00",
            "UTC",
            at("UTC", "2026-06-15 22:00"),
            None,
            id="start-equals-end-at-start",
        ),
        pytest.param(
            "00:00",
            "00:00",
            "UTC",
            at("UTC", "2026-06-15 03:00"),
            None,
            id="start-equals-end-midnight",
        ),
        pytest.param(None, "07:00", "UTC", at("UTC", "2026-06-15 03:00"), None, id="no-start"),
        pytest.param("22:00", None, "UTC", at("UTC", "2026-06-15 23:00"), None, id="no-end"),
        pytest.param(None, None, "UTC", at("UTC", "2026-06-15 23:00"), None, id="no-window"),
        # zones west and east of UTC (local wall time in, local wall time out)
        pytest.param(
            "22:00",
            "07:00",
            LA,
            at(LA, "2026-06-14 23:00"),
            "2026-06-15T07:00:00-07:00",
            id="los-angeles-night",
        ),
        pytest.param(
            "22:00",
            "07:00",
            TOKYO,
            at(TOKYO, "2026-06-15 06:30"),
            "2026-06-15T07:00:00+09:00",
            id="tokyo-morning",
        ),
        pytest.param(
            "22:00",
            "07:00",
            AUCKLAND,
            at(AUCKLAND, "2026-06-15 22:00"),
            "2026-06-16T07:00:00+12:00",
            id="auckland-at-start",
        ),
        pytest.param(
            "13:00",
            "15:00",
            KOLKATA,
            utc("2026-06-15 08:00"),
            "2026-06-15T15:00:00+05:30",
            id="kolkata-day-window",
        ),
        # the half-hour offset: 22:00 IST is 16:30 UTC, 07:00 IST is 01:30 UTC
        pytest.param(
            "22:00",
            "07:00",
            KOLKATA,
            utc("2026-06-15 16:30"),
            "2026-06-16T07:00:00+05:30",
            id="kolkata-at-start",
        ),
        pytest.param(
            "22:00",
            "07:00",
            KOLKATA,
            utc("2026-06-15 16:29"),
            None,
            id="kolkata-minute-before-start",
        ),
        pytest.param(
            "22:00",
            "07:00",
            KOLKATA,
            utc("2026-06-16 01:29"),
            "2026-06-16T07:00:00+05:30",
            id="kolkata-minute-before-end",
        ),
        pytest.param("22:00", "07:00", KOLKATA, utc("2026-06-16 01:30"), None, id="kolkata-at-end"),
    ],
)
def test_quiet_until(
    start: str | None, end: str | None, zone: str, now: datetime, expected: str | None
) -> None:
    check(start, end, zone, now, expected)


# One UTC instant, many zones: each recipient's own clock decides.
@pytest.mark.parametrize(
    ("now", "zone", "expected"),
    [
        pytest.param(
            utc("2026-06-15 12:00"), LA, "2026-06-15T07:00:00-07:00", id="12z-los-angeles-05h"
        ),
        pytest.param(utc("2026-06-15 12:00"), NY, None, id="12z-new-york-08h"),
        pytest.param(utc("2026-06-15 12:00"), BERLIN, None, id="12z-berlin-14h"),
        pytest.param(utc("2026-06-15 12:00"), TOKYO, None, id="12z-tokyo-21h"),
        pytest.param(utc("2026-06-15 12:00"), KOLKATA, None, id="12z-kolkata-17h30"),
        pytest.param(
            utc("2026-06-15 12:00"),
            AUCKLAND,
            "2026-06-16T07:00:00+12:00",
            id="12z-auckland-00h-next-day",
        ),
        pytest.param(utc("2026-06-15 17:00"), LA, None, id="17z-los-angeles-10h"),
        pytest.param(
            utc("2026-06-15 17:00"), TOKYO, "2026-06-16T07:00:00+09:00", id="17z-tokyo-02h"
        ),
        pytest.param(
            utc("2026-06-15 17:00"), KOLKATA, "2026-06-16T07:00:00+05:30", id="17z-kolkata-22h30"
        ),
        pytest.param(
            utc("2026-06-15 17:00"), AUCKLAND, "2026-06-16T07:00:00+12:00", id="17z-auckland-05h"
        ),
        pytest.param(utc("2026-06-15 17:00"), "UTC", None, id="17z-utc"),
    ],
)
def test_quiet_until_uses_the_recipients_zone(
    now: datetime, zone: str, expected: str | None
) -> None:
    check("22:00", "07:00", zone, now, expected)


# --- DST days --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "end", "zone", "now", "expected"),
    [
        # New York, 2026-03-08: 02:00 EST -> 03:00 EDT
        pytest.param(
            "22:00",
            "07:00",
            NY,
            at(NY, "2026-03-07 23:00"),
            "2026-03-08T07:00:00-04:00",
            id="ny-spring-from-evening",
        ),
        pytest.param(
            "22:00",
            "07:00",
            NY,
            at(NY, "2026-03-08 01:30"),
            "2026-03-08T07:00:00-04:00",
            id="ny-spring-before-gap",
        ),
        pytest.param(
            "22:00",
            "07:00",
            NY,
            at(NY, "2026-03-08 03:00"),
            "2026-03-08T07:00:00-04:00",
            id="ny-spring-after-gap",
        ),
        pytest.param(
            "00:00",
            "02:30",
            NY,
            at(NY, "2026-03-08 01:45"),
            "2026-03-08T03:30:00-04:00",
            id="ny-spring-end-in-gap-moves-forward",
        ),
        pytest.param(
            "01:00",
            "02:00",
            NY,
            at(NY, "2026-03-08 01:59"),
            "2026-03-08T03:00:00-04:00",
            id="ny-spring-end-at-gap-start",
        ),
        pytest.param(
            "02:30",
            "06:00",
            NY,
            at(NY, "2026-03-08 03:00"),
            "2026-03-08T06:00:00-04:00",
            id="ny-spring-start-in-gap",
        ),
        pytest.param(
            "13:00",
            "15:00",
            NY,
            at(NY, "2026-03-08 14:00"),
            "2026-03-08T15:00:00-04:00",
            id="ny-spring-day-window",
        ),
        # New York, 2026-11-01: 02:00 EDT -> 01:00 EST (01:00-02:00 happens twice)
        pytest.param(
            "22:00",
            "07:00",
            NY,
            at(NY, "2026-10-31 23:00"),
            "2026-11-01T07:00:00-05:00",
            id="ny-autumn-from-evening",
        ),
        pytest.param(
            "22:00",
            "07:00",
            NY,
            at(NY, "2026-11-01 01:30", fold=0),
            "2026-11-01T07:00:00-05:00",
            id="ny-autumn-first-1h30",
        ),
        pytest.param(
            "22:00",
            "07:00",
            NY,
            at(NY, "2026-11-01 01:30", fold=1),
            "2026-11-01T07:00:00-05:00",
            id="ny-autumn-second-1h30",
        ),
        pytest.param(
            "00:00",
            "01:30",
            NY,
            at(NY, "2026-11-01 01:10", fold=0),
            "2026-11-01T01:30:00-04:00",
            id="ny-autumn-end-in-fold-first-pass",
        ),
        pytest.param(
            "00:00",
            "01:30",
            NY,
            at(NY, "2026-11-01 01:10", fold=1),
            "2026-11-01T01:30:00-05:00",
            id="ny-autumn-end-in-fold-second-pass",
        ),
        pytest.param(
            "00:00",
            "01:30",
            NY,
            at(NY, "2026-11-01 01:40", fold=1),
            None,
            id="ny-autumn-after-end-second-pass",
        ),
        # Berlin, 2026-03-29: 02:00 CET -> 03:00 CEST
        pytest.param(
            "22:00",
            "07:00",
            BERLIN,
            at(BERLIN, "2026-03-28 23:30"),
            "2026-03-29T07:00:00+02:00",
            id="berlin-spring-from-evening",
        ),
        pytest.param(
            "22:00",
            "07:00",
            BERLIN,
            at(BERLIN, "2026-03-29 01:00"),
            "2026-03-29T07:00:00+02:00",
            id="berlin-spring-before-gap",
        ),
        pytest.param(
            "00:00",
            "02:30",
            BERLIN,
            at(BERLIN, "2026-03-29 01:30"),
            "2026-03-29T03:30:00+02:00",
            id="berlin-spring-end-in-gap-moves-forward",
        ),
        # Berlin, 2026-10-25: 03:00 CEST -> 02:00 CET (02:00-03:00 happens twice)
        pytest.param(
            "22:00",
            "07:00",
            BERLIN,
            at(BERLIN, "2026-10-25 01:00"),
            "2026-10-25T07:00:00+01:00",
            id="berlin-autumn-before-fold",
        ),
        pytest.param(
            "22:00",
            "07:00",
            BERLIN,
            at(BERLIN, "2026-10-25 02:30", fold=1),
            "2026-10-25T07:00:00+01:00",
            id="berlin-autumn-in-second-pass",
        ),
        pytest.param(
            "00:00",
            "02:30",
            BERLIN,
            at(BERLIN, "2026-10-25 02:15", fold=0),
            "2026-10-25T02:30:00+02:00",
            id="berlin-autumn-end-in-fold-first-pass",
        ),
        pytest.param(
            "00:00",
            "02:30",
            BERLIN,
            at(BERLIN, "2026-10-25 02:15", fold=1),
            "2026-10-25T02:30:00+01:00",
            id="berlin-autumn-end-in-fold-second-pass",
        ),
    ],
)
def test_quiet_until_on_dst_days(
    start: str, end: str, zone: str, now: datetime, expected: str | None
) -> None:
    check(start, end, zone, now, expected)


def _wall_exists(day: datetime, wall: time, tz: ZoneInfo) -> bool:
    candidate = datetime.combine(day.date(), wall, tzinfo=tz)
    return candidate.astimezone(UTC).astimezone(tz).time() == wall


@pytest.mark.parametrize(
    ("zone", "day", "start", "end"),
    [
        pytest.param(NY, "2026-03-08", "22:00", "07:00", id="ny-spring-night"),
        pytest.param(NY, "2026-03-08", "00:00", "02:30", id="ny-spring-end-in-gap"),
        pytest.param(NY, "2026-03-08", "02:30", "06:00", id="ny-spring-start-in-gap"),
        pytest.param(NY, "2026-11-01", "22:00", "07:00", id="ny-autumn-night"),
        pytest.param(NY, "2026-11-01", "01:30", "05:00", id="ny-autumn-start-in-fold"),
        pytest.param(NY, "2026-11-01", "00:00", "01:30", id="ny-autumn-end-in-fold"),
        pytest.param(BERLIN, "2026-03-29", "22:00", "07:00", id="berlin-spring-night"),
        pytest.param(BERLIN, "2026-03-29", "00:00", "02:30", id="berlin-spring-end-in-gap"),
        pytest.param(BERLIN, "2026-10-25", "22:00", "07:00", id="berlin-autumn-night"),
        pytest.param(BERLIN, "2026-10-25", "23:00", "02:30", id="berlin-autumn-end-in-fold"),
    ],
)
def test_every_five_minutes_of_a_dst_weekend(zone: str, day: str, start: str, end: str) -> None:
    """Over 48 hours around the change: quiet exactly when the local wall clock is in the
    window, and then `until` is the window end (local wall time, or moved past a spring gap),
    strictly after `now` and less than a day away."""
    tz, s, e = ZoneInfo(zone), hm(start), hm(end)
    now = at(zone, f"{day} 00:00").astimezone(UTC) - timedelta(days=1)
    for _ in range(48 * 12):
        now += timedelta(minutes=5)
        t = now.astimezone(tz).time()
        inside = (s <= t < e) if s < e else (t >= s or t < e)
        until = quiet_until(s, e, zone, now)
        assert (until is not None) == inside, now
        if until is not None:
            assert until > now, f"{now.astimezone(tz)} -> {until}"
            assert until - now <= timedelta(hours=24), now
            wall = until.astimezone(tz).time()
            assert wall == e or (not _wall_exists(until, e, tz) and wall > e), now


# --- allowed hours (marketing SMS 08:00-21:00) ----------------------------------------------


@pytest.mark.parametrize(
    ("zone", "now", "expected"),
    [
        pytest.param(
            LA, at(LA, "2026-06-15 07:59"), "2026-06-15T08:00:00-07:00", id="before-opening"
        ),
        pytest.param(LA, at(LA, "2026-06-15 08:00"), None, id="exactly-at-opening"),
        pytest.param(LA, at(LA, "2026-06-15 12:00"), None, id="midday"),
        pytest.param(LA, at(LA, "2026-06-15 20:59"), None, id="last-minute"),
        pytest.param(
            LA, at(LA, "2026-06-15 21:00"), "2026-06-16T08:00:00-07:00", id="exactly-at-closing"
        ),
        pytest.param(LA, at(LA, "2026-06-15 23:30"), "2026-06-16T08:00:00-07:00", id="late-night"),
        pytest.param(LA, at(LA, "2026-06-16 00:00"), "2026-06-16T08:00:00-07:00", id="midnight"),
        pytest.param(
            NY, at(NY, "2026-03-08 01:30"), "2026-03-08T08:00:00-04:00", id="ny-spring-night"
        ),
        pytest.param(
            KOLKATA, utc("2026-06-15 15:30"), "2026-06-16T08:00:00+05:30", id="kolkata-21h00-local"
        ),
        pytest.param(KOLKATA, utc("2026-06-15 15:29"), None, id="kolkata-20h59-local"),
        pytest.param(
            TOKYO, utc("2026-06-15 12:00"), "2026-06-16T08:00:00+09:00", id="tokyo-21h00-local"
        ),
    ],
)
def test_outside_hours_until_marketing_sms(zone: str, now: datetime, expected: str | None) -> None:
    until = outside_hours_until(time(8, 0), time(21, 0), zone, now)
    if expected is None:
        assert until is None
    else:
        assert until is not None
        assert until.astimezone(ZoneInfo(zone)).isoformat() == expected
        assert until > now


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("08:00", time(8, 0), id="morning"),
        pytest.param("21:00", time(21, 0), id="evening"),
        pytest.param("7:05", time(7, 5), id="one-digit-hour"),
        pytest.param("00:00", time(0, 0), id="midnight"),
        pytest.param("23:59", time(23, 59), id="last-minute"),
    ],
)
def test_parse_time(text: str, expected: time) -> None:
    assert parse_time(text) == expected


@pytest.mark.parametrize(
    ("text", "refusal"),
    [
        ("24:00", "hour must be in 0..23"),
        ("08:60", "minute must be in 0..59"),
        ("0800", "not enough values to unpack"),
        ("8", "not enough values to unpack"),
        ("08:00:00", "too many values to unpack"),
        ("ab:cd", "invalid literal for int"),
        ("", "not enough values to unpack"),
    ],
    ids=["hour-24", "minute-60", "no-colon", "hour-only", "seconds", "letters", "empty"],
)
def test_parse_time_rejects_malformed(text: str, refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        parse_time(text)
