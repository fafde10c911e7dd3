"""A local SendGrid: the v3 Mail Send wire format the real `sendgrid` SDK speaks, and SendGrid's
side of the Event Webhook (signed event batches), for tests and the demo (no internet).

    with FakeSendGrid() as sendgrid:   # CLARION_SENDGRID_API_URL=sendgrid.url
        ...                            # CLARION_SENDGRID_API_KEY=FakeSendGrid.API_KEY
        sendgrid.sent                  # what it took: payload and the X-Message-Id it answered

`POST /v3/mail/send` checks the Bearer key (401), the payload's shape as SendGrid does (400 with
SendGrid's `errors` list), then answers 202 with an `X-Message-Id` header and an empty body.
Failures on demand: `fail(429, retry_after=…)` or `fail(429, reset=<epoch>)` (SendGrid's rate-limit
headers), `fail(500)`, `fail(400)`…; lost answers on demand: `losses.next("drop" | "late" | "5xx")`
takes the message, then loses its answer (standins.local_server.AnswerLoss).

Events: `EventKey.generate()` is an ECDSA P-256 key pair (`public_key` is what SendGrid's console
shows: base64 DER); `event(sent, "delivered", at=…)` is one event as SendGrid posts it, with the
message's custom args echoed at the top level; `post_events(url, key, events)` signs a batch
exactly as SendGrid does (ECDSA-SHA256 over the timestamp followed by the raw body, base64 DER, in
X-Twilio-Email-Event-Webhook-Signature / -Timestamp) and posts it.
"""

from __future__ import annotations

import base64
import itertools
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clarion.standins.local_server import AnswerLoss, LocalServer, send_json

SIGNATURE = "X-Twilio-Email-Event-Webhook-Signature"
TIMESTAMP = "X-Twilio-Email-Event-Webhook-Timestamp"
RESERVED_HEADERS = frozenset(
    {
        "x-sg-id",
        "x-sg-eid",
        "received",
        "dkim-signature",
        "content-type",
        "content-transfer-encoding",
        "to",
        "from",
        "subject",
        "reply-to",
        "cc",
        "bcc",
    }
)


@dataclass(frozen=True)
class Sent:
    """One accepted mail/send: the payload as posted and the X-Message-Id answered."""

    message_id: str
    payload: dict[str, Any]
    answered: bool = True
    # when its request had been read (budgets, latencies): before the stand-in's own parsing and
    # checks, which are the receiving server's time, not the sender's
    arrived: float = field(default_factory=time.monotonic)

    @property
    def to(self) -> str:
        return str(self.payload["personalizations"][0]["to"][0]["email"])

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.payload.get("headers") or {})

    @property
    def custom_args(self) -> dict[str, str]:
        return dict(self.payload.get("custom_args") or {})

    def content(self, kind: str) -> str | None:
        return next((c["value"] for c in self.payload["content"] if c["type"] == kind), None)


@dataclass
class Failure:
    status: int
    retry_after: float | None = None
    reset: float | None = None
    times: int = 1


@dataclass
class Call:
    status: int
    authorized: bool
    errors: list[dict[str, Any]] = field(default_factory=list)


def _error(message: str, field_name: str | None = None) -> dict[str, Any]:
    return {"message": message, "field": field_name, "help": None}


