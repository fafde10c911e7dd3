"""The local Twilio (standins/fake_twilio.py) speaks Twilio's wire format: the real SDK's requests and
error parsing, raw HTTP for what the SDK hides (status codes, Retry-After), and callbacks whose
signatures the SDK's RequestValidator accepts at a local receiver."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qsl

import pytest
import requests
from twilio.base.exceptions import TwilioRestException
from twilio.request_validator import RequestValidator
from twilio.rest import Client

from clarion.adapters.sms import RoutedHttpClient
from clarion.standins.fake_twilio import Accepted, FakeTwilio, sign
from clarion.standins.local_server import LocalServer

MESSAGES = f"/2010-04-01/Accounts/{FakeTwilio.ACCOUNT_SID}/Messages.json"
AUTH = (FakeTwilio.ACCOUNT_SID, FakeTwilio.AUTH_TOKEN)


class Capture(LocalServer):
    """Receives callbacks and checks them exactly as a Twilio-facing endpoint must."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, str], bool]] = []
        self.lock = threading.Lock()
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                params = dict(parse_qsl(raw.decode()))
                url = capture.base_url + self.path
                valid = RequestValidator(FakeTwilio.AUTH_TOKEN).validate(
                    url, params, self.headers.get("X-Twilio-Signature", "")
                )
                with capture.lock:
                    capture.received.append((self.path, params, valid))
                self.send_response(204 if valid else 401)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)


@pytest.fixture
def fake() -> Iterator[FakeTwilio]:
    with FakeTwilio() as server:
        yield server


@pytest.fixture
def client(fake) -> Client:
    return Client(*AUTH, http_client=RoutedHttpClient(fake.url, 5.0))


def test_the_sdk_creates_a_message_and_reads_twilios_resource(fake, client):
    created = client.messages.create(to="+4915112345678", from_=FakeTwilio.NUMBER, body="€" * 81)
    assert created.sid.startswith("SM") and len(created.sid) == 34
    assert (created.status, created.num_segments, created.to) == ("queued", "2", "+4915112345678")
    by_service = client.messages.create(to="+4915112345678", messaging_service_sid="MG1", body="x")
    assert by_service.status == "accepted" and by_service.messaging_service_sid == "MG1"
    assert [m.sender for m in fake.messages()] == [FakeTwilio.NUMBER, "MG1"]


@pytest.mark.parametrize(
    ("form", "code"),
    [
        ({"From": FakeTwilio.NUMBER, "Body": "x"}, 21604),
        ({"To": "+4915112345678", "Body": "x"}, 21603),
        ({"To": "+4915112345678", "From": FakeTwilio.NUMBER}, 21602),
        ({"To": "12345", "From": FakeTwilio.NUMBER, "Body": "x"}, 21211),
    ],
)
def test_bad_requests_get_twilios_error_body(fake, form, code):
    answer = requests.post(fake.url + MESSAGES, data=form, auth=AUTH, timeout=5)
    assert answer.status_code == 400
    assert answer.json() == {
        "code": code,
        "message": answer.json()["message"],
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": 400,
    }
    assert fake.messages() == []


def test_basic_auth_is_checked(fake):
    form = {"To": "+4915112345678", "From": FakeTwilio.NUMBER, "Body": "x"}
    for auth in ((FakeTwilio.ACCOUNT_SID, "wrong"), None):
        answer = requests.post(fake.url + MESSAGES, data=form, auth=auth, timeout=5)
        assert answer.status_code == 401 and answer.json()["code"] == 20003
    other = fake.url + MESSAGES.replace(FakeTwilio.ACCOUNT_SID, "AC" + "9" * 32)
    assert requests.post(other, data=form, auth=AUTH, timeout=5).status_code == 401
    assert fake.messages() == []


def test_a_storm_answers_429_with_retry_after_then_passes(fake, client):
    fake.storm(2, retry_after=3)
    form = {"To": "+4915112345678", "From": FakeTwilio.NUMBER, "Body": "x"}
    for _ in range(2):
        answer = requests.post(fake.url + MESSAGES, data=form, auth=AUTH, timeout=5)
        assert answer.status_code == 429 and answer.headers["Retry-After"] == "3"
        assert answer.json()["code"] == 20429
    assert requests.post(fake.url + MESSAGES, data=form, auth=AUTH, timeout=5).status_code == 201
    assert len(fake.throttled()) == 2 and len(fake.messages()) == 1


