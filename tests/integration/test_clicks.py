"""Button answers that steer a series (stop, snooze), against real PostgreSQL and the local Slack:
the answer and its follow-up commit together, snooze never pulls an occurrence forward nor touches a
series that is not active, look-alike series keys change nothing but the record, and a click on a
delivery that was never sent is told so (issues 8 and 9)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from clarion.db import ledger
from clarion.db.engine import engine
from clarion.standins.fake_slack import FakeSlack
from clarion.tasks import register_recipient
from clarion.tasks.deliver import deliver
from clarion.tasks.interactions import handle_click, series_occurrence
from clarion.tasks.route import route
from clarion.tasks.series import arm_series, cancel_series, snooze_occurrence, tick_series
from tests.support.environment import ROOT
from tests.support.pipeline import (
    configure,
    count,
    counted,
    drain,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

ACTIVATION = ROOT / "catalog" / "examples" / "activation.yaml"
ONE_ON_ONE = "weekly_one_on_one"  # buttons: prepared, skip_week (snooze 24 h), stop (stop_series)
VARIABLES = {"first_name": "Ana", "report_name": "Bo"}
Key = tuple[str, int]


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        yield server


@pytest.fixture
def slack(clarion_env, fake, monkeypatch) -> Iterator[FakeSlack]:
    configure(
        monkeypatch, catalog=ACTIVATION, slack_token=FakeSlack.TOKEN, slack_api_url=fake.api_url
    )
    register_recipient("ana", timezone="UTC", addresses={"slack": "U1"})
    register_recipient("bob", timezone="UTC", addresses={"slack": "U2"})
    with publishing_to_this_tests_broker():
        yield fake


def _arm(user: str = "ana", every: str = "1w") -> tuple[int, datetime]:
    """A series whose occurrence 0 fell due a minute ago; returns (series id, its anchor in UTC)."""
    anchor = (datetime.now(UTC) - timedelta(minutes=1)).replace(second=0, microsecond=0)
    armed = arm_series(
        user,
        ONE_ON_ONE,
        anchor=anchor.replace(tzinfo=None),
        every=every,
        variables=VARIABLES,
        series_key=f"{user}-{every}",
    )
    return armed.series_id, anchor


def _tick(now: datetime | None = None) -> None:
    tick_series(now=now or datetime.now(UTC))


def _send_request(request_id: int, user: str = "ana") -> Key:
    """Route one request through the real task, which sends its Slack delivery itself."""
    assert route([user], [request_id]) == 1
    drain("activation")
    [found] = rows(
        "SELECT user_id, id FROM deliveries WHERE user_id = :u AND request_id = :r",
        u=user,
        r=request_id,
    )
    assert deliver([found["user_id"]], [found["id"]]) == 0  # nothing left for a deliver task
    return found["user_id"], found["id"]


def _occurrence(series_id: int, n: int, user: str = "ana") -> dict | None:
    found = rows(
        "SELECT id, state, due_at FROM requests WHERE user_id = :u AND occurrence_key = :o",
        u=user,
        o=f"series:{series_id}:{n}",
    )
    return found[0] if found else None


def _sent_occurrence(every: str = "1w", user: str = "ana") -> tuple[int, datetime, Key]:
    series_id, anchor = _arm(user, every)
    _tick()
    occurrence = _occurrence(series_id, 0, user)
    assert occurrence is not None
    key = _send_request(occurrence["id"], user)
    assert _state(key) == "sent"
    return series_id, anchor, key


def _request(
    occurrence_key: str, *, type_key: str = ONE_ON_ONE, variables: dict | None = None
) -> int:
    """ana's request under any occurrence key, as older producers (or a careless caller) wrote them,
    through the producer's own statement."""
    row = ledger.NewRequest(
        "ana", type_key, occurrence_key, "activation", 1, variables or VARIABLES
    )
    with engine().begin() as conn:
        [(request_id, _)] = ledger.insert_requests(
            conn, [row], now=datetime.now(UTC), due_at=datetime.now(UTC)
        )
    return request_id


def _click(key: Key, answer: str, slack_user: str = "U1"):
    value = json.dumps({"u": key[0], "d": key[1], "a": answer}, separators=(",", ":"))
    return handle_click("slack", slack_user, value)


def _state(key: Key) -> str:
    [row] = rows("SELECT state FROM deliveries WHERE user_id = :u AND id = :i", u=key[0], i=key[1])
    return row["state"]


def _series_state(series_id: int, user: str = "ana") -> tuple[str, datetime]:
    [row] = rows(
        "SELECT state, next_due_at FROM series WHERE user_id = :u AND id = :i", u=user, i=series_id
    )
    return row["state"], row["next_due_at"]


