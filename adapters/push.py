"""The push channel: one notification to every device of a recipient, over FCM HTTP v1
(adapters/fcm.py) and APNs over HTTP/2 (adapters/apns.py).

A recipient's push address is a space-separated list of devices, each `fcm:<token>` or
`apns:<hex token>`. One delivery sends to all of them, one provider request per device.

Per device (DeviceOutcome.kind): `sent`; `invalid` — the service says the token is gone
(FCM UNREGISTERED or INVALID_ARGUMENT naming the token, APNs 410 Unregistered, 400
BadDeviceToken / DeviceTokenNotForTopic): the token is removed from the recipient and put on the
suppression list with reason `invalid_token`, and never tried again; `throttled` (429): the
provider's budget is paused for every worker and the provider's remaining devices in this
delivery are not called; `unknown` — the request was written but no answer came (timeout, dropped
connection, 5xx): the device may show it; `retry` — not taken, worth retrying (no connection, an
expired OAuth/provider token); `rejected` — not taken, retrying cannot help (payload refused).

The delivery's outcome (`combine`, a pure function):

1. at least one device took it → sent. Devices that were throttled, lost or refused in the same
   attempt are not tried again (a retry would repeat it on the devices that have it); the
   provider message ids of the devices that took it are recorded, the others are logged
   (`action=push_partial`).
2. none took it, and an answer was lost → unknown (UnknownSendError);
3. none took it, one was throttled → deferred with the attempt refunded (ThrottledError);
4. none took it, one may take it later → failed, retried (TransientSendError);
5. none took it, one refused the message → failed for good with the provider's reason;
6. every device was invalid → failed for good, `no_valid_device` (the tokens are gone from the
   recipient, so the next notify is stopped at the gates).

Neither FCM nor APNs dedups by a key (`dedups_by_key = False`) and neither can be asked what it
delivered, but a repeat carries the same collapse id (APNs `apns-collapse-id`, FCM
`android.collapse_key` + notification tag, web push `Topic`) and, on APNs, the same `apns-id`, so
on the device it replaces the first notification instead of adding a second one
(`replaces_on_device`, true when every configured provider's sender says so). An unknown outcome
therefore follows tasks.send.outcomes as a resend for both guarantees: at-most-once types too
are sent again (to every remaining device) under the same collapse id, with a
`possible_duplicate` incident (a notification the user already dismissed is shown again).

The collapse id is the type's collapse key (`options.collapse.key` rendered) when it has one, so
a newer notification of the group replaces the older on the device; else `<type>:<occurrence>`.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import httpx

from clarion.adapters.base import Channel, Collaborators, Suppressions
from clarion.adapters.escape import plain_text
from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.errors import (
    ConfigurationError,
    PermanentSendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult

if TYPE_CHECKING:
    from clarion.settings import Settings

log = logging.getLogger(__name__)

CHANNEL = "push"
PROVIDERS = ("fcm", "apns")
COLLAPSE_ID_MAX = 64  # bytes: APNs' limit on apns-collapse-id, used for every provider
TOPIC = re.compile(r"[A-Za-z0-9_-]{1,32}")  # a Web Push Topic header (RFC 8030)
KINDS = ("sent", "invalid", "throttled", "unknown", "retry", "rejected")


@dataclass(frozen=True)
class DeviceOutcome:
    """What one provider said about one device. `reason` is the provider's code (UNREGISTERED,
    BadDeviceToken, http_503, no_answer); `message_id` is set when sent."""

    device: str  # as in the address: "fcm:<token>" | "apns:<hex>"
    kind: str
    reason: str
    detail: str = ""
    message_id: str | None = None
    retry_after: float | None = None  # throttled: seconds to pause (Retry-After, or a default)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"not a device outcome: {self.kind!r}")

    def describe(self) -> str:
        return f"{self.device[:24]}… {self.kind} {self.reason}" + (
            f" ({self.detail[:120]})" if self.detail else ""
        )


class DeviceSender(Protocol):
    """One push provider (FCM, APNs): sends one message to one device token."""

    provider: str  # "fcm" | "apns": the prefix of its devices
    quota: Quota
    replaces_by_collapse: bool  # a second message with the same collapse id replaces the first
    budget_key: str  # the credential whose budget a send spends (project id, team/key id)

    def send(self, message: Message, token: str, collapse: str) -> DeviceOutcome:
        """to_request → call → from_response for one device; never raises for provider answers."""
        ...


# --- pure --------------------------------------------------------------------------------------


def parse_devices(address: str | None) -> list[tuple[str, str]]:
    """(provider, token) for each device of a push address, in order, without repeats."""
    found: list[tuple[str, str]] = []
    for device in (address or "").split():
        provider, sep, token = device.partition(":")
        if sep and token and (provider, token) not in found:
            found.append((provider, token))
    return found


def collapse_id(message: Message) -> str:
    """The type's collapse key, else `<type>:<occurrence>`; hashed when over 64 bytes."""
    raw = message.collapse_key or f"{message.type_key}:{message.occurrence_key}"
    if len(raw.encode("utf-8")) <= COLLAPSE_ID_MAX:
        return raw
    return "h:" + hashlib.sha256(raw.encode("utf-8")).hexdigest()[: COLLAPSE_ID_MAX - 2]


