"""Email over SMTP end to end: notify → route → deliver through smtplib to a real SMTP server
(aiosmtpd, standins/fake_smtp.py), real PostgreSQL and Redis. What the relay took is counted at the
relay: headers (Message-ID stable across attempts, List-Unsubscribe only for non-transactional
mail), both parts, escaping; a 550 at RCPT suppressing the address; 4xx retried; the answer lost
after the end of data settled by the type's guarantee; STARTTLS with credentials; the relay budget.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from email.message import EmailMessage
from urllib.parse import parse_qs, urlsplit

import pytest

from clarion.adapters.email_mime import message_id, read_unsubscribe_token
from clarion.ops.explain import explain
from clarion.records import Message
from clarion.standins.fake_smtp import FakeSmtp, self_signed
from clarion.tasks import register_recipient
from tests.support.environment import WEBHOOK_SECRET
from tests.support.mail import (
    MK,
    PUBLIC,
    TX,
    Key,
    decisions,
    delivery,
    email_settings,
    incidents,
    notify_and_route,
    retry,
    send,
)
from tests.support.pipeline import configure, publishing_to_this_tests_broker, rows

pytestmark = pytest.mark.integration


@pytest.fixture
def relay() -> Iterator[FakeSmtp]:
    with FakeSmtp() as server:
        yield server


@pytest.fixture
def smtp(clarion_env, relay, monkeypatch) -> Iterator[FakeSmtp]:
    configure(monkeypatch, **email_settings(smtp_url=relay.url))
    register_recipient("ana", timezone="UTC", addresses={"email": "ana@example.com"})
    with publishing_to_this_tests_broker():
        yield relay


def expected_message_id(key: Key, type_key: str, event: str, domain: str) -> str:
    """What this deployment's secret makes of the delivery (adapters.email_mime.message_id)."""
    message = Message(key[1], key[0], type_key, f"event:{event}", "email", {})
    return message_id(message, f"x@{domain}", WEBHOOK_SECRET)


def parts(message: EmailMessage) -> tuple[str, str]:
    plain, html = message.get_body(("plain",)), message.get_body(("html",))
    assert plain is not None and html is not None
    return plain.get_content(), html.get_content()


# --- sending -----------------------------------------------------------------------------------------


def test_a_receipt_goes_out_with_both_parts_escaped_and_no_unsubscribe(smtp):
    key, sent = send(
        "ana", "receipt_email", order="A-1", note='<a href="https://x.example">win</a>'
    )
    assert sent == 1
    [got] = smtp.messages
    message = got.message
    assert got.mail_from == "notify@tx.clarion.test" and got.rcpt_tos == ("ana@example.com",)
    assert message["From"] == TX and message["To"] == "ana@example.com"
    assert message["Subject"] == "Receipt A-1"
    assert message["Message-ID"] == expected_message_id(
        key, "receipt_email", "e1", "tx.clarion.test"
    )
    assert "List-Unsubscribe" not in message and "List-Unsubscribe-Post" not in message
    plain, html = parts(message)
    assert '<a href="https://x.example">win</a>' in plain
    assert "&lt;a href=&#34;https://x.example&#34;&gt;win&lt;/a&gt;" in html
    assert "<a " not in html
    row = delivery(key)
    assert row["state"] == "sent" and row["platform"] == "email"
    assert row["provider_message_id"] == message["Message-ID"]


def test_a_digest_has_the_marketing_identity_and_a_one_click_link(smtp):
    key, _ = send("ana", "digest_email", name="Ana")
    message = smtp.messages[0].message
    assert message["From"] == MK
    assert message["Message-ID"] == expected_message_id(
        key, "digest_email", "e1", "mk.clarion.test"
    )
    link = re.fullmatch(r"<(.+)>", str(message["List-Unsubscribe"]))
    assert link is not None and message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    url = urlsplit(link[1])
    assert f"{url.scheme}://{url.netloc}{url.path}" == f"{PUBLIC}/webhooks/email/unsubscribe"
    [token] = parse_qs(url.query)["t"]
    assert read_unsubscribe_token(WEBHOOK_SECRET, token) == key  # names this user and delivery


