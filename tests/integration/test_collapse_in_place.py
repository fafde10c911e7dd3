"""Collapse in place: followers of a collapse group keep the leader's message showing the group's
running count — Slack chat.update, a Teams card refresh, the in-app item's count — through the
update job (tasks/refresh.py), with real PostgreSQL and Redis, the real slack_sdk and
botframework-connector against local stand-ins, the pipeline run in-process on an injected clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from slack_sdk import WebClient

from clarion.adapters.teams import ConversationRef
from clarion.errors import PermanentSendError
from clarion.records import ButtonValue, Message
from clarion.standins.fake_connector import FakeConnector
from clarion.standins.fake_slack import FakeSlack
from clarion.tasks import notify, register_recipient, runtime
from clarion.tasks.deliver import deliver
from clarion.tasks.inbox import feed
from clarion.tasks.interactions import handle_click
from clarion.tasks.refresh import refresh_due
from clarion.tasks.route import route
from clarion.web.slack import show_answer
from tests.support.environment import ROOT
from tests.support.pipeline import (
    Clock,
    configure,
    count,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

CATALOG = ROOT / "tests" / "catalog_collapse.yaml"
START = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
OPEN = "CRITICAL: CPU alerts on {n} hosts (and counting)"
CLOSED = "CRITICAL: CPU alerts on {n} hosts"


@pytest.fixture
def fake() -> Iterator[FakeSlack]:
    with FakeSlack() as server:
        yield server


@pytest.fixture
def connector() -> Iterator[FakeConnector]:
    with FakeConnector() as server:
        yield server


@pytest.fixture
def env(clarion_env, fake, monkeypatch) -> Iterator[Clock]:
    configure(
        monkeypatch,
        catalog=CATALOG,
        slack_token=FakeSlack.TOKEN,
        slack_api_url=fake.api_url,
        teams_app_id="none",
    )
    with publishing_to_this_tests_broker(), frozen_clock(START) as clock:
        yield clock
        drain("transactional")


def alert(user: str, n: int, type_key: str = "cpu_alert", cluster: str = "prod") -> int:
    """Notify and route one alert at the clock's time; the route sends what it made itself."""
    request = notify(
        user, type_key, event_id=f"{user}-{n}", variables={"host": f"h{n}", "cluster": cluster}
    )
    route([user], [request.request_id])
    return request.request_id


def deliver_pending() -> int:
    """Deliver what is left pending (the route sends its deliveries itself: a retry, here)."""
    found = rows("SELECT user_id, id FROM deliveries WHERE state = 'pending' ORDER BY id")
    return deliver([r["user_id"] for r in found], [r["id"] for r in found]) if found else 0


def title(text: str) -> str:
    return text.split("\n")[0]


def test_followers_update_the_leaders_slack_message_to_the_running_count(env, fake):
    register_recipient("ana", timezone="Europe/Berlin", addresses={"slack": "U1"})
    leader = alert("ana", 0)
    assert rows("SELECT state FROM deliveries") == [{"state": "sent"}]  # by the route
    [post] = fake.posts()
    assert post.text == "CRITICAL: CPU alerts on 1 host\nFirst: h0 in prod"
    for n in range(1, 5):
        env.advance(1)
        alert("ana", n)
    assert rows("SELECT reason, detail FROM decisions ORDER BY id")[0]["detail"].startswith(
        f"collapsed into request {leader} "
    )  # the follower's decision is unchanged: collapsed into the leader
    assert count("decisions", "reason = 'collapsed'") == 4 and count("deliveries") == 1
    env.advance(5)  # 10:00:09: the first follower (10:00:01) owes an update by 10:00:21
    assert refresh_due() == 0 and post.update_texts == []
    env.now = START.replace(second=21)
    assert refresh_due() == 1
    assert title(post.update_texts[-1]) == OPEN.format(n=5)
    assert post.updates[-1][-1]["type"] == "actions"  # the buttons stay
    assert refresh_due() == 0  # nothing more is owed until the window closes
    env.now = START.replace(minute=1)  # 10:01:00, the window's end: the closing update
    assert refresh_due() == 1
    assert title(post.update_texts[-1]) == CLOSED.format(n=5)
    assert count("collapse_refreshes", "due_at IS NOT NULL") == 0  # the final count is shown
    env.advance(30)
    assert refresh_due() == 0
    assert len(fake.called("chat.update")) == 2 and len(fake.posts()) == 1