def web_topic(collapse: str) -> str:
    """A Web Push Topic (at most 32 URL-safe base64 characters) for a collapse id."""
    if TOPIC.fullmatch(collapse):
        return collapse
    digest = hashlib.sha256(collapse.encode("utf-8")).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")[:32]


def title_and_body(message: Message) -> tuple[str, str]:
    """The notification's title and body as plain text (adapters.escape.plain_text)."""
    title = plain_text(message.content.get("title", "")).strip()
    body = plain_text(message.content.get("body") or message.content.get("text") or "").strip()
    return title or message.type_key, body


def transport_outcome(device: str, exc: httpx.HTTPError) -> DeviceOutcome:
    """A network error as a device outcome: `retry` if the request cannot have been written (no
    connection, no free connection, a request httpx could not build), else `unknown`."""
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return DeviceOutcome(device, "retry", "connection", str(exc)[:200])
    if isinstance(exc, httpx.LocalProtocolError | httpx.UnsupportedProtocol | httpx.InvalidURL):
        return DeviceOutcome(device, "retry", "bad_request", str(exc)[:200])
    return DeviceOutcome(device, "unknown", "no_answer", f"{type(exc).__name__}: {exc}"[:200])


def combine(outcomes: Sequence[DeviceOutcome]) -> SendResult:
    """The delivery's outcome from its devices' (see the module docstring for the order)."""
    by_kind: dict[str, list[DeviceOutcome]] = {k: [] for k in KINDS}
    for outcome in outcomes:
        by_kind[outcome.kind].append(outcome)
    summary = "; ".join(o.describe() for o in outcomes)[:400]
    if by_kind["sent"]:
        ids = " ".join(o.message_id or o.device.partition(":")[0] for o in by_kind["sent"])
        return SendResult(platform=CHANNEL, provider_message_id=ids or None, repeat=None)
    if lost := by_kind["unknown"]:
        raise UnknownSendError(lost[0].reason, summary)
    if throttled := by_kind["throttled"]:
        waits = [o.retry_after for o in throttled if o.retry_after is not None]
        raise ThrottledError(throttled[0].reason, summary, max(waits) if waits else None)
    if again := by_kind["retry"]:
        raise TransientSendError(again[0].reason, summary)
    if refused := by_kind["rejected"]:
        raise PermanentSendError(refused[0].reason, summary)
    raise PermanentSendError("no_valid_device", summary or "no device")


# --- the channel -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PushRequest:
    user_id: str
    collapse: str
    devices: tuple[tuple[str, str], ...]  # (provider, token), each with a configured sender
    message: Message


@dataclass(frozen=True)
class PushResponse:
    outcomes: tuple[DeviceOutcome, ...]


