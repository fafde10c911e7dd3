"""SMS end to end: the real twilio SDK against the local Twilio (standins/fake_twilio.py), clarion's
real webhooks served by uvicorn (callbacks signed as Twilio signs), real PostgreSQL and Redis, the
pipeline run in-process. Counted at the fake: messages it took, requests it throttled.

Send → status callbacks → delivered / undelivered; STOP / START / HELP replies and the next
notify; refusals that suppress the number (21211, 21610); forged callbacks (401, nothing written);
duplicated and reordered callbacks (hypothesis); a 429 pausing the number; a long message's
segments; the marketing SMS hours; a lost answer under each guarantee.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from pathlib import Path
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from clarion.adapters.sms import HELP_REPLY, SETTLE, budget_quota
from clarion.db.engine import engine
from clarion.ops.explain import explain
from clarion.standins.fake_slack import serving
from clarion.standins.fake_twilio import FakeTwilio, sign
from clarion.tasks import notify, register_recipient, runtime
from clarion.tasks.deliver import deliver
from clarion.tasks.route import route
from clarion.web.app import create_app
from tests.support.pipeline import (
    configure,
    count,
    drain,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

CATALOG = Path(__file__).parents[1] / "catalog_sms.yaml"
ANA, BOB = "+4915112345678", "+4915100000002"
Key = tuple[str, int]


@dataclass
class World:
    fake: FakeTwilio
    web: str

    @property
    def inbound_url(self) -> str:
        return f"{self.web}/webhooks/twilio/inbound"


@pytest.fixture
def world(clarion_env, monkeypatch) -> Iterator[World]:
    with FakeTwilio() as fake, serving(create_app()) as web:
        configure(
            monkeypatch,
            catalog=CATALOG,
            twilio_account_sid=FakeTwilio.ACCOUNT_SID,
            twilio_auth_token=FakeTwilio.AUTH_TOKEN,
            twilio_api_url=fake.url,
            twilio_from=FakeTwilio.NUMBER,
            public_url=web,
            sms_segments_per_second=100,  # the budget is not what most tests here count
            twilio_timeout=1,
            send_timeout=3,
        )
        register_recipient("ana", timezone="Europe/Berlin", addresses={"sms": ANA})
        register_recipient("bob", timezone="Europe/Berlin", addresses={"sms": BOB})
        with publishing_to_this_tests_broker():
            yield World(fake, web)


def _route(
    user: str,
    type_key: str = "sms_receipt",
    event: str | None = None,
    variables: dict[str, str] | None = None,
) -> Key | None:
    """Notify and route; the key of the delivery, or None. The route sends it itself (its lane
    has no budget): when this returns the first attempt has been made."""
    request = notify(user, type_key, event_id=event or uuid.uuid4().hex, variables=variables)
    assert route([user], [request.request_id]) == 1
    drain("transactional"), drain("activation")
    found = rows("SELECT user_id, id FROM deliveries WHERE request_id = :r", r=request.request_id)
    return (found[0]["user_id"], found[0]["id"]) if found else None


def _send(user: str, type_key: str = "sms_receipt") -> Key:
    """Route, which makes the first attempt; a deliver task handed the same key after it finds
    nothing to claim (what happens to a redelivered message)."""
    key = _route(user, type_key)
    assert key is not None, "no delivery"
    assert deliver([key[0]], [key[1]]) == 0
    return key


def _row(key: Key) -> dict:
    [row] = rows(
        "SELECT state, attempts, provider_message_id, last_error, maybe_sent_at FROM deliveries "
        "WHERE user_id = :u AND id = :i",
        u=key[0],
        i=key[1],
    )
    return row


def _due_now() -> None:
    with engine().begin() as conn:
        conn.execute(text("UPDATE deliveries SET not_before = now() WHERE state = 'pending'"))


def _suppressions() -> list[tuple[str, str, str]]:
    return [
        (r["user_id"], r["address"], r["reason"])
        for r in rows("SELECT user_id, address, reason FROM suppressions ORDER BY user_id")
    ]


def _last_decision(user: str) -> dict:
    return rows(
        "SELECT gate, outcome, reason, channel FROM decisions WHERE user_id = :u "
        "AND channel = 'sms' ORDER BY id DESC",
        u=user,
    )[0]


def _sid(key: Key) -> str:
    return _row(key)["provider_message_id"]


# --- send and receipts --------------------------------------------------------------------------------


def test_a_message_is_sent_and_its_callbacks_mark_it_delivered(world):
    key = _send("ana")
    [message] = world.fake.messages()
    assert _row(key)["state"] == "sent" and _sid(key) == message.sid
    assert message.to == ANA and message.body == "Your order shipped."
    assert message.status_callback == (
        f"{world.web}/webhooks/twilio/status?{urlencode({'u': 'ana', 'd': key[1]})}"
    )
    assert world.fake.progress(message.sid) == [
        ("queued", 204),
        ("sent", 204),
        ("delivered", 204),
    ]
    assert _row(key)["state"] == "delivered"
    assert [
        (r["event"], r["outcome"]) for r in rows("SELECT event, outcome FROM receipts ORDER BY id")
    ] == [("accepted", "applied"), ("accepted", "repeated"), ("delivered", "applied")]


def test_an_undelivered_message_ends_undelivered_with_its_error_code(world):
    world.fake.fail_number(BOB, 30003)
    key = _send("bob")
    assert _row(key)["state"] == "sent"
    assert [s for s, _ in world.fake.progress(_sid(key))] == ["queued", "sent", "undelivered"]
    row = _row(key)
    assert row["state"] == "undelivered" and "ErrorCode 30003" in row["last_error"]
    assert _suppressions() == []  # an unreachable handset today is not a dead number


# --- STOP / START / HELP ---------------------------------------------------------------------------------


def test_stop_suppresses_the_number_start_lifts_it_and_help_changes_nothing(world):
    status, answer = world.fake.inbound(world.inbound_url, ANA, " stop ")
    assert status == 200 and "<Response />" in answer and "<Message>" not in answer
    assert _suppressions() == [("ana", ANA, "stopped")]

    assert _route("ana") is None  # the next notify: no delivery, a recorded reason
    assert _last_decision("ana") == {
        "gate": "suppression",
        "outcome": "suppress",
        "reason": "suppressed_address",
        "channel": "sms",
    }
    before = {t: count(t) for t in ("suppressions", "deliveries", "decisions", "requests")}
    status, answer = world.fake.inbound(world.inbound_url, ANA, "HELP")
    assert status == 200 and f"<Message>{HELP_REPLY}</Message>" in answer
    assert {t: count(t) for t in before} == before

    assert world.fake.inbound(world.inbound_url, ANA, "Start")[0] == 200
    assert _suppressions() == []
    key = _send("ana")
    assert _row(key)["state"] == "sent"
    assert len(world.fake.messages()) == 1  # only the one sent after START


def test_a_reply_that_is_not_a_keyword_changes_nothing(world):
    assert world.fake.inbound(world.inbound_url, ANA, "stop sending me these please")[0] == 200
    assert world.fake.inbound(world.inbound_url, "+4917000000000", "STOP")[0] == 200  # nobody's
    assert _suppressions() == []


@pytest.mark.parametrize(("code", "reason"), [(21211, "invalid_number"), (21610, "stopped")])
def test_a_refused_number_fails_the_delivery_and_is_suppressed(world, code, reason):
    world.fake.fail_number(BOB, code)
    key = _send("bob")
    row = _row(key)
    assert row["state"] == "failed" and row["attempts"] == 1
    assert _last_decision("bob")["reason"] == f"twilio_{code}"
    assert _suppressions() == [("bob", BOB, reason)]
    assert _route("bob") is None and _last_decision("bob")["reason"] == "suppressed_address"
    assert len(world.fake.attempts) == 1 and world.fake.messages() == []
    world.fake.inbound(world.inbound_url, BOB, "START")  # lifts a STOP, never a dead number
    assert _suppressions() == ([] if reason == "stopped" else [("bob", BOB, reason)])


# --- forged callbacks ---------------------------------------------------------------------------------------


def _forgeries(url: str, params: dict[str, str]) -> list[dict]:
    good = sign(FakeTwilio.AUTH_TOKEN, url, params)
    body = urlencode(params)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    return [
        {"content": body, "headers": form},  # no signature
        {"content": body, "headers": {**form, "X-Twilio-Signature": "bm9wZQ=="}},
        {"content": body, "headers": {**form, "X-Twilio-Signature": sign("other", url, params)}},
        {  # signed for another URL
            "content": body,
            "headers": {
                **form,
                "X-Twilio-Signature": sign(FakeTwilio.AUTH_TOKEN, url + "x", params),
            },
        },
        {  # a changed parameter
            "content": urlencode({**params, "MessageStatus": "undelivered", "Body": "START"}),
            "headers": {**form, "X-Twilio-Signature": good},
        },
        {"content": b"\xff\xfe", "headers": {**form, "X-Twilio-Signature": good}},
    ]


def test_forged_callbacks_and_replies_get_401_and_change_nothing(world):
    key = _send("ana")
    world.fake.inbound(world.inbound_url, ANA, "STOP")
    before = {t: count(t) for t in ("receipts", "suppressions", "deliveries", "decisions")}
    status_url = f"{world.web}/webhooks/twilio/status?{urlencode({'u': 'ana', 'd': key[1]})}"
    status = {"MessageSid": _sid(key), "MessageStatus": "delivered", "To": ANA}
    reply = {"From": ANA, "Body": "START", "MessageSid": "SM1", "To": FakeTwilio.NUMBER}
    for url, params in ((status_url, status), (world.inbound_url, reply)):
        for forged in _forgeries(url, params):
            assert httpx.post(url, **forged).status_code == 401
    assert {t: count(t) for t in before} == before
    assert _row(key)["state"] == "sent" and _suppressions() == [("ana", ANA, "stopped")]


def test_a_signed_callback_with_bad_fields_is_400(world):
    key = _send("ana")
    base = f"{world.web}/webhooks/twilio/status"
    cases = [
        (f"{base}?u=ana&d={key[1]}", {"MessageStatus": "delivered"}),  # no MessageSid
        (f"{base}?u=ana&d=x", {"MessageSid": _sid(key), "MessageStatus": "delivered"}),
        (f"{base}?d={key[1]}", {"MessageSid": _sid(key), "MessageStatus": "delivered"}),
        (f"{base}?u=ana&d={key[1]}", {"MessageSid": "SM 1", "MessageStatus": "delivered"}),
    ]
    for url, params in cases:
        headers = {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Twilio-Signature": sign(FakeTwilio.AUTH_TOKEN, url, params),
        }
        answer = httpx.post(url, content=urlencode(params), headers=headers)
        assert answer.status_code == 400, (url, params, answer.text)
    assert count("receipts") == 0 and _row(key)["state"] == "sent"


# --- duplicated and reordered callbacks -------------------------------------------------------------------

LIVES = {  # Twilio's status sequences, and the state each must end in whatever the order
    "delivered": (["queued", "sent", "delivered"], "delivered"),
    "read": (["queued", "sent", "delivered", "read"], "read"),
    "undelivered": (["queued", "sent", "undelivered"], "undelivered"),
    "failed": (["queued", "failed"], "undelivered"),
}


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[list[str], str]:
    statuses, final = LIVES[draw(st.sampled_from(sorted(LIVES)))]
    repeated = statuses + draw(st.lists(st.sampled_from(statuses), max_size=4))
    return draw(st.permutations(repeated)), final


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(life=deliveries())
def test_duplicated_and_reordered_callbacks_leave_the_right_final_state(world, life):
    statuses, final = life
    key = _send("ana")
    sid = _sid(key)
    for status in statuses:
        code = 30003 if status in ("undelivered", "failed") else None
        assert world.fake.post_status(sid, status, error_code=code) == 204
    assert _row(key)["state"] == final, statuses


# --- the budget -------------------------------------------------------------------------------------------


def test_a_429_pauses_the_number_for_every_worker_and_refunds_the_attempt(world):
    world.fake.storm(1, retry_after=30)
    key = _send("ana")
    row = _row(key)
    assert (
        row["state"] == "pending" and row["attempts"] == 0 and "twilio_20429" in row["last_error"]
    )
    parts = runtime.collaborators()
    quota = budget_quota(100)
    assert 25 < (parts.limits.paused_for(quota, FakeTwilio.NUMBER) or 0) <= 30
    _due_now()
    deliver([key[0]], [key[1]])  # deferred again without asking Twilio
    assert len(world.fake.attempts) == 1 and _row(key)["attempts"] == 0
    assert "paused" in _row(key)["last_error"]


def test_a_message_longer_than_the_budget_spends_it_and_pauses_for_the_rest(world, monkeypatch):
    configure(monkeypatch, sms_segments_per_second=1)
    with frozen_clock(datetime.now(UTC)):
        key = _route("ana", "sms_receipt", variables={"text": "a" * 400})  # a three-segment text
        assert key is not None
        # sent by its route: not refused for costing more than a second holds
        assert _row(key)["state"] == "sent"
        [message] = world.fake.messages()
        assert message.segments == 3
        paused = runtime.collaborators().limits.paused_for(budget_quota(1), FakeTwilio.NUMBER)
        assert paused is not None and 2.5 < paused <= 3.0
        later = _route("bob")  # its route's send finds the number paused
        assert later is not None
        assert _row(later)["state"] == "pending" and _row(later)["attempts"] == 0
        assert len(world.fake.messages()) == 1


def test_a_worker_that_finds_the_budget_full_closes_it_a_little_past_its_window(world, monkeypatch):
    # one segment per 5 s: the budget lives on Redis's clock, which no test can freeze, and a
    # loaded machine took more than a one-second window's 1.5 s between the sends and the look
    configure(monkeypatch, sms_segments_per_second=0.2)
    first, second, third = _route("ana"), _route("bob"), _route("ana")  # each route sends its own
    assert first and second and third
    assert _row(first)["state"] == "sent"
    # the second's route found the budget spent: it closed the number
    assert _row(second)["state"] == "pending" and "budget_full" in _row(second)["last_error"]
    paused = runtime.collaborators().limits.paused_for(budget_quota(0.2), FakeTwilio.NUMBER)
    assert paused is not None and SETTLE < paused <= 5.0 + SETTLE  # the window's rest, and SETTLE
    # the third's route found the number paused
    assert "paused" in _row(third)["last_error"] and len(world.fake.attempts) == 1


# --- the marketing SMS hours ------------------------------------------------------------------------------


def test_marketing_sms_waits_for_the_recipients_daytime(world):
    register_recipient("cy", timezone="America/New_York", country="US", addresses={"sms": ANA})
    zone = ZoneInfo("America/New_York")
    tomorrow = (datetime.now(zone) + timedelta(days=1)).date()
    night = datetime.combine(tomorrow, time(3, 0), zone)  # leases and claims run on the real
    opens = datetime.combine(tomorrow, time(8, 0), zone)  # clock: the night is still to come
    with frozen_clock(night.astimezone(UTC)):
        key = _route("cy", "sms_promo")
        assert key is not None
        deliver([key[0]], [key[1]])
        decision = _last_decision("cy")
    assert (decision["outcome"], decision["reason"], decision["channel"]) == (
        "defer",
        "marketing_sms_hours",
        "sms",
    )
    [held] = rows("SELECT state, not_before FROM deliveries WHERE user_id = 'cy'")
    assert held == {"state": "pending", "not_before": opens}
    assert world.fake.messages() == []  # not at 03:00
    _due_now()  # 08:00 came
    deliver([key[0]], [key[1]])
    assert _row(key)["state"] == "sent" and len(world.fake.messages()) == 1


# --- the third outcome ----------------------------------------------------------------------------------


LOSSES = ("drop", "late", "5xx")
TYPES = ("sms_nudge", "sms_receipt")  # at-most-once, at-least-once


def _lose(world: World, loss: str, type_key: str) -> tuple[Key, str]:
    """Send with the answer lost (Twilio took the message); the key and the message's SID."""
    world.fake.losses.next(loss, delay=1.5)
    key = _send("ana", type_key)
    row = _row(key)
    assert row["state"] == "pending" and row["maybe_sent_at"] is not None  # owed a look first
    [message] = world.fake.messages()
    return key, message.sid


