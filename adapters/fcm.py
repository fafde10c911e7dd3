"""FCM HTTP v1: one `messages:send` per Android / web device token.

Auth: an OAuth2 access token for the service account (`CLARION_FCM_SERVICE_ACCOUNT`, the JSON
Firebase gives you) through google-auth, which signs the JWT-bearer grant and posts it to the
account's `token_uri`; the token is cached until google-auth says it is near expiry.

Request: POST {fcm_api_url}/v1/projects/{project_id}/messages:send with the notification's
title and body, `data.clarion_delivery_id`, and the collapse id as `android.collapse_key` and
notification tag, `apns.headers.apns-collapse-id` and the web push `Topic`.

Answers (`from_response`): 200 → sent (the message `name`); UNREGISTERED, or INVALID_ARGUMENT
that names the registration token → the token is invalid (removed and suppressed by the channel);
429 / QUOTA_EXCEEDED → throttled (Retry-After, else a minute); 5xx / UNAVAILABLE / INTERNAL →
unknown; 401 → retry with a new access token; SENDER_ID_MISMATCH, THIRD_PARTY_AUTH_ERROR and other
4xx → rejected (a configuration problem: the tokens are kept).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import urllib3
from google.auth import exceptions as auth_errors
from google.auth.transport.urllib3 import Request as AuthRequest
from google.oauth2 import service_account

from clarion.adapters.push import DeviceOutcome, title_and_body, transport_outcome, web_topic
from clarion.adapters.ratelimit import Quota
from clarion.errors import ConfigurationError
from clarion.records import Message, clean_provider_id

if TYPE_CHECKING:
    from clarion.settings import Settings

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
# Per Firebase project: FCM's documented 600,000 messages a minute.
QUOTA = Quota("fcm", ((600_000, 60.0),))
DEFAULT_PAUSE = 60.0  # FCM asks for at least a minute when a 429 has no Retry-After
HIGH_PRIORITY = frozenset({"transactional", "security", "alert"})
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
BODY_MAX = 2000  # characters of the body shown (the whole message must stay under 4 KiB)


# --- pure --------------------------------------------------------------------------------------


def to_request(message: Message, token: str, collapse: str) -> dict[str, Any]:
    """The `messages:send` body for one device."""
    title, body = title_and_body(message)
    high = message.category in HIGH_PRIORITY
    return {
        "message": {
            "token": token,
            "notification": {"title": title, "body": body[:BODY_MAX]},
            "data": {"clarion_delivery_id": str(message.delivery_id)},
            "android": {
                "collapse_key": collapse,
                "priority": "high" if high else "normal",
                "notification": {"tag": collapse},
            },
            "apns": {
                "headers": {"apns-collapse-id": collapse, "apns-priority": "10" if high else "5"}
            },
            "webpush": {"headers": {"Topic": web_topic(collapse)}},
        }
    }


def error_code(body: bytes) -> tuple[str, str, bool]:
    """(code, message, names_the_token) of an FCM error body: the FcmError errorCode if present,
    else the google.rpc status; whether a field violation or the message is about the token."""
    try:
        error = json.loads(body or b"{}").get("error") or {}
    except (ValueError, AttributeError, RecursionError):
        return "", body[:200].decode(errors="replace"), False
    if not isinstance(error, dict):
        return "", "", False
    text = str(error.get("message", ""))[:200]
    code = str(error.get("status", ""))
    names_token = "registration token" in text.lower()
    for part in error.get("details") or []:
        if not isinstance(part, dict):
            continue
        if part.get("@type") == FCM_ERROR and part.get("errorCode"):
            code = str(part["errorCode"])
        for violation in (
            part.get("fieldViolations") or [] if part.get("@type") == BAD_REQUEST else []
        ):
            if isinstance(violation, dict) and violation.get("field") == "message.token":
                names_token = True
    return code, text, names_token


def retry_after(headers: Mapping[str, str]) -> float | None:
    try:
        value = headers.get("retry-after")
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def from_response(
    device: str, status: int, headers: Mapping[str, str], body: bytes
) -> DeviceOutcome:
    """One FCM answer as a device outcome."""
    if status == 200:
        try:
            name = json.loads(body).get("name")
        except (ValueError, AttributeError, RecursionError):
            name = None
        return DeviceOutcome(device, "sent", "ok", message_id=clean_provider_id(name))
    code, text, names_token = error_code(body)
    reason = code or f"http_{status}"
    if code == "UNREGISTERED" or (code == "INVALID_ARGUMENT" and names_token):
        return DeviceOutcome(device, "invalid", reason, text)
    if status == 429 or code in ("QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED"):
        wait = retry_after(headers)
        return DeviceOutcome(device, "throttled", reason, text, retry_after=wait or DEFAULT_PAUSE)
    if status >= 500 or code in ("UNAVAILABLE", "INTERNAL"):
        return DeviceOutcome(device, "unknown", reason, text)
    if status == 401 and code in ("UNAUTHENTICATED", ""):
        return DeviceOutcome(device, "retry", reason, text)
    return DeviceOutcome(device, "rejected", reason, text)


# --- I/O ---------------------------------------------------------------------------------------


class FcmSender:
    """messages:send with an access token from the service account (a DeviceSender)."""

    provider = "fcm"
    quota = QUOTA
    # android.collapse_key (FCM keeps only the newest pending message of a key) and the
    # notification tag (Android replaces a shown notification with the same tag), apns-collapse-id
    # and the web push Topic: a resend replaces the first on the device.
    replaces_by_collapse = True

    def __init__(
        self, credentials: service_account.Credentials, *, api_url: str, timeout: float
    ) -> None:
        self.credentials = credentials
        self.project_id = str(credentials.project_id or "")
        if not self.project_id:
            raise ConfigurationError("CLARION_FCM_SERVICE_ACCOUNT has no project_id")
        self.budget_key = f"fcm:{self.project_id}"
        self.url = f"{api_url.rstrip('/')}/v1/projects/{self.project_id}/messages:send"
        self.client = httpx.Client(timeout=timeout)
        self._auth = AuthRequest(
            urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout), retries=False)
        )
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, s: Settings) -> FcmSender:
        path = Path(str(s.fcm_service_account))
        try:
            info = json.loads(path.read_text())
            credentials = service_account.Credentials.from_service_account_info(
                info, scopes=[SCOPE]
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigurationError(f"CLARION_FCM_SERVICE_ACCOUNT={path}: {exc}") from exc
        return cls(credentials, api_url=s.fcm_api_url, timeout=s.push_timeout)

    def access_token(self) -> str:
        """The cached access token, refreshed (the JWT-bearer grant) when google-auth says so."""
        with self._lock:
            if not self.credentials.valid:
                self.credentials.refresh(self._auth)
            return str(self.credentials.token)

    def send(self, message: Message, token: str, collapse: str) -> DeviceOutcome:
        device = f"fcm:{token}"
        try:
            bearer = self.access_token()
        except auth_errors.GoogleAuthError as exc:  # nothing was sent
            return DeviceOutcome(device, "retry", "fcm_auth", str(exc)[:200])
        try:
            response = self.client.post(
                self.url,
                json=to_request(message, token, collapse),
                headers={"Authorization": f"Bearer {bearer}"},
            )
        except httpx.HTTPError as exc:
            return transport_outcome(device, exc)
        outcome = from_response(device, response.status_code, response.headers, response.content)
        if response.status_code == 401:
            with self._lock:
                self.credentials.token = None  # the next send asks for a new one
        return outcome
