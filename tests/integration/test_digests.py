"""Digests against real PostgreSQL, driven in-process with an injected clock.

Items of a digested type are buffered (each with the decision `digested into request N`); the
window's digest request is found by the beat tick when the window closes, or made due at once when
max_items is reached, and goes back through the router: preferences, quiet hours and caps apply to
the digest. The summariser's failures give the fallback line, within its timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text

from clarion import settings
from clarion.ops.explain import explain
from clarion.standins.receiver import Receiver
from clarion.tasks import notify, register_recipient
from clarion.tasks.preferences import set_preferences
from clarion.tasks.route import route
from clarion.tasks.tick import tick
from tests.support import summarisers
from tests.support.digests import digest_requests, digested_into, flush_due, use_digest_catalog
from tests.support.gates import (
    VirtualClock,
    decisions_of,
    deliveries_of,
    fresh_event,
    rows,
    send_and_route,
)
from tests.support.pipeline import configure
from tests.support.race import waiting_on

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


@pytest.fixture
def vclock() -> Iterator[VirtualClock]:
    c = VirtualClock(T0)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def receiver(clarion_env, monkeypatch) -> Iterator[Receiver]:
    use_digest_catalog(monkeypatch)
    with Receiver(settings.get().webhook_secret) as running:
        configure(monkeypatch, webhook_url=running.url)
        yield running


def _replies(user: str, sellers: list[str]) -> list[int]:
    return [send_and_route(user, "seller_replied", {"seller": s}) for s in sellers]


def _arrived(receiver: Receiver, type_key: str = "replies_digest") -> list[dict]:
    with receiver.arrivals.lock:
        return [
            receiver.arrivals.contents[key]
            for key in receiver.arrivals.by_key
            if f"/{type_key}/" in key or type_key in str(receiver.arrivals.contents[key])
        ]


def test_items_are_buffered_and_one_digest_goes_back_through_the_router(receiver, vclock):
    register_recipient("ada", timezone="Europe/Berlin")
    sellers = ["ann", "bob", "ann", "cat", "bob", "ann", "cat"]
    made = []
    for seller in sellers:
        made += _replies("ada", [seller])
        vclock.advance(minutes=5)
    [digest] = digest_requests("ada")
    assert (digest["state"], digest["due_at"]) == ("deferred", T0 + timedelta(hours=1))
    for request_id in made:
        assert deliveries_of("ada", request_id) == []
        [(gate, outcome, reason, _, detail)] = decisions_of("ada", request_id)
        assert (gate, outcome, reason) == ("digest", "digest", "digested")
        assert detail.startswith(f"digested into request {digest['id']} (replies_digest")
    assert flush_due() == []  # 10:35: not due yet
    vclock.set(T0 + timedelta(hours=1))
    assert flush_due() == [digest["id"]]
    [digest] = digest_requests("ada")
    assert digest["state"] == "routed"
    assert digest["variables"]["summary"] == "3 sellers replied to you (7 new messages)"
    assert [i["request_id"] for i in digest["variables"]["items"]] == made
    assert [s for _, _, s in deliveries_of("ada", digest["id"])] == ["sent"]
    [content] = receiver.arrivals.contents.values()
    assert content["body"] == "3 sellers replied to you (7 new messages)"
    assert content["items"].split() == [str(i) for i in made]
    # explain answers "why didn't I get each reply?" with the digest that carried it
    text = explain("ada", type_key="seller_replied")
    assert text.count(f"digested into request {digest['id']}") == len(made)


def test_an_item_after_the_close_opens_the_next_window(receiver, vclock):
    register_recipient("bo", timezone="UTC")
    [first] = _replies("bo", ["ann"])
    vclock.set(T0 + timedelta(hours=1, seconds=1))
    flush_due()
    [late] = _replies("bo", ["bob"])
    old, new = digest_requests("bo")
    assert digested_into("bo", first) == old["id"] and digested_into("bo", late) == new["id"]
    assert (new["state"], new["due_at"]) == ("deferred", T0 + timedelta(hours=2, seconds=1))
    assert old["variables"]["count"] == 1


def test_max_items_flushes_at_once_and_the_next_item_opens_a_new_window(receiver, vclock):
    register_recipient("cy", timezone="UTC")
    made = _replies("cy", [f"s{n}" for n in range(10)])  # max_items is 10
    [full] = digest_requests("cy")
    assert full["due_at"] == T0  # due now, not in an hour
    [extra] = _replies("cy", ["s10"])
    assert digested_into("cy", extra) != full["id"]
    assert {digested_into("cy", r) for r in made} == {full["id"]}
    assert flush_due() == [full["id"]]
    sent = digest_requests("cy")[0]
    assert sent["variables"]["count"] == 10
    assert sent["variables"]["summary"] == "10 sellers replied to you (10 new messages)"
    assert len(receiver.arrivals.contents) == 1


def test_preferences_and_quiet_hours_apply_to_the_digest(receiver, vclock):
    register_recipient("di", timezone="UTC")
    register_recipient("ed", timezone="UTC", quiet_hours=("10:30", "12:00"))
    set_preferences("di", {"type:replies_digest/webhook": False})
    for user in ("di", "ed"):
        _replies(user, ["ann", "bob"])
    vclock.set(T0 + timedelta(hours=1))
    flush_due()
    [di] = digest_requests("di")
    assert [r for _, _, r, _, _ in decisions_of("di", di["id"])] == ["opted_out", "no_channel"]
    [ed] = digest_requests("ed")
    assert [r for _, _, r, _, _ in decisions_of("ed", ed["id"])] == ["quiet_hours"]
    assert ed["state"] == "deferred" and ed["variables"]["count"] == 2
    # an item arriving while the digest waits out quiet hours goes into the next window
    [later] = _replies("ed", ["cat"])
    assert digested_into("ed", later) != ed["id"]
    vclock.set(datetime(2026, 12, 7, 12, 0, tzinfo=UTC))
    flush_due()
    assert [s for _, _, s in deliveries_of("ed", ed["id"])] == ["sent"]
    assert digest_requests("ed")[0]["variables"]["count"] == 2
    assert receiver.arrivals.unique == 2  # the quiet-hours digest, and the window opened at 11:00


def test_the_fatigue_cap_applies_to_digests_not_to_their_items(receiver, vclock):
    register_recipient("jo", timezone="UTC")  # the catalog caps 3 a day, overflow summarised
    for _ in range(4):
        _replies("jo", [f"s{n}" for n in range(10)])  # each ten flush one digest at once
        flush_due()
    states = [[s for _, _, s in deliveries_of("jo", d["id"])] for d in digest_requests("jo")]
    assert states == [["sent"]] * 3 + [[]]
    fourth = digest_requests("jo")[3]
    assert [r for _, _, r, _, _ in decisions_of("jo", fourth["id"])] == ["fatigue_cap"]
    assert len(receiver.arrivals.contents) == 3


def test_a_daily_window_closes_at_the_recipients_local_time(receiver, vclock):
    register_recipient("fu", timezone="Asia/Tokyo")  # 19:00 in Tokyo at T0
    request = send_and_route("fu", "standup_note", {"team": "core"})
    [digest] = digest_requests("fu", "morning_digest")
    assert digest["due_at"] == datetime(2026, 12, 7, 23, 0, tzinfo=UTC)  # 08:00 on the 8th
    other = send_and_route("fu", "standup_note", {"team": "web"})  # another key: its own window
    assert digested_into("fu", other) != digested_into("fu", request)


def test_a_daily_digest_is_sent_once_when_08_00_passes_in_the_recipients_zone(receiver, vclock):
    """Items buffered through a New York day go out as one digest when the clock passes 08:00
    there the next morning (13:00 UTC); 08:00 UTC, and 07:59:59 in New York, send nothing."""
    new_york = ZoneInfo("America/New_York")
    register_recipient("gil", timezone="America/New_York")

    def at(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
        return datetime(2026, 12, day, hour, minute, second, tzinfo=new_york).astimezone(UTC)

    made = []
    for when in (at(7, 9), at(7, 12, 30), at(7, 17, 45), at(7, 23, 50), at(8, 3, 30)):
        vclock.set(when)  # the last one is 08:30 UTC: past 08:00 in UTC, not in New York
        made.append(send_and_route("gil", "standup_note", {"team": "core"}))
        assert flush_due() == []
    [digest] = digest_requests("gil", "morning_digest")
    assert digest["due_at"] == at(8, 8) == datetime(2026, 12, 8, 13, 0, tzinfo=UTC)
    vclock.set(at(8, 7, 59, 59))
    assert flush_due() == [] and receiver.arrivals.total == 0
    vclock.set(at(8, 8, 0, 1))
    assert flush_due() == [digest["id"]]
    vclock.set(at(8, 9))
    assert flush_due() == []  # a later tick sends nothing more
    assert receiver.arrivals.total == 1  # counted at the receiver: one digest, once
    [content] = receiver.arrivals.contents.values()
    assert content["body"] == "5 new updates"
    assert content["items"].split() == [str(i) for i in made]  # every item, in order
    assert [digested_into("gil", r) for r in made] == [digest["id"]] * len(made)
    assert [s for _, _, s in deliveries_of("gil", digest["id"])] == ["sent"]
    text = explain("gil", type_key="standup_note")
    assert text.count(f"digested into request {digest['id']}") == len(made)


def _flush_one(user: str, type_key: str) -> tuple[dict, float]:
    vclock_now = rows("SELECT max(due_at) FROM requests WHERE user_id = :u", u=user)[0][0]
    from clarion import clock

    clock.set_source(lambda: vclock_now)
    started = time.monotonic()
    flush_due()
    took = time.monotonic() - started
    return digest_requests(user, type_key)[-1], took


@pytest.mark.parametrize(
    ("type_key", "variables", "why"),
    [
        ("stalled_note", {}, "timeout"),
        ("raising_note", {}, "error"),
        ("ai_note", {"kind": "long"}, "junk"),
        ("ai_note", {"kind": "empty"}, "junk"),
        ("ai_note", {"kind": "bytes"}, "junk"),
        ("ai_note", {"kind": "none"}, "junk"),
        ("ai_note", {"kind": "lines"}, "junk"),
    ],
)
def test_a_summariser_that_fails_gives_the_fallback_and_the_digest_is_sent(
    receiver, vclock, type_key, variables, why
):
    register_recipient("gus", timezone="UTC")
    send_and_route("gus", type_key, variables)
    send_and_route("gus", type_key, variables)
    try:
        digest, took = _flush_one("gus", "ai_digest")
    finally:
        summarisers.RELEASE.set()
    assert digest["variables"]["summary"] == "2 new updates"
    assert digest["variables"]["summary_source"] == why
    assert took < 0.5 + 1.5, f"the route waited {took:.2f} s on a 0.5 s summariser timeout"
    assert [s for _, _, s in deliveries_of("gus", digest["id"])] == ["sent"]
    [content] = receiver.arrivals.contents.values()
    assert content["body"] == "2 new updates"


def test_a_summariser_line_within_the_limits_is_used(receiver, vclock):
    register_recipient("hal", timezone="UTC")
    send_and_route("hal", "ai_note", {"kind": "good"})
    digest, _ = _flush_one("hal", "ai_digest")
    assert (digest["variables"]["summary"], digest["variables"]["summary_source"]) == (
        "Two notes about builds",
        "summariser",
    )


def test_notify_of_a_digested_type_checks_its_variables_as_any_type(receiver, vclock):
    from clarion.errors import ClarionError

    register_recipient("ivy", timezone="UTC")
    with pytest.raises(ClarionError, match="seller"):
        notify("ivy", "seller_replied", event_id=fresh_event(), variables={})
    assert digest_requests("ivy") == []


def _blocked_on(held, statement: str) -> bool:
    """Does a backend running `statement` wait on a lock that `held`'s transaction holds?"""
    pid = held.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return any(statement in query for query in waiting_on(pid, within=10))


