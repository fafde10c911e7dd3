"""Email through SendGrid end to end: the real `sendgrid` SDK against a local mail/send
(standins/fake_sendgrid.py), events signed with a P-256 key made here and posted to clarion's real
`POST /webhooks/sendgrid` (uvicorn), real PostgreSQL and Redis. Counted at the fake and in the
ledger: the payload, receipts moving the delivery, a bounce suppressing the address, a bad
signature changing nothing, 429 pausing the API key's budget, a lost answer settled by the type's
guarantee, duplicated and reordered batches (hypothesis, through the door), and one-click
unsubscribe turning the category off while transactional mail still goes.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clarion import settings as clarion_settings
from clarion.adapters.sendgrid import SendGridAdapter
from clarion.errors import ConfigurationError
from clarion.ops.explain import explain
from clarion.standins.fake_sendgrid import EventKey, FakeSendGrid, Sent, event, post_events
from clarion.standins.fake_slack import serving
from clarion.tasks import register_recipient, runtime
from clarion.tasks.deliver import deliver
from clarion.web.app import create_app
from tests.support.mail import (
    Key,
    decisions,
    delivery,
    email_settings,
    incidents,
    notify_and_route,
    retry,
    send,
)
from tests.support.pipeline import (
    configure,
    count,
    frozen_clock,
    publishing_to_this_tests_broker,
    rows,
)

pytestmark = pytest.mark.integration

KEY = EventKey.generate()  # SendGrid's signing key for this session; clarion has the public half


@pytest.fixture
def fake() -> Iterator[FakeSendGrid]:
    with FakeSendGrid() as server:
        yield server


@pytest.fixture
def web(clarion_env, fake, monkeypatch) -> Iterator[str]:
    """clarion web on a real port, the email channel on the fake SendGrid."""
    with serving(create_app()) as url:
        configure(
            monkeypatch,
            **email_settings(
                sendgrid_api_key=FakeSendGrid.API_KEY,
                sendgrid_api_url=fake.url,
                sendgrid_webhook_public_key=KEY.public_key,
                public_url=url,
                email_per_second=1000,  # the hypothesis test sends dozens a second
            ),
        )
        register_recipient("ana", timezone="UTC", addresses={"email": "ana@example.com"})
        with publishing_to_this_tests_broker():
            yield url


def sent_for(fake: FakeSendGrid, key: Key) -> Sent:
    [found] = [s for s in fake.sent if s.custom_args.get("clarion_delivery") == str(key[1])]
    return found


def post(url: str, events: list[dict], key: EventKey = KEY) -> tuple[int, dict]:
    status, body = post_events(f"{url}/webhooks/sendgrid", key, events)
    return status, json.loads(body or b"{}")


def receipts() -> list[dict]:
    return rows("SELECT event, outcome, delivery_id FROM receipts ORDER BY id")


# --- sending -----------------------------------------------------------------------------------------


def test_a_digest_goes_through_the_sdk_with_ids_categories_and_one_click(web, fake):
    key, sent = send("ana", "digest_email", name="<b>Ana</b>")
    assert sent == 1
    [mail] = fake.sent
    assert mail.payload["from"] == {"email": "news@mk.clarion.test", "name": "Clarion News"}
    assert mail.to == "ana@example.com" and mail.payload["subject"] == "This week for <b>Ana</b>"
    assert mail.custom_args == {"clarion_user": "ana", "clarion_delivery": str(key[1])}
    assert sorted(mail.payload["categories"]) == ["digest", "digest_email"]
    assert mail.headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert mail.headers["List-Unsubscribe"].startswith(f"<{web}/webhooks/email/unsubscribe?t=")
    assert "&lt;b&gt;Ana&lt;/b&gt;" in (mail.content("text/html") or "")
    row = delivery(key)
    assert row["state"] == "sent" and row["platform"] == "sendgrid"
    assert row["provider_message_id"] == mail.message_id  # X-Message-Id


def test_a_receipt_has_no_unsubscribe_header(web, fake):
    send("ana", "receipt_email", order="A-1")
    [mail] = fake.sent
    assert mail.payload["from"]["email"] == "notify@tx.clarion.test"
    assert set(mail.headers) == {"Message-ID"}


def test_a_400_fails_the_delivery_for_good(web, fake):
    fake.fail(400)
    key, _ = send("ana", "receipt_email", order="A-1")
    assert delivery(key)["state"] == "failed" and "http_400" in delivery(key)["last_error"]


def test_mail_goes_out_on_one_kept_alive_connection(web, fake):
    for n in range(5):
        assert send("ana", "receipt_email", f"k{n}", order=f"A-{n}")[1] == 1
    assert len(fake.sent) == 5
    # the SDK's own transport (urllib) connected once per mail; one connection serves them all
    assert fake.server.accepted == 1


def test_no_connection_fails_the_send_and_the_retry_sends_it(web, fake):
    fake.refuse()  # nothing listens: nothing can have been sent
    key, sent = send("ana", "receipt_email", order="A-1")
    row = delivery(key)
    assert sent == 0 and row["state"] == "pending" and row["maybe_sent_at"] is None
    assert row["last_error"].startswith("connection"), row["last_error"]
    fake.reopen()
    assert retry(key) == 1
    assert len(fake.sent) == 1 and delivery(key)["state"] == "sent" and incidents() == []


def test_a_429_pauses_the_keys_budget_and_recovers(web, fake):
    with frozen_clock() as clock:
        fake.fail(429, retry_after=30)
        first = notify_and_route("ana", "receipt_email", "e1", order="A-1")
        second = notify_and_route("ana", "receipt_email", "e2", order="A-2")
        assert first and second
        # Each route sent its own: the first got the 429, the second found the key paused (SendGrid
        # is not even asked). Both are back to pending, not due before the pause ends.
        assert deliver(["ana"], [first[1]]) == 0
        assert deliver(["ana"], [second[1]]) == 0
        assert [c.status for c in fake.calls] == [429] and fake.sent == []
        assert [delivery(k)["attempts"] for k in (first, second)] == [0, 0]  # refunded
        assert "paused" in delivery(second)["last_error"]
        clock.advance(31)
        assert retry(first) == 1 and retry(second) == 1
        assert len(fake.sent) == 2 and incidents() == []


# --- the third outcome -----------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["drop", "5xx"])
def test_a_lost_answer_holds_a_digest_and_resends_a_receipt(web, fake, loss):
    fake.losses.next(loss, times=2)
    digest, _ = send("ana", "digest_email", name="Ana")
    receipt, _ = send("ana", "receipt_email", order="A-1")
    assert delivery(digest)["state"] == "unknown" and delivery(receipt)["state"] == "pending"
    assert retry(digest) == 0 and retry(receipt) == 1
    assert [s.custom_args["clarion_delivery"] for s in fake.sent] == [
        str(digest[1]),
        str(receipt[1]),
        str(receipt[1]),  # sent twice: SendGrid cannot dedup
    ]
    assert sorted(incidents()) == ["outcome_unknown", "possible_duplicate"]


@pytest.mark.parametrize("loss", ["drop", "late", "5xx"])
def test_a_processed_event_settles_a_held_digest_as_sent_without_an_operator(web, fake, loss):
    fake.losses.next(loss, delay=2.0)
    digest, _ = send("ana", "digest_email", name="Ana")
    assert delivery(digest)["state"] == "unknown" and incidents() == ["outcome_unknown"]
    [mail] = fake.sent
    assert mail.answered is (loss == "late")  # SendGrid took it; clarion never heard back
    status, body = post(web, [event(mail, "processed")])
    assert status == 200 and body["outcomes"] == {"applied": 1}
    row = delivery(digest)
    assert row["state"] == "sent" and row["platform"] == "sendgrid"
    assert row["provider_message_id"] == mail.message_id and row["maybe_sent_at"] is None
    assert retry(digest) == 0 and len(fake.sent) == 1  # exactly one message at SendGrid
    assert decisions("ana")[-1]["reason"] == "settled_by_receipt"


@pytest.mark.parametrize("loss", ["drop", "late", "5xx"])
@pytest.mark.parametrize("kind", ["processed", "delivered"])
def test_an_at_least_once_resend_waits_for_the_event_and_is_not_made_when_it_comes(
    web, fake, kind, loss
):
    from clarion.adapters.sendgrid import EVIDENCE_WAIT

    fake.losses.next(loss, delay=2.0)
    with frozen_clock() as clock:
        receipt, _ = send("ana", "receipt_email", order="A-1")
        [row] = rows("SELECT state, not_before FROM deliveries WHERE id = :d", d=receipt[1])
        assert row["state"] == "pending"
        assert (row["not_before"] - clock.now).total_seconds() >= EVIDENCE_WAIT  # bounded wait
        post(web, [event(fake.sent[0], kind)])
        clock.advance(EVIDENCE_WAIT + 1)
        assert deliver(["ana"], [receipt[1]]) == 0  # settled: not resent
    assert delivery(receipt)["state"] == ("sent" if kind == "processed" else "delivered")
    assert len(fake.sent) == 1 and incidents() == []


def test_an_event_for_the_resent_message_after_the_wait_changes_nothing_owed(web, fake):
    """No event within the wait: resent, with a possible_duplicate; the first message's late
    event then moves the sent row as any receipt does (nothing is resent a third time)."""
    fake.losses.next("5xx")
    receipt, _ = send("ana", "receipt_email", order="A-1")
    assert retry(receipt) == 1 and len(fake.sent) == 2
    assert incidents() == ["possible_duplicate"]
    status, _ = post(web, [event(fake.sent[0], "processed")])
    assert status == 200 and delivery(receipt)["state"] == "sent"
    assert retry(receipt) == 0 and len(fake.sent) == 2


# --- the Event Webhook -----------------------------------------------------------------------------------


def test_delivered_then_opened_move_the_delivery(web, fake):
    key, _ = send("ana", "digest_email", name="Ana")
    mail = sent_for(fake, key)
    status, body = post(web, [event(mail, "processed"), event(mail, "delivered")])
    assert status == 200 and body["outcomes"] == {"applied": 2}
    assert delivery(key)["state"] == "delivered"
    post(web, [event(mail, "open")])
    assert delivery(key)["state"] == "opened"


def test_a_bounce_suppresses_the_address_and_the_next_notify(web, fake):
    key, _ = send("ana", "receipt_email", order="A-1")
    mail = sent_for(fake, key)
    status, _ = post(web, [event(mail, "processed"), event(mail, "bounce")])
    assert status == 200
    row = delivery(key)
    assert row["state"] == "bounced" and "5.1.1" in row["last_error"]
    [suppressed] = rows("SELECT channel, address, reason FROM suppressions")
    assert suppressed == {"channel": "email", "address": "ana@example.com", "reason": "bounced"}
    assert notify_and_route("ana", "receipt_email", "e2", order="A-2") is None
    assert {
        "gate": "suppression",
        "outcome": "suppress",
        "reason": "suppressed_address",
        "channel": "email",
    } in decisions("ana")
    assert len(fake.sent) == 1


def test_a_blocked_bounce_is_soft_and_suppresses_nothing(web, fake):
    key, _ = send("ana", "receipt_email", order="A-1")
    mail = sent_for(fake, key)
    post(web, [event(mail, "bounce", type="blocked"), event(mail, "deferred")])
    assert delivery(key)["state"] == "sent" and count("suppressions") == 0
    assert [r["event"] for r in receipts()] == ["soft_bounced", "soft_bounced"]


def test_a_spam_report_suppresses(web, fake):
    key, _ = send("ana", "digest_email", name="Ana")
    post(web, [event(sent_for(fake, key), "spamreport")])
    assert rows("SELECT reason FROM suppressions") == [{"reason": "complained"}]


def _state() -> tuple:
    return (
        rows("SELECT id, state FROM deliveries ORDER BY id"),
        count("receipts"),
        count("suppressions"),
    )


@pytest.mark.parametrize(
    "headers",
    [
        {"X-Twilio-Email-Event-Webhook-Signature": ""},  # missing
        {"X-Twilio-Email-Event-Webhook-Signature": "bm90IGEgc2lnbmF0dXJl"},  # not DER
        {"X-Twilio-Email-Event-Webhook-Signature": "%%%"},  # not base64
        {"X-Twilio-Email-Event-Webhook-Timestamp": "1700000001"},  # another timestamp
        {"X-Twilio-Email-Event-Webhook-Timestamp": "soon"},
    ],
)
def test_a_bad_signature_is_401_and_changes_nothing(web, fake, headers):
    key, _ = send("ana", "receipt_email", order="A-1")
    before = _state()
    body = json.dumps([event(sent_for(fake, key), "bounce")]).encode()
    status, answer = post_events(
        f"{web}/webhooks/sendgrid", KEY, body, timestamp="1700000000", headers=headers
    )
    assert status == 401 and b"error" in answer
    assert _state() == before


def test_a_batch_signed_by_another_key_or_changed_after_signing_is_401(web, fake):
    key, _ = send("ana", "receipt_email", order="A-1")
    before = _state()
    events = [event(sent_for(fake, key), "bounce")]
    assert post(web, events, EventKey.generate())[0] == 401
    body = json.dumps(events).encode()
    signed = KEY.headers(body)
    tampered = body.replace(b'"bounce"', b'"open"', 1)
    answer = httpx.post(f"{web}/webhooks/sendgrid", content=tampered, headers=signed)
    assert answer.status_code == 401 and _state() == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"not json", "body is not JSON"),
        (b'{"event": "open"}', "expected a JSON array"),
        (b"[1]", "[0]: expected an object"),
        (b'[{"timestamp": 1}]', "[0].event"),
        (b'[{"event": "open", "timestamp": "x"}]', "[0].timestamp"),
        (b'[{"event": "open", "timestamp": 1, "email": 7}]', "[0].email"),
        (b'[{"event": "open", "timestamp": 1, "clarion_delivery": [1]}]', "[0].clarion_delivery"),
        (b'[{"event": "o\\u0000", "timestamp": 1}]', "[0].event"),
    ],
)
def test_a_signed_but_malformed_batch_is_400_naming_the_problem(web, body, field):
    before = _state()
    status, answer = post_events(f"{web}/webhooks/sendgrid", KEY, body)
    assert status == 400 and field in json.loads(answer)["error"]
    assert _state() == before


def test_events_for_messages_clarion_never_sent_are_kept_and_ignored(web, fake):
    stranger = Sent("not-ours", {"personalizations": [{"to": [{"email": "x@example.com"}]}]})
    status, body = post(web, [event(stranger, "delivered"), event(stranger, "group_resubscribe")])
    assert status == 200 and body == {"received": 2, "outcomes": {"unknown_message": 1}}
    assert rows("SELECT user_id, outcome FROM receipts") == [
        {"user_id": "", "outcome": "unknown_message"}
    ]


PROGRESS = ("delivered", "open", "click")
FINAL = {"delivered": "delivered", "open": "opened", "click": "clicked"}
_users = itertools.count(1)


@st.composite
def batches(draw) -> tuple[list[str], list[list[str]]]:
    """A lifecycle (some progress, or a bounce after deferrals), each event maybe repeated,
    shuffled and split into batches as SendGrid's retries and batching would."""
    if draw(st.booleans()):
        kinds = ["processed", *draw(st.sets(st.sampled_from(PROGRESS), min_size=1))]
    else:
        kinds = ["processed", "deferred", "bounce"]
    posted = kinds + draw(st.lists(st.sampled_from(kinds), max_size=6))
    order = draw(st.permutations(posted))
    cuts = sorted(draw(st.sets(st.integers(1, len(order) - 1), max_size=3)))
    return kinds, [list(order[a:b]) for a, b in itertools.pairwise([0, *cuts, len(order)])]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=batches())
