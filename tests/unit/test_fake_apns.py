"""The local APNs (standins/fake_apns.py) checks what Apple checks, and speaks only HTTP/2 over TLS.

Driven with a plain httpx HTTP/2 client and hand-made provider tokens, so each check can be
shown to refuse (the adapter's own tests are in tests/integration/test_push.py)."""

from __future__ import annotations

import gc
import json
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clarion.standins.fake_apns import FakeApns

DEVICE = "ab" * 32
ID = "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d"


@pytest.fixture
def fake() -> Iterator[FakeApns]:
    with FakeApns() as server:
        yield server


@pytest.fixture
def key(fake, tmp_path) -> str:
    return fake.write_key(tmp_path / "AuthKey.p8").read_text()


def _client(fake: FakeApns, *, http2: bool = True, timeout: float = 5) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(fake.ca_file))
    return httpx.Client(base_url=fake.url, http2=http2, verify=context, timeout=timeout)


def _jwt(
    key: str, *, kid: str = FakeApns.KEY_ID, iss: str = FakeApns.TEAM_ID, iat: float | None = None
) -> str:
    return jwt.encode(
        {"iss": iss, "iat": int(time.time() if iat is None else iat)},
        key,
        algorithm="ES256",
        headers={"kid": kid},
    )


def _headers(bearer: str | None, **extra: str) -> dict[str, str]:
    headers = {"apns-topic": FakeApns.TOPIC, "apns-push-type": "alert", "apns-id": ID, **extra}
    if bearer is not None:
        headers["authorization"] = f"bearer {bearer}"
    return headers


BODY = json.dumps({"aps": {"alert": {"title": "t", "body": "b"}}}).encode()


def _post(
    client: httpx.Client,
    bearer: str | None,
    *,
    device: str = DEVICE,
    body: bytes = BODY,
    **extra: str,
) -> httpx.Response:
    return client.post(f"/3/device/{device}", content=body, headers=_headers(bearer, **extra))


def test_a_notification_over_http2_is_recorded_with_its_headers(fake, key):
    with _client(fake) as client:
        answer = _post(client, _jwt(key), **{"apns-collapse-id": "build:42", "apns-priority": "10"})
        again = _post(client, _jwt(key))
    assert answer.status_code == 200 and answer.headers["apns-id"] == ID
    assert answer.http_version == "HTTP/2" and again.http_version == "HTTP/2"
    [first, second] = fake.for_device(DEVICE)
    assert (
        first.headers["apns-collapse-id"] == "build:42" and first.headers["apns-priority"] == "10"
    )
    assert "authorization" not in first.headers
    assert first.payload == json.loads(BODY)
    assert (first.alpn, first.connection, second.connection) == ("h2", 0, 0)  # one connection ...
    assert (first.stream_id, second.stream_id) == (1, 3)  # ... two HTTP/2 streams on it
    assert fake.connections == ["h2"]


def test_a_client_that_does_not_offer_h2_is_disconnected(fake, key):
    with (
        _client(fake, http2=False) as client,
        pytest.raises(
            httpx.TransportError, match=r"^Server disconnected without sending a response"
        ),
    ):
        _post(client, _jwt(key))
    assert fake.connections == [None] and fake.counts.requests == 0 and fake.notifications == []


def test_a_client_that_does_not_trust_the_ca_cannot_connect(fake, key):
    with (
        httpx.Client(base_url=fake.url, http2=True) as client,
        pytest.raises(httpx.ConnectError, match=r"CERTIFICATE_VERIFY_FAILED"),
    ):
        _post(client, _jwt(key))
    assert fake.counts.requests == 0


