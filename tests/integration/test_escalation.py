"""Escalation chains end to end (issue 11 item 5, Gridwatch): a page on Slack (the local Slack),
no ack in 5 min → SMS (the local Twilio, its status callbacks through clarion's real webhook) →
no ack in 10 min → a second recipient's webhook (the local receiver). A page by email (the local
SendGrid) is acknowledged by a link click and escalated by a bounce, both as signed events through
clarion's real Event Webhook. Real PostgreSQL and Redis, the pipeline in-process, time from an
injected clock; every send counted at the receiving server.
"""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from clarion.db import escalations
from clarion.db.engine import engine
from clarion.ops.explain import explain
from clarion.records import Receipt
from clarion.standins.fake_fcm import FakeFcm
from clarion.standins.fake_sendgrid import EventKey, FakeSendGrid, event, post_events
from clarion.tasks import notify, register_recipient
from clarion.tasks.escalation import fire_due
from clarion.tasks.inbox import feed, mark
from clarion.tasks.interactions import handle_click
from clarion.tasks.receipts import ingest
from tests.support.escalation import (
    ANA_PHONE,
    T0,
    Key,
    World,
    chain_of,
    escalation_decisions,
    send_request,
    step_requests,
    tick_at,
    world,
)
from tests.support.pipeline import (
    configure,
    rows,
)
from tests.support.race import race, waiting_on

pytestmark = pytest.mark.integration
__all__ = ["world"]  # a fixture, from tests/support/escalation.py

DEAD_PHONE = "+4915100000009"
SENDGRID_KEY = EventKey.generate()  # signs the Event Webhook's batches; clarion has the public half


@pytest.fixture
def sendgrid(world, monkeypatch) -> Iterator[FakeSendGrid]:
    """Ana's email on the local SendGrid; its events go to clarion's real Event Webhook."""
    with FakeSendGrid() as fake:
        configure(
            monkeypatch,
            email_from="Clarion <page@tx.clarion.test>",
            sendgrid_api_key=FakeSendGrid.API_KEY,
            sendgrid_api_url=fake.url,
            sendgrid_webhook_public_key=SENDGRID_KEY.public_key,
        )
        register_recipient(
            "ana",
            timezone="UTC",
            addresses={"slack": "U1", "sms": ANA_PHONE, "email": "ana@example.com"},
        )
        yield fake


def _page(type_key: str = "page", user: str = "ana", **variables) -> tuple[int, list[Key]]:
    request = notify(
        user,
        type_key,
        event_id=uuid.uuid4().hex,
        variables={"host": "db-1", "secondary": "sam", **variables},
    )
    return request.request_id, send_request(user, request.request_id)


def _click(key: Key, answer: str = "ack", slack_user: str = "U1"):
    value = json.dumps({"u": key[0], "d": key[1], "a": answer}, separators=(",", ":"))
    return handle_click("slack", slack_user, value)


# --- the must-shows ---------------------------------------------------------------------------


def test_acked_at_step_one_nothing_more_is_sent(world):
    request_id, [key] = _page()
    assert world.slack_posts() == 1
    assert chain_of(request_id)["state"] == "waiting"
    assert _click(key).outcome == "accepted"
    assert chain_of(request_id)["state"] == "acked"
    for minutes in (5, 15, 60, 24 * 60):
        assert tick_at(world, T0 + timedelta(minutes=minutes)) == 0
    assert (world.slack_posts(), world.sms(), world.hooks()) == (1, 0, 0)  # at the receivers
    assert step_requests() == []
    assert escalation_decisions(request_id) == [("wait", "no_ack"), ("stop", "acked")]
    shown = explain("ana")
    assert (
        "acknowledged: answered on delivery" in shown and "step 2 and later are not sent" in shown
    )