def test_duplicated_and_reordered_batches_leave_the_right_final_state(web, fake, case):
    kinds, posted = case
    user = f"h{next(_users)}"
    register_recipient(user, timezone="UTC", addresses={"email": f"{user}@example.com"})
    key, sent = send(user, "digest_email", f"e-{user}", name="Ana")
    assert sent == 1
    mail = sent_for(fake, key)
    events = {kind: event(mail, kind) for kind in kinds}  # a repeat is the same event again
    for batch in posted:
        status, _ = post(web, [events[kind] for kind in batch])
        assert status == 200
    reached = [FINAL[k] for k in PROGRESS if k in kinds]
    expected = "bounced" if "bounce" in kinds else reached[-1]
    assert delivery(key)["state"] == expected
    mine = rows("SELECT event, outcome FROM receipts WHERE delivery_id = :d", d=key[1])
    assert len(mine) == sum(len(b) for b in posted)  # every receipt kept, applied or not
    assert {r["outcome"] for r in mine} <= {"applied", "repeated", "stale"}
    suppressed = count("suppressions", "user_id = :u", u=user)
    assert suppressed == ("bounce" in kinds)


# --- one-click unsubscribe ----------------------------------------------------------------------------------


def _link(fake: FakeSendGrid, key: Key) -> str:
    found = re.fullmatch(r"<(.+)>", sent_for(fake, key).headers["List-Unsubscribe"])
    assert found is not None
    return found[1]


