"""The SMS channel: Twilio's Messages API through the official `twilio` SDK.

Pure parts: `segments` (GSM-7 or UCS-2, and how many segments a body costs), `body_of`,
`status_callback`, `outcome` (an answer as a SendResult or the SendError to raise),
`error_for` (a network failure). I/O: `SmsAdapter.call`, `Messages.create` over a
`RoutedHttpClient` (the SDK's own requests-based client, sent to CLARION_TWILIO_API_URL instead of
api.twilio.com when that is set: the SDK still builds every request itself).

Rate: a sending number (or Messaging Service) may send `CLARION_SMS_SEGMENTS_PER_SECOND` segments
a second (a US long code: 1); clarion spends 90% of it from the shared Redis budget, a message
costing its segment count. A message longer than one second's budget spends the whole second and
pauses the number for the rest (Twilio queues its segments at the number's rate). A worker that
finds the budget full closes it for every worker until its window has passed plus SETTLE, so
that one second's sends cannot arrive inside the previous one's, and sends its delivery away for
a random share of the time the deliveries turned away this second need at the number's rate (a
backlog comes back spread out, not all of it every second). A 429 pauses the number for every
worker (Retry-After, else DEFAULT_PAUSE).

Three outcomes. 201 is sent (the provider id is the Message SID). 429 is throttled (the attempt
refunded); any other 4xx failed for good, 21211 (not a valid number) and 21610 (the recipient
replied STOP) also suppress the number. A 5xx, a read timeout or a connection dropped after the
request was written is *unknown*. Twilio has no idempotency key (`dedups_by_key = False`), so an
unknown send is settled by evidence: any status callback for the delivery (its id rides in the
callback URL) settles it as sent (db.receipts), and before any further attempt sends, `reconcile`
looks for the message in Twilio's Messages list (see `lookup_outcome` for what is conclusive).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

import redis as redis_lib
import requests
from twilio.base.exceptions import TwilioRestException
from twilio.http.http_client import TwilioHttpClient
from twilio.http.response import Response
from twilio.rest import Client

from clarion import clock
from clarion.adapters.base import Channel, Collaborators, Suppressions
from clarion.adapters.escape import plain_text
from clarion.adapters.ratelimit import Quota, RateLimits, scope
from clarion.errors import (
    ConfigurationError,
    PermanentSendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, Receipt, SendResult, clean_provider_id
from clarion.settings import Settings

log = logging.getLogger(__name__)
# The SDK logs every request at INFO (URL and headers); kept to warnings unless asked for.
sdk_log = logging.getLogger(f"{__name__}.sdk")
sdk_log.setLevel(logging.WARNING)

# --- pure: segments ---------------------------------------------------------------------------------

# The GSM 03.38 default alphabet (one septet each; ESC, 0x1B, is not a character of its own) and
# its extension table (ESC + one septet: two each).
GSM_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
GSM_EXTENSION = frozenset("\f^{}\\[~]|€")
GSM7, UCS2 = "GSM-7", "UCS-2"
# (one segment, per segment of a concatenated message): the user data header takes the rest
LIMITS = {GSM7: (160, 153), UCS2: (70, 67)}
MAX_BODY = 1600  # characters Twilio accepts in one message
ELLIPSIS = "..."  # ASCII: a "…" would turn a GSM-7 body into UCS-2


def encoding(text: str) -> str:
    """GSM-7 if every character is in the default alphabet or its extension table, else UCS-2."""
    return GSM7 if all(c in GSM_BASIC or c in GSM_EXTENSION for c in text) else UCS2


def units(text: str, enc: str) -> list[int]:
    """What each character costs: septets in GSM-7 (2 for the extension table), UTF-16 code
    units in UCS-2 (2 for a character outside the BMP, such as most emoji)."""
    if enc == GSM7:
        return [2 if c in GSM_EXTENSION else 1 for c in text]
    return [2 if ord(c) > 0xFFFF else 1 for c in text]


def segments(text: str) -> tuple[str, int]:
    """(encoding, segment count) of an SMS body. Up to 160 septets (70 code units) is one segment;
    longer, each segment holds 153 (67), and a two-unit character (an escape sequence, a
    surrogate pair) is never split across two segments. An empty body still costs one."""
    enc = encoding(text)
    costs = units(text, enc)
    single, per_part = LIMITS[enc]
    if sum(costs) <= single:
        return enc, 1
    count, used = 1, 0
    for cost in costs:
        if used + cost > per_part:
            count, used = count + 1, 0
        used += cost
    return enc, count


# --- pure: the request --------------------------------------------------------------------------------


def body_of(message: Message) -> str:
    """The SMS text: the content's `text`, else title and body on two lines, as plain text
    (adapters.escape.plain_text: no control characters or bidi overrides); at most MAX_BODY."""
    text = message.content.get("text") or "\n".join(
        p.strip()
        for p in (message.content.get("title"), message.content.get("body"))
        if p and p.strip()
    )
    text = plain_text(text).strip()
    if len(text) > MAX_BODY:
        text = text[: MAX_BODY - len(ELLIPSIS)] + ELLIPSIS
    return text


def status_callback(public_url: str, message: Message) -> str:
    """Where Twilio reports this message's status: clarion's user and delivery id ride in the
    query string, which Twilio's signature covers."""
    query = urlencode({"u": message.user_id, "d": message.delivery_id})
    return f"{public_url.rstrip('/')}/webhooks/twilio/status?{query}"


