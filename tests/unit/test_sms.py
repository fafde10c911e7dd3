"""The SMS adapter's pure parts (tables and properties) and its I/O against the local Twilio
(standins/fake_twilio.py) through the real twilio SDK. No database or Redis here: the budget and
the suppression list are in tests/integration/test_sms.py."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from twilio.rest import Client

from clarion.adapters.sms import (
    GSM_BASIC,
    GSM_EXTENSION,
    LIMITS,
    MAX_BODY,
    RoutedHttpClient,
    SmsAdapter,
    SmsRequest,
    TwilioAnswer,
    body_of,
    budget_quota,
    error_for,
    keyword_of,
    outcome,
    segments,
    status_callback,
    status_receipt,
)
from clarion.errors import PermanentSendError, ThrottledError, TransientSendError, UnknownSendError
from clarion.records import Message, SendResult
from clarion.standins.fake_twilio import FakeTwilio

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
MESSAGE = Message(
    delivery_id=42,
    user_id="ana/ß&x",
    type_key="order_receipt",
    occurrence_key="event:e1",
    channel="sms",
    content={"title": "Receipt", "body": "We charged 12 EUR."},
    address="+4915112345678",
)

# --- segments: tables -----------------------------------------------------------------------------

SEGMENT_CASES = [
    ("", ("GSM-7", 1)),
    ("a" * 160, ("GSM-7", 1)),
    ("a" * 161, ("GSM-7", 2)),
    ("a" * 306, ("GSM-7", 2)),
    ("a" * 307, ("GSM-7", 3)),
    ("€" * 80, ("GSM-7", 1)),  # the extension table: two septets each
    ("€" * 81, ("GSM-7", 2)),
    ("[" * 80 + "a", ("GSM-7", 2)),
    ("a" * 152 + "€" * 77, ("GSM-7", 3)),  # 306 septets, but an escape pair is never split
    ("Grüße, Søren! ¿Qué tal? @£$¥", ("GSM-7", 1)),
    ("ç" * 70, ("UCS-2", 1)),  # lower-case ç is not in the GSM alphabet (Ç is)
    ("ç" * 71, ("UCS-2", 2)),
    ("a" * 159 + "ç", ("UCS-2", 3)),  # one character outside GSM-7 makes it all UCS-2
    ("😀" * 35, ("UCS-2", 1)),  # emoji: two UTF-16 code units each
    ("😀" * 36, ("UCS-2", 2)),
    ("😀" * 67, ("UCS-2", 3)),  # 134 units, but a surrogate pair is never split
    ("Hello 👋", ("UCS-2", 1)),
    ("日本語" * 23 + "a", ("UCS-2", 1)),
    ("日本語" * 24, ("UCS-2", 2)),
]


@pytest.mark.parametrize(("text", "expected"), SEGMENT_CASES)
def test_segments_table(text, expected):
    assert segments(text) == expected


# --- segments: properties against a reference built from the encoded bytes -------------------------

gsm_text = st.text(alphabet=st.sampled_from(sorted(GSM_BASIC | GSM_EXTENSION)), max_size=700)
any_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400) | st.builds(  # type: ignore[arg-type]
    lambda a, b: a + b, gsm_text, st.text(max_size=5)
)


def reference(text: str) -> tuple[str, int]:
    """Segments from the wire units: septets (the extension table as ESC + one), or the UTF-16
    code units of the UTF-16 encoding, cut into parts without splitting an escape or a pair."""
    if all(c in GSM_BASIC or c in GSM_EXTENSION for c in text):
        enc, wire = "GSM-7", [u for c in text for u in ((0x1B, 1) if c in GSM_EXTENSION else (1,))]
        starts_pair = [u == 0x1B for u in wire]
    else:
        raw = text.encode("utf-16-le")
        wire = [int.from_bytes(raw[i : i + 2], "little") for i in range(0, len(raw), 2)]
        enc, starts_pair = "UCS-2", [0xD800 <= u < 0xDC00 for u in wire]
    single, part = LIMITS[enc]
    if len(wire) <= single:
        return enc, 1
    count, used, i = 1, 0, 0
    while i < len(wire):
        need = 2 if starts_pair[i] else 1
        if used + need > part:
            count, used = count + 1, 0
        used += need
        i += need
    return enc, count


@given(any_text)
def test_segments_match_the_wire_reference(text):
    assert segments(text) == reference(text)


@given(gsm_text, gsm_text)
def test_gsm_text_stays_gsm_and_more_text_never_costs_less(a, b):
    enc, count = segments(a)
    assert enc == "GSM-7"
    assert segments(a + b)[1] >= count


@given(any_text)
def test_segment_counts_stay_between_the_bounds(text):
    enc, count = segments(text)
    size = len(text.encode("utf-16-le")) // 2 if enc == "UCS-2" else None
    if size is None:
        size = sum(2 if c in GSM_EXTENSION else 1 for c in text)
    single, part = LIMITS[enc]
    if size <= single:
        assert count == 1
    else:
        assert math.ceil(size / part) <= count <= math.ceil(size / (part - 1))


@given(gsm_text, st.characters(blacklist_categories=("Cs",)))  # type: ignore[arg-type]
def test_one_character_outside_the_alphabet_turns_the_body_into_ucs2(text, char):
    if char in GSM_BASIC or char in GSM_EXTENSION:
        return
    assert segments(text + char)[0] == "UCS-2"


# --- the request, the answer, the callbacks: tables --------------------------------------------------


def test_the_body_is_the_text_or_title_and_body_and_is_capped():
    assert body_of(MESSAGE) == "Receipt\nWe charged 12 EUR."
    only_text = Message(**{**MESSAGE.__dict__, "content": {"text": " Hi ", "title": "x"}})
    assert body_of(only_text) == "Hi"
    long = Message(**{**MESSAGE.__dict__, "content": {"body": "a" * 2000}})
    capped = body_of(long)
    assert len(capped) == MAX_BODY and capped.endswith("...") and segments(capped)[0] == "GSM-7"


def test_the_status_callback_names_the_user_and_the_delivery():
    url = status_callback("https://clarion.example/", MESSAGE)
    assert url == "https://clarion.example/webhooks/twilio/status?u=ana%2F%C3%9F%26x&d=42"


def test_a_messaging_service_sid_is_sent_as_one_and_a_number_as_from():
    adapter = SmsAdapter(
        Client("AC1", "t"), sender="MG123", public_url="http://x", quota=budget_quota(1)
    )
    args = adapter.to_request(MESSAGE).create_args()
    assert args["messaging_service_sid"] == "MG123" and "from_" not in args
    adapter.sender = "+15005550006"
    request = adapter.to_request(MESSAGE)
    assert request.create_args()["from_"] == "+15005550006" and request.segments == 1
    assert adapter.budget(MESSAGE, request) == (adapter.quota, "+15005550006", 1)
    for bad in ({"address": None}, {"content": {"body": "  "}}):
        with pytest.raises(
            PermanentSendError,
            match=r"^(no_address: .* has no sms number|empty_body: .* renders no SMS text)$",
        ):
            adapter.to_request(Message(**{**MESSAGE.__dict__, **bad}))


@pytest.mark.parametrize(
    ("answer", "error", "reason"),
    [
        (TwilioAnswer(429, code=20429, retry_after=3), ThrottledError, "twilio_20429"),
        (TwilioAnswer(400, code=21211, message="bad"), PermanentSendError, "twilio_21211"),
        (TwilioAnswer(400, code=21610), PermanentSendError, "twilio_21610"),
        (TwilioAnswer(401, code=20003), PermanentSendError, "twilio_20003"),
        (TwilioAnswer(404), PermanentSendError, "http_404"),
        (TwilioAnswer(500), UnknownSendError, "http_500"),
        (TwilioAnswer(503, code=20500), UnknownSendError, "twilio_20500"),
    ],
)
def test_answers_become_outcomes(answer, error, reason):
    with pytest.raises(error, match=rf"^{reason}: twilio answered {answer.status}: ") as raised:
        outcome(answer)
    assert raised.value.reason == reason
    if error is ThrottledError:
        assert raised.value.retry_after == 3


def test_a_201_is_sent_with_the_sid():
    result = outcome(TwilioAnswer(201, sid="SM1"))
    assert (result.platform, result.provider_message_id) == ("sms", "SM1")


def test_network_failures_are_failed_before_the_request_left_and_unknown_after():
    try:
        requests.post("http://127.0.0.1:9/", timeout=1)
    except requests.RequestException as exc:
        assert isinstance(error_for(exc), TransientSendError)
    assert isinstance(error_for(requests.ReadTimeout("slow")), UnknownSendError)
    assert isinstance(error_for(requests.ConnectTimeout("x")), TransientSendError)
    assert isinstance(error_for(requests.ConnectionError("reset")), UnknownSendError)


@pytest.mark.parametrize(
    ("body", "word"),
    [
        ("STOP", "stop"),
        (" stop\n", "stop"),
        ("StopAll", "stop"),
        ("unsubscribe", "stop"),
        ("cancel", "stop"),
        ("END", "stop"),
        ("quit", "stop"),
        ("start", "start"),
        ("Yes", "start"),
        ("UNSTOP", "start"),
        ("help", "help"),
        ("INFO", "help"),
        ("stop please", None),
        ("", None),
        ("STOPP", None),
    ],
)
def test_keywords(body, word):
    assert keyword_of(body) == word


@pytest.mark.parametrize(
    ("status", "event"),
    [
        ("queued", "accepted"),
        ("accepted", "accepted"),
        ("sending", "accepted"),
        ("sent", "accepted"),
        ("delivered", "delivered"),
        ("undelivered", "failed"),
        ("failed", "failed"),
        ("read", "read"),
        ("canceled", None),
        ("receiving", None),
    ],
)
def test_statuses_become_receipt_events(status, event):
    receipt = status_receipt(status, "SM1", now=NOW, user_id="u", delivery_id=3, error_code="30003")
    assert (receipt.event if receipt else None) == event
    if receipt is not None:
        assert (receipt.user_id, receipt.delivery_id, receipt.provider_message_id) == (
            "u",
            3,
            "SM1",
        )
        assert receipt.detail == f"{status} ErrorCode 30003"


def test_a_budget_is_whole_segments_per_whole_second():
    assert budget_quota(1).amounts(None) == [(1, 1)]
    assert budget_quota(10).amounts(None) == [(9, 1)]
    assert budget_quota(10).amounts("activation") == [(4, 1)]
    assert budget_quota(0.25).windows == ((1, 4.0),)


def test_only_twilio_hosts_are_routed_to_the_stand_in():
    http = RoutedHttpClient("http://127.0.0.1:5000/base/", 1.0)
    assert (
        http.route("https://api.twilio.com/2010-04-01/Accounts/AC1/Messages.json?x=1")
        == "http://127.0.0.1:5000/base/2010-04-01/Accounts/AC1/Messages.json?x=1"
    )
    assert http.route("https://example.com/a") == "https://example.com/a"
    assert RoutedHttpClient(None, 1.0).route("https://api.twilio.com/x") == (
        "https://api.twilio.com/x"
    )


# --- the real SDK against the local Twilio -----------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeTwilio]:
    with FakeTwilio() as server:
        yield server


def _adapter(fake: FakeTwilio, timeout: float = 2.0) -> SmsAdapter:
    http = RoutedHttpClient(fake.url, timeout)
    client = Client(FakeTwilio.ACCOUNT_SID, FakeTwilio.AUTH_TOKEN, http_client=http)
    return SmsAdapter(
        client, sender=FakeTwilio.NUMBER, public_url="http://clarion.test", quota=budget_quota(1)
    )


def test_a_send_reaches_the_fake_as_the_sdk_builds_it(fake):
    result = _adapter(fake).send(MESSAGE)
    [message] = fake.messages()
    assert result.provider_message_id == message.sid and message.sid.startswith("SM")
    assert (message.to, message.sender, message.body) == (
        "+4915112345678",
        FakeTwilio.NUMBER,
        "Receipt\nWe charged 12 EUR.",
    )
    assert message.status_callback == status_callback("http://clarion.test", MESSAGE)


def test_refusals_throttles_and_lost_answers_through_the_sdk(fake):
    adapter = _adapter(fake, timeout=0.5)
    fake.fail_number(MESSAGE.address, 21211)
    with pytest.raises(PermanentSendError, match="twilio_21211"):
        adapter.send(MESSAGE)
    fake.failing.clear()
    fake.storm(1, retry_after=7)
    with pytest.raises(ThrottledError, match=r"^twilio_20429: twilio answered 429: ") as throttled:
        adapter.send(MESSAGE)
    assert throttled.value.retry_after == 7  # Retry-After read from this thread's answer
    for loss, reason in (("drop", "no_answer"), ("late", "no_answer"), ("5xx", "http_500")):
        fake.losses.next(loss, delay=1.0)
        with pytest.raises(UnknownSendError, match=rf"^{reason}: ") as unknown:
            adapter.send(MESSAGE)
        assert unknown.value.reason == reason
    assert len(fake.messages()) == 3  # each lost answer was a message taken
    adapter.client.password = "wrong"
    adapter.client.auth = (FakeTwilio.ACCOUNT_SID, "wrong")
    with pytest.raises(PermanentSendError, match="twilio_20003"):
        adapter.send(MESSAGE)


def test_no_server_is_a_failure_not_an_unknown():
    http = RoutedHttpClient("http://127.0.0.1:9", 1.0)
    adapter = SmsAdapter(
        Client("AC1", "t", http_client=http),
        sender="+15005550006",
        public_url="http://x",
        quota=budget_quota(1),
    )
    with pytest.raises(TransientSendError, match="connection"):
        adapter.send(MESSAGE)


# --- looking for an earlier attempt's message (lookup_outcome) ---------------------------------------

ATTEMPT = datetime(2024, 5, 6, 12, 0, tzinfo=UTC)
LOOKED_UP = SmsRequest("+4915112345678", "+15005550006", "Your code is 1234", "http://cb", 1)


def _listed(body: str = "Your code is 1234", after: float = 2.0, direction: str = "outbound-api"):
    from clarion.adapters.sms import Listed

    return Listed("SM1", body, direction, ATTEMPT + timedelta(seconds=after))


@pytest.mark.parametrize(
    ("listed", "minutes_later", "expected"),
    [
        ([_listed()], 1, "found"),  # the attempt's message, created just after it began
        ([_listed(after=-30)], 1, "found"),  # Twilio's clock a little behind ours
        ([_listed(body="another text")], 1, "inconclusive"),
        ([_listed(after=-600)], 1, "inconclusive"),  # an older message: not this attempt's
        ([_listed(direction="inbound")], 1, "inconclusive"),
        ([], 1, "inconclusive"),  # may still be queued: no DateSent yet, not listed
        ([], 10, "inconclusive"),
        ([], 30, "not_sent"),  # past the validity period: Twilio sent it or failed it
        ([_listed(body="other")] * 200, 30, "inconclusive"),  # a full page: not read whole
    ],
)
def test_a_lookup_is_taken_as_not_sent_only_when_conclusive(listed, minutes_later, expected):
    from clarion.adapters.sms import lookup_outcome

    now = ATTEMPT + timedelta(minutes=minutes_later)
    if expected == "inconclusive":
        with pytest.raises(UnknownSendError, match="not among .* conclusive from"):
            lookup_outcome(listed, LOOKED_UP, ATTEMPT, now)
        return
    result = lookup_outcome(listed, LOOKED_UP, ATTEMPT, now)
    if expected == "found":
        assert result == SendResult(platform="sms", provider_message_id="SM1")
    else:
        assert result is None


def test_every_message_carries_the_validity_period_the_lookup_relies_on():
    from clarion.adapters.sms import VALIDITY_PERIOD

    assert LOOKED_UP.create_args()["validity_period"] == VALIDITY_PERIOD
    assert LOOKED_UP.list_args(ATTEMPT) == {
        "to": "+4915112345678",
        "from_": "+15005550006",
        "date_sent_after": ATTEMPT,
        "limit": 200,
    }