def _incident_kinds() -> list[str]:
    return [r["kind"] for r in rows("SELECT kind FROM incidents ORDER BY id")]


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("type_key", TYPES)
def test_a_status_callback_settles_a_lost_answer_as_sent_and_nothing_is_resent(
    world, loss, type_key
):
    key, sid = _lose(world, loss, type_key)
    assert [code for _, code in world.fake.progress(sid)] == [204, 204, 204]
    row = _row(key)
    assert row["state"] == "delivered" and row["provider_message_id"] == sid
    assert row["maybe_sent_at"] is None
    _due_now()
    assert deliver([key[0]], [key[1]]) == 0  # settled: nothing owed, nothing to claim
    assert len(world.fake.messages()) == 1 and world.fake.lookups == []
    assert _incident_kinds() == []
    assert _last_decision("ana")["reason"] == "settled_by_receipt"


@pytest.mark.parametrize("type_key", TYPES)
def test_with_no_callback_the_lookup_finds_the_message_before_any_resend(world, type_key):
    key, sid = _lose(world, "drop", type_key)
    world.fake.dispatch(sid)  # Twilio sent it on; its callback is lost
    _due_now()
    assert deliver([key[0]], [key[1]]) == 1
    row = _row(key)
    assert row["state"] == "sent" and row["provider_message_id"] == sid
    assert len(world.fake.messages()) == 1 and len(world.fake.lookups) == 1
    assert world.fake.lookups[0]["To"] == ANA and world.fake.lookups[0]["From"] == FakeTwilio.NUMBER
    assert _incident_kinds() == []