def _recorded() -> list[tuple[str, str]]:
    return [
        (r["outcome"], r["reason"])
        for r in rows("SELECT outcome, reason FROM interactions ORDER BY id")
    ]


# --- stop -----------------------------------------------------------------------------------------


def test_stop_cancels_the_series_and_the_answer_is_not_visible_before_the_cancel(slack):
    series_id, _, key = _sent_occurrence()
    with engine().begin() as holder:  # hold the series row: the click's follow-up must wait on it
        holder.execute(
            text("SELECT 1 FROM series WHERE user_id = 'ana' AND id = :i FOR UPDATE"),
            {"i": series_id},
        )
        result: list = []
        clicker = threading.Thread(target=lambda: result.append(_click(key, "stop")))
        clicker.start()
        assert _blocked_on_a_lock(), "the click's cancel never waited on the series row"
        # one transaction: while its follow-up waits, the answer is not committed either
        assert _state(key) == "sent" and count("interactions") == 0
    clicker.join(30)
    [click] = result
    assert (click.outcome, click.reason, click.answer) == ("accepted", "stop_series", "stop")
    assert _state(key) == "answered"
    assert _series_state(series_id)[0] == "cancelled"
    assert _recorded() == [("accepted", "stop_series")]


def _blocked_on_a_lock(timeout: float = 10) -> bool:
    """Some session of this test's database waits on a row lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if count("pg_stat_activity", "datname = current_database() AND wait_event_type = 'Lock'"):
            return True
        time.sleep(0.05)
    return False


def test_stop_drops_an_occurrence_a_snooze_created_early(slack):
    series_id, anchor = _arm(every="1d")
    _tick()
    assert snooze_occurrence("ana", series_id, 1, datetime.now(UTC) + timedelta(days=2))
    assert _occurrence(series_id, 1)["state"] == "deferred"
    cancelled = counted("clarion_suppressed_total", gate="series", reason="series_cancelled")
    assert cancel_series("ana", series_id)
    assert _occurrence(series_id, 1)["state"] == "routed"
    assert rows(
        "SELECT gate, outcome, reason FROM decisions WHERE request_id = :r",
        r=_occurrence(series_id, 1)["id"],
    ) == [{"gate": "series", "outcome": "suppress", "reason": "series_cancelled"}]
    assert counted("clarion_suppressed_total", gate="series", reason="series_cancelled") == (
        cancelled + count("decisions", "reason = 'series_cancelled'")  # this one, and today's
    )


# --- snooze ---------------------------------------------------------------------------------------


def test_skip_this_week_on_a_weekly_series_never_pulls_next_week_forward(slack):
    series_id, anchor, key = _sent_occurrence("1w")
    before = _series_state(series_id)
    click = _click(key, "skip_week")  # hours: 24, much less than the week to the next one
    assert (click.outcome, click.reason) == ("accepted", "snooze")
    assert _occurrence(series_id, 1) is None  # not created early: its own time (a week on) holds it
    assert _series_state(series_id) == before == ("active", anchor + timedelta(weeks=1))
    _tick(datetime.now(UTC) + timedelta(hours=25))  # the old behaviour sent next week's here
    assert _occurrence(series_id, 1) is None


def test_snooze_holds_the_next_occurrence_to_now_plus_hours_when_that_is_later(slack):
    series_id, anchor, key = _sent_occurrence("1d")
    clicked_at = datetime.now(UTC)
    assert _click(key, "skip_week").reason == "snooze"  # 24 h from now is later than anchor + 1 day
    held = _occurrence(series_id, 1)
    assert held["state"] == "deferred"
    assert (
        clicked_at + timedelta(hours=24)
        <= held["due_at"]
        <= datetime.now(UTC) + timedelta(hours=24)
    )
    _tick(anchor + timedelta(days=1, seconds=1))  # its own due time: the tick leaves the hold alone
    assert _occurrence(series_id, 1) == held


def test_a_second_shorter_snooze_does_not_shorten_the_hold(slack):
    series_id, _ = _arm(every="1d")
    later = datetime.now(UTC) + timedelta(days=3)
    assert snooze_occurrence("ana", series_id, 1, later)
    assert snooze_occurrence("ana", series_id, 1, datetime.now(UTC) + timedelta(days=2))
    assert _occurrence(series_id, 1)["due_at"] == later


def test_snooze_on_a_cancelled_series_creates_and_sends_nothing(slack):
    series_id, _, key = _sent_occurrence("1d")
    assert cancel_series("ana", series_id)
    requests = count("requests")
    click = _click(key, "skip_week")
    assert (click.outcome, click.reason) == ("accepted", "snooze:not_applied")
    assert _state(key) == "answered"
    assert count("requests") == requests and _occurrence(series_id, 1) is None
    assert _series_state(series_id)[0] == "cancelled"
    assert not snooze_occurrence("ana", series_id, 1, datetime.now(UTC) + timedelta(days=1))


def test_a_snooze_waits_for_a_concurrent_cancel_and_then_holds_nothing(slack):
    series_id, _ = _arm(every="1d")
    result: list[bool] = []
    with engine().begin() as conn:
        assert cancel_series("ana", series_id, connection=conn)  # not committed yet
        snoozer = threading.Thread(
            target=lambda: result.append(
                snooze_occurrence("ana", series_id, 1, datetime.now(UTC) + timedelta(days=2))
            )
        )
        snoozer.start()
        assert _blocked_on_a_lock(), "the snooze did not wait on the cancelling transaction"
        assert result == []
    snoozer.join(30)
    assert result == [False]
    assert _occurrence(series_id, 1) is None


# --- look-alike series keys -----------------------------------------------------------------------


LOOK_ALIKES = [
    "series:abc",
    "series:1",
    "series:1:2:3",
    "series:01:0",
    "series:1:",
    "series: 1:0",
    "series:99999999999999999999:0",
    "bobs",
    "missing",
]


@pytest.mark.parametrize("answer", ["stop", "skip_week"])
@pytest.mark.parametrize("shape", LOOK_ALIKES)
def test_a_key_that_only_looks_like_a_series_changes_nothing_but_the_record(slack, shape, answer):
    bobs, _ = _arm("bob")  # a real series, of someone else
    ours, _ = _arm("ana", "1d")
    occurrence = {"bobs": f"series:{bobs}:0", "missing": f"series:{bobs + ours + 10}:0"}.get(
        shape, shape
    )
    key = _send_request(_request(occurrence))
    _expect_no_series(key, answer, {"stop": "stop_series", "skip_week": "snooze"}[answer])


def test_a_key_naming_a_series_of_another_type_changes_nothing(slack):
    ours, _ = _arm("ana", "1d")
    key = _send_request(
        _request(f"series:{ours}:0", type_key="stalled_plan", variables={"first_name": "Ana"})
    )
    _expect_no_series(key, "pause", "snooze")  # stalled_plan's "Pause for a month" is a snooze


def _expect_no_series(key: Key, answer: str, action: str) -> None:
    requests, series = count("requests"), rows("SELECT * FROM series ORDER BY id")
    click = _click(key, answer)
    assert (click.outcome, click.reason) == ("accepted", f"{action}:no_series")
    assert _state(key) == "answered"
    assert count("requests") == requests and rows("SELECT * FROM series ORDER BY id") == series
    assert _recorded() == [("accepted", f"{action}:no_series")]


@pytest.mark.parametrize(
    ("key", "parsed"),
    [
        ("series:12:0", (12, 0)),
        ("series:12:345", (12, 345)),
        ("series:abc", None),
        ("series:1", None),
        ("series:1:2:3", None),
        ("series:01:0", None),
        ("series:1:01", None),
        ("series:-1:0", None),
        ("series:1:0\n", None),
        ("series:١:0", None),
        ("event:series:1:0", None),
        ("series:0:0", None),
    ],
)
def test_series_keys_are_parsed_strictly(key, parsed):
    assert series_occurrence(key) == parsed


# --- clicks on deliveries that were never sent ----------------------------------------------------


def test_a_click_on_a_failed_delivery_is_not_sent_not_wrong_platform(slack):
    slack.deactivate("U1")
    series_id, _ = _arm()
    _tick()
    key = _send_request(_occurrence(series_id, 0)["id"])
    assert _state(key) == "failed"
    click = _click(key, "stop")
    assert (click.outcome, click.reason) == ("rejected", "not_sent")
    assert _state(key) == "failed" and _series_state(series_id)[0] == "active"
    assert _recorded() == [("rejected", "not_sent")]


def test_a_click_on_a_pending_delivery_is_not_sent(slack):
    series_id, _ = _arm()
    _tick()
    slack.fail("chat.postMessage", "internal_error")  # the route's send fails: pending, to retry
    assert route(["ana"], [_occurrence(series_id, 0)["id"]]) == 1
    [row] = rows("SELECT user_id, id FROM deliveries")
    key = (row["user_id"], row["id"])
    assert _state(key) == "pending"
    assert _click(key, "skip_week").reason == "not_sent"
    assert _click(key, "stop", slack_user="U2").reason == "foreign_user"  # still truthful first
    assert (
        handle_click("teams", "U1", json.dumps({"u": "ana", "d": key[1], "a": "stop"})).reason
        == "wrong_platform"
    )
    assert _state(key) == "pending" and _series_state(series_id)[0] == "active"
