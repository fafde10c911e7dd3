"""The push channel's pure parts, as tables: devices, collapse ids, provider answers, and how the
devices' outcomes make the delivery's (adapters.push.combine)."""

from __future__ import annotations

import json
import re
import uuid

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clarion.adapters import apns, fcm
from clarion.adapters.push import DeviceOutcome, collapse_id, combine, parse_devices, web_topic
from clarion.errors import PermanentSendError, ThrottledError, TransientSendError, UnknownSendError
from clarion.records import Message

MESSAGE = Message(
    delivery_id=7,
    user_id="ana",
    type_key="build_failed",
    occurrence_key="event:e1",
    channel="push",
    content={"title": "Build 42 failed", "body": "on main"},
    category="alert",
)


def test_devices_are_read_in_order_without_repeats():
    assert parse_devices("fcm:aa apns:BB fcm:aa  fcm:cc bogus") == [
        ("fcm", "aa"),
        ("apns", "BB"),
        ("fcm", "cc"),
    ]
    assert parse_devices(None) == [] and parse_devices("") == []


@pytest.mark.parametrize(
    ("collapse_key", "expected"),
    [
        ("build:42", "build:42"),  # the type's collapse key
        (None, "build_failed:event:e1"),  # else the occurrence
        ("k" * 64, "k" * 64),
    ],
)
def test_the_collapse_id_is_the_types_key_or_the_occurrence(collapse_key, expected):
    message = Message(**{**MESSAGE.__dict__, "collapse_key": collapse_key})
    assert collapse_id(message) == expected


def test_a_long_collapse_key_is_hashed_to_64_bytes_stably():
    long = Message(**{**MESSAGE.__dict__, "collapse_key": "ü" * 40})  # 80 bytes
    assert len(collapse_id(long).encode()) == 64 and collapse_id(long) == collapse_id(long)
    assert collapse_id(long) != collapse_id(Message(**{**long.__dict__, "collapse_key": "ü" * 41}))


def test_web_push_topics_are_32_url_safe_characters():
    assert web_topic("build-42") == "build-42"
    topic = web_topic("build_failed:event:e1")
    assert len(topic) == 32 and all(c.isalnum() or c in "-_" for c in topic)


def _o(kind: str, reason: str = "r", **kw) -> DeviceOutcome:
    return DeviceOutcome(f"fcm:{kind}{reason}", kind, reason, **kw)


@pytest.mark.parametrize(
    ("outcomes", "raises", "reason"),
    [
        ([_o("sent", message_id="m1"), _o("invalid"), _o("unknown")], None, None),
        ([_o("invalid"), _o("throttled", retry_after=5)], ThrottledError, "r"),
        ([_o("throttled", "QUOTA"), _o("unknown", "no_answer")], UnknownSendError, "no_answer"),
        (
            [_o("retry", "connection"), _o("rejected", "TopicDisallowed")],
            TransientSendError,
            "connection",
        ),
        ([_o("rejected", "TopicDisallowed"), _o("invalid")], PermanentSendError, "TopicDisallowed"),
        (
            [_o("invalid", "UNREGISTERED"), _o("invalid", "BadDeviceToken")],
            PermanentSendError,
            "no_valid_device",
        ),
    ],
)
def test_the_delivery_outcome_from_its_devices(outcomes, raises, reason):
    if raises is None:
        result = combine(outcomes)
        assert (result.platform, result.provider_message_id, result.repeat) == ("push", "m1", None)
        return
    with pytest.raises(raises, match=rf"^{re.escape(reason)}: ") as caught:
        combine(outcomes)
    assert caught.value.reason == reason
    assert raises is not PermanentSendError or not isinstance(caught.value, TransientSendError)


def test_a_throttled_delivery_waits_as_long_as_its_longest_pause():
    with pytest.raises(ThrottledError, match=r"^r: ") as caught:
        combine(
            [
                _o("throttled", retry_after=5),
                _o("throttled", "paused"),
                _o("throttled", retry_after=30),
            ]
        )
    assert caught.value.retry_after == 30


# --- FCM ---------------------------------------------------------------------------------------


def test_the_fcm_message_carries_the_collapse_id_everywhere_and_the_delivery_id():
    body = fcm.to_request(MESSAGE, "tok", "build:42")["message"]
    assert body["token"] == "tok"
    assert body["notification"] == {"title": "Build 42 failed", "body": "on main"}
    assert body["data"] == {"clarion_delivery_id": "7"}
    assert body["android"]["collapse_key"] == body["android"]["notification"]["tag"] == "build:42"
    assert body["android"]["priority"] == "high"  # an alert
    assert body["apns"]["headers"] == {"apns-collapse-id": "build:42", "apns-priority": "10"}
    assert body["webpush"]["headers"] == {"Topic": web_topic("build:42")}


def _fcm_error(
    status: int, code: str, fcm_code: str | None = None, field: str | None = None
) -> bytes:
    details: list[dict] = []
    if fcm_code:
        details.append({"@type": fcm.FCM_ERROR, "errorCode": fcm_code})
    if field:
        details.append({"@type": fcm.BAD_REQUEST, "fieldViolations": [{"field": field}]})
    return json.dumps(
        {"error": {"code": status, "message": "x", "status": code, "details": details}}
    ).encode()


