"""Outbound events to an app's endpoint, signed per the Standard Webhooks specification.

Headers: `webhook-id` (the event's stable id: the same on every attempt and replay, so a receiver
drops a repeat by it), `webhook-timestamp` (integer seconds of this attempt) and
`webhook-signature`: `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, space-separated, one
per valid secret (both during a rotation's overlap). A secret reads `whsec_<base64 of the key>`;
the HMAC key is the decoded bytes. The body is `{"type", "timestamp", "data"}` JSON.

Any 2xx is "taken"; everything else (another status, a timeout, a dropped connection) is not, and
the dispatcher tries again later: an event is delivered at least once, and a receiver dedups by id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from clarion.adapters import http1
from clarion.errors import InvalidRequest

PREFIX = "whsec_"
KEY_BYTES = 32


def new_secret() -> str:
    """A fresh `whsec_` secret (32 random bytes, base64)."""
    return PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def key_of(secret: str) -> bytes:
    """The HMAC key of a `whsec_` secret; InvalidRequest when it is not one."""
    raw = secret.removeprefix(PREFIX)
    try:
        key = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidRequest(f"secret must be whsec_ followed by base64: {exc}") from exc
    if not secret.startswith(PREFIX) or not 24 <= len(key) <= 64:
        raise InvalidRequest("secret must be whsec_ followed by the base64 of 24 to 64 bytes")
    return key


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One `v1,<base64>` signature."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key_of(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def verify(
    secrets_: Iterable[str],
    headers: Mapping[str, str],
    body: bytes,
    *,
    now: float,
    tolerance: float = 300,
) -> bool:
    """For receivers (the stand-in, tests): does any signature match any of these secrets, with a
    timestamp within `tolerance` seconds of `now`?"""
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id, stamp = lowered.get("webhook-id", ""), lowered.get("webhook-timestamp", "")
    try:
        timestamp = int(stamp)
    except ValueError:
        return False
    if not msg_id or abs(now - timestamp) > tolerance:
        return False
    given = lowered.get("webhook-signature", "").split()
    expected = {signature(s, msg_id, timestamp, body) for s in secrets_}
    return any(hmac.compare_digest(e.encode(), g.encode()) for e in expected for g in given)


@dataclass(frozen=True)
class Outgoing:
    url: str
    headers: dict[str, str]
    body: bytes


def body_of(kind: str, at: str, data: Mapping[str, Any]) -> bytes:
    """The pure body: the same bytes on every attempt at one event."""
    payload = {"type": kind, "timestamp": at, "data": dict(data)}
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str).encode()


def to_request(
    url: str, msg_id: str, body: bytes, signing: Iterable[str], timestamp: int
) -> Outgoing:
    """Headers for one attempt, signed with every secret in `signing`."""
    signatures = " ".join(signature(s, msg_id, timestamp, body) for s in signing)
    headers = {
        "Content-Type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signatures,
        "User-Agent": "clarion-events/1",
    }
    return Outgoing(url, headers, body)


def call(pool: http1.Connections, request: Outgoing, timeout: float) -> str | None:
    """POST it; None when the endpoint took it (2xx), else why not (kept as the send's last
    error: `http_500`, `timeout: …`, `connection: …`)."""
    try:
        answer = pool.post(request.url, request.headers, request.body, timeout)
    except ValueError as exc:
        return f"bad_url: {exc}"[:200]
    except http1.NotSent as exc:
        return f"connection: {exc}"[:200]
    except http1.NoAnswer as exc:
        return f"no_answer: {exc}"[:200]
    if 200 <= answer.status < 300:
        return None
    return f"http_{answer.status}: {answer.body[:120].decode(errors='replace')}"