def test_followers_inside_one_spacing_make_one_update_and_a_repeat_changes_nothing(env, fake):
    register_recipient("ana", timezone="Europe/Berlin", addresses={"slack": "U1"})
    alert("ana", 0)
    assert deliver_pending() == 0  # the route sent the leader: nothing is left pending
    for n in range(1, 40):  # 39 followers in 19.5 s, all inside one update_seconds (20)
        env.advance(0.5)
        alert("ana", n)
    env.now = START.replace(second=21)
    assert refresh_due() == 1
    assert refresh_due() == 0
    [post] = fake.posts()
    assert [title(t) for t in post.update_texts] == [OPEN.format(n=40)]


def test_an_update_waits_for_the_leader_to_be_sent(env, fake):
    register_recipient("ana", timezone="Europe/Berlin", addresses={"slack": "U1"})
    # the route's send of the leader fails transiently: routed, not delivered yet (a retry is due
    # in about 2 s)
    fake.fail("chat.postMessage", "internal_error")
    alert("ana", 0)
    assert rows("SELECT state, attempts FROM deliveries") == [{"state": "pending", "attempts": 1}]
    assert fake.posts() == []
    env.advance(1)
    alert("ana", 1)
    env.now = START.replace(second=21)
    assert refresh_due() == 0
    [owed] = rows("SELECT count, shown, due_at, lease_until FROM collapse_refreshes")
    assert (owed["count"], owed["shown"], owed["lease_until"]) == (2, 1, None)
    assert owed["due_at"] == START.replace(second=41)  # asked again one spacing later
    assert deliver_pending() == 1
    [post] = fake.posts()
    assert title(post.text) == "CRITICAL: CPU alerts on 1 host"  # the first send renders 1
    env.now = START.replace(second=41)
    assert refresh_due() == 1
    assert title(post.update_texts[-1]) == OPEN.format(n=2)


def test_an_answered_leader_keeps_its_answer_and_its_count(env, fake):
    register_recipient("ana", timezone="Europe/Berlin", addresses={"slack": "U1"})
    alert("ana", 0)
    assert deliver_pending() == 0  # the route sent the leader: nothing is left pending
    [delivery] = rows("SELECT user_id, id FROM deliveries")
    clicked = handle_click("slack", "U1", ButtonValue("ana", delivery["id"], "ack").encode())
    assert clicked.outcome == "accepted"
    env.advance(1)
    alert("ana", 1)
    env.now = START.replace(second=21)
    assert refresh_due() == 1
    [post] = fake.posts()
    assert title(post.update_texts[-1]) == OPEN.format(n=2)
    assert post.updates[-1][-1]["elements"][0]["text"] == "Answered: Acknowledge"
    env.now = START.replace(minute=1)
    assert refresh_due() == 1  # closing
    client = WebClient(token=FakeSlack.TOKEN, base_url=fake.api_url)
    again = handle_click("slack", "U1", ButtonValue("ana", delivery["id"], "ack").encode())
    assert again.outcome == "repeated" and show_answer(client, again)  # as /slack/events does
    assert title(post.update_texts[-1]) == CLOSED.format(n=2)  # not "1 host"


def test_finished_rows_are_kept_a_day_after_their_window_then_deleted(env, fake):
    register_recipient("ana", timezone="Europe/Berlin", addresses={"slack": "U1"})
    alert("ana", 0)
    assert deliver_pending() == 0  # the route sent the leader: nothing is left pending
    env.advance(1)
    alert("ana", 1)
    env.now = START.replace(minute=1)
    assert refresh_due() == 1
    assert rows("SELECT count, shown, due_at FROM collapse_refreshes") == [
        {"count": 2, "shown": 2, "due_at": None}
    ]
    env.now = START + timedelta(days=1, minutes=1, seconds=1)
    assert refresh_due() == 0
    assert count("collapse_refreshes") == 0


