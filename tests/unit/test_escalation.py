"""Escalation chains without services: the catalog's `escalation:` checked at load (errors name
the file, type, step and field), and working-time timers over weekends, holidays, DST and
Friday–Saturday weeks (scheduling/worktime.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clarion.catalog import Catalog, CatalogError
from clarion.catalog.escalation import Escalation, EscalationStep, parse_duration
from clarion.scheduling.calendars import calendar_for
from clarion.scheduling.worktime import add_working_time
from clarion.scheduling.zones import load_zone
from clarion.tasks.escalation import occurrence_key, timer
from tests.support.records import recipient as fake_recipient


def _type(**extra: Any) -> dict[str, Any]:
    return {
        "category": "alert",
        "channels": ["webhook"],
        "required": ["host"],
        "templates": [{"version": 1, "body": "{{ host }} is down"}],
        **extra,
    }


def catalog(escalation: Any, **types: dict[str, Any]) -> Catalog:
    return Catalog.from_dict(
        {"types": {"page": _type(escalation=escalation), "sms": _type(), **types}},
        "gridwatch.yaml",
    )


def test_a_gridwatch_chain_loads():
    built = catalog(
        {
            "working_hours": "09:00-17:00",
            "steps": [{"after": "5m", "type": "sms"}, {"after": 600, "to": "host"}],
        }
    )
    assert built.types["page"].escalation == Escalation(
        (EscalationStep(300.0, "sms"), EscalationStep(600.0, "page", "host")),
        ("09:00", "17:00"),
    )
    assert built.types["sms"].escalation is None


@pytest.mark.parametrize(
    ("escalation", "message"),
    [
        ("5m", "escalation must be a mapping with steps"),
        ({"steps": []}, "escalation.steps must be a list of 1 to 10 steps"),
        ({"steps": [{"after": "5m"}], "retries": 2}, "escalation: unknown keys \\['retries'\\]"),
        ({"steps": [{"after": "soon"}]}, "escalation step 2 after must be a duration"),
        ({"steps": [{"after": 0}]}, "escalation step 2 after must be a duration"),
        ({"steps": [{"after": "31d"}]}, "escalation step 2 after must be a duration"),
        ({"steps": [{"after": "5m", "when": "x"}]}, "escalation step 2: unknown keys"),
        (
            {"steps": [{"after": "5m"}, {"after": "5m", "to": "oncall"}]},
            "escalation step 3: to must name a required or defaulted variable",
        ),
        ({"steps": [{"after": "5m", "type": ""}]}, "escalation step 2: type must name a type"),
        (
            {"steps": [{"after": "5m"}], "working_hours": "17:00-09:00"},
            "escalation.working_hours must be true or a local window",
        ),
        (
            {"steps": [{"after": "5m"}], "working_hours": "9-5"},
            "escalation.working_hours must be true or a local window",
        ),
    ],
)
def test_a_malformed_escalation_is_refused_at_load_naming_the_field(escalation, message):
    with pytest.raises(CatalogError, match=f"^gridwatch.yaml: type 'page': {message}"):
        catalog(escalation)


def test_step_types_are_checked_against_the_catalog():
    with pytest.raises(CatalogError, match="type 'page' escalation step 2: type 'voice' is not"):
        catalog({"steps": [{"after": "5m", "type": "voice"}]})
    with pytest.raises(CatalogError, match="step 2: type 'call' requires on_call, which 'page'"):
        catalog(
            {"steps": [{"after": "5m", "type": "call"}]},
            call=_type(required=["host", "on_call"], templates=[{"version": 1, "body": "x"}]),
        )
    with pytest.raises(CatalogError, match="step 2: type 'loop' has an escalation of its own"):
        catalog(
            {"steps": [{"after": "5m", "type": "loop"}]},
            loop=_type(escalation={"steps": [{"after": "1m"}]}),
        )


def test_a_catalog_built_in_python_is_checked_too():
    built = catalog({"steps": [{"after": "5m", "type": "sms"}]})
    del built.types["sms"]
    with pytest.raises(CatalogError, match="step 2: type 'sms' is not in the catalog"):
        built.check()


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("2h", 7200), (90, 90), ("1.5m", 90)]
)
def test_durations(text, seconds):
    assert parse_duration(text, "after", ValueError) == seconds


def test_step_occurrence_keys_are_reserved_for_chains():
    from clarion.errors import InvalidOccurrence
    from clarion.validation import occurrence_key as checked

    with pytest.raises(InvalidOccurrence, match="reserved for escalation chains"):
        checked(None, occurrence_key(7, 2))


# --- working time -------------------------------------------------------------------------------

BERLIN = calendar_for(workweek=None, country="DE", subdivision=None, zone="Europe/Berlin")
NINE_TO_FIVE = ("09:00", "17:00")


def test_ten_working_minutes_from_friday_afternoon_land_on_monday_morning():
    friday = datetime(2026, 12, 4, 15, 55, tzinfo=UTC)  # 16:55 in Berlin
    due = add_working_time(friday, 600, calendar=BERLIN, zone="Europe/Berlin", window=NINE_TO_FIVE)
    assert due == datetime(2026, 12, 7, 8, 5, tzinfo=UTC)  # Monday 09:05 in Berlin


def test_whole_working_days_count_friday_night_and_skip_the_weekend():
    friday = datetime(2026, 12, 4, 22, 55, tzinfo=UTC)  # 23:55 in Berlin
    due = add_working_time(friday, 600, calendar=BERLIN, zone="Europe/Berlin")
    assert due == datetime(2026, 12, 6, 23, 5, tzinfo=UTC)  # Monday 00:05 in Berlin


def test_a_timer_started_on_a_sunday_or_before_opening_starts_counting_at_opening():
    sunday = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
    assert add_working_time(
        sunday, 300, calendar=BERLIN, zone="Europe/Berlin", window=NINE_TO_FIVE
    ) == datetime(2026, 12, 7, 8, 5, tzinfo=UTC)


def test_public_holidays_do_not_count():
    # Thursday 24 Dec 2026 16:55 Berlin: 25 and 26 Dec are holidays, 27 is a Sunday
    eve = datetime(2026, 12, 24, 15, 55, tzinfo=UTC)
    due = add_working_time(eve, 600, calendar=BERLIN, zone="Europe/Berlin", window=NINE_TO_FIVE)
    assert due == datetime(2026, 12, 28, 8, 5, tzinfo=UTC)


def test_a_friday_saturday_week_works_on_sunday():
    israel = calendar_for(workweek=None, country="IL", subdivision=None, zone="Asia/Jerusalem")
    thursday = datetime(2026, 11, 26, 14, 55, tzinfo=UTC)  # 16:55 in Jerusalem
    due = add_working_time(
        thursday, 600, calendar=israel, zone="Asia/Jerusalem", window=NINE_TO_FIVE
    )
    assert due == datetime(2026, 11, 29, 7, 5, tzinfo=UTC)  # Sunday 09:05


def test_working_time_across_a_dst_change_is_real_elapsed_time():
    # whole days: Sat 28 Mar 2026 23:00 UTC is Sun 00:00 CET, spring forward at 02:00; workweek
    # set to every day so only the clock change matters: 24 h of working time is 24 real hours
    every_day = calendar_for(
        workweek=list(range(7)), country=None, subdivision=None, zone="Europe/Berlin"
    )
    start = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)
    assert add_working_time(
        start, 86400, calendar=every_day, zone="Europe/Berlin"
    ) == start + timedelta(hours=24)


@given(
    start=st.datetimes(
        min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31), timezones=st.just(UTC)
    ),
    seconds=st.integers(min_value=1, max_value=5 * 24 * 3600),
)
def test_working_time_lands_inside_a_window_and_not_before_the_plain_timer(start, seconds):
    due = add_working_time(
        start, seconds, calendar=BERLIN, zone="Europe/Berlin", window=NINE_TO_FIVE
    )
    local = due.astimezone(load_zone("Europe/Berlin"))
    assert due >= start + timedelta(seconds=seconds)
    assert (9, 0) <= (local.hour, local.minute) <= (17, 0) and local.weekday() < 5


def test_the_chain_timer_counts_plain_time_without_working_hours():
    start = datetime(2026, 12, 4, 15, 55, tzinfo=UTC)
    recipient = fake_recipient(timezone="Europe/Berlin", country="DE")
    assert timer(start, 600, None, recipient) == start + timedelta(minutes=10)
    assert timer(start, 600, "09:00-17:00", recipient) == datetime(2026, 12, 7, 8, 5, tzinfo=UTC)
