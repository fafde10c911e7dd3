"""standins/fake_sendgrid.py on its own, driven by the real `sendgrid` SDK: mail/send as SendGrid
answers it (auth, payload checks, 202 + X-Message-Id, 429, lost answers), and Event Webhook
batches signed so that the SDK's own EventWebhook verifier accepts them — and nothing else."""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from python_http_client import exceptions as http_errors
from sendgrid import SendGridAPIClient
from sendgrid.helpers.eventwebhook import EventWebhook, EventWebhookHeader
from sendgrid.helpers.mail import Mail

from clarion.standins.fake_sendgrid import (
    SIGNATURE,
    TIMESTAMP,
    EventKey,
    FakeSendGrid,
    event,
    payload_errors,
)

MAIL = {
    "personalizations": [{"to": [{"email": "ana@example.com"}]}],
    "from": {"email": "c@clarion.test"},
    "subject": "Hi",
    "content": [{"type": "text/plain", "value": "hello"}],
    "custom_args": {"clarion_user": "ana", "clarion_delivery": "7"},
    "categories": ["receipt"],
}


@pytest.fixture
def fake() -> Iterator[FakeSendGrid]:
    with FakeSendGrid() as server:
        yield server


def _client(fake: FakeSendGrid, key: str = FakeSendGrid.API_KEY) -> SendGridAPIClient:
    client = SendGridAPIClient(api_key=key, host=fake.url)
    client.client.timeout = 1
    return client


def test_a_send_is_taken_with_a_message_id(fake):
    mail = Mail("c@clarion.test", "ana@example.com", "Hi", plain_text_content="hello")
    response = _client(fake).send(mail)
    assert response.status_code == 202 and response.body == b""
    [sent] = fake.sent
    assert response.headers["X-Message-Id"] == sent.message_id
    assert sent.to == "ana@example.com" and sent.content("text/plain") == "hello"


def test_a_mail_arrives_when_its_request_was_read_not_when_the_stand_in_got_to_it(fake):
    """Latencies measured at the stand-in (tests/support/campaign.py) end when the sender's request
    was in, not after the stand-in's own wait for its lock or its parsing: a mail read while
    another thread holds the lock is stamped before the lock comes free."""
    client = _client(fake)
    with fake.lock:
        sending = threading.Thread(target=client.send, args=(MAIL,))
        began = time.monotonic()
        sending.start()
        deadline = time.monotonic() + 10
        while not _waiting_for_the_lock() and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = time.monotonic()  # the request is read; its handler waits in answer()
        assert _waiting_for_the_lock()
        time.sleep(0.1)
        freed = time.monotonic()
    sending.join(5)
    [sent] = fake.sent
    assert began < sent.arrived <= seen < freed, (began, sent.arrived, seen, freed)


def _waiting_for_the_lock() -> bool:
    """A server thread is inside FakeSendGrid.answer (blocked on its lock: the test holds it)."""
    return any(
        frame.f_code.co_name == "answer" and frame.f_code.co_filename.endswith("fake_sendgrid.py")
        for frame in sys._current_frames().values()
    )


def test_a_wrong_key_is_401_and_nothing_is_taken(fake):
    with pytest.raises(http_errors.UnauthorizedError, match=r"^HTTP Error 401: Unauthorized$"):
        _client(fake, "SG.wrong").send(MAIL)
    assert fake.sent == [] and [c.status for c in fake.calls] == [401]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"personalizations": []}, "personalizations"),
        ({"from": {"email": "nobody"}}, "from.email"),
        ({"subject": ""}, "subject"),
        ({"content": []}, "content"),
        (
            {
                "content": [
                    {"type": "text/html", "value": "<p>"},
                    {"type": "text/plain", "value": "x"},
                ]
            },
            "content",
        ),
        ({"custom_args": {"clarion_delivery": 7}}, "custom_args.clarion_delivery"),
        ({"headers": {"Subject": "x"}}, "headers.Subject"),
    ],
)
def test_a_malformed_payload_is_400_naming_the_field(fake, change, field):
    assert payload_errors(MAIL) == []
    with pytest.raises(
        http_errors.BadRequestsError, match=r"^HTTP Error 400: Bad Request$"
    ) as refused:
        _client(fake).send({**MAIL, **change})
    assert field in [e["field"] for e in json.loads(refused.value.body)["errors"]]
    assert fake.sent == []


def test_429_carries_sendgrids_rate_limit_headers_and_is_used_once(fake):
    fake.fail(429, reset=time.time() + 30)
    with pytest.raises(
        http_errors.TooManyRequestsError, match=r"^HTTP Error 429: Too Many Requests$"
    ) as limited:
        _client(fake).send(MAIL)
    headers = limited.value.headers
    assert (
        headers["X-RateLimit-Remaining"] == "0" and int(headers["X-RateLimit-Reset"]) > time.time()
    )
    fake.fail(429, retry_after=3)
    with pytest.raises(
        http_errors.TooManyRequestsError, match=r"^HTTP Error 429: Too Many Requests$"
    ) as limited:
        _client(fake).send(MAIL)
    assert limited.value.headers["Retry-After"] == "3"
    assert _client(fake).send(MAIL).status_code == 202
    assert [c.status for c in fake.calls] == [429, 429, 202] and len(fake.sent) == 1


@pytest.mark.parametrize("mode", ["drop", "5xx"])
def test_a_lost_answer_is_taken_and_counted(fake, mode):
    fake.losses.next(mode)
    error = http.client.RemoteDisconnected if mode == "drop" else http_errors.InternalServerError
    with pytest.raises(
        error,
        match=r"^(Remote end closed connection without response|HTTP Error 500: Internal Server Error)$",
    ):
        _client(fake).send(MAIL)
    [sent] = fake.sent
    assert not sent.answered and fake.losses.applied == [mode]


def test_events_echo_custom_args_and_the_message_id(fake):
    _client(fake).send(MAIL)
    [sent] = fake.sent
    bounce = event(sent, "bounce", at=1_700_000_000)
    assert bounce["clarion_user"] == "ana" and bounce["clarion_delivery"] == "7"
    assert bounce["sg_message_id"].startswith(sent.message_id + ".filter")
    assert bounce["type"] == "bounce" and bounce["timestamp"] == 1_700_000_000
    assert event(sent, "bounce", type="blocked")["type"] == "blocked"
    assert event(sent, "open")["sg_event_id"] != event(sent, "open")["sg_event_id"]


def test_a_signed_batch_verifies_with_the_sdk_and_a_changed_one_does_not():
    key = EventKey.generate()
    assert (SIGNATURE, TIMESTAMP) == (EventWebhookHeader.SIGNATURE, EventWebhookHeader.TIMESTAMP)
    body = json.dumps([{"event": "delivered", "timestamp": 1}]).encode()
    headers = key.headers(body, "1700000000")
    verifier = EventWebhook(key.public_key)
    assert verifier.verify_signature(body.decode(), headers[SIGNATURE], headers[TIMESTAMP])
    assert not verifier.verify_signature(
        body.decode() + " ", headers[SIGNATURE], headers[TIMESTAMP]
    )
    assert not verifier.verify_signature(body.decode(), headers[SIGNATURE], "1700000001")
    other = EventWebhook(EventKey.generate().public_key)
    assert not other.verify_signature(body.decode(), headers[SIGNATURE], headers[TIMESTAMP])