def test_scripted_refusals_reach_the_sdk_as_its_exception(fake, client):
    fake.fail_number("+4915100000001", 21610)
    with pytest.raises(
        TwilioRestException, match=r"Attempt to send to unsubscribed recipient: \+4915100000001$"
    ) as refused:
        client.messages.create(to="+4915100000001", from_=FakeTwilio.NUMBER, body="x")
    assert (refused.value.status, refused.value.code) == (400, 21610)
    with pytest.raises(ValueError, match=r"^no scripted failure for code 12345$"):
        fake.fail_number("+4915100000001", 12345)


def test_a_lost_answer_still_takes_the_message(fake):
    fake.losses.next("drop")
    form = {"To": "+4915112345678", "From": FakeTwilio.NUMBER, "Body": "x"}
    with pytest.raises(
        requests.ConnectionError, match=r"Remote end closed connection without response"
    ):
        requests.post(fake.url + MESSAGES, data=form, auth=AUTH, timeout=5)
    assert len(fake.messages()) == 1 and fake.losses.applied == ["drop"]


def test_segments_per_second_slides_over_arrivals(fake):
    fake.accepted = [
        Accepted(f"SM{i}", "+1", "+2", "x", cost, None, at)
        for i, (at, cost) in enumerate([(0.0, 2), (0.5, 3), (0.99, 1), (1.0, 4), (2.5, 1)])
    ]
    assert fake.segments_per_second() == 8  # (0.0, 1.0]: 3 + 1 + 4 ... without the first
    fake.accepted = []
    assert fake.segments_per_second() == 0


def test_callbacks_are_signed_as_twilio_signs_and_tell_the_messages_life(fake, client):
    with Capture() as capture:
        callback = f"{capture.base_url}/status?u=ana&d=7"
        fake.fail_number("+4915100000002", 30003)
        ok = client.messages.create(
            to="+4915112345678", from_=FakeTwilio.NUMBER, body="x", status_callback=callback
        )
        gone = client.messages.create(
            to="+4915100000002", from_=FakeTwilio.NUMBER, body="x", status_callback=callback
        )
        assert fake.progress(ok.sid) == [("queued", 204), ("sent", 204), ("delivered", 204)]
        assert [s for s, _ in fake.progress(gone.sid)] == ["queued", "sent", "undelivered"]
        status, answer = fake.inbound(f"{capture.base_url}/inbound", "+4915112345678", "STOP")
        assert status == 204 and answer == ""
        received = list(capture.received)
    assert all(valid for _, _, valid in received) and len(received) == 7
    path, last, _ = received[5]
    assert path == "/status?u=ana&d=7"
    assert (last["MessageSid"], last["MessageStatus"], last["ErrorCode"]) == (
        gone.sid,
        "undelivered",
        "30003",
    )
    assert received[6][1]["Body"] == "STOP" and received[6][1]["From"] == "+4915112345678"
    assert fake.message(ok.sid).statuses == ["queued", "sent", "delivered"]


def test_a_signature_covers_the_url_and_every_parameter():
    params = {"Body": "STOP", "From": "+4915112345678"}
    url = "https://clarion.example/webhooks/twilio/inbound"
    signature = sign(FakeTwilio.AUTH_TOKEN, url, params)
    validator = RequestValidator(FakeTwilio.AUTH_TOKEN)
    assert validator.validate(url, params, signature)
    assert not validator.validate(url + "?x=1", params, signature)
    assert not validator.validate(url, {**params, "Body": "START"}, signature)
    assert not RequestValidator("other").validate(url, params, signature)