@dataclass(frozen=True)
class SmsRequest:
    to: str
    sender: str  # E.164 number, or a Messaging Service SID (MG…)
    body: str
    status_callback: str
    segments: int

    def create_args(self) -> dict[str, Any]:
        """Keyword arguments for `client.messages.create`. The validity period bounds how long
        Twilio keeps the message queued: past it, Twilio has sent it or failed it, which is what
        makes a later look-up that does not find it conclusive (`lookup_outcome`)."""
        origin = (
            {"messaging_service_sid": self.sender}
            if self.sender.startswith("MG")
            else {"from_": self.sender}
        )
        return {
            "to": self.to,
            "body": self.body,
            "status_callback": self.status_callback,
            "validity_period": VALIDITY_PERIOD,
            **origin,
        }

    def list_args(self, since: datetime) -> dict[str, Any]:
        """Keyword arguments for `client.messages.list`: messages to this number, from this
        sender (a Messaging Service picks the number itself: not filtered), sent on or after the
        day of `since` (Twilio's DateSent>= filter works by day)."""
        origin = {} if self.sender.startswith("MG") else {"from_": self.sender}
        return {"to": self.to, "date_sent_after": since, "limit": LOOKUP_LIMIT, **origin}


# --- pure: looking for an earlier attempt's message ---------------------------------------------

VALIDITY_PERIOD = 900  # seconds Twilio may keep a message queued before it fails it
SKEW = 60.0  # seconds between clarion's clock (PostgreSQL's) and Twilio's, either way
ATTEMPT_WINDOW = 300.0  # seconds after an attempt began within which Twilio received its request
LOOKUP_LIMIT = 200  # messages read per look-up; a full page is never taken as "not there"


@dataclass(frozen=True)
class Listed:
    """One message of Twilio's Messages list, as the look-up reads it."""

    sid: str
    body: str
    direction: str
    date_created: datetime | None


def lookup_outcome(
    listed: Sequence[Listed], request: SmsRequest, since: datetime, now: datetime
) -> SendResult | None:
    """What a look-up of messages to the number says about an attempt that began at `since`.

    - Found: an outbound message with this body, created by Twilio from SKEW before the attempt
      to ATTEMPT_WINDOW after it (when its request could have arrived): the attempt sent it;
      SendResult with its SID. (Another delivery with the very same text to the same number in
      that window would be taken for this one: an omission, never a repeat.)
    - Not found, conclusive (None: send it now): only once every message Twilio could have taken
      from the attempt has left its queue (VALIDITY_PERIOD past the window, plus SKEW) — a queued
      message has no DateSent and the filter cannot see it — and the list was read whole (fewer
      than LOOKUP_LIMIT). A message Twilio failed from its queue never reached the handset.
    - Not found otherwise: inconclusive. "Not found" is *not* "not sent": UnknownSendError, and
      the outcome policy holds (at-most-once) or resends with an incident (at-least-once)."""
    earliest = since - timedelta(seconds=SKEW)
    latest = since + timedelta(seconds=ATTEMPT_WINDOW + SKEW)
    for m in listed:
        ours = m.body == request.body and m.direction.startswith("outbound")
        created = m.date_created.astimezone(UTC) if m.date_created is not None else None
        if ours and created is not None and earliest <= created <= latest:
            return SendResult(platform="sms", provider_message_id=clean_provider_id(m.sid))
    settled_by = latest + timedelta(seconds=VALIDITY_PERIOD)
    if now >= settled_by and len(listed) < LOOKUP_LIMIT:
        return None
    raise UnknownSendError(
        "lookup_inconclusive",
        f"not among {len(listed)} messages to the number; conclusive from {settled_by:%H:%M:%S}Z",
    )


# --- pure: the answer ------------------------------------------------------------------------------