def test_an_inconclusive_lookup_holds_a_nudge_until_its_callback_settles_it(world):
    key, sid = _lose(world, "5xx", "sms_nudge")
    _due_now()  # still queued at Twilio: no DateSent, the list cannot show it
    assert deliver([key[0]], [key[1]]) == 0
    assert _row(key)["state"] == "unknown" and _incident_kinds() == ["outcome_unknown"]
    assert world.fake.post_status(sid, "sent") == 204  # the evidence, later
    row = _row(key)
    assert row["state"] == "sent" and row["provider_message_id"] == sid  # no operator needed
    assert len(world.fake.messages()) == 1


def test_an_inconclusive_lookup_resends_a_receipt_and_says_so(world):
    key, _ = _lose(world, "late", "sms_receipt")
    _due_now()
    assert deliver([key[0]], [key[1]]) == 1
    assert len(world.fake.messages()) == 2  # Twilio cannot dedup: a possible duplicate ...
    assert _row(key)["state"] == "sent" and _sid(key) == world.fake.messages()[1].sid
    assert _incident_kinds() == ["possible_duplicate"]  # ... that the operator is told about


def test_a_callback_that_beats_the_lost_answer_settles_the_next_attempt(world):
    """Twilio's callback arrives while the send still waits for its answer (`early`): the
    attempt after the unknown outcome reads it first, and sends nothing."""
    key, sid = _lose(world, "drop", "sms_receipt")
    with engine().begin() as conn:  # as if the callback had come while the row was claimed
        conn.execute(
            text(
                "UPDATE deliveries SET state = 'claimed', claim_token = gen_random_uuid(), "
                "lease_until = now() + interval '1 minute' WHERE id = :d"
            ),
            {"d": key[1]},
        )
    assert world.fake.post_status(sid, "sent") == 204
    assert rows("SELECT outcome FROM receipts") == [{"outcome": "early"}]
    with engine().begin() as conn:
        conn.execute(
            text(
                "UPDATE deliveries SET state = 'pending', claim_token = NULL, lease_until = NULL, "
                "not_before = now() WHERE id = :d"
            ),
            {"d": key[1]},
        )
    assert deliver([key[0]], [key[1]]) == 1
    assert _row(key)["state"] == "sent" and _sid(key) == sid
    assert len(world.fake.messages()) == 1 and world.fake.lookups == []


def test_a_lookup_past_the_validity_period_is_conclusive_and_sends(world):
    """Twilio failed the message off its queue (it never got a sent date): once the validity
    period has passed, "not listed" means "not sent", and the nudge is sent, with no incident."""
    key, _ = _lose(world, "drop", "sms_nudge")
    with frozen_clock(datetime.now(UTC)) as clock:
        clock.advance(30 * 60)
        _due_now()
        assert deliver([key[0]], [key[1]]) == 1
    assert _row(key)["state"] == "sent" and len(world.fake.messages()) == 2
    assert len(world.fake.lookups) == 1 and _incident_kinds() == []


def test_stop_from_one_users_number_stops_it_for_every_user_who_has_it(world):
    assert world.fake.inbound(world.inbound_url, ANA, "STOP")[0] == 200  # ana's number
    for user in ("dee", "eve"):  # the same number registered later for others: allowed…
        register_recipient(user, timezone="Europe/Berlin", addresses={"sms": ANA})
        assert _route(user) is None  # …but nothing is sent, with the reason
        assert _last_decision(user)["reason"] == "suppressed_address"
        assert "stopped recorded for another recipient with this address" in explain(user)
    assert world.fake.messages() == []  # no message at the stand-in