def test_4xx_replies_are_retried_until_the_relay_takes_it(smtp):
    smtp.fail("rcpt", "451 4.3.0 Try again later")
    key, sent = send("ana", "receipt_email", order="A-1")
    assert sent == 0 and smtp.messages == []
    row = delivery(key)
    assert row["state"] == "pending" and row["maybe_sent_at"] is None  # nothing was taken
    assert "smtp_451" in row["last_error"]
    smtp.fail("data", "452 4.3.1 Insufficient system storage")  # the answer to the data: 4xx
    assert retry(key) == 0
    assert smtp.messages == []  # the relay refused the data: it kept nothing
    assert retry(key) == 1
    [got] = smtp.messages  # the third attempt, under the id every attempt had
    assert got.message["Message-ID"] == expected_message_id(
        key, "receipt_email", "e1", "tx.clarion.test"
    )
    assert delivery(key)["state"] == "sent" and incidents() == []


def test_a_relay_that_cannot_be_reached_is_retried(smtp, monkeypatch):
    configure(monkeypatch, **email_settings(smtp_url="smtp://127.0.0.1:1"))
    key, sent = send("ana", "receipt_email", order="A-1")
    row = delivery(key)
    assert sent == 0 and row["state"] == "pending" and row["maybe_sent_at"] is None
    assert "smtp_connect" in row["last_error"]


def test_starttls_with_credentials_from_the_url(clarion_env, monkeypatch, tmp_path):
    context, cafile = self_signed(tmp_path)
    with FakeSmtp(auth=("relay@x", "p:w/d"), tls=context) as relay:
        url = f"smtp+starttls://relay%40x:p%3Aw%2Fd@127.0.0.1:{relay.port}?cafile={cafile}"
        configure(monkeypatch, **email_settings(smtp_url=url))
        register_recipient("ana", timezone="UTC", addresses={"email": "ana@example.com"})
        with publishing_to_this_tests_broker():
            _, sent = send("ana", "receipt_email", order="A-1")
        assert sent == 1 and relay.logins == ["relay@x"] and len(relay.messages) == 1


# --- bounces and suppression -----------------------------------------------------------------------------


def test_a_550_at_rcpt_fails_the_delivery_and_suppresses_the_address(smtp):
    register_recipient("bo", timezone="UTC", addresses={"email": "gone@example.com"})
    smtp.reject("gone@example.com")
    key, sent = send("bo", "receipt_email", order="A-1")
    assert sent == 0 and smtp.messages == []
    row = delivery(key)
    assert row["state"] == "failed" and "smtp_550" in row["last_error"]
    assert rows("SELECT channel, address, reason, detail FROM suppressions") == [
        {
            "channel": "email",
            "address": "gone@example.com",
            "reason": "bounced",
            "detail": "rcpt: 550 5.1.1 <gone@example.com>: Recipient address rejected: User unknown",
        }
    ]
    assert [d for d in decisions("bo") if d["gate"] == "deliver"] == [
        {"gate": "deliver", "outcome": "failed", "reason": "smtp_550", "channel": "email"}
    ]
    assert notify_and_route("bo", "receipt_email", "e2", order="A-2") is None  # not even tried
    assert {
        "gate": "suppression",
        "outcome": "suppress",
        "reason": "suppressed_address",
        "channel": "email",
    } in decisions("bo")
    assert smtp.messages == []


