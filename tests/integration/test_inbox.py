"""The in-app channel end to end on real PostgreSQL and Redis: notify → route (which sends what
it routes, in process) puts one item per delivery in the user's inbox; the feed pages by cursor,
counts unread, marks items (reading one moves its delivery to `read` through a receipt); a type on
[in_app, webhook] is two deliveries that both arrive; collapse followers count on the leader's
item, concurrently too, and on a leader routed but not yet delivered."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from clarion.adapters.inapp import InAppAdapter
from clarion.db import collapse_groups, inbox
from clarion.db.engine import engine
from clarion.errors import FaultInjected, PermanentSendError
from clarion.standins.receiver import Receiver
from clarion.tasks import inbox as app_inbox
from clarion.tasks import notify, register_recipient, runtime
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from tests.support.inbox import deliveries_of, delivery, items, routed, send
from tests.support.pipeline import (
    configure,
    expire_lease,
    publishing_to_this_tests_broker,
    rows,
)
from tests.support.race import held, race

pytestmark = pytest.mark.integration
CATALOG = Path(__file__).parents[1] / "catalog_inapp.yaml"


@pytest.fixture
def inapp(clarion_env, monkeypatch) -> Iterator[Receiver]:
    with Receiver(clarion_env.env["CLARION_WEBHOOK_SECRET"]) as receiver:
        configure(monkeypatch, catalog=CATALOG, webhook_url=receiver.url)
        register_recipient("ana", timezone="UTC")
        with publishing_to_this_tests_broker():
            yield receiver


def stranded(
    monkeypatch: pytest.MonkeyPatch, user: str, type_key: str, event: str, **variables: str
) -> list[tuple[str, int]]:
    """notify + a route that dies right after its commit (fault `route.after_commit`): its
    deliveries are written, claimed by a task that is gone, and nothing is sent. Their lease then
    lapses (expire_lease), so the next deliver task takes them over and sends them: a delivery
    routed but not yet delivered, as a follower may find its leader."""
    request = notify(user, type_key, event_id=event, variables=variables)
    configure(monkeypatch, faults="route.after_commit=raise")
    try:
        with pytest.raises(FaultInjected, match=r"^route\.after_commit$"):
            route([user], [request.request_id])
    finally:
        configure(monkeypatch, faults="")
    keys = deliveries_of(user, request.request_id)
    for key in keys:
        assert delivery(key)["state"] == "claimed"
        expire_lease(key)
    assert items(user) == []
    return keys


def test_a_notification_becomes_one_inbox_item_and_a_repeat_adds_none(inapp):
    [key] = send("ana", "inbox_note", "e1", n="1")
    [item] = items()
    assert item["delivery_id"] == key[1] and item["title"] == "Note 1" and item["count"] == 1
    assert delivery(key) == {
        "state": "sent",
        "platform": "in_app",
        "provider_message_id": str(item["id"]),
    }
    page = app_inbox.feed("ana")
    assert [i.id for i in page.items] == [item["id"]] and page.unread == 1
    assert page.items[0].to_json()["body"] == "Something happened (1)."

    # the same delivery again (a takeover resending under its key): the store finds its item
    adapter = runtime.adapters()["in_app"]
    assert isinstance(adapter, InAppAdapter)
    again = adapter.store.put(adapter.to_request(_message(key)))
    assert (again.item_id, again.new) == (item["id"], False)
    assert adapter.from_response(_message(key), again).repeat is True
    assert len(items()) == 1
    assert deliver([key[0]], [key[1]]) == 0  # and a redelivered task does not even claim it
    assert len(items()) == 1


def _message(key: tuple[str, int]):
    from clarion.records import Message

    return Message(key[1], key[0], "inbox_note", "event:e1", "in_app", {"title": "Note 1"})


def test_an_item_without_content_fails_for_good():
    from clarion.adapters.inapp import to_request
    from clarion.records import Message

    with pytest.raises(PermanentSendError, match=r"^empty: type t renders no title or body$"):
        to_request(Message(1, "u", "t", "o", "in_app", {"title": "", "body": ""}))


def test_the_feed_pages_by_cursor_newest_first(inapp):
    for n in range(7):
        send("ana", "inbox_note", f"e{n}", n=str(n))
    ids = [i["id"] for i in items()]
    first = app_inbox.feed("ana", limit=3)
    assert [i.id for i in first.items] == ids[::-1][:3] and first.next == ids[-3]
    second = app_inbox.feed("ana", before_id=first.next, limit=3)
    assert [i.id for i in second.items] == ids[::-1][3:6]
    last = app_inbox.feed("ana", before_id=second.next, limit=3)
    assert [i.id for i in last.items] == [ids[0]] and last.next is None
    assert app_inbox.feed("bob").items == []  # another user's inbox is their own


def test_marks_seen_read_archived_and_the_unread_count(inapp):
    keys = [send("ana", "inbox_note", f"e{n}", n=str(n))[0] for n in range(4)]
    a, b, c, d = [i["id"] for i in items()]
    assert app_inbox.unread_count("ana") == 4
    assert app_inbox.mark("ana", [a, b], "seen") == [a, b]
    assert app_inbox.mark("ana", [a], "seen") == []  # already seen: nothing changes
    assert app_inbox.unread_count("ana") == 4  # seen is not read
    assert sorted(app_inbox.mark("ana", [a, c], "read")) == [a, c]
    assert app_inbox.unread_count("ana") == 2
    assert app_inbox.mark("bob", [b], "read") == []  # not bob's item
    assert app_inbox.mark("ana", [d], "archived") == [d]
    assert app_inbox.unread_count("ana") == 1  # an archived item is not counted
    assert [i.id for i in app_inbox.feed("ana").items] == [c, b, a]
    assert [i.id for i in app_inbox.feed("ana", include_archived=True).items] == [d, c, b, a]
    assert app_inbox.mark_all_read("ana") == [b]  # the archived one stays unread
    assert app_inbox.unread_count("ana") == 0

    # each read item moved its delivery sent -> read, by a receipt row
    states = [delivery(k)["state"] for k in keys]
    assert states == ["read", "read", "read", "sent"]
    receipts = rows("SELECT delivery_id, event, outcome, provider_message_id FROM receipts")
    assert sorted((r["delivery_id"], r["event"], r["outcome"]) for r in receipts) == [
        (k[1], "read", "applied") for k in keys[:3]
    ]
    assert {r["provider_message_id"] for r in receipts} == {str(a), str(b), str(c)}


def test_a_type_on_in_app_and_webhook_gives_two_deliveries_that_both_arrive(inapp):
    receiver = inapp
    keys = send("ana", "inbox_fanout", "order-1", order="A-1")
    assert len(keys) == 2
    channels = rows("SELECT channel, state FROM deliveries ORDER BY channel")
    assert channels == [
        {"channel": "in_app", "state": "sent"},
        {"channel": "webhook", "state": "sent"},
    ]
    assert [i["title"] for i in items()] == ["Order A-1"]
    assert receiver.arrivals.unique == 1 and receiver.arrivals.total == 1


def test_collapse_followers_count_on_the_leaders_item(inapp):
    send("ana", "inbox_alert", "a0", host="h0", cluster="prod")
    for n in (1, 2, 3):
        assert routed("ana", "inbox_alert", f"a{n}", host=f"h{n}", cluster="prod") == []
    routed("ana", "inbox_alert", "s1", host="x", cluster="staging")  # another group
    [item] = [i for i in items() if i["title"] == "CPU high in prod"]
    assert item["count"] == 4
    assert app_inbox.feed("ana").items[-1].to_json()["more"] == 3


def test_followers_before_the_leader_is_delivered_are_counted_when_it_is(inapp, monkeypatch):
    [leader] = stranded(monkeypatch, "ana", "inbox_alert", "a0", host="h0", cluster="prod")
    assert routed("ana", "inbox_alert", "a1", host="h1", cluster="prod") == []
    assert deliver([leader[0]], [leader[1]]) == 1
    routed("ana", "inbox_alert", "a2", host="h2", cluster="prod")
    assert [i["count"] for i in items()] == [3]


def _blocked_on_a_lock(query_like: str, deadline: float = 10.0) -> bool:
    """Is another backend waiting on a lock while running a statement like `query_like`?"""
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        with engine().connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE :q"
                ),
                {"q": query_like},
            ).scalar_one()
        if waiting:
            return True
        time.sleep(0.02)
    return False


def test_a_follower_folding_in_while_the_leader_is_stored_is_not_lost(inapp, monkeypatch):
    """The leader's insert reads the group's count: it must wait for a follower whose fold has
    updated the group but not committed (else it starts at the old count and the follower's
    fold finds no item). Hold the follower's transaction open and show the insert blocked."""
    from clarion import clock

    [leader] = stranded(monkeypatch, "ana", "inbox_alert", "a0", host="h0", cluster="prod")
    with engine().connect() as held:
        tx = held.begin()
        collapse_groups.join_collapse(
            held, "ana", key="cpu:prod", now=clock.now()
        )  # as gates.apply does
        assert inbox.fold_follower(held, "ana", key="cpu:prod", now=clock.now()) is None
        sent: list[int] = []
        worker = threading.Thread(target=lambda: sent.append(deliver([leader[0]], [leader[1]])))
        worker.start()
        assert _blocked_on_a_lock("%INSERT INTO inbox_items%")
        tx.commit()
    worker.join(30)
    assert sent == [1]
    assert [i["count"] for i in items()] == [2]