def test_one_click_turns_the_category_off_and_transactional_mail_still_goes(web, fake):
    key, _ = send("ana", "digest_email", "e1", name="Ana")
    link = _link(fake, key)
    page = httpx.get(link)  # a link scanner, or a person: a page, and no change
    assert page.status_code == 200 and 'method="post"' in page.text
    assert 'name="List-Unsubscribe" value="One-Click"' in page.text
    assert count("receipts") == 0 and count("preferences") == 0
    done = httpx.post(
        link,
        content=b"List-Unsubscribe=One-Click",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert done.status_code == 200 and "unsubscribed" in done.text
    assert rows("SELECT event, outcome FROM receipts") == [
        {"event": "unsubscribed", "outcome": "applied"}
    ]
    assert rows("SELECT scope, key, channel, enabled FROM preferences") == [
        {"scope": "category", "key": "digest", "channel": "email", "enabled": False}
    ]
    assert notify_and_route("ana", "digest_email", "e2", name="Ana") is None
    assert {"gate": "preferences", "outcome": "suppress", "channel": "email"}.items() <= next(
        d for d in decisions("ana") if d["gate"] == "preferences"
    ).items()
    receipt, sent = send("ana", "receipt_email", "e3", order="A-1")
    assert sent == 1 and len(fake.sent) == 2  # locked: a receipt still reaches the address
    again = httpx.post(link, content=b"List-Unsubscribe=One-Click")
    assert again.status_code == 200 and count("preferences") == 1


@pytest.mark.parametrize(
    ("query", "body", "status"),
    [
        ("t=forged.token", b"List-Unsubscribe=One-Click", 400),
        ("", b"List-Unsubscribe=One-Click", 400),
        (None, b"", 400),  # the right token, no one-click body
        (None, b"List-Unsubscribe=Yes", 400),
    ],
)
def test_a_bad_unsubscribe_request_changes_nothing(web, fake, query, body, status):
    key, _ = send("ana", "digest_email", name="Ana")
    link = _link(fake, key)
    url = link if query is None else link.split("?")[0] + f"?{query}"
    answer = httpx.post(url, content=body)
    assert answer.status_code == status and "not valid" in answer.text
    assert count("receipts") == 0 and count("preferences") == 0
    assert httpx.get(link.split("?")[0] + "?t=forged").status_code == 400


def test_the_webhook_is_404_when_not_configured(web, monkeypatch):
    configure(monkeypatch, sendgrid_webhook_public_key=None)
    assert post(web, [])[0] == 404


def test_a_complaint_stops_the_address_for_every_user_who_has_it(web, fake):
    key, _ = send("ana", "digest_email", name="Ana")
    post(web, [event(sent_for(fake, key), "spamreport")])
    for user in ("ana2", "ana3"):  # ana's address, registered for two other users
        register_recipient(user, timezone="UTC", addresses={"email": "ana@example.com"})
        assert notify_and_route(user, "digest_email", "e2", name="Ana") is None
        [why] = rows(
            "SELECT detail FROM decisions WHERE user_id = :u AND gate = 'suppression'", u=user
        )
        assert "complained recorded for another recipient with this address" in why["detail"]
        assert "complained recorded for another recipient" in explain(user)
    assert len(fake.sent) == 1  # the stand-in got ana's message and nothing since


@pytest.mark.parametrize(
    ("field", "value", "names"),
    [
        ("sendgrid_api_key", "SG.key\r\nX-Injected: 1", "CLARION_SENDGRID_API_KEY"),
        ("sendgrid_api_key", "SG.key with space", "CLARION_SENDGRID_API_KEY"),
        ("sendgrid_api_url", "ftp://api.sendgrid.example", "CLARION_SENDGRID_API_URL"),
        ("sendgrid_api_url", "https://", "CLARION_SENDGRID_API_URL"),
    ],
)
def test_a_bad_api_key_or_url_is_a_configuration_error(
    clarion_env, monkeypatch, field, value, names
):
    configure(
        monkeypatch, **email_settings(**{"sendgrid_api_key": FakeSendGrid.API_KEY, field: value})
    )
    with pytest.raises(ConfigurationError, match=rf"^{names}\b"):
        SendGridAdapter.from_settings(clarion_settings.get(), runtime.collaborators())