@pytest.mark.parametrize(
    ("status", "headers", "body", "kind", "reason", "wait"),
    [
        (200, {}, b'{"name": "projects/p/messages/1"}', "sent", "ok", None),
        (404, {}, _fcm_error(404, "NOT_FOUND", "UNREGISTERED"), "invalid", "UNREGISTERED", None),
        (
            400,
            {},
            _fcm_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "message.token"),
            "invalid",
            "INVALID_ARGUMENT",
            None,
        ),
        # an invalid argument that is not the token: the message is wrong, the token is kept
        (
            400,
            {},
            _fcm_error(400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", "message.data"),
            "rejected",
            "INVALID_ARGUMENT",
            None,
        ),
        (404, {}, _fcm_error(404, "NOT_FOUND"), "rejected", "NOT_FOUND", None),  # a wrong project
        (
            429,
            {"retry-after": "12"},
            _fcm_error(429, "RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),
            "throttled",
            "QUOTA_EXCEEDED",
            12.0,
        ),
        (429, {}, b"", "throttled", "http_429", fcm.DEFAULT_PAUSE),
        (503, {}, _fcm_error(503, "UNAVAILABLE", "UNAVAILABLE"), "unknown", "UNAVAILABLE", None),
        (500, {}, b"<html>", "unknown", "http_500", None),
        (401, {}, _fcm_error(401, "UNAUTHENTICATED"), "retry", "UNAUTHENTICATED", None),
        (
            403,
            {},
            _fcm_error(403, "PERMISSION_DENIED", "SENDER_ID_MISMATCH"),
            "rejected",
            "SENDER_ID_MISMATCH",
            None,
        ),
        (
            401,
            {},
            _fcm_error(401, "UNAUTHENTICATED", "THIRD_PARTY_AUTH_ERROR"),
            "rejected",
            "THIRD_PARTY_AUTH_ERROR",
            None,
        ),
    ],
)
def test_fcm_answers(status, headers, body, kind, reason, wait):
    outcome = fcm.from_response("fcm:t", status, headers, body)
    assert (outcome.kind, outcome.reason, outcome.retry_after) == (kind, reason, wait)


# --- APNs --------------------------------------------------------------------------------------


def test_the_apns_request_has_the_headers_apple_wants():
    path, headers, body = apns.to_request(MESSAGE, "ab" * 32, "build:42", topic="com.x", bearer="J")
    assert path == "/3/device/" + "ab" * 32
    assert headers["authorization"] == "bearer J"
    assert (headers["apns-topic"], headers["apns-push-type"], headers["apns-priority"]) == (
        "com.x",
        "alert",
        "10",
    )
    assert headers["apns-collapse-id"] == "build:42"
    assert uuid.UUID(headers["apns-id"])  # a UUID, the same for every attempt at this device
    assert headers["apns-id"] == apns.apns_id(MESSAGE.idempotency_key, "AB" * 32)
    assert headers["apns-id"] != apns.apns_id(MESSAGE.idempotency_key, "cd" * 32)
    assert json.loads(body) == {
        "aps": {"alert": {"title": "Build 42 failed", "body": "on main"}, "sound": "default"},
        "clarion": {"delivery_id": 7},
    }
    nudge = Message(**{**MESSAGE.__dict__, "category": "activation"})
    assert apns.to_request(nudge, "ab", "c", topic="t", bearer="J")[1]["apns-priority"] == "5"


def test_a_long_body_is_cut_to_fit_four_kilobytes():
    long = Message(**{**MESSAGE.__dict__, "content": {"title": "t", "body": "ü" * 5000}})
    data = apns.payload(long)
    assert len(data) <= apns.PAYLOAD_MAX and json.loads(data)["aps"]["alert"]["body"].endswith("…")


@pytest.mark.parametrize(
    ("status", "body", "kind", "reason"),
    [
        (410, b'{"reason": "Unregistered", "timestamp": 1}', "invalid", "Unregistered"),
        (400, b'{"reason": "BadDeviceToken"}', "invalid", "BadDeviceToken"),
        (400, b'{"reason": "DeviceTokenNotForTopic"}', "invalid", "DeviceTokenNotForTopic"),
        (400, b'{"reason": "BadCollapseId"}', "rejected", "BadCollapseId"),
        (400, b'{"reason": "TopicDisallowed"}', "rejected", "TopicDisallowed"),  # config: kept
        (429, b'{"reason": "TooManyRequests"}', "throttled", "TooManyRequests"),
        (500, b'{"reason": "InternalServerError"}', "unknown", "InternalServerError"),
        (503, b"", "unknown", "http_503"),
        (403, b'{"reason": "ExpiredProviderToken"}', "retry", "ExpiredProviderToken"),
        (413, b'{"reason": "PayloadTooLarge"}', "rejected", "PayloadTooLarge"),
    ],
)
def test_apns_answers(status, body, kind, reason):
    outcome = apns.from_response("apns:t", status, {}, body)
    assert (outcome.kind, outcome.reason) == (kind, reason)
    assert outcome.kind != "throttled" or outcome.retry_after == apns.DEFAULT_PAUSE


def test_a_sent_apns_answer_records_the_apns_id():
    outcome = apns.from_response("apns:t", 200, {"apns-id": "1-2"}, b"")
    assert (outcome.kind, outcome.message_id) == ("sent", "1-2")


def test_the_provider_token_is_reused_for_fifty_minutes_then_signed_again():
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    now = [1_800_000_000.0]
    token = apns.ProviderToken(pem, key_id="K1", team_id="T1", wall=lambda: now[0])
    first = token.current()
    now[0] += 49 * 60
    assert token.current() == first
    now[0] += 60
    second = token.current()
    assert second != first
    claims = jwt.decode(
        second, key.public_key(), algorithms=["ES256"], options={"verify_iat": False}
    )
    assert claims == {"iss": "T1", "iat": int(now[0])}
    assert jwt.get_unverified_header(second) == {"alg": "ES256", "kid": "K1", "typ": "JWT"}
    token.forget()
    now[0] += 1
    assert token.current() != second
