"""The local FCM (standins/fake_fcm.py): Google's token endpoint checks the JWT-bearer assertion the
real google-auth signs, and messages:send checks the access token and records per device token.
Faults come out in FCM's own error shapes."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import jwt
import pytest
import urllib3
from cryptography.hazmat.primitives.asymmetric import rsa
from google.auth import exceptions as auth_errors
from google.auth.transport.urllib3 import Request
from google.oauth2 import service_account

from clarion.standins.fake_fcm import GOOGLE_TOKEN_AUDIENCE, JWT_BEARER, SCOPE, FakeFcm

TOKEN = "fcm-device-token-0001"


@pytest.fixture
def fake() -> Iterator[FakeFcm]:
    with FakeFcm() as server:
        yield server


def _credentials(info: dict) -> service_account.Credentials:
    return service_account.Credentials.from_service_account_info(info, scopes=[SCOPE])


def _access_token(fake: FakeFcm) -> str:
    credentials = _credentials(fake.service_account())
    credentials.refresh(Request(urllib3.PoolManager()))
    return str(credentials.token)


def _send(
    fake: FakeFcm, bearer: str | None, token: str = TOKEN, project: str = FakeFcm.PROJECT
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
    body = {"message": {"token": token, "notification": {"title": "t", "body": "b"}}}
    return httpx.post(f"{fake.url}/v1/projects/{project}/messages:send", json=body, headers=headers)


def test_google_auth_gets_an_access_token_with_the_service_account(fake, tmp_path):
    path = fake.write_service_account(tmp_path / "sa.json")
    credentials = service_account.Credentials.from_service_account_file(str(path), scopes=[SCOPE])
    credentials.refresh(Request(urllib3.PoolManager()))
    assert credentials.valid and str(credentials.token).startswith("ya29.")
    assert fake.counts.token_requests == 1 and fake.counts.tokens_refused == 0


def test_an_assertion_not_signed_by_the_account_is_refused(fake):
    info = fake.service_account()
    forged = _credentials(
        {
            **info,
            "private_key": _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        }
    )
    with pytest.raises(auth_errors.RefreshError, match="invalid_grant"):
        forged.refresh(Request(urllib3.PoolManager()))
    assert fake.counts.tokens_refused == 1 and fake.access_tokens == {}


@pytest.mark.parametrize(
    ("claims", "error"),
    [
        ({"aud": "https://example.com/token"}, "invalid_grant"),
        ({"iss": "someone@else.iam.gserviceaccount.com"}, "invalid_grant"),
        ({"exp": int(time.time()) - 10}, "invalid_grant"),
        ({"scope": "https://www.googleapis.com/auth/cloud-platform"}, "invalid_scope"),
    ],
)
def test_the_token_endpoint_checks_the_assertions_claims(fake, claims, error):
    now = int(time.time())
    base = {
        "iss": fake.CLIENT_EMAIL,
        "aud": GOOGLE_TOKEN_AUDIENCE,
        "scope": SCOPE,
        "iat": now,
        "exp": now + 3600,
    }
    assertion = jwt.encode(
        {**base, **claims},
        fake.service_account()["private_key"],
        algorithm="RS256",
        headers={"kid": fake.key_id},
    )
    answer = httpx.post(
        f"{fake.url}/token", data={"grant_type": JWT_BEARER, "assertion": assertion}
    )
    assert (answer.status_code, answer.json()["error"]) == (400, error)
    wrong_grant = httpx.post(f"{fake.url}/token", data={"grant_type": "password"})
    assert wrong_grant.json()["error"] == "unsupported_grant_type"


def test_messages_send_needs_an_issued_access_token_and_the_accounts_project(fake):
    assert _send(fake, None).status_code == 401
    assert _send(fake, "ya29.made-up").json()["error"]["status"] == "UNAUTHENTICATED"
    bearer = _access_token(fake)
    assert _send(fake, bearer, project="other-project").status_code == 403
    answer = _send(fake, bearer)
    assert answer.status_code == 200 and answer.json()["name"].startswith(
        "projects/clarion-test/messages/"
    )
    assert fake.per_token() == {TOKEN: 1}
    assert fake.messages(TOKEN)[0]["notification"] == {"title": "t", "body": "b"}


def test_faults_come_in_fcms_error_shapes(fake):
    bearer = _access_token(fake)
    fake.unregister("gone-token-000000001")
    fake.fail("INVALID_ARGUMENT", token="bad-token-0000000001")
    gone = _send(fake, bearer, "gone-token-000000001").json()["error"]
    fake.fail("QUOTA_EXCEEDED", retry_after=12)  # the next send, to any token
    throttled = _send(fake, bearer)
    bad = _send(fake, bearer, "bad-token-0000000001").json()["error"]
    fake.fail("UNAVAILABLE")
    unavailable = _send(fake, bearer)
    assert (gone["code"], gone["details"][0]["errorCode"]) == (404, "UNREGISTERED")
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "12"
    assert throttled.json()["error"]["details"][0]["errorCode"] == "QUOTA_EXCEEDED"
    assert (bad["code"], bad["details"][0]["errorCode"]) == (400, "INVALID_ARGUMENT")
    assert bad["details"][1]["fieldViolations"][0]["field"] == "message.token"
    assert unavailable.status_code == 503 and unavailable.json()["error"]["status"] == "UNAVAILABLE"
    assert _send(fake, bearer).status_code == 200
    assert fake.per_token() == {TOKEN: 1}
    assert fake.attempts == {"gone-token-000000001": 1, TOKEN: 3, "bad-token-0000000001": 1}


@pytest.mark.parametrize("loss", ["drop", "late", "5xx"])
def test_a_lost_answer_comes_after_the_message_was_taken(fake, loss):
    bearer = _access_token(fake)
    fake.losses.next(loss, delay=1.0, match="messages:send")
    if loss == "5xx":
        assert _send(fake, bearer).status_code == 500
    else:
        with pytest.raises(
            httpx.TransportError,
            match=r"^(Server disconnected without sending a response|timed out)",
        ):
            httpx.post(
                f"{fake.url}/v1/projects/{fake.PROJECT}/messages:send",
                json={"message": {"token": TOKEN}},
                headers={"Authorization": f"Bearer {bearer}"},
                timeout=0.3,
            )
    assert fake.per_token() == {TOKEN: 1} and fake.losses.applied == [loss]


def _pem(key: rsa.RSAPrivateKey) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def test_the_device_shows_a_message_with_a_shown_tag_in_its_place(fake):
    bearer = _access_token(fake)
    cases = [
        ("a", "a", "first"),
        ("b", "b", "other"),
        ("a", "a", "first, again"),  # the same tag: replaces "first"
        (None, "c", "untagged"),
        (None, "c", "untagged, again"),  # no tag: the collapse key replaces
    ]
    for tag, collapse, title in cases:
        android = {"collapse_key": collapse, "notification": {"tag": tag} if tag else {}}
        body = {"message": {"token": TOKEN, "android": android, "notification": {"title": title}}}
        answer = httpx.post(
            f"{fake.url}/v1/projects/{fake.PROJECT}/messages:send",
            json=body,
            headers={"Authorization": f"Bearer {bearer}"},
        )
        assert answer.status_code == 200
    assert fake.per_token() == {TOKEN: 5}  # every one reached FCM ...
    shown = [m["notification"]["title"] for m in fake.shown(TOKEN)]
    assert shown == ["other", "first, again", "untagged, again"]  # ... three are on the device