def test_provider_tokens_are_checked(fake, key):
    other = (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    cases = [
        (None, "MissingProviderToken"),
        ("not-a-jwt", "InvalidProviderToken"),
        (_jwt(other), "InvalidProviderToken"),  # signed by another key
        (_jwt(key, kid="OTHERKEY01"), "InvalidProviderToken"),
        (_jwt(key, iss="OTHERTEAM1"), "InvalidProviderToken"),
        (_jwt(key, iat=time.time() - 3700), "ExpiredProviderToken"),  # older than an hour
        (_jwt(key, iat=time.time() + 600), "InvalidProviderToken"),  # from the future
    ]
    with _client(fake) as client:
        for bearer, reason in cases:
            answer = _post(client, bearer)
            assert (answer.status_code, answer.json()["reason"]) == (403, reason), reason
        assert _post(client, _jwt(key, iat=time.time() - 3500)).status_code == 200
    assert len(fake.notifications) == 1


def test_requests_are_checked_as_apple_does(fake, key):
    bearer = _jwt(key)
    cases = [
        ({"device": "nothex"}, 400, "BadDeviceToken"),
        ({"apns-topic": "com.other.app"}, 400, "TopicDisallowed"),
        ({"apns-collapse-id": "c" * 65}, 400, "BadCollapseId"),
        ({"apns-id": "not-a-uuid"}, 400, "BadMessageId"),
        ({"apns-priority": "7"}, 400, "BadPriority"),
        ({"apns-push-type": "shout"}, 400, "InvalidPushType"),
        ({"body": b""}, 400, "PayloadEmpty"),
        ({"body": b'{"aps": {}, "x": "' + b"y" * 4100 + b'"}'}, 413, "PayloadTooLarge"),
        ({"body": b"[1]"}, 400, "BadPayload"),
    ]
    with _client(fake) as client:
        for extra, status, reason in cases:
            answer = _post(client, bearer, **extra)
            assert (answer.status_code, answer.json()["reason"]) == (status, reason), reason
        assert _post(client, bearer, **{"apns-collapse-id": "c" * 64}).status_code == 200
    assert len(fake.notifications) == 1


def test_unregistered_tokens_and_scripted_failures(fake, key):
    fake.unregister(DEVICE.upper())
    fake.fail("TooManyRequests", 429, times=2)
    fake.fail("BadDeviceToken", 400, token="cd" * 32)
    with _client(fake) as client:
        answers = [_post(client, _jwt(key), device="ef" * 32) for _ in range(3)]
        gone = _post(client, _jwt(key))
        bad = _post(client, _jwt(key), device="cd" * 32)
    assert [a.status_code for a in answers] == [429, 429, 200]
    assert answers[0].json() == {"reason": "TooManyRequests"}
    assert gone.status_code == 410 and gone.json()["reason"] == "Unregistered"
    assert isinstance(gone.json()["timestamp"], int)
    assert (bad.status_code, bad.json()["reason"]) == (400, "BadDeviceToken")
    assert fake.per_device() == {"ef" * 32: 1}
    assert fake.attempts == {"ef" * 32: 3, DEVICE: 1, "cd" * 32: 1}


@pytest.mark.parametrize("loss", ["drop", "late", "5xx"])
def test_a_lost_answer_comes_after_the_notification_was_taken(fake, key, loss):
    fake.losses.next(loss, delay=1.0)
    with _client(fake, timeout=0.3) as client:
        if loss == "5xx":
            assert _post(client, _jwt(key)).status_code == 500
        else:
            with pytest.raises(
                (httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError),
                match=r"^(Server disconnected|The read operation timed out)",
            ):
                _post(client, _jwt(key))
        assert _post(client, _jwt(key)).status_code == 200  # the next one is answered
    assert len(fake.for_device(DEVICE)) == 2 and fake.losses.applied == [loss]


def test_the_key_file_is_a_pkcs8_p8(fake, tmp_path: Path):
    text = fake.write_key(tmp_path / "k.p8").read_text()
    assert text.startswith("-----BEGIN PRIVATE KEY-----")


def test_stopping_ends_an_answer_still_held_back(tmp_path, caplog):
    """A late answer asleep when the fake stops is cancelled, not left pending on a closed loop
    (a pending task's finalizer logs from inside whatever the garbage collector interrupts)."""
    with FakeApns() as fake:
        key = fake.write_key(tmp_path / "AuthKey.p8").read_text()
        fake.losses.next("late", delay=60.0)
        with (
            _client(fake, timeout=0.3) as client,
            pytest.raises(httpx.ReadTimeout, match="timed out"),
        ):
            _post(client, _jwt(key))
    del fake
    gc.collect()
    destroyed = [r for r in caplog.records if "destroyed but it is pending" in r.getMessage()]
    assert destroyed == []
