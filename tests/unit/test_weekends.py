"""scheduling/weekends.py: every country's weekend from two sources, and the table that decides.

The first two tests run over every country the holidays package supports (which includes every
country of a tzdata zone). They fail when holidays and CLDR start to disagree somewhere the
override table does not decide (a new release of either), and when an override is no longer
needed or no longer matches the source it says it follows.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest

from clarion.scheduling.calendars import calendar_for, is_working_day, non_working_reason
from clarion.scheduling.recurrence import Every, local_occurrence
from clarion.scheduling.series import preview
from clarion.scheduling.weekends import (
    OVERRIDES,
    SAT,
    SUN,
    cldr_weekend,
    countries,
    disagreements,
    holidays_weekend,
)
from clarion.scheduling.zones import country_of_zone, load_zone, zone_names


def test_every_country_is_checked_including_every_zones_country() -> None:
    checked = set(countries())
    assert len(checked) > 240
    assert {country_of_zone(z) for z in zone_names()} - {None} <= checked


def test_every_disagreement_between_holidays_and_cldr_is_decided_by_the_table() -> None:
    undecided = [
        f"{d.country}: holidays {sorted(d.holidays)} vs CLDR {sorted(d.cldr)}"
        for d in disagreements()
        if d.country not in OVERRIDES
    ]
    assert undecided == [], "add a cited entry to scheduling/weekends.py OVERRIDES for each"


@pytest.mark.parametrize("code", sorted(OVERRIDES))
def test_each_override_follows_what_it_says_and_is_still_needed(code: str) -> None:
    entry = OVERRIDES[code]
    h, c = holidays_weekend(code), cldr_weekend(code)
    assert not (h == c == entry.current), f"{code}: both sources now agree with the table: drop it"
    expected = {"holidays": entry.current == h, "CLDR": entry.current == c}
    expected["neither"] = entry.current not in (h, c)
    assert expected[entry.follows], (
        f"{code}: says it follows {entry.follows}: holidays {h}, CLDR {c}"
    )
    assert len(entry.source) > 40  # a citation, not a word
    sinces = [r.since for r in entry.rules]
    assert sinces[0] is None and all(a < b for a, b in zip(sinces[1:], sinces[2:], strict=False))  # type: ignore[operator]


def test_the_two_sources_really_disagree_somewhere() -> None:
    """A guard on the guard: with CLDR read wrongly (say, always the world default) the table
    would look unnecessary and the tests above would pass for the wrong reason."""
    assert cldr_weekend("IL") == frozenset({4, 5}) and cldr_weekend("IR") == frozenset({4})
    assert {d.country for d in disagreements()} >= {"BD", "IN", "LY", "MR", "VE"}


# --- Nepal -------------------------------------------------------------------------------------------

KATHMANDU = calendar_for(workweek=None, country=None, subdivision=None, zone="Asia/Kathmandu")


@pytest.mark.parametrize(
    ("day", "reason"),
    [
        (date(2022, 5, 8), None),  # a Sunday before the trial: working
        (date(2022, 5, 14), "weekend (NP: Sat)"),
        (date(2022, 5, 15), "weekend (NP: Sat–Sun)"),  # the trial's first Sunday
        (date(2022, 6, 12), "weekend (NP: Sat–Sun)"),  # its last
        (date(2022, 6, 19), None),  # Sunday after the cabinet revoked it (from 15 June)
        (date(2026, 3, 15), None),  # a Sunday today
        (date(2026, 3, 7), "weekend (NP: Sat)"),
    ],
)
def test_nepal_is_saturday_only_but_for_one_month_in_2022(day: date, reason: str | None) -> None:
    assert KATHMANDU.country == "NP"
    assert non_working_reason(KATHMANDU, day) == reason


def test_a_year_of_daily_working_day_occurrences_in_kathmandu_works_on_sundays() -> None:
    anchor = datetime(2026, 1, 1, 9, 0)
    year = []
    n = 0
    while (at := local_occurrence(anchor, Every(1, "working_days"), n, KATHMANDU)).year == 2026:
        year.append(at.date())
        n += 1
    days = [date(2026, 1, 1) + timedelta(days=i) for i in range(365)]
    expected = [d for d in days if d.weekday() != SAT and is_working_day(KATHMANDU, d)]
    sundays = [d for d in year if d.weekday() == SUN]
    assert year == expected
    assert not any(d.weekday() == SAT for d in year)
    assert len(sundays) >= 45  # 52 Sundays less the public holidays that fall on one
    # holidays 0.109 alone would have taken every Sunday off: about 50 wrong dates here, 259
    # shifted ones in a daily next_working_day series
    assert sum(1 for d in days if d.weekday() == SUN and is_working_day(KATHMANDU, d)) == len(
        sundays
    )


def test_a_daily_next_working_day_series_in_kathmandu_sends_on_sundays() -> None:
    row = {
        "anchor_local": datetime(2026, 1, 4, 9, 0),  # a Sunday
        "zone": "Asia/Kathmandu",
        "every": "1d",
        "calendar_policy": "next_working_day",
        "next_n": 0,
    }
    start = datetime(2026, 1, 1, tzinfo=load_zone("Asia/Kathmandu"))
    got = preview(row, KATHMANDU, start=start, end=start.replace(year=2027), limit=400)
    by_weekday = {
        wd: {occ.action for _, _, local, occ in got if local.weekday() == wd} for wd in (SAT, SUN)
    }
    sunday_actions = [occ.action for _, _, local, occ in got if local.weekday() == SUN]
    assert sunday_actions.count("send") >= 45 and "moved" not in sunday_actions
    assert by_weekday[SAT] == {"merged"}  # Saturday lands on Sunday, which has its own


# --- other decided countries, one date each ------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "day", "working"),
    [
        ("Africa/Nouakchott", date(2014, 9, 26), False),  # Friday, before the 2014 switch
        ("Africa/Nouakchott", date(2014, 10, 3), True),  # Friday after it
        ("Africa/Nouakchott", date(2026, 3, 8), False),  # Sunday
        ("Africa/Tripoli", date(2026, 3, 8), True),  # Sunday: Libya rests Friday–Saturday
        ("Asia/Hong_Kong", date(2026, 3, 7), False),  # Saturday (five-day week since 2006)
        ("Asia/Kolkata", date(2026, 3, 7), False),  # Saturday, as the holidays package says
        ("America/Caracas", date(2026, 3, 7), False),  # Saturday: CLDR's office week
    ],
)
def test_the_table_decides_for_the_date(zone: str, day: date, working: bool) -> None:
    cal = calendar_for(workweek=None, country=None, subdivision=None, zone=zone)
    assert is_working_day(cal, day) is working