def test_no_ack_step_two_at_five_minutes_and_step_three_ten_after(world):
    request_id, _ = _page()
    assert tick_at(world, T0 + timedelta(minutes=4, seconds=59)) == 0
    assert world.sms() == 0
    assert tick_at(world, T0 + timedelta(minutes=5)) == 1
    [sms] = world.twilio.messages()
    assert sms.to == ANA_PHONE and "db-1 is down" in sms.body
    assert tick_at(world, T0 + timedelta(minutes=14, seconds=59)) == 0
    assert world.hooks() == 0
    assert tick_at(world, T0 + timedelta(minutes=15)) == 1
    assert (world.slack_posts(), world.sms(), world.hooks()) == (1, 1, 1)
    assert [(r["user_id"], r["type_key"]) for r in step_requests()] == [
        ("ana", "page_sms"),
        ("sam", "page_hook"),
    ]
    assert chain_of(request_id)["state"] == "finished"
    assert escalation_decisions(request_id) == [
        ("wait", "no_ack"),
        ("escalate", "no_ack"),
        ("escalate", "no_ack"),
        ("stop", "chain_finished"),
    ]
    assert tick_at(world, T0 + timedelta(hours=2)) == 0
    [hook] = rows("SELECT provider_message_id FROM deliveries WHERE user_id = 'sam'")
    failed = Receipt("webhook", "failed", hook["provider_message_id"], T0 + timedelta(hours=2))
    assert ingest([failed]) == {"applied": 1}  # the last step failed: nothing is left to fire
    assert escalation_decisions(request_id)[-1] == ("stop", "no_further_step")
    assert "step 3 (page_hook to sam, request 3): 10m without an acknowledgement" in explain("ana")
    assert "step 3 of ana's page" in explain("sam")


def test_a_failed_chat_send_escalates_at_once(world):
    world.slack.deactivate("U1")  # conversations.open answers user_disabled: a permanent failure
    request_id, [key] = _page()
    assert rows("SELECT state FROM deliveries WHERE id = :i", i=key[1])[0]["state"] == "failed"
    assert chain_of(request_id)["due_at"] == T0  # brought forward from 12:05
    assert tick_at(world, T0) == 1
    assert world.sms() == 1  # at once, not at 12:05
    assert ("hurry", "step_failed") in escalation_decisions(request_id)
    assert ("escalate", "step_failed") in escalation_decisions(request_id)


def test_an_undelivered_sms_escalates_to_the_second_recipient_at_once(world):
    register_recipient("ana", timezone="UTC", addresses={"slack": "U1", "sms": DEAD_PHONE})
    world.twilio.fail_number(DEAD_PHONE, 30003)  # its status callback says undelivered
    request_id, _ = _page()
    assert tick_at(world, T0 + timedelta(minutes=5)) == 1
    [sms] = world.twilio.messages()
    assert [status for status, _ in world.twilio.progress(sms.sid)] == [
        "queued",
        "sent",
        "undelivered",
    ]  # signed status callbacks through clarion's Twilio webhook
    sms_row = rows("SELECT state FROM deliveries WHERE channel = 'sms'")[0]
    assert sms_row["state"] == "undelivered"
    assert chain_of(request_id)["due_at"] == T0 + timedelta(minutes=5)  # not 12:15
    assert tick_at(world, T0 + timedelta(minutes=5)) == 1
    assert world.hooks() == 1
    assert escalation_decisions(request_id)[-3:] == [
        ("hurry", "step_failed"),
        ("escalate", "step_failed"),
        ("stop", "chain_finished"),
    ]


def test_an_invalid_push_token_escalates_at_once(world, monkeypatch, tmp_path):
    token = "fcm-phone-" + "a" * 24
    with FakeFcm() as fcm:
        configure(
            monkeypatch,
            fcm_service_account=fcm.write_service_account(tmp_path / "service-account.json"),
            fcm_api_url=fcm.url,
        )
        register_recipient("ana", timezone="UTC", addresses={"push": [f"fcm:{token}"]})
        fcm.unregister(token)  # FCM answers 404 UNREGISTERED: the only device is gone
        request_id, [key] = _page("page_push")
        assert fcm.attempts == {token: 1} and fcm.per_token() == {}
    assert rows("SELECT state FROM deliveries WHERE id = :i", i=key[1])[0]["state"] == "failed"
    assert tick_at(world, T0) == 1
    assert world.hooks() == 1  # the secondary, at once
    assert ("hurry", "step_failed") in escalation_decisions(request_id)


