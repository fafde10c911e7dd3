"""scheduling/recurrence.py: anchored occurrences in local wall time, DST gaps and folds, no drift."""

from __future__ import annotations

import calendar as gregorian
from datetime import UTC, datetime, timedelta, tzinfo
from functools import cache
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clarion.scheduling import recurrence
from clarion.scheduling.calendars import WorkCalendar, calendar_for, is_working_day
from clarion.scheduling.recurrence import (
    FOLD_POLICY,
    GAP_POLICY,
    Every,
    due_at,
    first_due_after,
    local_occurrence,
    parse_every,
    to_utc,
)
from clarion.scheduling.zones import load_zone, zone_names

# Every IANA zone this machine knows. "localtime" is a copy of the host's own zone, not an IANA name.
ZONES = sorted(zone_names())
WEEKLY = Every(1, "weeks")
SCAN_START, SCAN_END = datetime(2020, 1, 1, tzinfo=UTC), datetime(2041, 1, 1, tzinfo=UTC)
PROPERTY = settings(max_examples=150, deadline=None)

anchors = st.datetimes(
    min_value=datetime(2020, 1, 1), max_value=datetime(2040, 12, 31, 23, 59)
).map(lambda d: d.replace(second=0, microsecond=0))
calendar_units = st.builds(Every, st.integers(1, 3), st.sampled_from(["days", "weeks", "months"]))


def _naive(instant: datetime, offset: timedelta) -> datetime:
    return (instant + offset).replace(tzinfo=None)


def offset(tz: tzinfo, at: datetime) -> timedelta:
    """tz's UTC offset at `at` (a zone always has one)."""
    found = tz.utcoffset(at)
    assert found is not None
    return found


@cache
def transitions(zone: str) -> tuple[tuple[datetime, timedelta, timedelta], ...]:
    """(UTC instant, offset before, offset after) of every UTC-offset change in 2020–2040.

    A 14-day scan, then bisection to the second. On the tzdata tested here it finds the same 8,544
    changes as a daily scan (no zone changes its offset twice within 14 days in those years)."""
    tz, found, step = load_zone(zone), [], timedelta(days=14)
    lo, before = SCAN_START, offset(tz, SCAN_START.astimezone(tz))
    while lo < SCAN_END:
        hi = lo + step
        after = offset(tz, hi.astimezone(tz))
        if after != before:
            a, b = lo, hi
            while b - a > timedelta(seconds=1):
                mid = a + (b - a) / 2
                a, b = (mid, b) if offset(tz, mid.astimezone(tz)) == before else (a, mid)
            found.append((b, before, after))
        lo, before = hi, after
    return tuple(found)


def assert_wall_time_policy(local: datetime, zone: str) -> None:
    """to_utc(local) is the first instant showing `local` on the wall clock; when no instant does
    (a spring gap), it is the wall time moved forward by exactly the gap."""
    tz, utc = load_zone(zone), to_utc(local, zone)
    assert utc.tzinfo is UTC
    seen = utc.astimezone(tz).replace(tzinfo=None)
    offsets = {offset(tz, local.replace(fold=0)), offset(tz, local.replace(fold=1))}
    candidates = [(local - off).replace(tzinfo=UTC) for off in offsets]
    instants = sorted(u for u in candidates if u.astimezone(tz).replace(tzinfo=None) == local)
    if instants:
        assert utc == instants[0], f"{local} in {zone}: not the first instant"
        assert seen == local
    else:
        gap = offset(tz, local.replace(fold=1)) - offset(tz, local.replace(fold=0))
        assert gap > timedelta(0), f"{local} in {zone} neither exists nor is in a gap"
        assert seen == local + gap, f"{local} in {zone}: gap of {gap} not applied"


# --- interval text --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "every"),
    [
        ("1d", Every(1, "days")),
        ("2w", Every(2, "weeks")),
        ("1mo", Every(1, "months")),
        ("3wd", Every(3, "working_days")),
        ("daily", Every(1, "days")),
        ("weekly", Every(1, "weeks")),
        ("monthly", Every(1, "months")),
        (" 12MO ", Every(12, "months")),
    ],
)
def test_parse_every(text: str, every: Every) -> None:
    assert parse_every(text) == every
    assert parse_every(str(every)) == every


@pytest.mark.parametrize(
    "text", ["", "1m", "0d", "-1w", "w", "2 weeks", "1.5d", "fortnightly", "1y"]
)
def test_parse_every_refuses_bad_text_with_a_clear_message(text: str) -> None:
    with pytest.raises(ValueError, match=r"interval|count"):
        parse_every(text)


