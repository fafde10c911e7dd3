"""The email channel's pure parts, in tables: the MIME builder (identities, Message-ID, subject,
escaping, one-click headers), the unsubscribe token, SMTP replies as outcomes, SendGrid answers as
outcomes and its events as receipts. The I/O is tested against local servers in
tests/integration/test_email.py."""

from __future__ import annotations

import email
import email.policy
import re
from dataclasses import replace
from datetime import UTC, datetime
from email.message import EmailMessage

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clarion.adapters.email_mime import (
    Identities,
    build,
    message_id,
    read_unsubscribe_token,
    subject_of,
    to_bytes,
    unsubscribe_token,
)
from clarion.adapters.sendgrid import (
    SendGridResponse,
    event_name,
    message_id_of,
    receipts,
    to_payload,
)
from clarion.adapters.sendgrid import from_response as sendgrid_outcome
from clarion.adapters.smtp import Relay, SmtpReply, dot_stuffed, names_bad_address, outcome
from clarion.errors import (
    ConfigurationError,
    PermanentSendError,
    SendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message

TX, MK = "Clarion <notify@tx.clarion.test>", "Clarion News <news@mk.clarion.test>"
IDS = Identities(TX, MK)
NOW = datetime(2026, 3, 2, 9, 30, tzinfo=UTC)
MESSAGE = Message(
    delivery_id=41,
    user_id="ana",
    type_key="receipt_email",
    occurrence_key="event:o-1",
    channel="email",
    content={"title": "Receipt A-1", "body": "Thanks.\n\nSee you."},
    address="ana@example.com",
    lane="transactional",
    category="transactional",
)


def _email(message: Message = MESSAGE, ids: Identities = IDS):
    return build(message, identities=ids, public_url="https://clarion.test/", secret="s3cret")


def _parsed(message: Message = MESSAGE) -> EmailMessage:
    raw = to_bytes(_email(message), now=NOW)
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return parsed


@pytest.mark.parametrize(
    ("category", "lane", "sender", "one_click"),
    [
        ("transactional", "transactional", TX, False),
        ("security", "transactional", TX, False),
        ("transactional", "activation", MK, False),  # the lane's identity; still locked: no link
        ("alert", "transactional", MK, True),
        ("activation", "activation", MK, True),
        ("digest", "activation", MK, True),
        ("marketing", "activation", MK, True),
    ],
)
def test_identity_and_one_click_follow_category_and_lane(category, lane, sender, one_click):
    built = _email(replace(MESSAGE, category=category, lane=lane))
    assert built.sender == sender
    names = [name for name, _ in built.headers]
    assert ("List-Unsubscribe" in names) is one_click
    assert ("List-Unsubscribe-Post" in names) is one_click
    domain = sender.rpartition("@")[2].rstrip(">")
    assert built.message_id == message_id(MESSAGE, sender, "s3cret")
    assert re.fullmatch(rf"<clm_[0-9a-f]{{40}}@{re.escape(domain)}>", built.message_id)


def test_marketing_identity_defaults_to_the_transactional_one():
    built = _email(replace(MESSAGE, category="digest", lane="activation"), Identities(TX))
    assert built.sender == TX


def test_message_id_is_the_same_for_every_attempt_and_differs_per_occurrence():
    first, again = _email(), _email(replace(MESSAGE, attempt=3))
    other = _email(replace(MESSAGE, occurrence_key="event:o-2"))
    assert first.message_id == again.message_id != other.message_id
    assert _parsed()["Message-ID"] == first.message_id


def test_message_id_differs_per_deployment_and_for_a_key_reused_after_retention():
    here = message_id(MESSAGE, TX, "deployment-a")
    assert here == message_id(replace(MESSAGE, attempt=2), TX, "deployment-a")
    assert message_id(MESSAGE, TX, "deployment-b") != here  # staging vs production
    # retention deleted the old request; the reused event id is a new delivery row
    assert (
        message_id(replace(MESSAGE, delivery_id=MESSAGE.delivery_id + 1), TX, "deployment-a")
        != here
    )
    assert MESSAGE.idempotency_key not in here and "deployment-a" not in here


def test_the_wire_form_has_both_parts_and_an_unfolded_one_click_header():
    parsed = _parsed(replace(MESSAGE, category="digest", lane="activation", user_id="u" * 256))
    assert parsed.get_content_type() == "multipart/alternative"
    assert [p.get_content_type() for p in parsed.iter_parts()] == ["text/plain", "text/html"]
    header = str(parsed["List-Unsubscribe"])
    assert re.fullmatch(r"<https://clarion\.test/webhooks/email/unsubscribe\?t=[\w.-]+>", header)
    assert parsed["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    raw = to_bytes(_email(replace(MESSAGE, category="digest", user_id="u" * 256)), now=NOW)
    assert b"=?utf-8?" not in raw.split(b"\r\n\r\n")[0]  # no encoded words in the headers


@pytest.mark.parametrize(
    ("title", "subject"),
    [
        ("Receipt\r\nBcc: evil@example.com", "Receipt Bcc: evil@example.com"),
        ("a\nb\rc\u2028d", "a b c d"),
        ("tab\there\x00\x1b[31m", "tab here[31m"),
        ("   ", "receipt_email"),  # nothing left: the type key
        ("x" * 500, "x" * 200),
    ],
)
def test_the_subject_is_one_line_whatever_the_title(title, subject):
    message = replace(MESSAGE, content={"title": title, "body": "b"})
    assert subject_of(message) == subject
    assert _parsed(message)["Subject"] == subject
    assert "Bcc" not in _parsed(message)


def test_without_a_title_the_subject_is_the_bodys_first_line():
    assert subject_of(replace(MESSAGE, content={"body": "\n\nFirst\nsecond"})) == "First"


def test_html_is_escaped_text_in_a_fixed_frame():
    body = 'Hi <b>Ana</b> & "co"\n<a href="https://evil.example">click</a>\n\n<img src=x onerror=1>'
    parsed = _parsed(replace(MESSAGE, content={"title": "<script>", "body": body}))
    plain = parsed.get_body(("plain",))
    html_part = parsed.get_body(("html",))
    assert plain is not None and html_part is not None
    assert plain.get_content().replace("\r\n", "\n").strip() == body
    markup = html_part.get_content()
    tags = set(re.findall(r"</?([a-zA-Z!]+)", markup))
    assert tags == {"!DOCTYPE", "html", "head", "meta", "title", "body", "p", "br"}
    assert "&lt;b&gt;Ana&lt;/b&gt; &amp; &#34;co&#34;" in markup
    assert "&lt;script&gt;" in markup


@given(st.text(max_size=200))
def test_no_body_text_adds_a_tag(body):
    markup = _email(replace(MESSAGE, content={"title": "t", "body": body})).html
    assert set(re.findall(r"<(/?[a-zA-Z!]+)", markup)) <= {
        "!DOCTYPE",
        "html",
        "head",
        "meta",
        "title",
        "/title",
        "/head",
        "body",
        "p",
        "/p",
        "br",
        "/body",
        "/html",
    }


def test_no_address_can_never_be_sent():
    with pytest.raises(PermanentSendError, match="no_address"):
        _email(replace(MESSAGE, address=None))


# --- the unsubscribe token ---------------------------------------------------------------------------


@given(st.text(min_size=1, max_size=256).filter(lambda u: "\x00" not in u), st.integers(1, 2**62))
def test_a_token_names_its_user_and_delivery(user, delivery):
    try:
        user.encode()
    except UnicodeEncodeError:
        return
    token = unsubscribe_token("s3cret", user, delivery)
    assert read_unsubscribe_token("s3cret", token) == (user, delivery)
    assert read_unsubscribe_token("other", token) is None


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the MAC
        lambda t: "NDIfZXZl" + t[t.index(".") :],  # another delivery/user ("42\x1feve"), old MAC
        lambda t: t.replace(".", ""),
        lambda t: t + ".x",
        lambda t: "",
        lambda t: "é." + t,
        lambda t: t * 40,
    ],
)
def test_a_tampered_token_is_refused(mangle):
    token = unsubscribe_token("s3cret", "ana", 41)
    assert read_unsubscribe_token("s3cret", mangle(token)) is None