def test_an_item_meeting_an_uncommitted_close_waits_and_opens_the_next_window(receiver, vclock):
    """Hold the flush's transaction open after it resolved the digest request and closed its
    window: the item's join waits on
    the window's row, then (the close committed) finds it closed and opens the next window."""
    from clarion.db import ledger
    from clarion.db.engine import engine
    from clarion.tasks import runtime
    from clarion.tasks.flush import close_windows

    register_recipient("kit", timezone="UTC")
    [first] = _replies("kit", ["ann"])
    old = digested_into("kit", first)
    vclock.set(T0 + timedelta(hours=1))
    tick()
    joined: list[int] = []
    with engine().connect() as held:
        tx = held.begin()
        resolved = ledger.resolve_requests(held, [("kit", old)], now=vclock.now)
        [closed] = close_windows(held, resolved, runtime.catalog(), now=vclock.now)
        assert closed.variables["count"] == 1  # its window closed, the items filled in
        worker = threading.Thread(target=lambda: joined.extend(_replies("kit", ["bob"])))
        worker.start()
        assert _blocked_on(held, "INSERT INTO digests")
        tx.commit()
    worker.join(30)
    assert digested_into("kit", joined[0]) not in (None, old)
    assert [i["request_id"] for i in digest_requests("kit")[0]["variables"]["items"]] == [first]