# Seconds a full budget stays closed past its window. Sends reach Twilio at different delays after
# their budget was taken (a loaded worker can hold a request for a few hundred ms); without this,
# a second's sends could land within the previous second's at Twilio, and bursts of a whole budget
# make that likely. Measured: 0.2 s let 12 segments into one second of a 10/s number at the fake
# under `make soak` on this 2-core machine; 0.5 s costs throughput (9 per 1.5 s), not delivery.
SETTLE = 0.5
BACKLOG_PREFIX = "clarion:sms:waiting"  # Redis: deliveries turned away per number and second
MAX_SPREAD = 300.0  # seconds: the longest a waiting delivery is sent away for at once
DEFAULT_PAUSE = 2.0  # seconds a number is paused after a 429 without Retry-After
SUPPRESS_CODES = {21211: "invalid_number", 21610: "stopped"}


@dataclass(frozen=True)
class TwilioAnswer:
    status: int
    sid: str | None = None
    code: int | None = None
    message: str = ""
    retry_after: float | None = None


def outcome(answer: TwilioAnswer) -> SendResult:
    """A Twilio answer as a send result, or the SendError to raise."""
    if 200 <= answer.status < 300:
        return SendResult(platform="sms", provider_message_id=clean_provider_id(answer.sid))
    # the SDK puts the HTTP status in `code` when the body has none
    coded = answer.code and answer.code != answer.status
    reason = f"twilio_{answer.code}" if coded else f"http_{answer.status}"
    detail = f"twilio answered {answer.status}: {answer.message}"[:300]
    if answer.status == 429:
        raise ThrottledError(reason, detail, answer.retry_after or DEFAULT_PAUSE)
    if answer.status >= 500:
        raise UnknownSendError(reason, detail)
    raise PermanentSendError(reason, detail)


def retry_after(headers: Any) -> float | None:
    try:
        value = headers.get("Retry-After") if headers is not None else None
        return max(0.0, float(value)) if value else None
    except (TypeError, ValueError):
        return None


def error_for(exc: requests.RequestException) -> TransientSendError | UnknownSendError:
    """A network failure as an outcome: failed when the request cannot have been written (no
    connection was made), unknown once it may have (a read timeout, a connection dropped before
    the answer)."""
    if isinstance(exc, requests.ConnectTimeout):
        return TransientSendError("connection", str(exc)[:200])
    reason = getattr(exc.args[0], "reason", None) if exc.args else None
    if isinstance(exc, requests.ConnectionError) and _never_connected(reason):
        return TransientSendError("connection", str(exc)[:200])
    return UnknownSendError("no_answer", str(exc)[:200])


def _never_connected(reason: object) -> bool:
    import urllib3.exceptions as u3

    return isinstance(
        reason, u3.NewConnectionError | u3.ConnectTimeoutError | u3.NameResolutionError
    )


# --- pure: what Twilio posts back (web/sms.py verifies it first) ------------------------------------

# MessageStatus → receipt event. Others (scheduled, canceled, receiving, received…) are ignored.
STATUS_EVENTS = {
    "queued": "accepted",
    "accepted": "accepted",
    "sending": "accepted",
    "sent": "accepted",
    "delivered": "delivered",
    "undelivered": "failed",
    "failed": "failed",
    "read": "read",
}
# An inbound body, trimmed and upper-cased → the keyword it is (Twilio's opt-out keywords).
KEYWORDS = {
    **dict.fromkeys(("STOP", "STOPALL", "UNSUBSCRIBE", "CANCEL", "END", "QUIT"), "stop"),
    **dict.fromkeys(("START", "YES", "UNSTOP"), "start"),
    **dict.fromkeys(("HELP", "INFO"), "help"),
}
HELP_REPLY = "Reply STOP to stop these messages, START to get them again."


def status_receipt(
    status: str,
    sid: str,
    *,
    now: datetime,
    to: str | None = None,
    error_code: str | None = None,
    user_id: str | None = None,
    delivery_id: int | None = None,
    platform: str = "sms",
) -> Receipt | None:
    """A status callback as a receipt (None for a status clarion does not track). `user_id` and
    `delivery_id` come from the callback URL's query, which Twilio's signature covers;
    `platform` names the account whose token signed it (web.sms)."""
    event = STATUS_EVENTS.get(status)
    if event is None:
        return None
    detail = f"{status} ErrorCode {error_code}" if error_code else status
    return Receipt(
        channel="sms",
        event=event,
        provider_message_id=sid,
        occurred_at=now,
        address=to,
        detail=detail,
        user_id=user_id if delivery_id is not None else None,
        delivery_id=delivery_id if user_id is not None else None,
        platform=platform,  # Twilio's own report: it took the message (settles an unknown outcome)
    )