# --- SMTP ---------------------------------------------------------------------------------------------


def _reply(stage: str, code: int, text: str = "") -> SmtpReply:
    return SmtpReply(stage, code, text, "<k@d>")


@pytest.mark.parametrize(
    ("reply", "kind", "suppress"),
    [
        (_reply("end", 250, "2.0.0 Ok: queued"), None, False),
        (_reply("connect", 421, "4.3.2 closing"), TransientSendError, False),
        (_reply("mail", 451, "4.3.0 later"), TransientSendError, False),
        (_reply("rcpt", 450, "4.2.1 mailbox busy"), TransientSendError, False),
        (_reply("rcpt", 550, "5.1.1 <x>: User unknown"), PermanentSendError, True),
        (_reply("rcpt", 550, "5.1.10 null MX"), PermanentSendError, True),
        (_reply("rcpt", 550, "5.2.1 mailbox disabled"), PermanentSendError, True),
        (_reply("rcpt", 553, "mailbox name not allowed"), PermanentSendError, True),
        (_reply("rcpt", 554, "5.7.1 relay access denied"), PermanentSendError, False),
        (_reply("rcpt", 550, "5.7.1 policy"), PermanentSendError, False),
        (_reply("rcpt", 552, "5.2.2 mailbox full"), PermanentSendError, False),
        (_reply("auth", 535, "5.7.8 bad credentials"), PermanentSendError, False),
        (_reply("data", 554, "5.6.0 bad content"), PermanentSendError, False),
        (_reply("end", 451, "4.3.0 queue full"), TransientSendError, False),
        (_reply("end", 550, "5.7.1 spam"), PermanentSendError, False),
        (_reply("end", -1, "garbage"), UnknownSendError, False),
    ],
)
def test_smtp_replies_as_outcomes(reply, kind, suppress):
    result = outcome(reply)
    if kind is None:
        assert not isinstance(result, SendError) and result.provider_message_id == "<k@d>"
    else:
        assert (
            type(result) is kind
            and result.reason == f"smtp_{reply.code}"
            or (kind is UnknownSendError and result.reason == "smtp_bad_reply")
        )
    assert names_bad_address(reply) is suppress


