"""scheduling/calendars.py: the recipient's workweek and holidays — never one country for everybody."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clarion.scheduling.calendars import (
    MON_FRI,
    Policy,
    WorkCalendar,
    _holidays,
    add_working_days,
    adjust,
    calendar_for,
    is_working_day,
    non_working_reason,
    working_days_between,
)
from clarion.scheduling.recurrence import Every, local_occurrence
from clarion.scheduling.zones import country_of_zone, zone_names


def recipient(zone: str, *, workweek=None, country=None, subdivision=None) -> WorkCalendar:
    return calendar_for(workweek=workweek, country=country, subdivision=subdivision, zone=zone)


IL = recipient("Asia/Jerusalem")
US = recipient("America/New_York")
AE = recipient("Asia/Dubai")
NOWHERE = recipient("UTC")


# --- Israel: Sunday–Thursday ---------------------------------------------------------------------


def test_jerusalem_with_no_settings_uses_israel() -> None:
    assert (IL.country, IL.subdivision, IL.workweek) == ("IL", None, None)
    assert "IL" in IL.source and "Asia/Jerusalem" in IL.source


@pytest.mark.parametrize(
    ("day", "reason"),
    [
        (date(2026, 1, 11), None),  # Sunday: a working day
        (date(2026, 1, 15), None),  # Thursday
        (date(2026, 1, 9), "weekend (IL: Fri–Sat)"),
        (date(2026, 1, 10), "weekend (IL: Fri–Sat)"),
        (date(2026, 9, 21), "holiday: Yom Kippur"),  # a Monday
    ],
)
def test_israel(day: date, reason: str | None) -> None:
    assert non_working_reason(IL, day) == reason
    assert is_working_day(IL, day) is (reason is None)


def test_working_days_series_in_israel_skips_friday_and_saturday_and_yom_kippur() -> None:
    anchor = datetime(2026, 9, 13, 9)  # Sunday (Rosh Hashanah, day 2: occurrence 0 all the same)
    got = [local_occurrence(anchor, Every(1, "working_days"), n, IL) for n in range(1, 11)]
    assert [d.strftime("%a %d") for d in got] == [
        "Mon 14", "Tue 15", "Wed 16", "Thu 17",  # Fri 18, Sat 19 off
        "Sun 20",  # Mon 21 Yom Kippur off
        "Tue 22", "Wed 23", "Thu 24",  # Fri 25, Sat 26 (Sukkot) off
        "Sun 27", "Mon 28",
    ]  # fmt: skip
    assert all(d.hour == 9 for d in got)


# --- United States, UAE ----------------------------------------------------------------------------


def test_new_york_thanksgiving_is_off() -> None:
    assert non_working_reason(US, date(2026, 11, 26)) == "holiday: Thanksgiving Day"
    assert is_working_day(US, date(2026, 11, 25))
    assert non_working_reason(US, date(2026, 11, 28)) == "weekend (US: Sat–Sun)"


@pytest.mark.parametrize(
    ("day", "reason"),
    [
        (date(2021, 6, 4), "weekend (AE: Fri–Sat)"),  # a Friday in 2021
        (date(2021, 6, 6), None),  # a Sunday in 2021: working
        (date(2021, 12, 31), "weekend (AE: Fri–Sat)"),  # the last Friday weekend
        (date(2022, 1, 2), "weekend (AE: Sat–Sun)"),  # the first Sunday weekend
        (date(2022, 1, 7), None),  # the first working Friday
        (date(2023, 6, 2), None),  # a Friday in 2023, no holiday
        (date(2023, 6, 4), "weekend (AE: Sat–Sun)"),  # a Sunday in 2023
    ],
)
def test_dubai_follows_the_uae_weekend_of_the_date(day: date, reason: str | None) -> None:
    """The UAE moved from Friday–Saturday to Saturday–Sunday on 2022-01-01. The holidays package
    models it per date; this pins it so a release that stopped doing so fails here."""
    assert non_working_reason(AE, day) == reason


def test_malaysian_states_have_their_own_weekend() -> None:
    kedah = recipient("Asia/Kuala_Lumpur", subdivision="MY-02")
    selangor = recipient("Asia/Kuala_Lumpur", subdivision="10")
    friday, sunday = date(2026, 1, 9), date(2026, 1, 11)
    assert not is_working_day(kedah, friday) and is_working_day(kedah, sunday)
    assert is_working_day(selangor, friday) and not is_working_day(selangor, sunday)


def test_a_working_day_moved_onto_a_weekend_counts() -> None:
    russia = recipient("Europe/Moscow")
    assert is_working_day(russia, date(2024, 11, 2))  # a Saturday worked for the Nov 4 bridge
    assert non_working_reason(russia, date(2024, 11, 3)) == "weekend (RU: Sat–Sun)"


# --- precedence: explicit workweek, explicit country, zone, nothing ----------------------------------


def test_explicit_workweek_overrides_the_country_but_keeps_its_holidays() -> None:
    cal = recipient("Asia/Jerusalem", workweek=[0, 1, 2, 3, 4])
    assert cal.workweek == MON_FRI and "workweek" in cal.source
    assert is_working_day(cal, date(2026, 1, 9))  # Friday
    assert non_working_reason(cal, date(2026, 1, 11)) == "weekend (workweek setting: Sat–Sun)"
    assert non_working_reason(cal, date(2026, 9, 21)) == "holiday: Yom Kippur"


def test_explicit_country_overrides_the_zone() -> None:
    cal = recipient("Asia/Jerusalem", country="us")
    assert cal.country == "US" and "recipient's country" in cal.source
    assert not is_working_day(cal, date(2026, 11, 26))
    assert is_working_day(cal, date(2026, 1, 11)) is False  # Sunday, US weekend


def test_subdivision_adds_regional_holidays() -> None:
    california = recipient("America/Los_Angeles", subdivision="US-CA")
    assert california.subdivision == "CA"
    assert non_working_reason(california, date(2026, 3, 31)) == "holiday: Cesar Chavez Day"
    assert is_working_day(recipient("America/Los_Angeles"), date(2026, 3, 31))


@pytest.mark.parametrize("zone", ["UTC", "Etc/UTC", "Etc/GMT+5", "GMT", "EST5EDT"])
def test_a_zone_without_a_country_gets_mon_fri_and_no_holidays(zone: str) -> None:
    cal = recipient(zone)
    assert (cal.country, cal.subdivision, cal.workweek) == (None, None, None)
    assert "no country" in cal.source and "no holidays" in cal.source
    assert is_working_day(cal, date(2026, 12, 25))  # Christmas, a Friday: no country's holidays
    assert is_working_day(cal, date(2026, 1, 1))
    assert non_working_reason(cal, date(2026, 12, 26)) == "weekend (no country: Sat–Sun)"


def test_a_zone_without_a_country_with_a_workweek() -> None:
    cal = recipient("UTC", workweek=[6, 0, 1, 2, 3])
    assert is_working_day(cal, date(2026, 1, 11))  # Sunday
    assert non_working_reason(cal, date(2026, 1, 9)) == "weekend (workweek setting: Fri–Sat)"


def test_every_zone_gets_its_own_country_and_never_a_default() -> None:
    for zone in sorted(zone_names()):  # the pinned tzdata package's zones, not the host's
        cal = recipient(zone)
        assert cal.country == country_of_zone(zone), zone
        assert cal.workweek is None
    assert {recipient(z).country for z in ("Asia/Tokyo", "Europe/Paris", "Africa/Lagos")} == {
        "JP",
        "FR",
        "NG",
    }


def test_odd_settings_are_noted_not_raised() -> None:
    cal = recipient("Europe/Berlin", country="ZZ", subdivision="XX")
    assert (cal.country, cal.subdivision) == ("DE", None)
    assert "'ZZ' unknown" in cal.source and "'XX' unknown" in cal.source


@pytest.mark.parametrize(
    ("call", "refusal"),
    [
        (lambda: recipient("Nowhere/Atlantis"), "not an IANA time zone: 'Nowhere/Atlantis'"),
        (lambda: recipient("UTC", workweek=[]), "workweek must list weekdays"),
        (lambda: recipient("UTC", workweek=[0, 7]), r"workweek .* not frozenset\(\{0, 7\}\)"),
        (lambda: WorkCalendar("ZZ", None, None), "Country ZZ not available"),
        (lambda: WorkCalendar("US", "XX", None), "does not have subdivision XX"),
        (lambda: WorkCalendar(None, "CA", None), "subdivision 'CA' needs a country"),
    ],
    ids=[
        "unknown-zone",
        "empty-workweek",
        "weekday-7",
        "unknown-country",
        "unknown-subdivision",
        "subdivision-alone",
    ],
)
def test_malformed_calendars_raise(call, refusal: str) -> None:
    with pytest.raises(ValueError, match=refusal):
        call()


def test_calendars_compare_by_content_not_by_source() -> None:
    assert (
        recipient("Asia/Jerusalem") == recipient("Asia/Tel_Aviv") == WorkCalendar("IL", None, None)
    )
    assert hash(recipient("Asia/Jerusalem")) == hash(WorkCalendar("il", None, None))


def test_holiday_objects_are_cached_per_country_subdivision_and_year() -> None:
    assert _holidays("IL", None, 2026) is _holidays("IL", None, 2026)
    assert _holidays("IL", None, 2026) is not _holidays("IL", None, 2027)


# --- adjust ------------------------------------------------------------------------------------------

YOM_KIPPUR_9 = datetime(2026, 9, 21, 9, 30)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("skip", (None, "holiday: Yom Kippur")),
        ("next_working_day", (datetime(2026, 9, 22, 9, 30), "holiday: Yom Kippur")),
        ("send", (YOM_KIPPUR_9, None)),
    ],
)
def test_adjust_on_a_non_working_day(policy: Policy, expected: tuple) -> None:
    assert adjust(IL, YOM_KIPPUR_9, policy) == expected


@pytest.mark.parametrize("policy", ["skip", "next_working_day", "send"])
def test_adjust_on_a_working_day_changes_nothing(policy: Policy) -> None:
    sunday = datetime(2026, 1, 11, 9)
    assert adjust(IL, sunday, policy) == (sunday, None)


def test_next_working_day_crosses_a_weekend_and_holidays() -> None:
    friday = datetime(2026, 9, 11, 8, 15)  # then Sat 12 and Sun 13 are Rosh Hashanah
    assert adjust(IL, friday, "next_working_day") == (
        datetime(2026, 9, 14, 8, 15),
        "weekend (IL: Fri–Sat)",
    )
    thanksgiving = datetime(2026, 11, 26, 17)
    assert adjust(US, thanksgiving, "next_working_day")[0] == datetime(2026, 11, 27, 17)


def test_adjust_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy"):
        adjust(IL, YOM_KIPPUR_9, "later")  # type: ignore[arg-type]


# --- working-day arithmetic against a day-by-day scan --------------------------------------------------

CALENDARS = [IL, US, AE, NOWHERE, recipient("Europe/Berlin", workweek=[0, 2, 4])]
days_2020_2040 = st.dates(min_value=date(2020, 1, 1), max_value=date(2040, 12, 31))


def scan_add(cal: WorkCalendar, day: date, k: int) -> date:
    while k:
        day += timedelta(days=1)
        k -= is_working_day(cal, day)
    return day


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(CALENDARS), days_2020_2040, st.integers(0, 400))
def test_add_working_days_agrees_with_a_scan(cal: WorkCalendar, day: date, k: int) -> None:
    got = add_working_days(cal, day, k)
    assert got == scan_add(cal, day, k)
    assert working_days_between(cal, day, got) == k
    assert working_days_between(cal, got, day) == 0