def keyword_of(body: str) -> str | None:
    """stop / start / help for an inbound body that is exactly one of the keywords, else None."""
    return KEYWORDS.get(body.strip().upper())


# --- I/O -------------------------------------------------------------------------------------------


class RoutedHttpClient(TwilioHttpClient):
    """The SDK's HTTP client, sending what it builds for *.twilio.com to `base_url` instead (a
    local stand-in), and keeping each thread's last answer (its headers: Retry-After). No
    retries: a retried create could send twice."""

    def __init__(self, base_url: str | None, timeout: float) -> None:
        super().__init__(timeout=timeout, max_retries=0, logger=sdk_log)
        self.base = urlsplit(base_url.rstrip("/")) if base_url else None
        if self.session is not None:  # the SDK mounts only https://; a stand-in may be http
            self.session.mount(
                "http://", requests.adapters.HTTPAdapter(max_retries=0, pool_maxsize=16)
            )
        self._last = threading.local()

    def route(self, url: str) -> str:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if self.base is None or not (host == "twilio.com" or host.endswith(".twilio.com")):
            return url
        return urlunsplit(
            parts._replace(
                scheme=self.base.scheme, netloc=self.base.netloc, path=self.base.path + parts.path
            )
        )

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Response:
        self._last.response = None
        response = super().request(method, self.route(url), *args, **kwargs)
        self._last.response = response
        return response

    def last_response(self) -> Response | None:
        return getattr(self._last, "response", None)


def budget_quota(segments_per_second: float) -> Quota:
    """A sending number's budget: `segments_per_second` as a whole number of segments per whole
    second (slower rates as one segment per several seconds), of which clarion spends 90%."""
    seconds = 1.0 if segments_per_second >= 1 else float(math.ceil(1 / segments_per_second))
    return Quota("twilio", ((max(1, round(segments_per_second * seconds)), seconds),), share=0.9)