def test_the_end_of_data_is_dot_stuffed():
    assert dot_stuffed(b"a\r\n.b\r\n..c") == b"a\r\n..b\r\n...c\r\n.\r\n"
    assert dot_stuffed(b".\r\n") == b"..\r\n.\r\n"


@pytest.mark.parametrize(
    ("url", "relay"),
    [
        ("smtp://mx.example:2525", Relay("smtp", "mx.example", 2525)),
        (
            "smtp+starttls://u%40x:p%3Aw@mx.example",
            Relay("smtp+starttls", "mx.example", 587, "u@x", "p:w"),
        ),
        (
            "smtps://u:p@mx.example?cafile=/ca.pem",
            Relay("smtps", "mx.example", 465, "u", "p", "/ca.pem"),
        ),
    ],
)
def test_relay_urls(url, relay):
    assert Relay.from_url(url) == relay


@pytest.mark.parametrize(
    ("url", "refusal"),
    [
        ("http://mx.example", "must be smtp://"),
        ("smtp://", "must be smtp://"),
        ("smtp://mx:99999", "bad port"),
        ("mx.example", "must be smtp://"),
    ],
)
def test_bad_relay_urls_are_configuration_errors(url, refusal):
    with pytest.raises(ConfigurationError, match=rf"^CLARION_SMTP_URL\b.*{refusal}"):
        Relay.from_url(url)


# --- SendGrid -------------------------------------------------------------------------------------------