class PushAdapter(Channel[PushRequest, PushResponse]):
    """Every device of the recipient, through the sender of its provider (see module docstring)."""

    channel = CHANNEL
    needs_address = True
    dedups_by_key = False  # neither FCM nor APNs drops a repeat; the collapse id replaces it

    def __init__(
        self,
        senders: Mapping[str, DeviceSender],
        *,
        suppressions: Suppressions,
        limits: RateLimits | None = None,
    ) -> None:
        self.senders = dict(senders)
        self.suppressions = suppressions
        self.limits = limits
        # An at-most-once resend after an unknown outcome is allowed only where every provider
        # makes the device replace the first notification with it (tasks.send.outcomes).
        self.replaces_on_device = all(s.replaces_by_collapse for s in self.senders.values())

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> PushAdapter:
        senders: dict[str, DeviceSender] = {}
        if s.fcm_service_account:
            from clarion.adapters.fcm import FcmSender

            senders["fcm"] = FcmSender.from_settings(s)
        if s.apns_key:
            from clarion.adapters.apns import ApnsSender

            senders["apns"] = ApnsSender.from_settings(s)
        if not senders:
            raise ConfigurationError("push needs CLARION_FCM_SERVICE_ACCOUNT or CLARION_APNS_KEY")
        return cls(senders, suppressions=parts.suppressions, limits=parts.limits)

    def to_request(self, message: Message) -> PushRequest:
        devices = parse_devices(message.address)
        if not devices:
            raise PermanentSendError("no_address", "the recipient has no push device")
        usable = tuple(d for d in devices if d[0] in self.senders)
        if not usable:
            names = sorted({p for p, _ in devices})
            raise PermanentSendError(
                "no_provider", f"no push provider configured for the devices' {names}"
            )
        return PushRequest(message.user_id, collapse_id(message), usable, message)

    def spend(self, message: Message, request: PushRequest) -> None:
        """Spend one slot per device from each provider's shared budget before any device is
        called, so a full or paused budget defers the whole delivery before anything is sent
        (push spends from more than one budget)."""
        if self.limits is None:
            return
        for provider in PROVIDERS:
            cost = sum(1 for p, _ in request.devices if p == provider)
            if cost:
                sender = self.senders[provider]
                self.limits.take(sender.quota, sender.budget_key, cost=cost, lane=message.lane)

    def call(self, request: PushRequest) -> PushResponse:
        """Send to each device in turn. An invalid token is removed and suppressed at once; a
        429 pauses the provider's budget and its remaining devices are not called."""
        outcomes: list[DeviceOutcome] = []
        paused: set[str] = set()
        for provider, token in request.devices:
            device = f"{provider}:{token}"
            if provider in paused:
                outcomes.append(DeviceOutcome(device, "throttled", "paused", "not called"))
                continue
            sender = self.senders[provider]
            outcome = sender.send(request.message, token, request.collapse)
            if outcome.kind == "invalid":
                self._forget(request.user_id, outcome, request.message.delivery_id)
            elif outcome.kind == "throttled":
                paused.add(provider)
                self._pause(sender, outcome)
            outcomes.append(outcome)
        return PushResponse(tuple(outcomes))

    def from_response(self, message: Message, response: PushResponse) -> SendResult:
        result = combine(response.outcomes)
        missed = [o for o in response.outcomes if o.kind not in ("sent", "invalid")]
        if missed:
            log.warning(
                "push sent to some devices only",
                extra={
                    "action": "push_partial",
                    "delivery": message.delivery_id,
                    "missed": [o.describe() for o in missed],
                },
            )
        return result

    def _forget(self, user_id: str, outcome: DeviceOutcome, delivery_id: int) -> None:
        """Remove the token from the recipient and list it, so it is never tried again. A write
        that fails is logged, not raised: the next send meets the same answer and tries again."""
        detail = f"delivery {delivery_id}: {outcome.reason} {outcome.detail}".strip()[:500]
        try:
            self.suppressions.forget_address(user_id, CHANNEL, outcome.device)
            self.suppressions.suppress(user_id, CHANNEL, outcome.device, "invalid_token", detail)
        except Exception:  # the database is down: the send's outcome must not depend on it
            log.exception("invalid push token not recorded", extra={"action": "push_token_kept"})
        else:
            log.info("push token removed: %s", detail, extra={"action": "push_token_removed"})

    def _pause(self, sender: DeviceSender, outcome: DeviceOutcome) -> None:
        if self.limits is not None and outcome.retry_after is not None:
            self.limits.pause(sender.quota, sender.budget_key, outcome.retry_after)
