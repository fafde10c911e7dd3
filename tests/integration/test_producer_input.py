"""Hostile and careless input at every producer entry point, on real PostgreSQL.

The fuzz tests call notify, notify_many, register_recipient and arm_series with arbitrary Python
values (text with surrogates and NUL, bytes, huge and negative ints, NaN and infinities, sets,
objects, deep nesting), mixed with valid ones so that calls also get past the first checks. Each
call either succeeds or raises a ClarionError, never anything else, and a refused call leaves the
row count of every table unchanged.
"""

from __future__ import annotations

import logging
import re
import time as clock_time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from clarion.db.engine import engine
from clarion.db.schema import metadata
from clarion.errors import ClarionError, InvalidField, InvalidOccurrence
from clarion.tasks import notify, notify_many, register_recipient
from clarion.tasks.publish import ROUTE
from clarion.tasks.series import (
    arm_series,
    cancel_series,
    pause_series,
    resume_series,
    snooze_occurrence,
)
from tests.support.pipeline import (
    configure,
    count,
    published,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

ORDER = {"order": "A-1"}
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture
def ann(clarion_env) -> Iterator[str]:
    with publishing_to_this_tests_broker():
        register_recipient("ann", timezone="Europe/Berlin", country="de")
        yield "ann"


def table_counts() -> dict[str, int]:
    """Rows in every table of the schema (db/schema.py), in one query."""
    names = sorted(metadata.tables)
    sql = " UNION ALL ".join(f"SELECT '{n}', count(*) FROM {n}" for n in names)
    with engine().connect() as conn:
        return dict(conn.execute(text(sql)).all())


# --- arbitrary values -----------------------------------------------------------------------------

TRICKY_TEXT = [
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfffy",
    "\\u0000",
    "series:1:0",
    "series:",
    "é" * 300,
    "x" * 600,
    " ",
    "ann\n",
    "Europe/Berlin\x00",
    "../etc/passwd",
    "DE-BY",
    "en_US",
    "+1",
]
any_text = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=40), st.sampled_from(TRICKY_TEXT)
)


class Opaque:
    """Some application object that is not JSON."""


scalars = st.one_of(
    st.none(),
    st.booleans(),
    any_text,
    st.binary(max_size=20),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.builds(pow, st.just(10), st.just(5000)),
    st.floats(allow_nan=True, allow_infinity=True),
    st.just(Opaque()),
    st.just(object()),
    st.datetimes(),
    st.just(time(22)),
    st.complex_numbers(max_magnitude=10),
)
hashables = st.one_of(
    st.none(), st.booleans(), any_text, st.integers(), st.floats(), st.binary(max_size=5)
)


def _nest(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


arbitrary = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(hashables, children, max_size=4),
        st.dictionaries(any_text, children, max_size=4),
        st.frozensets(hashables, max_size=3),
        st.sets(st.integers(), max_size=3),
    ),
    max_leaves=12,
) | st.integers(min_value=1, max_value=60).map(_nest)


