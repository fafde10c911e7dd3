"""clarion.rows: records from result rows, and `evolve`, the planner's cheap copy of a record."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from clarion.gates.contract import Plan, Step
from clarion.rows import CreatedDelivery, Preference, Recipient, evolve

AT = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


def test_from_row_takes_a_tuple_a_list_or_a_mapping_alike():
    as_tuple = Preference.from_row(("type", "tip", "email", False))
    assert as_tuple == Preference.from_row(["type", "tip", "email", False])
    mapping = {"enabled": False, "channel": "email", "key": "tip", "scope": "type", "extra": 1}
    assert as_tuple == Preference.from_row(mapping)


def test_from_row_without_init_still_runs_post_init_and_checks_the_width():
    columns = ("u1", "Asia/Kathmandu", "ne", "NP", None, None, None, None, [6, 0], None)
    person = Recipient.from_row(columns)
    assert person == Recipient(*columns)  # __post_init__ ran: jsonb null -> {}, list -> tuple
    assert person.addresses == {} and person.workweek == (6, 0)
    with pytest.raises(AttributeError, match="cannot assign to field 'locale'"):
        person.locale = "en"
    short = ("u1", 7, 3, "webhook", "transactional", False)
    with pytest.raises(TypeError, match="lease_left"):
        CreatedDelivery.from_row(short)  # a column missing: the dataclass's own error
    with pytest.raises(TypeError, match="positional arguments"):
        Preference.from_row(("type", "tip", "email", False, "extra"))


def test_evolve_is_replace_without_init():
    plan = Plan((Step("quiet_hours", "allow", "outside_quiet_hours"),), on_window="send")
    later = evolve(plan, defer_until=AT, channels=(("email", None),))
    assert later == replace(plan, defer_until=AT, channels=(("email", None),))
    assert later is not plan and plan.defer_until is None and plan.channels == ()
    assert hash(later) == hash(replace(plan, defer_until=AT, channels=(("email", None),)))
    with pytest.raises(AttributeError, match="cannot assign to field 'defer_until'"):
        later.defer_until = None  # still frozen


def test_evolve_refuses_a_field_the_record_lacks():
    with pytest.raises(TypeError, match="Plan has no field"):
        evolve(Plan(), chanels=())
    step = Step("suppression", "suppress", "suppressed_address", channel="email")
    assert evolve(step, channel="sms") == replace(step, channel="sms")
