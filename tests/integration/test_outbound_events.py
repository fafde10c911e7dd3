"""Outbound events (issue 25): the outbox written by triggers with the change it reports, and
their delivery to an app's endpoint (the stand-in standins/fake_app_endpoint.py), signed per
Standard Webhooks, ordered per delivery, backed off, disabled after a day, replayed.

Everything about delivery is counted at the stand-in; the injected clock drives backoff and the
day of failures (tasks.events.dispatch takes it)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import standardwebhooks
from sqlalchemy import text

from clarion.db import outbound
from clarion.db.engine import engine
from clarion.standins.fake_app_endpoint import FakeAppEndpoint
from clarion.standins.receiver import Receiver
from clarion.tasks import event_endpoints, notify, register_recipient
from clarion.tasks.events import backoff, dispatch
from clarion.tasks.preferences import set_preferences
from clarion.tasks.route import route
from tests.support.api import _broker
from tests.support.pipeline import Clock, configure, count, frozen_clock, rows

pytestmark = pytest.mark.integration
__all__ = ["_broker"]  # the fixture, from tests/support/api.py
ORDER = {"order": "A-1"}


@pytest.fixture
def ann(clarion_env, monkeypatch) -> Iterator[str]:
    register_recipient("ann", timezone="Europe/Berlin")
    with Receiver("clarion-test-secret") as receiver:  # the webhook *channel*'s far end
        configure(monkeypatch, webhook_url=receiver.url, webhook_secret="clarion-test-secret")
        yield "ann"


def _events(where: str = "true", **params: object) -> list[dict]:
    return rows(f"SELECT * FROM outbound_events WHERE {where} ORDER BY id", **params)


def _sent(user: str, event: str) -> int:
    """Notify and route one receipt (the route sends it): its request id."""
    made = notify(user, "receipt", event_id=event, variables=ORDER)
    assert route([user], [made.request_id]) == 1
    return made.request_id


def test_no_endpoint_means_no_event_row(ann):
    _sent(ann, "e1")
    assert count("deliveries", "state = 'sent'") == 1
    assert count("outbound_events") == 0


def test_each_change_writes_its_event_in_its_transaction(ann):
    event_endpoints.create("http://127.0.0.1:9/x", ["*"])
    request_id = _sent(ann, "e1")
    set_preferences(ann, {"type:nudge/webhook": False})
    kinds = [(e["kind"], e["request_id"]) for e in _events()]
    assert kinds == [
        ("request.accepted", request_id),
        ("delivery.sent", request_id),
        ("preference.changed", None),
    ]
    [sent] = _events("kind = 'delivery.sent'")
    assert sent["stream"] == f"d:{ann}:{sent['delivery_id']}"
    assert (sent["type_key"], sent["occurrence_key"], sent["channel"]) == (
        "receipt",
        "event:e1",
        "webhook",
    )
    assert sent["data"]["event_id"] == "e1" and sent["data"]["previous_state"] == "claimed"
    # the opted-out channel: a gate decision that stopped it, as its own event
    stopped = notify(ann, "nudge", event_id="e2", variables={"name": "Ann"})
    route([ann], [stopped.request_id])
    gates = _events("kind = 'gate.stopped'")
    assert [(g["request_id"], g["channel"], g["data"]["reason"]) for g in gates] == [
        (stopped.request_id, "webhook", "opted_out"),
        (stopped.request_id, None, "no_channel"),
    ]
    assert count("outbound_sends") == count("outbound_events")  # one endpoint wants every kind


def test_a_rolled_back_change_leaves_no_event(ann):
    event_endpoints.create("http://127.0.0.1:9/x", ["request.accepted", "delivery.sent"])
    with engine().connect() as conn, conn.begin() as tx:
        notify(ann, "receipt", event_id="gone", variables=ORDER, connection=conn)
        assert conn.execute(text("SELECT count(*) FROM outbound_events")).scalar() == 1
        tx.rollback()
    assert count("requests") == 0 and count("outbound_events") == 0
    request_id = _sent(ann, "kept")
    with engine().connect() as conn, conn.begin() as tx:  # a rolled back state change: no event
        conn.execute(text("UPDATE deliveries SET state = 'failed'"))
        tx.rollback()
    assert [e["kind"] for e in _events()] == ["request.accepted", "delivery.sent"]
    assert {e["request_id"] for e in _events()} == {request_id}


def test_an_endpoint_gets_only_the_kinds_it_wants(ann):
    wants_sent = event_endpoints.create("http://127.0.0.1:9/a", ["delivery.sent"])
    wants_all = event_endpoints.create("http://127.0.0.1:9/b", ["*"])
    _sent(ann, "e1")
    per = {
        r["endpoint_id"]: r["n"]
        for r in rows("SELECT endpoint_id, count(*) AS n FROM outbound_sends GROUP BY endpoint_id")
    }
    assert per == {wants_sent.id: 1, wants_all.id: 2}


def test_events_arrive_signed_per_standard_webhooks(ann):
    with FakeAppEndpoint([]) as app:
        endpoint = event_endpoints.create(app.url, ["*"])
        app.state.secrets.append(endpoint.secret)
        _sent(ann, "e1")
        dispatch()
        taken = app.state.taken()
    assert [a.payload["type"] for a in taken] == ["request.accepted", "delivery.sent"]
    verifier = standardwebhooks.Webhook(endpoint.secret)  # the reference library agrees
    for arrival in taken:
        headers = {
            "webhook-id": arrival.msg_id,
            "webhook-timestamp": arrival.timestamp,
            "webhook-signature": arrival.signature,
        }
        assert verifier.verify(arrival.body, headers)["data"]["id"] == arrival.msg_id
        assert arrival.payload["data"]["user_id"] == ann
    assert count("outbound_sends", "state = 'delivered'") == 2


def test_rotation_signs_with_both_secrets_during_the_overlap_then_only_the_new(ann, monkeypatch):
    start = datetime.now(UTC)
    with FakeAppEndpoint([]) as app, frozen_clock(start) as clock:
        old = event_endpoints.create(app.url, ["request.accepted"])
        rotated = event_endpoints.change(old.id, rotate=True, overlap=3600)
        app.state.secrets[:] = [old.secret, rotated.secret]
        notify(ann, "receipt", event_id="during", variables=ORDER)
        dispatch(clock.read)
        clock.advance(3601)
        notify(ann, "receipt", event_id="after", variables=ORDER)
        dispatch(clock.read)
        arrivals = app.state.taken()
    assert rotated.secret != old.secret
    during, after = (a for a in arrivals)
    assert during.payload["data"]["event_id"] == "during" and during.matched == (0, 1)
    assert after.payload["data"]["event_id"] == "after" and after.matched == (1,)


def test_a_later_event_of_a_delivery_waits_until_the_earlier_one_is_taken(ann):
    with FakeAppEndpoint([]) as app, frozen_clock(datetime.now(UTC)) as clock:
        endpoint = event_endpoints.create(app.url, ["delivery.sent", "delivery.delivered"])
        app.state.secrets.append(endpoint.secret)
        _sent(ann, "e1")
        with engine().begin() as conn:  # a receipt's change, while "sent" is still undelivered
            conn.execute(text("UPDATE deliveries SET state = 'delivered'"))
        app.state.script("500")
        dispatch(clock.read)  # "sent" refused: "delivered" must not go before it
        assert [a.answer for a in app.state.snapshot()] == ["500"]
        dispatch(clock.read)  # backing off: nothing goes
        assert len(app.state.snapshot()) == 1
        clock.advance(backoff(1).total_seconds() + 10)
        dispatch(clock.read)
        arrivals = app.state.snapshot()
    kinds = [(a.payload["type"], a.answer) for a in arrivals]
    assert kinds == [
        ("delivery.sent", "500"),
        ("delivery.sent", "204"),
        ("delivery.delivered", "204"),
    ]
    assert arrivals[0].msg_id == arrivals[1].msg_id  # a repeat carries the same webhook-id


def test_backoff_doubles_with_jitter_up_to_an_hour():
    low = [backoff(n, lambda: 0.0).total_seconds() for n in range(1, 15)]
    high = [backoff(n, lambda: 1.0).total_seconds() for n in range(1, 15)]
    assert low[:4] == [2.5, 5.0, 10.0, 20.0] and high[:4] == [5.0, 10.0, 20.0, 40.0]
    assert max(high) == 3600.0 and max(low) == 1800.0
    # retrying for a day at most an hour apart: more than 24 attempts within it
    assert sum(1 for _ in range(1, 40) if sum(high[: min(_, 14)]) < 86400) > 24


def test_an_endpoint_failing_for_a_day_is_disabled_with_an_alert_then_enabled_and_replayed(
    ann, monkeypatch
):
    start = datetime.now(UTC)
    with FakeAppEndpoint([], hold=0.5) as app, frozen_clock(start) as clock:
        configure(monkeypatch, events_timeout=0.3)
        endpoint = event_endpoints.create(app.url, ["request.accepted"])
        app.state.secrets.append(endpoint.secret)
        notify(ann, "receipt", event_id="e1", variables=ORDER)
        app.state.script("500", 10_000)
        attempts = _fail_for_a_day(clock, start)
        assert 24 <= attempts <= 60, attempts  # retried all day, about hourly at the end
        [row] = rows("SELECT enabled, disabled_reason FROM webhook_endpoints")
        assert row["enabled"] is False and "failing since" in row["disabled_reason"]
        [alert] = rows("SELECT kind, subject, cleared_at FROM alerts")
        assert (alert["kind"], alert["subject"]) == ("endpoint_disabled", f"endpoint:{endpoint.id}")
        seen = len(app.state.snapshot())
        notify(ann, "receipt", event_id="e2", variables=ORDER)
        clock.advance(7200)
        dispatch(clock.read)
        assert len(app.state.snapshot()) == seen  # disabled: nothing is posted
        app.state.clear_script()
        event_endpoints.change(endpoint.id, enabled=True)
        dispatch(clock.read)
        assert [a.payload["data"]["event_id"] for a in app.state.taken()] == ["e1", "e2"]
        assert rows("SELECT cleared_at FROM alerts")[0]["cleared_at"] is not None
        # an operator replays the day: the same events again, under the same ids
        assert event_endpoints.replay(start - timedelta(minutes=1), [endpoint.id]) == 2
        dispatch(clock.read)
    taken = app.state.taken()
    assert [a.payload["data"]["event_id"] for a in taken] == ["e1", "e2", "e1", "e2"]
    assert taken[0].msg_id == taken[2].msg_id and taken[1].msg_id == taken[3].msg_id


def _fail_for_a_day(clock: Clock, start: datetime) -> int:
    """Dispatch at each due retry until the endpoint is disabled; the attempts made."""
    attempts = 0
    while clock.now - start < timedelta(hours=26):
        rounds = dispatch(clock.read)
        if not rounds:
            break
        attempts += sum(len(r.failed) for r in rounds.values())
        [nxt] = rows("SELECT next_at FROM outbound_sends WHERE state = 'pending'")
        clock.now = max(clock.now, nxt["next_at"]) + timedelta(seconds=1)
    return attempts


def test_a_timeout_and_a_dropped_answer_are_sent_again_under_the_same_id(ann, monkeypatch):
    with FakeAppEndpoint([], hold=1.0) as app, frozen_clock(datetime.now(UTC)) as clock:
        configure(monkeypatch, events_timeout=0.3)
        endpoint = event_endpoints.create(app.url, ["request.accepted"])
        app.state.secrets.append(endpoint.secret)
        notify(ann, "receipt", event_id="e1", variables=ORDER)
        app.state.script("timeout")
        app.state.script("drop")
        for _ in range(3):
            dispatch(clock.read)
            clock.advance(120)
        arrivals = app.state.snapshot()
    assert [a.answer for a in arrivals] == ["timeout", "drop", "204"]
    assert len({a.msg_id for a in arrivals}) == 1
    assert count("outbound_sends", "state = 'delivered' AND attempts = 3") == 1


def test_endpoint_input_is_refused_naming_the_field(clarion_env):
    from clarion.errors import InvalidField, UnknownEndpoint

    with pytest.raises(InvalidField, match="^url: must be http"):
        event_endpoints.create("ftp://x", ["*"])
    with pytest.raises(InvalidField, match="^kinds: unknown event kind 'delivery.lost'"):
        event_endpoints.create("http://127.0.0.1:9/", ["delivery.lost"])
    with pytest.raises(InvalidField, match="^secret: secret must be whsec_"):
        event_endpoints.create("http://127.0.0.1:9/", ["*"], secret="whsec_!!")
    with pytest.raises(UnknownEndpoint, match="^no webhook endpoint 77$"):
        event_endpoints.change(77, enabled=True)
    assert count("webhook_endpoints") == 0


def test_retention_removes_what_every_endpoint_took_and_keeps_what_one_still_owes(ann):
    from clarion.tasks.retention import remove_old

    with FakeAppEndpoint([]) as app:
        taking = event_endpoints.create(app.url, ["request.accepted"])
        app.state.secrets.append(taking.secret)
        notify(ann, "receipt", event_id="e1", variables=ORDER)
        dispatch()
        owing = event_endpoints.create("http://127.0.0.1:9/", ["request.accepted"])
        notify(ann, "receipt", event_id="e2", variables=ORDER)
        event_endpoints.change(owing.id, enabled=False)
        dispatch()
    assert count("outbound_sends", "state = 'delivered'") == 2
    removed = remove_old(datetime.now(UTC) + timedelta(days=365))
    assert (removed["outbound_sends"], removed["outbound_events"]) == (2, 1)
    [kept] = _events()
    assert kept["occurrence_key"] == "event:e2"  # the disabled endpoint has not taken it
    assert count("outbound_sends", "state = 'pending'") == 1


def test_reading_an_in_app_item_is_one_event_and_its_receipt_another(clarion_env, monkeypatch):
    from pathlib import Path

    from clarion.tasks import inbox as app_inbox
    from tests.support.inbox import items, send

    configure(monkeypatch, catalog=Path(__file__).parents[1] / "catalog_inapp.yaml")
    register_recipient("ana", timezone="UTC")
    event_endpoints.create("http://127.0.0.1:9/", ["inbox.read", "delivery.read"])
    [key] = send("ana", "inbox_note", "e1", n="1")
    [item] = items()
    assert app_inbox.mark("ana", [item["id"]], "read") == [item["id"]]
    assert app_inbox.mark("ana", [item["id"]], "read") == []  # read already: no second event
    events = _events()
    assert [(e["kind"], e["delivery_id"], e["stream"]) for e in events] == [
        ("inbox.read", key[1], f"d:ana:{key[1]}"),
        ("delivery.read", key[1], f"d:ana:{key[1]}"),
    ]
    assert events[0]["data"]["item_id"] == item["id"] and events[0]["request_id"] is not None


def test_erasure_scrubs_the_detail_of_a_persons_events(ann):
    from clarion.tasks import recipients

    event_endpoints.create("http://127.0.0.1:9/", ["gate.stopped"])
    set_preferences(ann, {"type:nudge/webhook": False})
    stopped = notify(ann, "nudge", event_id="e1", variables={"name": "Ann"})
    route([ann], [stopped.request_id])
    assert all(e["data"]["detail"] for e in _events())
    assert recipients.forget(ann) is not None
    events = _events()
    assert events and all("detail" not in e["data"] for e in events)
    assert [e["data"]["reason"] for e in events] == ["opted_out", "no_channel"]  # kept


def test_a_round_skips_an_endpoint_whose_turns_are_taken_and_posts_once_one_is_free(
    ann, monkeypatch
):
    """CLARION_EVENTS_PARALLEL bounds the processes posting to one endpoint: with its one turn
    held by another session (a process inside a slow POST), a round leaves the endpoint at once,
    counted at the endpoint; with two turns, or once the turn is given back, the round posts."""
    with FakeAppEndpoint([]) as app:
        endpoint = event_endpoints.create(app.url, ["*"])
        app.state.secrets.append(endpoint.secret)
        _sent(ann, "e1")
        with engine().connect() as other:  # its open transaction holds the turn
            turn = outbound.take_turn(other, endpoint.id, turns=1)
            assert turn == 0
            assert dispatch() == {}
            assert app.state.snapshot() == []  # the endpoint saw nothing
            configure(monkeypatch, events_parallel=2)
            assert len(dispatch()[endpoint.id].taken) == 2  # the second turn was free
            configure(monkeypatch, events_parallel=1)
            _sent(ann, "e2")
            assert dispatch() == {}
            other.rollback()  # the turn ends with its transaction
        assert len(dispatch()[endpoint.id].taken) == 2
    assert count("outbound_sends", "state = 'delivered'") == 4