def test_a_follower_routed_while_the_leader_is_being_stored_is_not_lost(inapp, monkeypatch):
    """The other order: the leader's item is inserted but not committed; the follower's fold
    waits for it (the group row), then counts on the item it can now see."""
    from clarion import clock

    [leader] = stranded(monkeypatch, "ana", "inbox_alert", "a0", host="h0", cluster="prod")
    with engine().connect() as held:
        tx = held.begin()
        inbox.insert_item(
            held,
            user_id="ana",
            delivery_id=leader[1],
            type_key="inbox_alert",
            title="CPU high in prod",
            body="",
            data={},
            collapse_key="cpu:prod",
            now=clock.now(),
        )
        worker = threading.Thread(
            target=lambda: routed("ana", "inbox_alert", "a1", host="h1", cluster="prod")
        )
        worker.start()
        assert _blocked_on_a_lock("%collapse_groups%")
        tx.commit()
    worker.join(30)
    assert [i["count"] for i in items()] == [2]


def _follow(n: int) -> int:
    request = notify(
        "ana", "inbox_alert", event_id=f"r{n}", variables={"host": f"h{n}", "cluster": "prod"}
    )
    return route(["ana"], [request.request_id])


def test_concurrent_followers_all_count(inapp):
    send("ana", "inbox_alert", "a0", host="h0", cluster="prod")
    # the group's row is held until all six followers queue on it: then they count at once
    lock = "SELECT 1 FROM collapse_groups WHERE user_id = 'ana' FOR UPDATE"
    with held(lock, {}, waiters=6) as queued:
        followed = race(6, _follow, lambda i: (i,))
    assert queued.waiters == 6 and queued.all_in("collapse_groups"), queued.statements
    assert followed == [1] * 6
    assert [i["count"] for i in items()] == [7]
    assert rows("SELECT count FROM collapse_groups") == [{"count": 7}]