def calls(valid: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments: valid ones with up to two of them (or, now and then, all of them) replaced
    by anything at all, so that calls get past the first checks and also succeed."""
    names = sorted(valid)
    spoilt = st.one_of(st.sets(st.sampled_from(names), max_size=2), st.just(frozenset(names)))
    return st.tuples(
        st.fixed_dictionaries(valid), st.fixed_dictionaries(dict.fromkeys(names, arbitrary)), spoilt
    ).map(lambda t: {n: (t[1][n] if n in t[2] else t[0][n]) for n in names})


def one_of(*values: Any) -> st.SearchStrategy:
    return st.sampled_from(values)


variables_like = st.one_of(
    st.just(ORDER),
    st.dictionaries(st.sampled_from(["order", "code", "x"]) | any_text, arbitrary, max_size=4).map(
        lambda d: {**d, "order": "A-1"}
    ),
)


class Outcomes:
    """What the fuzzed calls did; a fuzz run must have seen both successes and refusals."""

    def __init__(self) -> None:
        self.ok = self.refused = 0

    def run(self, call: Callable[[], object]) -> None:
        """Call it: success, or a ClarionError that wrote nothing. Anything else fails the test."""
        before = table_counts()
        try:
            call()
        except ClarionError:
            assert table_counts() == before
            self.refused += 1
        else:
            self.ok += 1
        # any other exception propagates and fails the test, with the example that raised it

    def check(self) -> None:
        assert self.ok >= 3 and self.refused >= 30, (self.ok, self.refused)


# --- the fuzz tests -------------------------------------------------------------------------------


def test_notify_takes_any_values_and_raises_only_clarion_errors(ann):
    @FUZZ
    @given(
        kw=calls(
            {
                "user_id": one_of("ann"),
                "type_key": one_of("receipt"),
                "event_id": st.text(min_size=1, max_size=8),
                "variables": variables_like,
                "connection": st.none(),
            }
        ),
        explicit_key=st.booleans(),
    )
    def fuzz(kw, explicit_key):
        key = {"occurrence_key": kw.pop("event_id")} if explicit_key else {}
        seen.run(lambda: notify(kw.pop("user_id"), kw.pop("type_key"), **key, **kw))

    seen = Outcomes()
    fuzz()
    seen.check()


def test_notify_many_takes_any_values_and_raises_only_clarion_errors(ann):
    item = calls(
        {
            "user_id": one_of("ann"),
            "type_key": one_of("receipt"),
            "event_id": st.text(min_size=1, max_size=8),
            "variables": variables_like,
        }
    )

    @FUZZ
    @given(items=st.lists(item, max_size=4) | arbitrary, bare=st.booleans())
    def fuzz(items, bare):
        seen.run(
            lambda: notify_many(items if bare or not isinstance(items, list) else tuple(items))
        )

    seen = Outcomes()
    fuzz()
    seen.check()


def test_register_recipient_takes_any_values_and_raises_only_clarion_errors(clarion_env):
    @FUZZ
    @given(
        kw=calls(
            {
                "user_id": one_of("ann", "bob"),
                "timezone": one_of("UTC", "Europe/Berlin", "Asia/Jerusalem"),
                "locale": one_of("en", "de-AT"),
                "country": one_of(None, "DE", "il"),
                "org_id": one_of(None, "acme"),
                "addresses": one_of(
                    None,
                    {"email": "ann@example.com"},
                    {"slack": "U1", "sms": "+4915112345678"},
                    {"webhook": "https://h.example/x", "teams": "29:a"},
                ),
                "quiet_hours": one_of(None, ("22:00", "07:00"), (time(23), time(6))),
                "workweek": one_of(None, [0, 1, 2, 3, 6]),
                "subdivision": one_of(None, "BY"),
                "connection": st.none(),
            }
        )
    )
    def fuzz(kw):
        seen.run(lambda: register_recipient(kw.pop("user_id"), **kw))

    seen = Outcomes()
    fuzz()
    seen.check()


def test_arm_series_takes_any_values_and_raises_only_clarion_errors(ann):
    @FUZZ
    @given(
        kw=calls(
            {
                "user_id": one_of("ann"),
                "type_key": one_of("nudge"),
                "anchor": one_of(
                    "2026-12-07T09:00",
                    datetime(2026, 12, 7, 9),
                    datetime(2026, 1, 1, tzinfo=UTC),
                    datetime.min.replace(tzinfo=UTC),
                    datetime.max,
                    "9999-12-31T23:59+00:00",
                ),
                "every": one_of("1w", "2d", "1mo", "3wd", "999999d"),
                "count": one_of(None, 3, 0, 10**12),
                "until": one_of(None, datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 1, 1)),
                "variables": one_of({"name": "Ann"}),
                "calendar_policy": one_of("send", "skip", "next_working_day"),
                "series_key": st.none() | st.text(max_size=8),
                "connection": st.none(),
            }
        )
    )
    def fuzz(kw):
        seen.run(lambda: arm_series(kw.pop("user_id"), kw.pop("type_key"), **kw))

    seen = Outcomes()
    fuzz()
    seen.check()


def test_the_series_steering_calls_take_any_values_and_raise_only_clarion_errors(ann):
    armed = arm_series(
        ann, "nudge", anchor="2026-12-07T09:00", every="1w", variables={"name": "Ann"}
    )
    steer = [cancel_series, pause_series, resume_series]

    @FUZZ
    @given(
        which=st.integers(0, 3),
        kw=calls(
            {
                "user_id": one_of("ann", "bob"),
                "series_id": one_of(armed.series_id, 0, -1, 2**70, "1", 1.5, True),
                "n": one_of(0, 1, -1, 2**70, "2", False),
                "until": one_of(datetime(2027, 1, 1, tzinfo=UTC), datetime(2027, 1, 1), "tomorrow"),
            }
        ),
    )
    def fuzz(which, kw):
        user, series = kw.pop("user_id"), kw.pop("series_id")
        if which == 3:
            seen.run(lambda: snooze_occurrence(user, series, kw.pop("n"), kw.pop("until")))
        else:
            seen.run(lambda: steer[which](user, series))

    seen = Outcomes()
    fuzz()
    seen.check()


# --- named cases ----------------------------------------------------------------------------------


def test_the_literal_text_backslash_u0000_is_stored_as_written(ann):
    enqueued = notify(
        ann, "receipt", event_id="e1", variables={"order": "\\u0000", "note": "C:\\u0000"}
    )
    assert enqueued.new
    assert rows("SELECT variables FROM requests") == [
        {"variables": {"order": "\\u0000", "note": "C:\\u0000"}}
    ]


@pytest.mark.parametrize("key", ["series:1:0", "series:look-alike", "series:"])
def test_notify_refuses_series_keys(ann, key):
    before = table_counts()
    with pytest.raises(InvalidOccurrence, match="reserved for series") as caught:
        notify(ann, "receipt", occurrence_key=key, variables=ORDER)
    assert caught.value.field == "occurrence_key"
    assert table_counts() == before


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ("not a list", "items"),
        ({"user_id": "ann"}, "items"),
        (42, "items"),
        ([["ann", "receipt"]], "items[0]"),
        (
            [{"user_id": "ann", "type_key": "receipt", "event_id": "e", "variables": ORDER}, "x"],
            "items[1]",
        ),
        (
            [{"user_id": "ann", "type_key": "receipt", "event_id": "e", "varaibles": ORDER}],
            "items[0]",
        ),
        ([{"type_key": "receipt", "event_id": "e"}], "items[0].user_id"),
    ],
)
def test_notify_many_refuses_wrong_containers_with_the_item_named(ann, items, field):
    before = table_counts()
    with pytest.raises(InvalidField, match=rf"^{re.escape(field)}: ") as caught:
        notify_many(items)
    assert caught.value.field == field
    assert table_counts() == before


def test_a_bad_item_in_notify_many_says_which_one(ann):
    good = {"user_id": ann, "type_key": "receipt", "event_id": "e", "variables": ORDER}
    with pytest.raises(
        InvalidField, match=r"^variables\.order: numbers must be finite, not nan\nin items\[1\]$"
    ) as caught:
        notify_many([good, {**good, "variables": {"order": float("nan")}}])
    assert caught.value.field == "variables.order"
    assert caught.value.__notes__ == ["in items[1]"]
    assert count("requests") == 0


def test_variables_caps_come_from_settings(ann, monkeypatch):
    configure(monkeypatch, variables_max_bytes=64, variables_max_depth=2)
    with pytest.raises(InvalidField, match="at most 64 bytes"):
        notify(ann, "receipt", event_id="big", variables={"order": "x" * 64})
    with pytest.raises(InvalidField, match="deeper than 2 levels"):
        notify(ann, "receipt", event_id="deep", variables={"order": "A", "x": {"y": {}}})
    assert notify(ann, "receipt", event_id="ok", variables={"order": "A", "x": {"y": 1}}).new


def test_register_recipient_refuses_bad_addresses_and_writes_nothing(clarion_env):
    for addresses, field in (
        (["ann@example.com"], "addresses"),
        ({"email": "ann"}, "addresses.email"),
        ({"slack": "ann"}, "addresses.slack"),
        ({"sms": "0151"}, "addresses.sms"),
        ({"webhook": "javascript:alert(1)"}, "addresses.webhook"),
        ({"teams": ""}, "addresses.teams"),
    ):
        with pytest.raises(InvalidField, match=rf"^{re.escape(field)}: ") as caught:
            register_recipient("ann", timezone="UTC", addresses=addresses)
        assert caught.value.field == field
    assert count("recipients") == 0


# --- after the commit, nothing raises -------------------------------------------------------------


def test_notify_with_the_broker_down_commits_logs_and_returns(ann, monkeypatch, caplog):
    configure(monkeypatch, broker_url="redis://127.0.0.1:1/0")
    caplog.set_level(logging.WARNING, logger="clarion.tasks.producer")
    started = clock_time.monotonic()
    enqueued = notify(ann, "receipt", event_id="e1", variables=ORDER)
    elapsed = clock_time.monotonic() - started
    assert enqueued.new
    assert rows("SELECT id, state FROM requests") == [
        {"id": enqueued.request_id, "state": "pending"}
    ]
    assert [r.action for r in caplog.records] == ["publish_failed"]
    assert caplog.records[0].requests == [enqueued.request_id]
    assert elapsed < 3, f"publishing to a dead broker took {elapsed:.1f} s"
    configure(monkeypatch, broker_url=None)
    assert published("transactional")[ROUTE] == []  # nothing reached the real broker either