def test_a_bounce_for_one_user_suppresses_the_address_for_every_other_user(smtp):
    register_recipient("bo", timezone="UTC", addresses={"email": "gone@example.com"})
    smtp.reject("gone@example.com")
    send("bo", "receipt_email", order="A-1")
    assert smtp.rcpts == ["gone@example.com"]  # the one RCPT that bounced
    for user in ("bo2", "bo3"):  # registering the address for others is allowed…
        register_recipient(user, timezone="UTC", addresses={"email": "gone@example.com"})
        assert notify_and_route(user, "receipt_email", "e2", order="A-2") is None  # …sends nothing
        why = rows(
            "SELECT detail FROM decisions WHERE user_id = :u AND gate = 'suppression'", u=user
        )
        assert [d["detail"] for d in why] == [
            "email address is on the suppression list (bounced recorded for another recipient "
            f"with this address at {at('bo')}: rcpt: 550 5.1.1 <gone@example.com>: Recipient "
            "address rejected: User unknown)"
        ]
        assert "bounced recorded for another recipient" in explain(user)
    register_recipient("ok", timezone="UTC", addresses={"email": "ok@example.com"})
    send("ok", "receipt_email", order="A-3")  # another address still goes out
    assert smtp.rcpts == [
        "gone@example.com",
        "ok@example.com",
    ]  # no further RCPT to the bounced one


def at(user: str) -> str:
    [row] = rows("SELECT created_at FROM suppressions WHERE user_id = :u", u=user)
    return row["created_at"].isoformat(timespec="seconds")


def test_a_policy_refusal_at_rcpt_fails_without_suppressing(smtp):
    smtp.fail("rcpt", "554 5.7.1 Relay access denied")
    key, _ = send("ana", "receipt_email", order="A-1")
    assert delivery(key)["state"] == "failed"
    assert rows("SELECT * FROM suppressions") == []


# --- the third outcome: the relay took the data, the answer was lost ------------------------------------


@pytest.mark.parametrize("loss", ["drop", "late"])
def test_an_at_most_once_digest_is_held_as_unknown(smtp, loss):
    smtp.lose(loss, delay=2.0)
    key, sent = send("ana", "digest_email", name="Ana")
    assert sent == 0
    row = delivery(key)
    assert row["state"] == "unknown" and row["maybe_sent_at"] is not None
    assert retry(key) == 0  # held: nothing to claim
    assert len(smtp.messages) == 1 and smtp.lost == 1
    assert incidents() == ["outcome_unknown"]
    assert [d["reason"] for d in decisions("ana") if d["gate"] == "deliver"] == ["no_answer"]


@pytest.mark.parametrize("type_key", ["receipt_email", "digest_email_resent"])
def test_an_at_least_once_email_is_resent_with_a_possible_duplicate_incident(smtp, type_key):
    smtp.lose("drop")
    key, sent = (
        send("ana", type_key, order="A-1") if type_key == "receipt_email" else send("ana", type_key)
    )
    assert sent == 0
    row = delivery(key)
    assert row["state"] == "pending" and row["maybe_sent_at"] is not None  # may have sent
    assert retry(key) == 1
    first, second = smtp.messages
    assert (first.answered, second.answered) == (False, True)
    assert first.message["Message-ID"] == second.message["Message-ID"]  # clients can fold it
    assert delivery(key)["state"] == "sent"
    assert incidents() == ["possible_duplicate"]


# --- the relay's budget ---------------------------------------------------------------------------------


def test_the_relay_budget_defers_without_spending_an_attempt(smtp, monkeypatch):
    configure(monkeypatch, **email_settings(smtp_url=smtp.url, email_per_second=1))
    first = notify_and_route("ana", "receipt_email", "e1", order="A-1")  # its route sends it
    second = notify_and_route("ana", "receipt_email", "e2", order="A-2")  # the budget is spent
    assert first is not None and second is not None
    # each route sent its own delivery: the budget let the first through and deferred the second
    assert [delivery(k)["state"] for k in (first, second)] == ["sent", "pending"]
    assert len(smtp.messages) == 1
    states = sorted((delivery(k)["state"], delivery(k)["attempts"]) for k in (first, second))
    assert states == [("pending", 0), ("sent", 1)]
    waiting = next(k for k in (first, second) if delivery(k)["state"] == "pending")
    assert "budget_full" in delivery(waiting)["last_error"]