def test_a_step_suppressed_by_a_gate_escalates_at_once(world):
    register_recipient("ana", timezone="UTC", addresses={"slack": "U1"})  # no phone number
    request_id, _ = _page()
    assert tick_at(world, T0 + timedelta(minutes=5)) == 1  # step 2: routed to no channel
    assert world.sms() == 0
    assert tick_at(world, T0 + timedelta(minutes=5)) == 1  # so step 3 is due at once
    assert world.hooks() == 1
    assert ("hurry", "step_not_delivered") in escalation_decisions(request_id)


def test_quiet_hours_hold_a_non_critical_step_but_not_the_chain(world):
    register_recipient(
        "ana",
        timezone="UTC",
        addresses={"slack": "U1", "sms": ANA_PHONE},
        quiet_hours=("11:00", "13:00"),
    )
    request_id, _ = _page("page_gentle")
    assert world.slack_posts() == 1  # critical: through quiet hours
    assert tick_at(world, T0 + timedelta(minutes=5)) == 1
    assert world.sms() == 0  # not critical: deferred to 13:00
    assert tick_at(world, T0 + timedelta(minutes=10)) == 1  # the chain kept its time
    assert world.hooks() == 1
    assert escalation_decisions(request_id)[:3] == [
        ("wait", "no_ack"),
        ("escalate", "no_ack"),
        ("wait", "step_deferred"),
    ]
    assert "is held until 2026-12-01T13:00:00+00:00; step 3 stays due at" in explain("ana")


def test_a_defaulted_variable_names_the_second_recipient_and_reaches_the_step(world):
    register_recipient("ana", timezone="UTC", addresses={"webhook": "https://hooks.example/a"})
    request_id, _ = _page("page_default_to")
    assert tick_at(world, T0 + timedelta(minutes=1)) == 1
    [step] = rows(
        "SELECT user_id, variables FROM requests WHERE occurrence_key LIKE 'escalation:%'"
    )
    assert (
        step["user_id"] == "sam" and step["variables"]["runbook"] == "https://runbooks.example/db"
    )
    assert world.hooks() == 2  # ana's page, then sam's, rendered with the defaulted runbook
    assert rows("SELECT state FROM deliveries WHERE user_id = 'sam'")[0]["state"] == "sent"


def test_working_hours_timers_wait_over_the_weekend(world):
    register_recipient(
        "bea", timezone="Europe/Berlin", country="DE", addresses={"webhook": "https://h.example/b"}
    )
    friday = datetime(2026, 12, 4, 15, 55, tzinfo=UTC)  # 16:55 in Berlin
    world.clock.now = friday
    request_id, _ = _page("page_workday", user="bea")
    monday = datetime(2026, 12, 7, 8, 5, tzinfo=UTC)  # 5 minutes on Friday, 5 on Monday 09:00
    assert chain_of(request_id)["due_at"] == monday
    assert world.hooks() == 1  # step 1
    for at in (
        friday + timedelta(minutes=10),
        friday + timedelta(days=1),
        monday - timedelta(seconds=1),
    ):
        assert tick_at(world, at) == 0
    assert tick_at(world, monday) == 1
    assert world.hooks() == 2
    assert "10m of working time (09:00-17:00 on working days)" in explain("bea")


def test_an_in_app_read_acknowledges(world):
    request_id, _ = _page("page_inapp")
    [item] = feed("ana").items
    assert mark("ana", [item.id], "read") == [item.id]
    assert chain_of(request_id)["state"] == "acked"
    assert tick_at(world, T0 + timedelta(minutes=30)) == 0
    assert world.hooks() == 0
    assert escalation_decisions(request_id) == [("wait", "no_ack"), ("stop", "acked")]


def _email_events(world: World, sendgrid: FakeSendGrid, *kinds: str, **fields) -> None:
    """SendGrid's events about the one mail it took, signed and posted to clarion's webhook."""
    [mail] = sendgrid.sent
    events = [event(mail, kind, **fields) for kind in kinds]
    status, _ = post_events(f"{world.web}/webhooks/sendgrid", SENDGRID_KEY, events)
    assert status == 200