def test_every_validates_itself() -> None:
    with pytest.raises(ValueError, match="unit"):
        Every(1, "hours")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1"):
        Every(0, "days")


def test_policies_are_named() -> None:
    assert (GAP_POLICY, FOLD_POLICY) == ("forward", "first")


# --- table: DST, months, working days ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("anchor", "due"),
    [
        # 2026-03-08 spring forward: EST (-5) then EDT (-4)
        (
            datetime(2026, 3, 2, 9),
            [datetime(2026, 3, 2, 14), datetime(2026, 3, 9, 13), datetime(2026, 3, 16, 13)],
        ),
        # 2026-11-01 fall back: EDT (-4) then EST (-5)
        (
            datetime(2026, 10, 26, 9),
            [datetime(2026, 10, 26, 13), datetime(2026, 11, 2, 14), datetime(2026, 11, 9, 14)],
        ),
    ],
    ids=["spring-forward", "fall-back"],
)
def test_new_york_weekly_nine_stays_nine_local(anchor: datetime, due: list[datetime]) -> None:
    ny = load_zone("America/New_York")
    for n, expected in enumerate(due):
        at = due_at(anchor, "America/New_York", WEEKLY, n)
        assert at == expected.replace(tzinfo=UTC)
        assert at.astimezone(ny).hour == 9


def test_berlin_gap_moves_forward_by_the_gap() -> None:
    at = to_utc(datetime(2026, 3, 29, 2, 30), "Europe/Berlin")
    assert at == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert at.astimezone(load_zone("Europe/Berlin")).replace(tzinfo=None) == datetime(
        2026, 3, 29, 3, 30
    )
    # the series is not moved: the week after is at 02:30 again
    anchor = datetime(2026, 3, 22, 2, 30)
    local = [
        due_at(anchor, "Europe/Berlin", WEEKLY, n).astimezone(load_zone("Europe/Berlin"))
        for n in range(3)
    ]
    assert [t.strftime("%m-%d %H:%M") for t in local] == [
        "03-22 02:30",
        "03-29 03:30",
        "04-05 02:30",
    ]


def test_new_york_fold_uses_the_first_instant() -> None:
    at = to_utc(datetime(2026, 11, 1, 1, 30), "America/New_York")
    assert at == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT, not 01:30 EST (06:30Z)
    assert at.astimezone(load_zone("America/New_York")).tzname() == "EDT"


def test_fold_attribute_on_the_input_does_not_matter() -> None:
    local = datetime(2026, 11, 1, 1, 30, fold=1)
    assert to_utc(local, "America/New_York") == datetime(2026, 11, 1, 5, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("anchor", "every", "expected"),
    [
        (
            datetime(2026, 1, 31, 9),
            Every(1, "months"),
            ["01-31", "02-28", "03-31", "04-30", "05-31"],
        ),
        (
            datetime(2024, 1, 31, 9),
            Every(1, "months"),
            ["01-31", "02-29", "03-31", "04-30", "05-31"],
        ),
        (
            datetime(2026, 1, 31, 9),
            Every(2, "months"),
            ["01-31", "03-31", "05-31", "07-31", "09-30"],
        ),
        (
            datetime(2026, 11, 30, 9),
            Every(1, "months"),
            ["11-30", "12-30", "01-30", "02-28", "03-30"],
        ),
    ],
    ids=["jan-31", "jan-31-leap", "jan-31-every-2", "nov-30-over-new-year"],
)
def test_monthly_keeps_the_day_clamped_and_counts_from_the_anchor(
    anchor: datetime, every: Every, expected: list[str]
) -> None:
    got = [local_occurrence(anchor, every, n) for n in range(5)]
    assert [d.strftime("%m-%d") for d in got] == expected
    assert all(d.time() == anchor.time() for d in got)


def test_working_days_skip_the_weekend_and_start_at_the_anchor() -> None:
    il = calendar_for(workweek=None, country=None, subdivision=None, zone="Asia/Jerusalem")
    friday = datetime(2026, 1, 9, 9)  # not a working day in Israel, still occurrence 0
    got = [local_occurrence(friday, Every(1, "working_days"), n, il) for n in range(4)]
    assert [d.strftime("%a %m-%d %H:%M") for d in got] == [
        "Fri 01-09 09:00",
        "Sun 01-11 09:00",
        "Mon 01-12 09:00",
        "Tue 01-13 09:00",
    ]
    every_2 = [
        local_occurrence(friday, Every(2, "working_days"), n, il).strftime("%a") for n in range(4)
    ]
    assert every_2 == ["Fri", "Mon", "Wed", "Sun"]


