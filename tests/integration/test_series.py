"""Recurring series against real PostgreSQL: arming, the tick, catch-up, liveness, calendars."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from clarion import clock, settings
from clarion.db.engine import engine
from clarion.errors import (
    FaultInjected,
    InvalidRequest,
    MissingVariables,
    UnknownRecipient,
    UnknownType,
)
from clarion.tasks import register_recipient
from clarion.tasks.preferences import set_preferences
from clarion.tasks.route import route
from clarion.tasks.series import (
    arm_series,
    cancel_series,
    pause_series,
    resume_series,
    snooze_occurrence,
    tick_series,
)
from tests.support.environment import ROOT
from tests.support.pipeline import configure, counted
from tests.support.race import race

pytestmark = pytest.mark.integration

GATES = ROOT / "tests" / "catalog_gates.yaml"


@pytest.fixture
def gates_catalog(clarion_env, monkeypatch):
    from tests.support.environment import reset_process_state

    monkeypatch.setenv("CLARION_CATALOG", str(GATES))
    reset_process_state()
    return clarion_env


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start
        clock.set_source(lambda: self.now)

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def virtual_clock():
    c = Clock(datetime(2026, 12, 7, 7, 0, tzinfo=UTC))  # a Monday, 08:00 in Berlin
    yield c
    clock.set_source(None)


def rows(sql: str, **params) -> list[tuple]:
    with engine().connect() as conn:
        return [tuple(r) for r in conn.execute(text(sql), params)]


def tick(now: datetime) -> int:
    return tick_series(now=now)


def route_pending() -> None:
    pending = rows("SELECT user_id, id FROM requests WHERE state = 'pending'")
    if pending:
        route([u for u, _ in pending], [i for _, i in pending])


@pytest.mark.parametrize(
    ("call", "error", "refusal"),
    [
        (dict(type_key="nope"), UnknownType, r"^unknown notification type 'nope'"),
        (dict(user_id="ghost"), UnknownRecipient, r"^unknown recipient 'ghost'$"),
        (dict(every="fortnightly-ish"), InvalidRequest, r"^every: cannot read the interval"),
        (dict(calendar_policy="maybe"), InvalidRequest, r"^calendar_policy: .*not 'maybe'$"),
        (dict(count=0), InvalidRequest, r"^count: must be a whole number .*, not 0$"),
        (dict(anchor="next tuesday"), InvalidRequest, r"^anchor: .*not 'next tuesday'$"),
        (dict(type_key="tip"), MissingVariables, r"^type 'tip' needs variables: n$"),
    ],
)
def test_bad_arm_calls_fail_and_write_nothing(gates_catalog, call, error, refusal):
    register_recipient("u1", timezone="Europe/Berlin")
    args = dict(
        user_id="u1",
        type_key="weekly_one_on_one",
        anchor="2026-12-07T09:00",
        every="1w",
        calendar_policy="send",
        count=None,
    )
    args.update(call)
    with pytest.raises(error, match=refusal):
        arm_series(args.pop("user_id"), args.pop("type_key"), **args)
    assert rows("SELECT count(*) FROM series") == [(0,)]


def test_arming_twice_is_one_series_due_at_the_local_anchor(gates_catalog):
    register_recipient("u1", timezone="Europe/Berlin")
    first = arm_series(
        "u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1w", series_key="k"
    )
    again = arm_series(
        "u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1w", series_key="k"
    )
    assert (first.series_id, first.new, again.new) == (again.series_id, True, False)
    assert first.first_due_at == datetime(2026, 12, 7, 8, 0, tzinfo=UTC)  # 09:00 CET


def test_the_tick_fires_each_occurrence_once_and_advances_by_the_anchor(
    gates_catalog, virtual_clock
):
    register_recipient("u1", timezone="Europe/Berlin")
    armed = arm_series("u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1w")
    assert tick(virtual_clock.now) == 0  # 08:00 local: not due yet
    now = virtual_clock.advance(hours=1, minutes=5)
    assert tick(now) == 1
    assert tick(now) == 0  # a second tick at the same instant finds nothing due
    assert rows("SELECT occurrence_key, state FROM requests") == [
        (f"series:{armed.series_id}:0", "pending")
    ]
    assert rows("SELECT next_n, next_due_at FROM series") == [
        (1, datetime(2026, 12, 14, 8, 0, tzinfo=UTC))
    ]


def test_beat_down_for_three_days_records_misses_and_sends_at_most_one(
    gates_catalog, virtual_clock
):
    register_recipient("u1", timezone="Europe/Berlin")
    armed = arm_series("u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1d")
    now = virtual_clock.advance(
        days=3, hours=1, minutes=30
    )  # Thursday 09:30 local: occurrences 0..3
    missed = counted("clarion_suppressed_total", gate="schedule", reason="missed")
    assert tick(now) == 1
    got = rows("SELECT occurrence_key, state FROM requests ORDER BY id")
    assert [state for _, state in got] == ["routed", "routed", "routed", "pending"]
    assert got[-1][0] == f"series:{armed.series_id}:3"
    reasons = rows("SELECT reason, detail FROM decisions ORDER BY request_id")
    assert [r for r, _ in reasons] == ["missed"] * 3
    assert [d.split(",")[0] for _, d in reasons] == [
        "missed: the tick came 3 days after it was due",
        "missed: the tick came 2 days after it was due",
        "missed: the tick came 24 h after it was due",
    ]  # beat was down: not the anchor's fault
    assert tick(now) == 0
    assert counted("clarion_suppressed_total", gate="schedule", reason="missed") - missed == 3


def test_a_tick_whose_commit_fails_writes_and_counts_nothing(
    gates_catalog, virtual_clock, monkeypatch
):
    register_recipient("u1", timezone="Europe/Berlin")
    arm_series("u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1d")
    now = virtual_clock.advance(days=3, hours=1, minutes=30)  # three missed, one to send
    missed = counted("clarion_suppressed_total", gate="schedule", reason="missed")
    configure(monkeypatch, faults="tick.before_commit=raise*1")
    with pytest.raises(FaultInjected, match=r"^tick\.before_commit$"):
        tick(now)
    assert rows("SELECT (SELECT count(*) FROM requests), (SELECT next_n FROM series)") == [(0, 0)]
    assert counted("clarion_suppressed_total", gate="schedule", reason="missed") == missed
    assert tick(now) == 1  # the fault fired once: this tick commits, then counts
    assert counted("clarion_suppressed_total", gate="schedule", reason="missed") - missed == 3


def test_an_anchor_far_in_the_past_records_missed_and_no_burst(gates_catalog, virtual_clock):
    register_recipient("u1", timezone="Europe/Berlin")
    arm_series("u1", "weekly_one_on_one", anchor="2024-01-01T09:00", every="1d")
    tick(virtual_clock.now)  # 08:00 local: today's occurrence is not due; all elapsed ones are old
    states = rows("SELECT state, count(*) FROM requests GROUP BY 1")
    assert states == [("routed", 51)]  # 50 listed one by one, plus one row counting the rest
    assert rows("SELECT count(*) FROM requests WHERE state = 'pending'") == [(0,)]
    details = [d for (d,) in rows("SELECT detail FROM decisions ORDER BY request_id")]
    # the real cause is named: the anchor was in the past, not a late beat
    assert details[0].startswith("missed: this row stands for occurrences 0..1020 (1021)")
    assert "1021 due before the series was armed (the anchor is in the past)" in details[0]
    assert all(d.startswith("missed: due before the series was armed") for d in details[1:])
    assert not any("tick" in d and "late" in d for d in details)


def test_an_opted_out_occurrence_does_not_end_the_series(gates_catalog, virtual_clock):
    register_recipient("u1", timezone="Europe/Berlin")
    set_preferences("u1", {"type:weekly_one_on_one": False})
    arm_series("u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1d")
    for day in range(3):
        now = virtual_clock.advance(days=1 if day else 0, hours=0 if day else 2)
        tick(now)
        route_pending()
    assert rows("SELECT reason, count(*) FROM decisions GROUP BY 1 ORDER BY 1") == [
        ("no_channel", 3),
        ("opted_out", 3),
    ]
    assert rows("SELECT state, next_n FROM series") == [("active", 3)]


def test_count_ends_the_series(gates_catalog, virtual_clock):
    register_recipient("u1", timezone="Europe/Berlin")
    arm_series("u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1d", count=2)
    for _ in range(4):
        tick(virtual_clock.advance(days=1))
    assert rows("SELECT state FROM series") == [("ended",)]
    assert rows("SELECT count(*) FROM requests") == [(2,)]


def test_pause_resume_cancel_and_snooze(gates_catalog, virtual_clock):
    register_recipient("u1", timezone="Europe/Berlin")
    sid = arm_series("u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1d").series_id
    assert snooze_occurrence("u1", sid, 0, virtual_clock.now + timedelta(hours=5))
    tick(virtual_clock.advance(hours=2))  # occurrence 0 is due, but was snoozed: stays deferred
    assert rows("SELECT state, due_at FROM requests") == [
        ("deferred", datetime(2026, 12, 7, 12, 0, tzinfo=UTC))
    ]
    assert pause_series("u1", sid) and not pause_series("u1", sid)
    tick(virtual_clock.advance(days=3))
    assert rows("SELECT count(*) FROM requests") == [(1,)]  # nothing fires while paused
    assert resume_series("u1", sid)
    assert rows("SELECT next_n FROM series") == [(4,)]  # resumes after now: no late burst
    assert cancel_series("u1", sid) and not cancel_series("u1", sid)


def test_a_jerusalem_week_gets_sunday_and_no_friday_or_saturday(gates_catalog, virtual_clock):
    register_recipient("il", timezone="Asia/Jerusalem")  # no country, no workweek: from the zone
    arm_series(
        "il", "weekly_one_on_one", anchor="2026-12-06T09:00", every="1d", calendar_policy="skip"
    )
    for _ in range(8):  # Sunday 6 Dec .. Sunday 13 Dec, ticking each morning at 09:30 local
        tick(virtual_clock.now)
        virtual_clock.advance(days=1)
    sent = rows("SELECT occurrence_key FROM requests WHERE state = 'pending' ORDER BY id")
    skipped = rows("SELECT detail FROM decisions WHERE reason = 'non_working_day'")
    assert len(sent) == 6 and len(skipped) == 2  # Friday 11th and Saturday 12th
    assert all("weekend" in d for (d,) in skipped)


def _two_tickers(now: datetime) -> int:
    return tick_series(now=now, limit=400)


def test_concurrent_ticks_never_create_an_occurrence_twice(gates_catalog):
    for u in range(50):
        register_recipient(f"u{u}", timezone="Europe/Berlin")
        for k in range(20):
            arm_series(
                f"u{u}",
                "weekly_one_on_one",
                anchor="2026-12-07T09:00",
                every="1d",
                series_key=f"s{k}",
            )
    now = datetime(2026, 12, 7, 8, 30, tzinfo=UTC)
    rounds = [race(4, _two_tickers, lambda i: (now,)) for _ in range(2)]
    assert [r.most_at_once() >= 2 for r in rounds] == [True, True]  # the contenders met
    assert sum(rounds[0] + rounds[1]) == 1000
    assert rows("SELECT count(*), count(DISTINCT (user_id, occurrence_key)) FROM requests") == [
        (1000, 1000)
    ]
    assert rows("SELECT DISTINCT next_n FROM series") == [(1,)]


def test_grace_window_is_a_setting(gates_catalog, virtual_clock, monkeypatch):
    monkeypatch.setenv("CLARION_SERIES_GRACE", "60")
    settings.reset()
    register_recipient("u1", timezone="Europe/Berlin")
    arm_series("u1", "weekly_one_on_one", anchor="2026-12-07T09:00", every="1d")
    tick(virtual_clock.advance(hours=1, minutes=2))  # two minutes late, grace is one
    assert rows("SELECT state FROM requests") == [("routed",)]


def test_due_rows_read_as_a_list_of_dicts_converting_only_what_is_read(clarion_env):
    from clarion.db.series import DueRows

    with engine().connect() as conn:
        raw = conn.connection.dbapi_connection
        expected = [{"n": n, "sq": n * n} for n in range(1, 8)]
        cursor = raw.execute("SELECT g AS n, g * g AS sq FROM generate_series(1, 7) g")
        due = DueRows(cursor)
        assert len(due) == 7 and bool(due)
        assert due[0:2] == expected[0:2] and len(due._read) == 2  # only what was asked for
        assert due[1] == expected[1] and len(due._read) == 2
        assert due[5:100] == expected[5:] and len(due._read) == 7
        assert due[-1] == expected[-1] and list(due) == expected and due[3:1] == []
        with pytest.raises(IndexError, match=r"index out of range"):
            due[7]
        empty = DueRows(raw.execute("SELECT 1 AS n WHERE false"))
        assert len(empty) == 0 and not empty and empty[0:25] == []