def test_the_sdk_lists_messages_to_a_number_sent_on_or_after_a_day(fake, client):
    from datetime import UTC, datetime

    to, other = "+4915112345678", "+4915100000002"
    sent = client.messages.create(to=to, from_=FakeTwilio.NUMBER, body="one")
    queued = client.messages.create(to=to, from_=FakeTwilio.NUMBER, body="two")
    client.messages.create(to=other, from_=FakeTwilio.NUMBER, body="three")
    fake.dispatch(sent.sid)
    today = datetime.now(UTC)
    listed = client.messages.list(to=to, from_=FakeTwilio.NUMBER, date_sent_after=today)
    # a queued message has no DateSent, so the filter cannot see it (as at Twilio)
    assert [m.sid for m in listed] == [sent.sid]
    assert listed[0].body == "one" and listed[0].direction == "outbound-api"
    assert listed[0].date_created is not None and listed[0].date_sent is not None
    unfiltered = client.messages.list(to=to)
    assert {m.sid for m in unfiltered} == {sent.sid, queued.sid}
    assert fake.lookups[0]["To"] == to and fake.lookups[0]["DateSent>"].startswith(
        today.date().isoformat()
    )
    tomorrow = datetime.fromtimestamp(today.timestamp() + 86400, UTC)
    assert client.messages.list(to=to, date_sent_after=tomorrow) == []


def test_the_list_pages_as_twilio_does_and_checks_auth(fake, client):
    for i in range(5):
        fake.dispatch(client.messages.create(to="+4915112345678", from_="+1", body=str(i)).sid)
    assert len(client.messages.list(to="+4915112345678", page_size=2)) == 5  # three pages
    assert sum(1 for q in fake.lookups if q.get("Page") in (None, "0")) == 1
    answer = requests.get(fake.url + MESSAGES, auth=(FakeTwilio.ACCOUNT_SID, "x"), timeout=5)
    assert answer.status_code == 401 and answer.json()["code"] == 20003


def test_a_callback_past_queued_gives_the_message_its_sent_date(fake, client):
    with Capture() as capture:
        created = client.messages.create(
            to="+4915112345678",
            from_=FakeTwilio.NUMBER,
            body="x",
            status_callback=f"{capture.base_url}/status",
        )
        fake.post_status(created.sid, "queued")
        assert fake.message(created.sid).date_sent is None
        fake.post_status(created.sid, "sent")
        assert fake.message(created.sid).date_sent is not None


@pytest.mark.parametrize("loss", ["drop", "late", "5xx"])
def test_every_lost_answer_mode_still_takes_the_message(fake, loss):
    fake.losses.next(loss, delay=1.0)
    form = {"To": "+4915112345678", "From": FakeTwilio.NUMBER, "Body": "x"}
    try:
        answer = requests.post(fake.url + MESSAGES, data=form, auth=AUTH, timeout=0.5)
    except requests.RequestException:
        answer = None
    assert answer is None or answer.status_code == 500
    assert len(fake.messages()) == 1 and fake.losses.applied == [loss]


def test_an_outage_answers_5xx_and_takes_nothing_until_it_recovers(fake, client):
    fake.fail(503, times=2)
    for _ in range(2):
        with pytest.raises(TwilioRestException, match="Internal Server Error") as refused:
            client.messages.create(to="+4915112345678", from_=FakeTwilio.NUMBER, body="x")
        assert refused.value.status == 503
    fake.fail(500, times=5)
    fake.recover()
    client.messages.create(to="+4915112345678", from_=FakeTwilio.NUMBER, body="x")
    assert [a.status for a in fake.attempts] == [503, 503, 201] and len(fake.messages()) == 1


def test_refused_connections_then_served_again_on_the_same_port(fake, client):
    client.messages.create(to="+4915112345678", from_=FakeTwilio.NUMBER, body="kept alive")
    url = fake.url
    fake.refuse()
    with pytest.raises(requests.ConnectionError, match="Connection refused"):
        requests.post(fake.url + MESSAGES, data={"To": "+1", "Body": "x"}, auth=AUTH, timeout=5)
    fake.reopen()
    assert fake.url == url
    client.messages.create(to="+4915112345678", from_=FakeTwilio.NUMBER, body="again")
    assert [m.body for m in fake.messages()] == ["kept alive", "again"]


def test_a_second_account_has_its_own_credentials():
    with FakeTwilio(account_sid="AC" + "b" * 32, auth_token="other") as second:
        mine = Client("AC" + "b" * 32, "other", http_client=RoutedHttpClient(second.url, 5.0))
        mine.messages.create(to="+4915112345678", from_="+15005550007", body="x")
        theirs = Client(*AUTH, http_client=RoutedHttpClient(second.url, 5.0))
        with pytest.raises(TwilioRestException, match="Authenticate"):
            theirs.messages.create(to="+4915112345678", from_="+15005550007", body="x")
        assert len(second.messages()) == 1