def test_the_payload_carries_identity_ids_categories_and_headers():
    digest = replace(MESSAGE, category="digest", lane="activation", type_key="digest_email")
    payload = to_payload(
        digest,
        identities=IDS,
        public_url="https://clarion.test",
        secret="s",
        ip_pools=("tx-pool", "mk-pool"),
        asm_group=7,
    )
    assert payload["from"] == {"email": "news@mk.clarion.test", "name": "Clarion News"}
    assert payload["personalizations"] == [{"to": [{"email": "ana@example.com"}]}]
    assert payload["custom_args"] == {"clarion_user": "ana", "clarion_delivery": "41"}
    assert sorted(payload["categories"]) == ["digest", "digest_email"]
    assert payload["ip_pool_name"] == "mk-pool" and payload["asm"] == {"group_id": 7}
    assert [c["type"] for c in payload["content"]] == ["text/plain", "text/html"]
    assert payload["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    receipt = to_payload(
        MESSAGE, identities=IDS, public_url="x", secret="s", ip_pools=("tx-pool", None), asm_group=7
    )
    assert receipt["from"]["email"] == "notify@tx.clarion.test"
    assert receipt["ip_pool_name"] == "tx-pool" and "asm" not in receipt
    assert set(receipt["headers"]) == {"Message-ID"}


def _answer(status: int, **headers: str) -> SendGridResponse:
    return SendGridResponse(status, headers, b'{"errors":[]}')


@pytest.mark.parametrize(
    ("response", "kind", "wait"),
    [
        (_answer(202, **{"X-Message-Id": "abc"}), None, None),
        (_answer(429, **{"Retry-After": "7"}), ThrottledError, 7.0),
        (_answer(429, **{"X-RateLimit-Reset": "1000030"}), ThrottledError, 30.0),
        (_answer(429), ThrottledError, 5.0),
        (_answer(500), UnknownSendError, None),
        (_answer(503), UnknownSendError, None),
        (_answer(400), PermanentSendError, None),
        (_answer(401), PermanentSendError, None),
        (_answer(413), PermanentSendError, None),
    ],
)
def test_sendgrid_answers_as_outcomes(response, kind, wait):
    if kind is None:
        result = sendgrid_outcome(response, now=1_000_000)
        assert result.provider_message_id == "abc" and result.platform == "sendgrid"
        return
    with pytest.raises(kind, match=rf"^http_{response.status}: ") as raised:
        sendgrid_outcome(response, now=1_000_000)
    if wait is not None:
        assert raised.value.retry_after == wait


@pytest.mark.parametrize(
    ("event", "name"),
    [
        ({"event": "processed"}, "accepted"),
        ({"event": "delivered"}, "delivered"),
        ({"event": "open"}, "opened"),
        ({"event": "click"}, "clicked"),
        ({"event": "bounce", "type": "bounce"}, "bounced"),
        ({"event": "bounce", "type": "blocked"}, "soft_bounced"),
        ({"event": "deferred"}, "soft_bounced"),
        ({"event": "dropped", "reason": "Bounced Address"}, "bounced"),
        ({"event": "dropped", "reason": "Invalid"}, "bounced"),
        ({"event": "dropped", "reason": "Unsubscribed Address"}, "failed"),
        ({"event": "dropped", "reason": "Invalid SMTPAPI header"}, "failed"),
        ({"event": "spamreport"}, "complained"),
        ({"event": "unsubscribe"}, "unsubscribed"),
        ({"event": "group_unsubscribe"}, "unsubscribed"),
        ({"event": "group_resubscribe"}, None),
        ({"event": "something_new"}, None),
    ],
)
def test_sendgrid_events_as_receipt_events(event, name):
    assert event_name(event) == name


def test_receipts_carry_clarions_ids_and_fall_back_to_the_message_id():
    base = {"email": "ana@example.com", "timestamp": 1_700_000_000, "sg_event_id": "e1"}
    found = receipts(
        [
            {
                **base,
                "event": "delivered",
                "clarion_user": "ana",
                "clarion_delivery": "41",
                "sg_message_id": "abc.filterdrecv-1-2",
            },
            {
                **base,
                "event": "open",
                "clarion_user": "ana",
                "clarion_delivery": "4x1",
                "sg_message_id": "abc.recvd-5",
            },
            {**base, "event": "group_resubscribe"},
        ]
    )
    assert [(r.event, r.user_id, r.delivery_id, r.provider_message_id) for r in found] == [
        ("delivered", "ana", 41, "abc"),
        ("opened", None, None, "abc"),
    ]
    assert found[0].occurred_at == datetime.fromtimestamp(1_700_000_000, UTC)
    assert found[0].address == "ana@example.com" and found[0].event_id == "e1"
    assert message_id_of("") is None and message_id_of(7) is None
