"""The email channel through SendGrid's v3 Mail Send API (the official `sendgrid` SDK), and the
parser of its Event Webhook.

Sending: the same email as over SMTP (adapters.email_mime), as SendGrid's JSON (built with the
SDK's mail helpers), POSTed on the process's kept-alive connections (adapters.http1: the SDK's
own transport, urllib, opens a connection per mail, and a campaign's mail each paid a connect —
a TLS handshake against the real API — on both sides; measured in bench/RESULTS.md): From per lane
(and the lane's IP pool, CLARION_SENDGRID_IP_POOL / _MARKETING), the Message-ID and one-click
List-Unsubscribe headers, categories (the type and its category), an unsubscribe group for
non-transactional mail (CLARION_SENDGRID_ASM_GROUP), and custom_args `clarion_user` /
`clarion_delivery`, which SendGrid echoes in every event. Outcomes:

| answer                                       | outcome                                      |
| -------------------------------------------- | -------------------------------------------- |
| 202                                          | sent; provider_message_id = X-Message-Id     |
| 429                                          | deferred, attempt refunded; the API key's budget paused (Retry-After / X-RateLimit-Reset) |
| no connection                                | failed, retried                              |
| 5xx, a read timeout, a dropped connection    | unknown                                      |
| other 4xx                                    | failed for good                              |

SendGrid has no idempotency key and no look-up of a message by our ids (`dedups_by_key = False`,
no reconcile), but every event it posts echoes the custom args: a `processed` (or any later)
event naming the delivery settles an unknown outcome as sent (db.receipts), whether the row was
held (at-most-once) or is waiting to be resent (at-least-once). The resend waits EVIDENCE_WAIT
for that event first (`evidence_wait`); with none by then it is resent with a
`possible_duplicate` incident (tasks.send.outcomes).

Events: `receipts(events)` maps a verified batch to clarion receipts (see EVENTS).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from clarion import clock
from clarion.adapters import http1
from clarion.adapters.base import Channel, Collaborators
from clarion.adapters.email_mime import Identities, build, is_transactional
from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.adapters.webhook import error_for
from clarion.errors import (
    ConfigurationError,
    PermanentSendError,
    ThrottledError,
    UnknownSendError,
)
from clarion.records import Message, Receipt, SendResult, clean_provider_id
from clarion.settings import Settings

USER_ARG, DELIVERY_ARG = "clarion_user", "clarion_delivery"
DEFAULT_PAUSE = 5.0  # seconds, for a 429 that names no wait
# Seconds an at-least-once resend after an unknown outcome waits for SendGrid's `processed`
# event: the Event Webhook posts a batch every 30 s (or sooner when it fills), and `processed`
# follows acceptance within seconds.
EVIDENCE_WAIT = 60.0
MAX_CATEGORY = 255


@dataclass(frozen=True)
class SendGridResponse:
    status: int
    headers: Mapping[str, str]
    body: bytes


def _category(value: str) -> str | None:
    """SendGrid categories are ASCII, at most 255 characters."""
    text = "".join(ch for ch in value if ch.isascii() and ch.isprintable())[:MAX_CATEGORY]
    return text or None


def to_payload(
    message: Message,
    *,
    identities: Identities,
    public_url: str,
    secret: str,
    ip_pools: tuple[str | None, str | None] = (None, None),
    asm_group: int | None = None,
) -> dict[str, Any]:
    """The pure part: the v3 mail/send body for one message (the SDK's Mail, as JSON)."""
    from sendgrid.helpers.mail import (
        Asm,
        Category,
        CustomArg,
        From,
        GroupId,
        Header,
        HtmlContent,
        IpPoolName,
        Mail,
        PlainTextContent,
        Subject,
        To,
    )

    email = build(message, identities=identities, public_url=public_url, secret=secret)
    mail = Mail(
        from_email=From(email.sender_address, email.sender_name or None),
        to_emails=To(email.to),
        subject=Subject(email.subject),
        plain_text_content=PlainTextContent(email.text),
        html_content=HtmlContent(email.html),
    )
    mail.header = [Header(name, value) for name, value in email.headers]
    mail.custom_arg = [
        CustomArg(USER_ARG, message.user_id),
        CustomArg(DELIVERY_ARG, str(message.delivery_id)),
    ]
    categories = {c for c in (_category(message.type_key), _category(message.category)) if c}
    mail.category = [Category(c) for c in sorted(categories)]
    pool = ip_pools[0] if is_transactional(message) else ip_pools[1] or ip_pools[0]
    if pool:
        mail.ip_pool_name = IpPoolName(pool)
    if asm_group is not None and not email.transactional:
        mail.asm = Asm(GroupId(asm_group))
    return mail.get()


def wait_of(headers: Mapping[str, str], now: float) -> float:
    """Seconds a 429 asks for: Retry-After, else X-RateLimit-Reset (an epoch second)."""
    for name, relative in (("Retry-After", True), ("X-RateLimit-Reset", False)):
        raw = header(headers, name)
        try:
            value = float(raw) if raw else None
        except ValueError:
            value = None
        if value is not None:
            return max(0.0, value if relative else value - now)
    return DEFAULT_PAUSE


def from_response(response: SendGridResponse, *, now: float) -> SendResult:
    """The pure part: an answer as a result, or the error to raise."""
    status, detail = response.status, response.body[:200].decode("utf-8", "replace")
    if status == 202 or 200 <= status < 300:
        message_id = clean_provider_id(header(response.headers, "X-Message-Id"))
        return SendResult(platform="sendgrid", provider_message_id=message_id, repeat=None)
    if status == 429:
        raise ThrottledError("http_429", detail, wait_of(response.headers, now))
    if status >= 500:
        raise UnknownSendError(f"http_{status}", detail)
    raise PermanentSendError(f"http_{status}", detail)


def header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value, its name matched in any case (HTTP's rule)."""
    if (value := headers.get(name)) is not None:
        return value
    wanted = name.lower()
    return next((v for k, v in headers.items() if k.lower() == wanted), None)


class SendGridAdapter(Channel[dict[str, Any], SendGridResponse]):
    """Email through SendGrid (see the module docstring)."""

    channel = "email"
    needs_address = True
    dedups_by_key = False  # no idempotency key on mail/send
    evidence_wait = EVIDENCE_WAIT  # its events name the delivery: wait for one before a resend

    def __init__(
        self,
        http: http1.Connections,
        *,
        url: str,
        timeout: float,
        api_key: str,
        identities: Identities,
        public_url: str,
        secret: str,
        ip_pools: tuple[str | None, str | None] = (None, None),
        asm_group: int | None = None,
        limits: RateLimits | None = None,
        quota: Quota | None = None,
    ) -> None:
        self.http, self.url, self.timeout = http, url, timeout
        self.api_key = api_key
        self.headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": "clarion",
        }
        self.identities = identities
        self.public_url = public_url
        self.secret = secret
        self.ip_pools = ip_pools
        self.asm_group = asm_group
        self.limits = limits
        self.quota = quota

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> SendGridAdapter:
        key = s.sendgrid_api_key or ""
        group = s.sendgrid_asm_group
        if group is not None and not (group.isascii() and group.isdigit()):
            raise ConfigurationError(f"CLARION_SENDGRID_ASM_GROUP={group!r} must be a group id")
        if not all(" " < ch < "\x7f" for ch in key):  # it goes into a header line as it is
            raise ConfigurationError(
                "CLARION_SENDGRID_API_KEY holds a space or a control character"
            )
        url = s.sendgrid_api_url.rstrip("/") + "/v3/mail/send"
        try:
            http1.target(url)
        except ValueError as exc:
            raise ConfigurationError(f"CLARION_SENDGRID_API_URL: {exc}") from exc
        return cls(
            parts.http,
            url=url,
            timeout=s.email_timeout,  # per request, all of it; never retried here
            api_key=key,
            identities=Identities(s.email_from, s.email_from_marketing),
            public_url=s.public_url,
            secret=s.webhook_secret,
            ip_pools=(s.sendgrid_ip_pool, s.sendgrid_ip_pool_marketing),
            asm_group=int(group) if group is not None else None,
            limits=parts.limits,
            quota=Quota("sendgrid", ((s.email_per_second, 1.0),)),
        )

    def to_request(self, message: Message) -> dict[str, Any]:
        return to_payload(
            message,
            identities=self.identities,
            public_url=self.public_url,
            secret=self.secret,
            ip_pools=self.ip_pools,
            asm_group=self.asm_group,
        )

    def budget(self, message: Message, request: dict[str, Any]) -> tuple[Quota, str, int] | None:
        return (self.quota, self.api_key, 1) if self.quota else None

    def call(self, request: dict[str, Any]) -> SendGridResponse:
        """POST /v3/mail/send. No connection (nothing can have been sent): failed, retried; once
        the request may have been written, no complete answer is an unknown outcome."""
        body = json.dumps(request, separators=(",", ":")).encode()
        try:
            answer = self.http.post(self.url, self.headers, body, self.timeout)
        except (http1.NotSent, http1.NoAnswer) as exc:
            raise error_for(exc) from exc
        response = SendGridResponse(answer.status, answer.headers, answer.body)
        if response.status == 429 and self.limits is not None and self.quota is not None:
            wait = wait_of(response.headers, clock.now().timestamp())
            self.limits.pause(self.quota, self.api_key, wait)
        return response

    def from_response(self, message: Message, response: SendGridResponse) -> SendResult:
        return from_response(response, now=clock.now().timestamp())


# --- the Event Webhook ---------------------------------------------------------------------------------

# SendGrid event → clarion receipt event (bounce and dropped are judged by their fields)
EVENTS = {
    "processed": "accepted",
    "delivered": "delivered",
    "open": "opened",
    "click": "clicked",
    "deferred": "soft_bounced",
    "spamreport": "complained",
    "unsubscribe": "unsubscribed",
    "group_unsubscribe": "unsubscribed",
}
BOUNCED_DROPS = frozenset({"Bounced Address", "Invalid"})  # a dropped address that cannot receive


def event_name(event: Mapping[str, Any]) -> str | None:
    """The clarion receipt event for one SendGrid event; None for events clarion ignores
    (group_resubscribe, a future event type)."""
    kind = event.get("event")
    if kind == "bounce":  # type=bounce is a hard bounce; type=blocked a refusal that may pass later
        return "soft_bounced" if event.get("type") == "blocked" else "bounced"
    if kind == "dropped":
        return "bounced" if event.get("reason") in BOUNCED_DROPS else "failed"
    return EVENTS.get(kind) if isinstance(kind, str) else None


def message_id_of(sg_message_id: object) -> str | None:
    """X-Message-Id from an event's sg_message_id (`<X-Message-Id>.filter…` or `.recvd-…`)."""
    if not isinstance(sg_message_id, str) or not sg_message_id:
        return None
    for marker in (".filter", ".recvd"):
        sg_message_id = sg_message_id.partition(marker)[0]
    return clean_provider_id(sg_message_id)


def _ids(event: Mapping[str, Any]) -> tuple[str | None, int | None]:
    user, delivery = event.get(USER_ARG), event.get(DELIVERY_ARG)
    if not (isinstance(user, str) and user and isinstance(delivery, str | int)):
        return None, None
    text = str(delivery)
    if isinstance(delivery, bool) or not (text.isascii() and text.isdigit() and len(text) < 19):
        return None, None
    return user, int(text)


def _detail(event: Mapping[str, Any]) -> str:
    parts = [
        f"{name}={event[name]}"
        for name in ("type", "status", "reason", "response", "url", "bounce_classification")
        if isinstance(event.get(name), str | int) and not isinstance(event.get(name), bool)
    ]
    return "; ".join(parts)[:500]


def receipts(events: Iterable[Mapping[str, Any]], platform: str = "sendgrid") -> list[Receipt]:
    """Receipts for a verified, shape-checked batch (web/email.py checks the shape). Events
    clarion ignores are left out. clarion's custom args name the delivery; without them the
    X-Message-Id does. `platform`: the account whose key signed the batch."""
    found = []
    for event in events:
        name = event_name(event)
        if name is None:
            continue
        user, delivery = _ids(event)
        email = event.get("email")
        event_id = event.get("sg_event_id")
        found.append(
            Receipt(
                channel="email",
                event=name,
                provider_message_id=message_id_of(event.get("sg_message_id")),
                occurred_at=datetime.fromtimestamp(int(event["timestamp"]), UTC),
                address=email if isinstance(email, str) and email else None,
                detail=f"sendgrid {event.get('event')}: {_detail(event)}"[:500],
                user_id=user,
                delivery_id=delivery,
                event_id=clean_provider_id(event_id) if isinstance(event_id, str) else None,
                platform=platform,  # SendGrid's own report: it took the message
            )
        )
    return found