def payload_errors(payload: Any) -> list[dict[str, Any]]:
    """What SendGrid's v3 mail/send would refuse in this body (a subset of its checks)."""
    if not isinstance(payload, dict):
        return [_error("Bad Request", None)]
    errors = []
    people = payload.get("personalizations")
    if not (isinstance(people, list) and people):
        errors.append(_error("The personalizations field is required.", "personalizations"))
        people = []
    for i, person in enumerate(people):
        to = person.get("to") if isinstance(person, dict) else None
        if not (isinstance(to, list) and to):
            errors.append(_error("The to array is required.", f"personalizations.{i}.to"))
            continue
        for j, who in enumerate(to):
            if not (isinstance(who, dict) and "@" in str(who.get("email", ""))):
                errors.append(_error("Invalid email.", f"personalizations.{i}.to.{j}.email"))
    sender = payload.get("from")
    if not (isinstance(sender, dict) and "@" in str(sender.get("email", ""))):
        errors.append(_error("The from email is required.", "from.email"))
    subjects = [payload.get("subject")] + [p.get("subject") for p in people if isinstance(p, dict)]
    if not any(isinstance(s, str) and s for s in subjects):
        errors.append(_error("The subject is required.", "subject"))
    content = payload.get("content")
    if not (isinstance(content, list) and content):
        errors.append(_error("The content value must be at least one character.", "content"))
    else:
        kinds = [c.get("type") if isinstance(c, dict) else None for c in content]
        if not all(isinstance(c, dict) and c.get("value") for c in content):
            errors.append(_error("The content value must be a string.", "content"))
        if "text/plain" in kinds and kinds[0] != "text/plain":
            errors.append(_error("text/plain must be the first content type.", "content"))
    for name, value in (payload.get("custom_args") or {}).items():
        if not isinstance(value, str):
            errors.append(_error("Custom args must be strings.", f"custom_args.{name}"))
    categories = payload.get("categories") or []
    if not (isinstance(categories, list) and len(categories) <= 10):
        errors.append(_error("Too many categories.", "categories"))
    for name in payload.get("headers") or {}:
        if name.lower() in RESERVED_HEADERS:
            errors.append(_error(f"The header {name} is reserved.", f"headers.{name}"))
    return errors