def test_a_close_meeting_an_uncommitted_item_waits_and_carries_it(receiver, vclock):
    """The other order: the item joined but has not committed; the close waits on the row, then
    returns the item with the others."""
    from clarion.db import digests as digest_rows
    from clarion.db.engine import engine

    register_recipient("lin", timezone="UTC")
    [first] = _replies("lin", ["ann"])
    old = digested_into("lin", first)
    vclock.set(T0 + timedelta(hours=1))
    tick()
    with engine().connect() as held:
        tx = held.begin()
        late = notify("lin", "seller_replied", event_id="late", variables={"seller": "bob"})
        joined = digest_rows.join(
            held,
            "lin",
            digest_type="replies_digest",
            digest_key="",
            lane="activation",
            version=1,
            item={"seller": "bob", "request_id": late.request_id},
            max_items=10,
            due_at=T0 + timedelta(hours=2),
            now=vclock.now,
        )
        assert joined.request_id == old and not joined.opened
        flushed: list[int] = []
        worker = threading.Thread(target=lambda: flushed.append(route(["lin"], [old])))
        worker.start()
        assert _blocked_on(held, "UPDATE digests d SET state = 'closed'")
        tx.commit()
    worker.join(30)
    assert flushed == [1]
    items = digest_requests("lin")[0]["variables"]["items"]
    assert [i["request_id"] for i in items] == [first, late.request_id]