class SmsAdapter(Channel[SmsRequest, TwilioAnswer]):
    """Twilio SMS (see the module docstring).

    `reconcile`: Twilio's Messages list, filtered by To, From and DateSent (a day), read for the
    earlier attempt's message; `lookup_outcome` says when found and not-found are conclusive.
    An unknown outcome waits EVIDENCE_WAIT before its next attempt, for a status callback to
    settle it first."""

    channel = "sms"
    needs_address = True  # the recipient's E.164 number
    dedups_by_key = False  # Twilio takes no idempotency key
    evidence_wait = 15.0  # seconds: Twilio posts `sent` within seconds of taking a message

    def __init__(
        self,
        client: Client,
        *,
        sender: str,
        public_url: str,
        quota: Quota,
        limits: RateLimits | None = None,
        suppressions: Suppressions | None = None,
    ) -> None:
        self.client = client
        # Resolved now, not on the first send: the SDK imports its API modules on first use, and
        # a loaded worker spent up to a second in them between taking the budget and reaching
        # Twilio, so one second's sends arrived inside the next one's.
        self.messages = client.messages
        self.sender = sender
        self.public_url = public_url
        self.quota = quota
        self.limits = limits
        self.suppressions = suppressions

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> SmsAdapter:
        if not (s.twilio_auth_token and s.twilio_from):
            raise ConfigurationError(
                "CLARION_TWILIO_ACCOUNT_SID is set: CLARION_TWILIO_AUTH_TOKEN and "
                "CLARION_TWILIO_FROM are needed too"
            )
        http = RoutedHttpClient(s.twilio_api_url, s.twilio_timeout)
        client = Client(s.twilio_account_sid, s.twilio_auth_token, http_client=http)
        return cls(
            client,
            sender=s.twilio_from,
            public_url=s.public_url,
            quota=budget_quota(s.sms_segments_per_second),
            limits=parts.limits,
            suppressions=parts.suppressions,
        )

    def to_request(self, message: Message) -> SmsRequest:
        if not message.address:
            raise PermanentSendError("no_address", f"{message.user_id} has no sms number")
        body = body_of(message)
        if not body:
            raise PermanentSendError("empty_body", f"{message.type_key} renders no SMS text")
        return SmsRequest(
            message.address,
            self.sender,
            body,
            status_callback(self.public_url, message),
            segments(body)[1],
        )

    def budget(self, message: Message, request: SmsRequest) -> tuple[Quota, str, int] | None:
        return self.quota, self.sender, request.segments

    def spend(self, message: Message, request: SmsRequest) -> None:
        """Spend the message's segments from the number's budget: a message longer than the
        window holds spends the window and pauses the number for the rest (Twilio queues it and
        drains it at the number's rate); a full budget closes the number a little past its
        window (SETTLE) for every worker, and the delivery comes back spread over the backlog."""
        if self.limits is None:
            return
        quota, key, cost = self.quota, self.sender, request.segments
        window, seconds = min(quota.amounts(message.lane))
        charge = min(cost, window)
        try:
            self.limits.take(quota, key, cost=charge, lane=message.lane)
        except ThrottledError as full:
            if full.reason != "budget_full":
                raise
            # Close the number until the window has passed and SETTLE more, for every worker:
            # the next second's sends then cannot reach Twilio inside this one's.
            wait = (full.retry_after or 0.0) + SETTLE
            self.limits.pause(quota, key, wait)
            later = wait + random.uniform(0.0, self._backlog(window / seconds))
            raise ThrottledError(full.reason, full.detail, later) from full
        if cost > charge:  # the number's queue at Twilio drains the rest at its rate
            self.limits.pause(quota, key, seconds * cost / window)

    def _backlog(self, per_second: float) -> float:
        """Seconds over which deliveries waiting for this number should come back: those turned
        away in the current second, at the number's rate. Without the spread, a backlog of
        thousands would be claimed and deferred again every second."""
        if self.limits is None:
            return 0.0
        name = f"{BACKLOG_PREFIX}:{scope(self.sender)}:{int(time.time())}"
        try:
            client = self.limits.redis()
            waiting = int(client.incr(name))
            client.expire(name, 5)
        except redis_lib.RedisError:
            return 0.0
        return min(MAX_SPREAD, waiting / max(per_second, 0.1))

    def call(self, request: SmsRequest) -> TwilioAnswer:
        try:
            created = self.messages.create(**request.create_args())
        except TwilioRestException as exc:
            last = self._last_response()
            return TwilioAnswer(
                int(exc.status),
                code=exc.code if isinstance(exc.code, int) else None,
                message=str(exc.msg)[:200],
                retry_after=retry_after(last.headers if last is not None else None),
            )
        except requests.RequestException as exc:
            raise error_for(exc) from exc
        except ValueError as exc:  # an answer that is not Twilio's JSON
            last = self._last_response()
            if last is not None and 200 <= last.status_code < 300:
                return TwilioAnswer(last.status_code)  # taken, though its SID is unreadable
            raise UnknownSendError("bad_answer", str(exc)[:200]) from exc
        return TwilioAnswer(201, sid=created.sid)

    def reconcile(self, message: Message, since: datetime) -> SendResult | None:
        """The earlier attempt's message if Twilio lists it (see `lookup_outcome`).
        TransientSendError: Twilio cannot be asked now (nothing is sent meanwhile)."""
        request = self.to_request(message)
        try:
            found = self.messages.list(**request.list_args(since))
        except TwilioRestException as exc:
            raise TransientSendError(f"lookup_{exc.status}", str(exc.msg)[:200]) from exc
        except (requests.RequestException, ValueError) as exc:
            raise TransientSendError("lookup_failed", str(exc)[:200]) from exc
        listed = [
            Listed(str(m.sid), m.body or "", m.direction or "", m.date_created) for m in found
        ]
        return lookup_outcome(listed, request, since, clock.now())

    def _last_response(self) -> Response | None:
        """This thread's last HTTP answer, when the client keeps it (RoutedHttpClient)."""
        http = self.client.http_client
        return http.last_response() if isinstance(http, RoutedHttpClient) else None

    def from_response(self, message: Message, response: TwilioAnswer) -> SendResult:
        try:
            return outcome(response)
        except ThrottledError as error:
            if self.limits is not None:
                self.limits.pause(self.quota, self.sender, error.retry_after or DEFAULT_PAUSE)
            log.warning(
                "twilio paused", extra={"action": "sms_paused", "seconds": error.retry_after}
            )
            raise
        except PermanentSendError:
            reason = SUPPRESS_CODES.get(response.code or 0)
            if reason and self.suppressions is not None and message.address:
                self._suppress(message, reason, response)
            raise

    def _suppress(self, message: Message, reason: str, response: TwilioAnswer) -> None:
        try:
            self.suppressions.suppress(  # type: ignore[union-attr]
                message.user_id,
                "sms",
                message.address or "",
                reason,
                f"twilio {response.code}: {response.message}",
            )
        except Exception:  # the delivery still fails for good; the next one will try again
            log.exception("suppression not recorded", extra={"action": "sms_suppress_failed"})
