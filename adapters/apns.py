"""APNs over HTTP/2: one POST /3/device/<token> per iOS device, on one multiplexed connection.

Auth: a provider token (a JWT signed ES256 with the team's .p8 key, `kid` = key id, `iss` = team
id, `iat` = now), cached and re-signed every 50 minutes — Apple refuses one older than an hour
and asks for no more than one new token every 20 minutes.

Headers: `apns-topic` (the bundle id), `apns-push-type: alert`, `apns-priority` (10 for
transactional, security and alert categories, else 5: delivered with the device's power in mind),
`apns-collapse-id` (at most 64 bytes), and an `apns-id` derived from the delivery's idempotency
key and the device (a UUID): every attempt at one delivery on one device carries the same id.

Answers (`from_response`): 200 → sent (the apns-id); 410 Unregistered, 400 BadDeviceToken or
DeviceTokenNotForTopic → the token is invalid (removed and suppressed by the channel); 429
TooManyRequests → throttled; 500 / 503 or a lost answer → unknown; 403 Expired/InvalidProviderToken
→ retry with a new provider token; anything else → rejected.
"""

from __future__ import annotations

import json
import ssl
import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import jwt

from clarion import clock
from clarion.adapters.push import DeviceOutcome, title_and_body, transport_outcome
from clarion.adapters.ratelimit import Quota
from clarion.errors import ConfigurationError
from clarion.records import Message, clean_provider_id

if TYPE_CHECKING:
    from clarion.settings import Settings

# Apple publishes no rate; a ceiling per team key so a runaway cannot flood, paused on 429.
QUOTA = Quota("apns", ((9000, 1.0),))
TOKEN_LIFETIME = 50 * 60.0  # seconds a provider token is reused
DEFAULT_PAUSE = 10.0  # APNs' 429 carries no Retry-After
PAYLOAD_MAX = 4096  # bytes: APNs' limit for an alert
HIGH_PRIORITY = frozenset({"transactional", "security", "alert"})
INVALID_REASONS = frozenset({"Unregistered", "BadDeviceToken", "DeviceTokenNotForTopic"})
TOKEN_REASONS = frozenset({"ExpiredProviderToken", "InvalidProviderToken", "MissingProviderToken"})
APNS_ID_NAMESPACE = uuid.UUID("6f1d5c2e-3a47-4c55-9f8b-2a0c1d7e9b30")  # clarion's, for uuid5


# --- pure --------------------------------------------------------------------------------------


def apns_id(idempotency_key: str, token: str) -> str:
    """The same UUID for every attempt at one delivery on one device."""
    return str(uuid.uuid5(APNS_ID_NAMESPACE, f"{idempotency_key}/{token.lower()}"))