def test_working_days_need_a_calendar() -> None:
    with pytest.raises(ValueError, match="calendar"):
        local_occurrence(datetime(2026, 1, 5, 9), Every(1, "working_days"), 3)


@pytest.mark.parametrize(
    "call",
    [
        lambda: local_occurrence(datetime(2026, 1, 5, 9, tzinfo=UTC), WEEKLY, 1),
        lambda: local_occurrence(datetime(2026, 1, 5, 9), WEEKLY, -1),
        lambda: to_utc(datetime(2026, 1, 5, 9), "Mars/Olympus_Mons"),
        lambda: first_due_after(datetime(2026, 1, 5, 9), "UTC", WEEKLY, datetime(2026, 2, 1)),
    ],
    ids=["aware-anchor", "negative-n", "unknown-zone", "naive-after"],
)
def test_bad_arguments_raise_value_error(call, request: pytest.FixtureRequest) -> None:
    refusal = {
        "aware-anchor": "anchor_local must be a naive local wall time",
        "negative-n": "occurrence numbers start at 0, not -1",
        "unknown-zone": "not an IANA time zone: 'Mars/Olympus_Mons'",
        "naive-after": "after must be a timezone-aware datetime",
    }[request.node.callspec.id]
    with pytest.raises(ValueError, match=refusal):
        call()


def test_first_due_after_an_old_series_is_arithmetic_not_a_scan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, ...]] = []
    real = recurrence.due_at

    def counted(*a: Any) -> datetime:
        calls.append(a)
        return real(*a)

    monkeypatch.setattr(recurrence, "due_at", counted)
    anchor, after = datetime(2000, 1, 3, 9), datetime(2040, 6, 1, 12, tzinfo=UTC)
    n = first_due_after(anchor, "Europe/Berlin", Every(1, "days"), after)
    assert (
        real(anchor, "Europe/Berlin", Every(1, "days"), n - 1)
        <= after
        < real(anchor, "Europe/Berlin", Every(1, "days"), n)
    )
    assert n > 14_000 and len(calls) <= 4
    calls.clear()
    il = calendar_for(workweek=None, country=None, subdivision=None, zone="Asia/Jerusalem")
    n = first_due_after(anchor, "Asia/Jerusalem", Every(1, "working_days"), after, il)
    assert n > 9_000 and len(calls) <= 4


def test_first_due_after_is_zero_before_the_anchor_and_strict_at_a_due_time() -> None:
    anchor = datetime(2026, 3, 2, 9)
    first = due_at(anchor, "America/New_York", WEEKLY, 0)
    assert first_due_after(anchor, "America/New_York", WEEKLY, first - timedelta(days=400)) == 0
    assert (
        first_due_after(anchor, "America/New_York", WEEKLY, first - timedelta(microseconds=1)) == 0
    )
    assert first_due_after(anchor, "America/New_York", WEEKLY, first) == 1
    assert (
        first_due_after(
            anchor, "America/New_York", WEEKLY, first.astimezone(load_zone("Asia/Tokyo"))
        )
        == 1
    )


# --- every zone, every transition 2020–2040 ---------------------------------------------------------


def test_every_zone_every_transition_keeps_the_weekly_wall_time() -> None:
    """Deterministic sweep: for each offset change in 2020–2040 in every zone, wall times just before,
    at, inside and just after the gap or fold are reached as a weekly occurrence k weeks after its
    anchor (k cycling through 0..520) and follow the gap/fold policy."""
    checked = 0
    for zone in ZONES:
        for i, (instant, before, after) in enumerate(transitions(zone)):
            lo = _naive(instant, min(before, after))
            hi = _naive(instant, max(before, after))
            for j, wall in enumerate(
                (lo - timedelta(minutes=1), lo, lo + (hi - lo) / 2, hi - timedelta(minutes=1), hi)
            ):
                k = (i * 5 + j) % 521
                anchor = wall - timedelta(weeks=k)
                assert local_occurrence(anchor, WEEKLY, k) == wall
                assert_wall_time_policy(wall, zone)
                if k:
                    assert due_at(anchor, zone, WEEKLY, k - 1) < due_at(anchor, zone, WEEKLY, k)
                checked += 1
    assert checked > 40_000  # ~8,500 transitions × 5 wall times