def test_the_dry_run_shows_the_digest_step_and_writes_nothing(receiver, vclock):
    from clarion.tasks.planning import preview

    register_recipient("max", timezone="UTC")
    before = rows("SELECT (SELECT count(*) FROM digests), (SELECT count(*) FROM requests)")
    planned = preview("max", "seller_replied", event_id="e1", variables={"seller": "ann"})
    assert planned.outcome == "digest"
    assert [(s.gate, s.reason) for s in planned.decisions] == [("digest", "digested")]
    assert "replies_digest digest" in planned.decisions[0].detail
    assert rows("SELECT (SELECT count(*) FROM digests), (SELECT count(*) FROM requests)") == before


def test_a_producer_holding_the_digest_occurrence_key_does_not_stop_the_digest(receiver, vclock):
    register_recipient("ned", timezone="UTC")
    variables = {"count": 0, "items": [], "summary": "mine"}
    next_id = rows("SELECT coalesce(max(id), 0) + 1 FROM digests")[0][0]
    notify("ned", "replies_digest", occurrence_key=f"digest:{next_id}", variables=variables)
    [item] = _replies("ned", ["ann"])
    own, digest = digest_requests("ned")
    assert digested_into("ned", item) == digest["id"] != own["id"]
    key = rows("SELECT occurrence_key FROM requests WHERE id = :d", d=digest["id"])[0][0]
    assert key == f"digest:{next_id}+1"