def test_a_link_clicked_in_the_email_acknowledges(world, sendgrid):
    request_id, _ = _page("page_email")
    world.clock.now = T0 + timedelta(minutes=2)
    _email_events(world, sendgrid, "delivered", "open")
    assert chain_of(request_id)["state"] == "waiting"  # an open is not an acknowledgement
    _email_events(world, sendgrid, "click")
    assert chain_of(request_id)["state"] == "acked"
    for minutes in (5, 15, 60):
        assert tick_at(world, T0 + timedelta(minutes=minutes)) == 0
    assert (len(sendgrid.sent), world.sms(), world.hooks()) == (1, 0, 0)  # at the receivers
    assert step_requests() == []
    assert escalation_decisions(request_id) == [("wait", "no_ack"), ("stop", "acked")]
    assert "acknowledged: clicked on delivery" in explain("ana")


def test_a_bounced_email_escalates_at_once(world, sendgrid):
    request_id, _ = _page("page_email")
    bounced_at = T0 + timedelta(minutes=1)
    world.clock.now = bounced_at
    _email_events(world, sendgrid, "bounce")
    assert chain_of(request_id)["due_at"] == bounced_at  # brought forward from 12:05
    assert world.sms() == 0
    assert tick_at(world, bounced_at) == 1
    [sms] = world.twilio.messages()  # at once, not at 12:05
    assert sms.to == ANA_PHONE and "db-1 is down" in sms.body
    assert escalation_decisions(request_id)[:3] == [
        ("wait", "no_ack"),
        ("hurry", "step_failed"),
        ("escalate", "step_failed"),
    ]
    assert "bounced on delivery" in explain("ana")
    assert tick_at(world, bounced_at + timedelta(minutes=10)) == 1  # step 3 keeps its own timer
    assert (len(sendgrid.sent), world.sms(), world.hooks()) == (1, 1, 1)


# --- the ack racing the escalation ------------------------------------------------------------
#
# "Exactly one outcome": for a chain whose step 2 is due when an acknowledgement arrives, either
# (a) the ack commits first: step 2 is never requested, or (b) step 2 fires first (one request,
# one message at the receiver) and the ack then stops step 3 and later. Never step 2 twice, never
# a step requested after the ack committed, never an ack lost (the chain always ends `acked`).


def _fire(at: datetime) -> int:
    with engine().begin() as conn:
        return len(fire_due(conn, now=at))


def _visible_due(at: datetime) -> int:
    with engine().connect() as conn:
        return conn.execute(
            text("SELECT count(*) FROM escalations WHERE state = 'waiting' AND due_at <= :at"),
            {"at": at},
        ).scalar_one()


def _tick_in_child(at: datetime) -> tuple[int, int]:
    """(chains it saw due without locking, steps it fired) — a beat worker's tick."""
    return _visible_due(at), _fire(at)


def test_an_ack_holding_the_chain_makes_a_racing_tick_skip_it_and_nothing_fires(world):
    request_id, [key] = _page()
    due = T0 + timedelta(minutes=5)
    with engine().connect() as acking:  # the ack, written but not committed
        assert escalations.delivery_event(acking, *key, "answered", "slack answer 'ack'", T0) == (
            "acked"
        )
        [(seen, fired)] = race(1, _tick_in_child, lambda i: (due,))
        assert (seen, fired) == (1, 0)  # it saw the chain due, and skipped the locked row
        acking.commit()
    assert tick_at(world, due) == 0
    assert (world.sms(), world.hooks()) == (0, 0)
    assert chain_of(request_id)["state"] == "acked"


def test_a_step_firing_holds_the_chain_and_the_racing_ack_waits_then_stops_the_rest(world):
    request_id, [key] = _page()
    due = T0 + timedelta(minutes=5)
    waited: list[list[str]] = []
    with engine().connect() as ticking:
        keys = fire_due(ticking, now=due)  # step 2 requested, not committed
        pid = ticking.execute(text("SELECT pg_backend_pid()")).scalar_one()

        def commit_once_the_ack_waits() -> None:
            waited.append(waiting_on(pid, within=30))
            ticking.commit()

        releaser = threading.Thread(target=commit_once_the_ack_waits)
        releaser.start()
        try:
            [click] = race(1, lambda k: _click(k).outcome, lambda i: (key,))
        finally:
            releaser.join()
    assert len(waited[0]) == 1, "the ack never queued behind the firing step's lock"
    assert click == "accepted"
    for user, rid, _lane in keys:
        send_request(user, rid)
    assert chain_of(request_id)["state"] == "acked" and chain_of(request_id)["next_step"] == 3
    for minutes in (15, 60):
        assert tick_at(world, T0 + timedelta(minutes=minutes)) == 0
    assert (world.sms(), world.hooks()) == (1, 0)  # step 2 once; step 3 never
    assert escalation_decisions(request_id) == [
        ("wait", "no_ack"),
        ("escalate", "no_ack"),
        ("stop", "acked"),
    ]