class FakeSendGrid(LocalServer):
    """See the module docstring."""

    API_KEY = "SG.clarion-test.key"

    def __init__(self, api_key: str = API_KEY, now: Callable[[], float] = time.time) -> None:
        self.api_key = api_key
        self.now = now
        self.sent: list[Sent] = []
        self.calls: list[Call] = []
        self.failures: list[Failure] = []
        self.losses = AnswerLoss()
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        super().__init__(self._handler())

    @property
    def url(self) -> str:
        return self.base_url

    def fail(
        self,
        status: int,
        *,
        retry_after: float | None = None,
        reset: float | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` authorized sends with `status` (nothing is taken)."""
        with self.lock:
            self.failures.append(Failure(status, retry_after, reset, times))

    def answer(self, auth: str, body: bytes, arrived: float) -> tuple[int, dict[str, str], Any]:
        """(status, headers, JSON body or None) for one POST /v3/mail/send, whose request was read
        at `arrived` (monotonic); records it."""
        with self.lock:
            if auth != f"Bearer {self.api_key}":
                self.calls.append(Call(401, False))
                return 401, {}, {"errors": [_error("The provided authorization grant is invalid")]}
            if self.failures:
                return self._failure()
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            errors = payload_errors(payload)
            if errors:
                self.calls.append(Call(400, True, errors))
                return 400, {}, {"errors": errors}
            message_id = f"fake{next(self._ids):06d}{secrets.token_hex(6)}"
            self.sent.append(Sent(message_id, payload, arrived=arrived))
            self.calls.append(Call(202, True))
            return 202, {"X-Message-Id": message_id}, None

    def _failure(self) -> tuple[int, dict[str, str], Any]:
        failure = self.failures[0]
        failure.times -= 1
        if failure.times <= 0:
            self.failures.pop(0)
        headers = {}
        if failure.status == 429:
            headers = {"X-RateLimit-Limit": "600", "X-RateLimit-Remaining": "0"}
            headers["X-RateLimit-Reset"] = str(int(failure.reset or self.now() + 1))
        if failure.retry_after is not None:
            headers["Retry-After"] = str(int(failure.retry_after))
        self.calls.append(Call(failure.status, True))
        return failure.status, headers, {"errors": [_error(f"fake failure {failure.status}")]}

    def _lost(self, message_id: str | None) -> None:
        with self.lock:
            for i, sent in enumerate(self.sent):
                if sent.message_id == message_id:
                    self.sent[i] = Sent(sent.message_id, sent.payload, False, sent.arrived)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                arrived = time.monotonic()
                if self.path.partition("?")[0] != "/v3/mail/send":
                    send_json(self, 404, {"errors": [_error("Not found")]})
                    return
                status, headers, answer = fake.answer(
                    self.headers.get("Authorization", ""), body, arrived
                )
                lost = lambda: fake._lost(headers.get("X-Message-Id"))  # noqa: E731
                if status == 202 and fake.losses.apply(self, lost):
                    return
                if answer is not None:
                    send_json(self, status, answer, headers)
                    return
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        return Handler


# --- SendGrid's side of the Event Webhook -----------------------------------------------------------


@dataclass(frozen=True)
class EventKey:
    """The Event Webhook's signing key pair (SendGrid keeps the private half)."""

    private: ec.EllipticCurvePrivateKey

    @classmethod
    def generate(cls) -> EventKey:
        return cls(ec.generate_private_key(ec.SECP256R1()))

    @property
    def public_key(self) -> str:
        """The verification key as SendGrid's console shows it (CLARION_SENDGRID_WEBHOOK_PUBLIC_KEY)."""
        der = self.private.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return base64.b64encode(der).decode()

    def sign(self, timestamp: str, body: bytes) -> str:
        signature = self.private.sign(timestamp.encode() + body, ec.ECDSA(hashes.SHA256()))
        return base64.b64encode(signature).decode()

    def headers(self, body: bytes, timestamp: str | None = None) -> dict[str, str]:
        stamp = timestamp or str(int(time.time()))
        return {
            "Content-Type": "application/json",
            SIGNATURE: self.sign(stamp, body),
            TIMESTAMP: stamp,
        }


EVENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "bounce": {
        "type": "bounce",
        "status": "5.1.1",
        "reason": "550 5.1.1 The email account that you tried to reach does not exist.",
        "bounce_classification": "Invalid Address",
    },
    "dropped": {"reason": "Bounced Address", "status": "5.0.0"},
    "deferred": {"response": "451 4.7.1 try again later", "attempt": "1"},
    "click": {"url": "https://example.com/x", "useragent": "Mozilla/5.0", "ip": "192.0.2.1"},
    "open": {"useragent": "Mozilla/5.0", "ip": "192.0.2.1", "sg_machine_open": False},
    "delivered": {"response": "250 2.0.0 OK", "ip": "192.0.2.9"},
}
_event_ids = itertools.count(1)


def event(sent: Sent, kind: str, *, at: int | None = None, **fields: Any) -> dict[str, Any]:
    """One event about `sent`, shaped as SendGrid posts it (custom args at the top level)."""
    return {
        "email": sent.to,
        "timestamp": int(time.time()) if at is None else at,
        "event": kind,
        "sg_event_id": f"ev{next(_event_ids):08d}{secrets.token_hex(4)}",
        "sg_message_id": f"{sent.message_id}.filterdrecv-5f8d7c-1-64B4F0B6-2.0",
        "smtp-id": sent.headers.get("Message-ID", f"<{sent.message_id}@sendgrid>"),
        "category": list(sent.payload.get("categories") or []),
        **sent.custom_args,
        **EVENT_DEFAULTS.get(kind, {}),
        **fields,
    }


def post_events(
    url: str,
    key: EventKey,
    events: Sequence[dict[str, Any]] | bytes,
    *,
    timestamp: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes]:
    """Sign and POST a batch as SendGrid does; (status, body) of the answer."""
    body = events if isinstance(events, bytes) else json.dumps(list(events)).encode()
    sent_headers = {**key.headers(body, timestamp), **(headers or {})}
    request = urllib.request.Request(url, data=body, headers=sent_headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
