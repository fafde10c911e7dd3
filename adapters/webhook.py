"""The webhook channel: a signed JSON POST to the URL in the type's config.

Headers: `Idempotency-Key` (the same for every attempt at one user/type/occurrence/channel),
`X-Clarion-Timestamp` and `X-Clarion-Signature: v1=<hex HMAC-SHA256 of "{timestamp}.{body}">`.
Three outcomes. A 2xx or 409 (the receiver already has this key) is a send; 408, 425 and 429
failed (transient: nothing was taken), other 4xx failed for good; a 5xx, a read timeout or a
connection dropped after the request was written is *unknown* (it may have been taken). Receivers
dedup on the key (`dedups_by_key`), so clarion may repeat an unknown send under the same key; a
409 tells it the earlier attempt had arrived (recorded as an incident of kind `repeat`).
"""

from __future__ import annotations

import hmac
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from clarion.adapters import http1
from clarion.adapters.base import Channel, Collaborators
from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.errors import (
    PermanentSendError,
    SendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult, clean_provider_id
from clarion.settings import Settings

FAILED_STATUSES = frozenset({408, 425, 429})  # the receiver says it did not take the request


def sign(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.digest(secret.encode(), f"{timestamp}.".encode() + body, "sha256")  # one-shot
    return f"v1={digest.hex()}"


class Headers(Protocol):
    """What verify reads: a Mapping[str, str], or http.server's (case-insensitive) headers."""

    def get(self, name: str, default: str, /) -> str: ...


def verify(
    secret: str, headers: Headers, body: bytes, *, now: float, tolerance: float = 300
) -> bool:
    """For receivers: is this request signed by us, recently?"""
    timestamp = headers.get("X-Clarion-Timestamp", "")
    try:
        fresh = abs(now - int(timestamp)) <= tolerance
    except ValueError:
        return False
    expected = sign(secret, timestamp, body).encode()
    given = headers.get("X-Clarion-Signature", "").encode("utf-8", "surrogateescape")
    return fresh and hmac.compare_digest(expected, given)


def to_request(message: Message, secret: str, now: float) -> tuple[dict[str, str], bytes]:
    """The pure part: headers and body for one message."""
    body = json.dumps(
        {
            "delivery_id": message.delivery_id,
            "user_id": message.user_id,
            "type": message.type_key,
            "occurrence_key": message.occurrence_key,
            "channel": message.channel,
            "attempt": message.attempt,
            "content": message.content,
        },
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    timestamp = str(int(now))
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": message.idempotency_key,
        "X-Clarion-Timestamp": timestamp,
        "X-Clarion-Signature": sign(secret, timestamp, body),
    }
    return headers, body


def retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


def from_response(status: int, headers: Mapping[str, str], body: bytes) -> SendResult:
    """The pure part: a provider answer as a result, or the error to raise."""
    if 200 <= status < 300 or status == 409:
        try:
            message_id = json.loads(body or b"{}").get("id")
        except (ValueError, AttributeError, RecursionError):
            message_id = None
        return SendResult(
            platform="webhook",
            provider_message_id=clean_provider_id(message_id),
            repeat=status == 409,
        )
    detail = body[:200].decode(errors="replace")
    hint = retry_after(headers.get("Retry-After"))
    if status == 429:
        raise ThrottledError(f"http_{status}", detail, hint)
    if status in FAILED_STATUSES:
        raise TransientSendError(f"http_{status}", detail, hint)
    if status >= 500:
        raise UnknownSendError(f"http_{status}", detail, hint)
    raise PermanentSendError(f"http_{status}", detail)


def error_for(exc: http1.NotSent | http1.NoAnswer) -> TransientSendError | UnknownSendError:
    """A network error as an outcome: failed if the request cannot have left (no connection),
    unknown once it may have been written (a read timeout, a connection dropped mid-answer)."""
    if isinstance(exc, http1.NotSent):
        return TransientSendError("connection", str(exc)[:200])
    return UnknownSendError("no_answer", str(exc)[:200])


def _response(
    answer: http1.Answer | http1.NotSent | http1.NoAnswer | ValueError,
) -> WebhookResponse | SendError:
    if isinstance(answer, http1.Answer):
        return WebhookResponse(answer.status, answer.headers, answer.body)
    error = (
        PermanentSendError("bad_url", str(answer))
        if isinstance(answer, ValueError)
        else error_for(answer)
    )
    error.__cause__ = answer
    return error


def pool_manager() -> http1.Connections:
    """Connections kept alive per receiving host (up to 8 idle each: the requests one batch has in
    flight at most by CLARION_SEND_CONCURRENCY's default); the client never retries (a repeat is
    the ledger's decision) nor follows a redirect."""
    return http1.Connections(keep=8)


@dataclass(frozen=True)
class WebhookRequest:
    url: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class WebhookResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes


class WebhookAdapter(Channel[WebhookRequest, WebhookResponse]):
    """The model channel: pure `to_request` and `from_response` around a `call` that does only
    the I/O. Copy this shape for a new channel (see README, "Adding a channel")."""

    channel = "webhook"
    needs_address = False
    dedups_by_key = True  # the webhook contract: receivers drop a repeated Idempotency-Key
    sends_many = True  # a batch's requests go out together (call_many)

    def __init__(
        self,
        *,
        secret: str,
        timeout: float,
        default_url: str | None = None,
        limits: RateLimits | None = None,
        quota: Quota | None = None,
        http: http1.Connections | None = None,
    ) -> None:
        """`http`: the process's connection pool (tasks.runtime hands one in, so every send to
        a host reuses its kept-alive connections); by default one of its own."""
        self.secret = secret
        self.default_url = default_url
        self.limits = limits
        self.quota = quota  # CLARION_WEBHOOK_RATE: per receiving host
        self.timeout = timeout  # seconds for the whole request: connect, write, answer
        self.pool = http or pool_manager()

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> WebhookAdapter:
        """The configured default receiver (CLARION_WEBHOOK_URL), through the process's pool."""
        return cls(
            secret=s.webhook_secret,
            timeout=s.webhook_timeout,
            default_url=s.webhook_url,
            limits=parts.limits,
            http=parts.http,
        )

    def to_request(self, message: Message) -> WebhookRequest:
        url = message.config.get("url") or self.default_url
        if not url:
            raise PermanentSendError("no_url", f"type {message.type_key} has no webhook url")
        if not str(url).startswith(("http://", "https://")):
            raise PermanentSendError("bad_url", f"webhook url must be http(s): {url!r}")
        headers, body = to_request(message, self.secret, time.time())
        return WebhookRequest(str(url), headers, body)

    def budget(self, message: Message, request: WebhookRequest) -> tuple[Quota, str, int] | None:
        if self.quota is None:
            return None
        try:
            host = http1.target(request.url).origin[1]
        except ValueError:
            host = request.url  # call() refuses it
        return self.quota, host, 1

    def call(self, request: WebhookRequest) -> WebhookResponse:
        [response] = self.call_many([request])
        if isinstance(response, SendError):
            raise response
        return response

    def call_many(self, requests: list[WebhookRequest]) -> list[WebhookResponse | SendError]:
        """The requests in flight together on kept-alive connections, one each (a batch's
        webhooks wait for their answers once, not once a request)."""
        answers = self.pool.post_many([(r.url, r.headers, r.body) for r in requests], self.timeout)
        return [_response(answer) for answer in answers]

    def from_response(self, message: Message, response: WebhookResponse) -> SendResult:
        return from_response(response.status, response.headers, response.body)