HOLD = 1.0  # seconds a racing ack keeps its transaction open after it stopped the chain
SKIPPED, WAITED = "the tick skipped the chain the ack held", "the ack waited on the firing step"


def _tick_until_met(at: datetime) -> tuple[list[Key], str]:
    """A beat worker's tick that keeps its transaction open until the racing ack queues behind
    it: (the step requests it made, how it met the ack; "" if it never did)."""
    with engine().connect() as conn, conn.begin():
        made = fire_due(conn, now=at)
        if made:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            met = WAITED if waiting_on(pid, within=30) else ""
        else:  # still due to an unlocking reader: the ack that locked it has not committed
            met = SKIPPED if _visible_due(at) else ""
    return [(user, request_id) for user, request_id, _lane in made], met


def _ack_or_tick(role: int, key: Key, at: datetime, stagger: float) -> tuple[str, object]:
    if role == 0:
        return "ack", _click(key).outcome
    time.sleep(stagger)  # the click has more to do before it locks the chain: let either win
    return "tick", _tick_until_met(at)


def _stop_detail(request_id: int) -> str:
    [row] = rows(
        "SELECT detail FROM decisions WHERE request_id = :r AND gate = 'escalation' "
        "AND outcome = 'stop'",
        r=request_id,
    )
    return row["detail"]


def test_an_ack_and_a_tick_racing_in_two_processes_have_exactly_one_outcome(world, monkeypatch):
    """Each race: the Slack click (its transaction held open HOLD s once it stopped the chain) and
    a tick holding the firing step open until the ack waits on it. Whichever takes the chain's
    row first, the other meets its open transaction: shown every time, as the tick finding the
    chain locked or the ack queued behind the tick. Then what the tick requested is delivered, and
    the outcome counted at the local Twilio: no SMS and the chain stopped before step 2, or one
    SMS and the ack recorded after it, stopping step 3."""
    configure(monkeypatch, faults=f"click.before_commit=sleep:{HOLD}")
    due = T0 + timedelta(minutes=5)
    outcomes = {
        (0, 2, (("wait", "no_ack"), ("stop", "acked"))): "ack first",
        (1, 3, (("wait", "no_ack"), ("escalate", "no_ack"), ("stop", "acked"))): "step 2 first",
    }
    races, orders = 8, Counter[str]()
    for n in range(races):
        world.clock.now = T0
        request_id, [key] = _page()
        world.clock.now = due  # the ack arrives as step 2 falls due
        stagger = random.Random(n).uniform(0, 0.1)
        sms_before = world.sms()
        [(_, click), (_, (made, met))] = sorted(
            race(2, _ack_or_tick, lambda i, k=key, s=stagger: (i, k, due, s))
        )
        for user, step_request in made:
            send_request(user, step_request)
        sent, chain = world.sms() - sms_before, chain_of(request_id)
        outcome = outcomes.get((sent, chain["next_step"], tuple(escalation_decisions(request_id))))
        assert outcome is not None, (n, sent, chain, escalation_decisions(request_id))
        assert click == "accepted" and chain["state"] == "acked", n
        assert f"step {chain['next_step']} and later are not sent" in _stop_detail(request_id)
        assert met == (SKIPPED if outcome == "ack first" else WAITED), f"race {n} did not overlap"
        orders[outcome] += 1
    assert tick_at(world, T0 + timedelta(hours=1)) == 0  # nothing of any chain fires later
    assert (world.slack_posts(), world.sms(), world.hooks()) == (races, orders["step 2 first"], 0)
    print(f"\nack vs tick, {races} races: {dict(orders)}")