def test_updates_keep_to_the_workspace_chat_update_budget(env, fake, monkeypatch):
    """3 chat.update a minute (clarion spends 90%: 2) and five leaders owed one update each: two
    go, three wait for the budget — owed again, never dropped — and Slack, limiting chat.update
    to 3 a minute on its side, refuses none."""
    configure(monkeypatch, slack_updates_per_minute=3)
    fake.limit("chat.update", 3, 60.0)
    users = [f"u{n}" for n in range(5)]
    for n, user in enumerate(users):
        register_recipient(user, timezone="UTC", addresses={"slack": f"U{n}"})
        alert(user, 0)
    assert deliver_pending() == 0  # the routes sent the leaders: nothing is left pending
    env.advance(1)
    for user in users:
        alert(user, 1)
    env.now = START.replace(second=21)
    assert refresh_due() == 2
    assert len(fake.called("chat.update", ok=True)) == 2 and fake.throttled("chat.update") == 0
    waiting = rows("SELECT due_at, lease_until FROM collapse_refreshes WHERE shown = 1")
    assert len(waiting) == 3
    assert all(r["lease_until"] is None and START.replace(second=21) < r["due_at"] for r in waiting)
    assert refresh_due() == 0  # not before the budget has room


def test_a_teams_leader_card_is_refreshed_in_its_conversation(env, connector):
    reference = ConversationRef(connector.url, "a:conv-mia", "tenant-1").to_json()
    register_recipient(
        "mia",
        timezone="UTC",
        addresses={"teams": "29:mia", "teams_conversation": reference},
    )
    alert("mia", 0, "cpu_alert_teams")
    assert rows("SELECT state FROM deliveries") == [{"state": "sent"}]  # by the route
    assert len(connector.sent) == 1
    for n in range(1, 3):
        env.advance(1)
        alert("mia", n, "cpu_alert_teams")
    env.now = START.replace(second=21)
    assert refresh_due() == 1
    [sent] = connector.sent
    [update] = connector.updates
    assert (update.conversation_id, update.activity_id) == ("a:conv-mia", sent.answer_id)
    texts = [b.get("text") for b in update.card["body"]]
    assert OPEN.format(n=3) in texts
    assert update.card.get("actions")  # the buttons stay


def test_an_in_app_item_counts_in_place_and_its_text_follows(env):
    register_recipient("ivy", timezone="UTC")
    alert("ivy", 0, "cpu_alert_inbox")
    assert rows("SELECT state FROM deliveries") == [{"state": "sent"}]  # by the route
    for n in range(1, 4):
        env.advance(1)
        alert("ivy", n, "cpu_alert_inbox")
    [item] = feed("ivy").items
    assert (item.count, item.to_json()["more"]) == (4, 3)  # counted in the routing transaction
    assert item.title == "CRITICAL: CPU alerts on 1 host"
    rev = item.rev
    env.now = START.replace(second=21)
    assert refresh_due() == 1
    [item] = feed("ivy").items
    assert (item.title, item.count) == (OPEN.format(n=4), 4)
    assert item.rev > rev  # a change an open stream is sent (`updated`)
    env.now = START.replace(minute=1)
    assert refresh_due() == 1
    assert feed("ivy").items[0].title == CLOSED.format(n=4)
    assert count("collapse_refreshes", "due_at IS NOT NULL") == 0


def test_the_in_app_update_refuses_an_item_it_does_not_have(env):
    register_recipient("ivy", timezone="UTC")
    adapter = runtime.adapters()["in_app"]
    message = Message(1, "ivy", "cpu_alert_inbox", "o", "in_app", {"title": "t", "body": "b"})
    with pytest.raises(PermanentSendError, match="no_item"):
        adapter.update(message, "987654")
    with pytest.raises(PermanentSendError, match="bad_message_id"):
        adapter.update(message, "D1:1.0001")