@st.composite
def near_a_transition(draw: st.DrawFn) -> tuple[str, datetime, int]:
    """A zone, and a weekly anchor whose occurrence k falls in or next to one of its transitions."""
    zone = draw(st.sampled_from([z for z in ZONES if transitions(z)]))
    instant, before, after = draw(st.sampled_from(transitions(zone)))
    lo = _naive(instant, min(before, after))
    width = abs(after - before) // timedelta(minutes=1)
    wall = lo + timedelta(minutes=draw(st.integers(-5, width + 5)))
    k = draw(st.integers(0, min(520, (wall - datetime(2020, 1, 1)).days // 7)))
    return zone, wall - timedelta(weeks=k), k


@PROPERTY
@given(near_a_transition())
def test_weekly_occurrence_at_a_transition_follows_the_policy(
    case: tuple[str, datetime, int],
) -> None:
    zone, anchor, k = case
    local = local_occurrence(anchor, WEEKLY, k)
    assert local.time() == anchor.time() and (local - anchor).days == 7 * k
    assert_wall_time_policy(local, zone)


@PROPERTY
@given(st.sampled_from(ZONES), anchors)
def test_520_weekly_occurrences_never_drift(zone: str, anchor: datetime) -> None:
    locals_ = [local_occurrence(anchor, WEEKLY, n) for n in range(521)]
    assert locals_[520] - anchor == timedelta(days=520 * 7)
    assert all(b - a == timedelta(days=7) for a, b in zip(locals_, locals_[1:], strict=False))
    assert all(local.time() == anchor.time() for local in locals_)
    dues = [due_at(anchor, zone, WEEKLY, n) for n in range(521)]
    assert all(a < b for a, b in zip(dues, dues[1:], strict=False))
    for local in locals_[::13] + [locals_[520]]:
        assert_wall_time_policy(local, zone)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ZONES), anchors, st.integers(0, 520))
def test_any_weekly_occurrence_keeps_the_wall_time(zone: str, anchor: datetime, n: int) -> None:
    local = local_occurrence(anchor, WEEKLY, n)
    assert local == anchor + timedelta(weeks=n)
    assert_wall_time_policy(local, zone)


@PROPERTY
@given(st.sampled_from(ZONES), anchors, calendar_units, st.integers(0, 600))
def test_due_at_is_strictly_increasing(zone: str, anchor: datetime, every: Every, n: int) -> None:
    assert due_at(anchor, zone, every, n) < due_at(anchor, zone, every, n + 1)


@PROPERTY
@given(anchors, st.integers(1, 12), st.integers(0, 240))
def test_months_keep_the_day_clamped_and_count_from_the_anchor(
    anchor: datetime, count: int, n: int
) -> None:
    got = local_occurrence(anchor, Every(count, "months"), n)
    months = (got.year - anchor.year) * 12 + got.month - anchor.month
    assert months == count * n
    assert got.day == min(anchor.day, gregorian.monthrange(got.year, got.month)[1])
    assert got.time() == anchor.time()


CALENDAR_ZONES = ["Asia/Jerusalem", "America/New_York", "Asia/Dubai", "Europe/Berlin", "UTC"]


def _calendar(zone: str) -> WorkCalendar:
    return calendar_for(workweek=None, country=None, subdivision=None, zone=zone)


@PROPERTY
@given(
    st.sampled_from(ZONES),
    anchors,
    st.one_of(calendar_units, st.builds(Every, st.integers(1, 3), st.just("working_days"))),
    st.sampled_from(CALENDAR_ZONES),
    st.integers(-40, 400),
    st.integers(0, 86_399),
    st.booleans(),
)
def test_first_due_after_agrees_with_a_scan(
    zone: str,
    anchor: datetime,
    every: Every,
    calendar_zone: str,
    days: int,
    seconds: int,
    exactly_at_one: bool,
) -> None:
    cal = _calendar(calendar_zone) if every.unit == "working_days" else None
    after = to_utc(anchor, zone) + timedelta(days=days, seconds=seconds)
    if exactly_at_one:
        after = due_at(anchor, zone, every, max(0, days // 2), cal)
    expected = next(n for n in range(2_000) if due_at(anchor, zone, every, n, cal) > after)
    assert first_due_after(anchor, zone, every, after, cal) == expected


@PROPERTY
@given(st.sampled_from(CALENDAR_ZONES), anchors, st.integers(1, 3), st.integers(0, 300))
def test_working_day_occurrences_increase_and_land_on_working_days(
    zone: str, anchor: datetime, count: int, n: int
) -> None:
    cal, every = _calendar(zone), Every(count, "working_days")
    nxt = local_occurrence(anchor, every, n + 1, cal)
    assert is_working_day(cal, nxt.date()) and nxt.time() == anchor.time()
    assert due_at(anchor, zone, every, n, cal) < due_at(anchor, zone, every, n + 1, cal)