def payload(message: Message) -> bytes:
    """The aps alert with clarion's delivery id; the body is cut until it fits 4 KiB."""
    title, body = title_and_body(message)
    while True:
        data = json.dumps(
            {
                "aps": {"alert": {"title": title, "body": body}, "sound": "default"},
                "clarion": {"delivery_id": message.delivery_id},
            },
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode()
        if len(data) <= PAYLOAD_MAX or not body:
            return data
        body = body[: len(body) // 2] + "…"
        title = title[:200]


def to_request(
    message: Message, token: str, collapse: str, *, topic: str, bearer: str
) -> tuple[str, dict[str, str], bytes]:
    """(path, headers, body) of one notification."""
    headers = {
        "authorization": f"bearer {bearer}",
        "apns-topic": topic,
        "apns-push-type": "alert",
        "apns-priority": "10" if message.category in HIGH_PRIORITY else "5",
        "apns-collapse-id": collapse,
        "apns-id": apns_id(message.idempotency_key, token),
        "content-type": "application/json",
    }
    return f"/3/device/{token}", headers, payload(message)


def reason_of(body: bytes) -> str:
    try:
        reason = json.loads(body or b"{}").get("reason")
    except (ValueError, AttributeError, RecursionError):
        return ""
    return reason if isinstance(reason, str) and reason.isidentifier() else ""


def from_response(
    device: str, status: int, headers: Mapping[str, str], body: bytes
) -> DeviceOutcome:
    """One APNs answer as a device outcome."""
    if status == 200:
        return DeviceOutcome(
            device, "sent", "ok", message_id=clean_provider_id(headers.get("apns-id"))
        )
    reason = reason_of(body) or f"http_{status}"
    detail = f"apns answered {status} {reason}"
    if status == 410 or reason in INVALID_REASONS:
        return DeviceOutcome(device, "invalid", reason, detail)
    if status == 429:
        return DeviceOutcome(device, "throttled", reason, detail, retry_after=DEFAULT_PAUSE)
    if status >= 500:
        return DeviceOutcome(device, "unknown", reason, detail)
    if reason in TOKEN_REASONS:
        return DeviceOutcome(device, "retry", reason, detail)
    return DeviceOutcome(device, "rejected", reason, detail)


# --- I/O ---------------------------------------------------------------------------------------


class ProviderToken:
    """The provider JWT, signed once and reused for TOKEN_LIFETIME seconds (thread-safe)."""

    def __init__(self, key: str, *, key_id: str, team_id: str, wall: Callable[[], float]) -> None:
        self.key, self.key_id, self.team_id, self.wall = key, key_id, team_id, wall
        self._token: tuple[float, str] | None = None
        self._lock = threading.Lock()

    def current(self) -> str:
        with self._lock:
            now = self.wall()
            if (
                self._token is None
                or now - self._token[0] >= TOKEN_LIFETIME
                or now < self._token[0]
            ):
                signed = jwt.encode(
                    {"iss": self.team_id, "iat": int(now)},
                    self.key,
                    algorithm="ES256",
                    headers={"kid": self.key_id},
                )
                self._token = (now, signed)
            return self._token[1]

    def forget(self) -> None:
        with self._lock:
            self._token = None


class ApnsSender:
    """POST /3/device/<token> over HTTP/2 (httpx with h2) — a DeviceSender."""

    provider = "apns"
    quota = QUOTA
    # apns-collapse-id (with the same apns-id on every attempt): the device shows the newest
    # notification of a collapse id in place of the older one, so a resend replaces.
    replaces_by_collapse = True

    def __init__(
        self,
        token: ProviderToken,
        *,
        topic: str,
        url: str,
        timeout: float,
        ca_file: Path | None = None,
    ) -> None:
        self.token = token
        self.topic = topic
        self.budget_key = f"apns:{token.team_id}:{token.key_id}"
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=str(ca_file)) if ca_file else True
        )
        self.client = httpx.Client(
            base_url=url.rstrip("/"), http2=True, verify=verify, timeout=timeout
        )

    @classmethod
    def from_settings(cls, s: Settings) -> ApnsSender:
        missing = [
            f"CLARION_{n.upper()}"
            for n in ("apns_key_id", "apns_team_id", "apns_topic")
            if not getattr(s, n)
        ]
        if missing:
            raise ConfigurationError(f"CLARION_APNS_KEY is set: {', '.join(missing)} must be too")
        try:
            key = Path(str(s.apns_key)).read_text()
        except OSError as exc:
            raise ConfigurationError(f"CLARION_APNS_KEY={s.apns_key}: {exc}") from exc
        token = ProviderToken(
            key,
            key_id=str(s.apns_key_id),
            team_id=str(s.apns_team_id),
            wall=lambda: clock.now().timestamp(),
        )
        return cls(
            token,
            topic=str(s.apns_topic),
            url=s.apns_url,
            timeout=s.push_timeout,
            ca_file=s.apns_ca_file,
        )

    def send(self, message: Message, token: str, collapse: str) -> DeviceOutcome:
        device = f"apns:{token}"
        for _ in range(2):  # a refused provider token is re-signed once: APNs took nothing
            outcome = self._post(device, message, token, collapse)
            if outcome.reason not in TOKEN_REASONS:
                return outcome
            self.token.forget()
        return outcome

    def _post(self, device: str, message: Message, token: str, collapse: str) -> DeviceOutcome:
        try:
            bearer = self.token.current()
        except (ValueError, TypeError, jwt.PyJWTError) as exc:  # a key that cannot sign
            return DeviceOutcome(device, "rejected", "apns_key", str(exc)[:200])
        path, headers, body = to_request(message, token, collapse, topic=self.topic, bearer=bearer)
        try:
            response = self.client.post(path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return transport_outcome(device, exc)
        return from_response(device, response.status_code, response.headers, response.content)
