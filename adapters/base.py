"""What every channel adapter takes and returns. Adapters are thin: build the payload, do the I/O."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from clarion.catalog import Button, NotificationType

if TYPE_CHECKING:
    import redis as redis_lib

    from clarion.adapters.ratelimit import Quota, RateLimits

MAX_VALUE_BYTES = 512


def idempotency_key(user_id: str, type_key: str, occurrence_key: str, channel: str) -> str:
    """The same for every attempt at one (user, type, occurrence, channel): receivers dedup on it."""
    raw = "\x1f".join((user_id, type_key, occurrence_key, channel)).encode()
    return "clk_" + hashlib.sha256(raw).hexdigest()[:40]


@dataclass(frozen=True)
class ButtonValue:
    """What a chat button carries: the delivery it belongs to and the answer key. Nothing else —
    labels and meaning come from the server-side catalog."""

    user_id: str
    delivery_id: int
    answer: str

    def encode(self) -> str:
        return json.dumps(
            {"u": self.user_id, "d": self.delivery_id, "a": self.answer}, separators=(",", ":")
        )


def _is_storable(text: str) -> bool:
    """Free of NUL and lone surrogates: what we emit, and what PostgreSQL text can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


def decode_value(raw: object) -> ButtonValue | None:
    """Parse an untrusted button value; None for anything that is not exactly what we emit."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    if not isinstance(raw, str) or len(raw.encode("utf-8", "surrogatepass")) > MAX_VALUE_BYTES:
        return None
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or set(data) != {"u", "d", "a"}:
        return None
    user, delivery, answer = data["u"], data["d"], data["a"]
    if not (isinstance(user, str) and 0 < len(user) <= 200 and _is_storable(user)):
        return None
    if not (isinstance(delivery, int) and not isinstance(delivery, bool) and 0 < delivery < 2**63):
        return None
    if not (isinstance(answer, str) and 0 < len(answer) <= 32 and _is_storable(answer)):
        return None
    return ButtonValue(user, delivery, answer)


@dataclass(frozen=True)
class Message:
    """One rendered delivery, ready for a provider."""

    delivery_id: int
    user_id: str
    type_key: str
    occurrence_key: str
    channel: str
    content: dict[str, str]
    attempt: int = 1
    address: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    buttons: tuple[Button, ...] = ()
    lane: str = "transactional"
    category: str = ""
    collapse_key: str | None = None  # the type's collapse group for this occurrence, if any

    def button_value(self, button: Button) -> str:
        return ButtonValue(self.user_id, self.delivery_id, button.key).encode()

    @classmethod
    def for_type(
        cls,
        ntype: NotificationType,
        version: int,
        channel: str,
        content: dict[str, str],
        variables: dict[str, Any],
        *,
        delivery_id: int,
        user_id: str,
        occurrence_key: str,
        attempt: int = 1,
        address: str | None = None,
        lane: str | None = None,
    ) -> Message:
        """The message for rendered `content` of a type's pinned version: what the deliver task
        hands the adapter, and what `clarion preview` shows (one place, so they cannot differ)."""
        return cls(
            delivery_id=delivery_id,
            user_id=user_id,
            type_key=ntype.key,
            occurrence_key=occurrence_key,
            channel=channel,
            content=content,
            attempt=attempt,
            config=ntype.config.get(channel, {}),
            address=address,
            buttons=ntype.templates[version].buttons,
            lane=lane or ntype.lane,
            category=ntype.category,
            collapse_key=ntype.collapse_key(variables),
        )

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.user_id, self.type_key, self.occurrence_key, self.channel)


MAX_PROVIDER_ID = 512


def clean_provider_id(value: object) -> str | None:
    """A provider's message id as PostgreSQL text can hold it: a string, no NUL or lone
    surrogates, at most MAX_PROVIDER_ID characters; None for nothing usable."""
    if value is None or isinstance(value, bool):
        return None
    text = str(value).encode("utf-8", "replace").decode("utf-8").replace("\x00", "")
    return text[:MAX_PROVIDER_ID] or None


@dataclass(frozen=True)
class SendResult:
    """Sent: the provider took the message. `repeat` is what the provider said about the
    idempotency key: True (it had it already: this was a repeat it dropped), False (first arrival),
    None (the provider cannot tell)."""

    platform: str
    provider_message_id: str | None = None
    repeat: bool | None = None


class Adapter(Protocol):
    """A channel. Three outcomes of `send`: a SendResult (sent), TransientSendError or
    PermanentSendError (failed: the provider did not take it), UnknownSendError (it may have).

    `dedups_by_key`: the provider drops a second request with the same idempotency key, so a send
    with an unknown outcome may be repeated under that key. A channel that can look for its own
    earlier message also has `reconcile(message, since) -> SendResult | None` (see ChatAdapter)."""

    channel: str
    needs_address: bool
    dedups_by_key: bool

    def send(self, message: Message) -> SendResult:
        """Hand the message to the provider."""
        ...


class ChatAdapter(Adapter, Protocol):
    """Channels with buttons (Slack, Teams) also update a sent message in place (see
    `Channel.update`), and may find a message an earlier, crashed attempt already posted."""

    updates_in_place: bool

    def update(
        self, message: Message, provider_message_id: str, answered: str | None = None
    ) -> None:
        """Re-render the sent message; `answered` is the catalog label of the recorded answer."""
        ...

    def reconcile(self, message: Message, since: datetime) -> SendResult | None:
        """The message an earlier attempt (started at or after `since`) posted, if the provider
        has it; None if it does not. TransientSendError: the provider cannot be asked now."""
        ...


# --- receipts: what providers report after a send -------------------------------------------------

# Delivery events a receipt may carry, in clarion's words (each adapter maps its provider's).
RECEIPT_EVENTS = frozenset(
    {
        "accepted",  # queued/sent at the provider: nothing new for a row that is already sent
        "delivered",
        "opened",
        "read",
        "clicked",
        "bounced",  # hard: the address does not exist; suppressed
        "soft_bounced",  # full mailbox, greylisting: recorded, not suppressed
        "complained",  # marked as spam; suppressed
        "unsubscribed",  # one-click or provider unsubscribe; suppressed
        "failed",  # the provider gave up (SMS undelivered/failed, push rejected)
        "invalid_token",  # a push token the service says is gone; removed, suppressed
    }
)


@dataclass(frozen=True)
class Receipt:
    """One provider report about a message clarion sent. `provider_message_id` is what the send
    recorded; `user_id`/`delivery_id` are set when the provider echoes clarion's own metadata
    (SendGrid custom args, a status callback URL), and then must agree with the stored row."""

    channel: str
    event: str
    provider_message_id: str | None
    occurred_at: datetime
    address: str | None = None
    detail: str = ""
    user_id: str | None = None
    delivery_id: int | None = None
    event_id: str | None = None  # the provider's id for this report, when it has one

    def __post_init__(self) -> None:
        if self.event not in RECEIPT_EVENTS:
            raise ValueError(f"not a receipt event: {self.event!r}")


@dataclass(frozen=True)
class Keyword:
    """An inbound reply that steers a channel: SMS STOP / START / HELP (and their synonyms)."""

    channel: str
    address: str
    keyword: str  # "stop" | "start" | "help"
    received_at: datetime
    detail: str = ""


# --- collaborators: what the composition root (tasks.runtime) hands an adapter ---------------------


class Suppressions(Protocol):
    """The permanent suppression list, as adapters may touch it (db.gating behind it)."""

    def suppress(self, user_id: str, channel: str, address: str, reason: str, detail: str) -> None:
        """Never use this address on this channel again (bounced, STOP, invalid token, gone)."""
        ...

    def forget_address(self, user_id: str, channel: str, value: str) -> None:
        """Remove one value (a push token) from the recipient's address for `channel`."""
        ...


@dataclass(frozen=True)
class Collaborators:
    """Everything an adapter may need from outside itself. Adapters never import db/ or tasks/:
    tasks.runtime builds this once per process and passes it to each adapter's factory."""

    redis: Callable[[], redis_lib.Redis]
    limits: RateLimits
    suppressions: Suppressions
    extra: dict[str, Any] = field(default_factory=dict)  # channel-specific stores (teams, in_app)


# --- the channel template ---------------------------------------------------------------------------

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class Channel(Generic[Req, Resp]):
    """The shape every adapter follows (adapters/webhook.py is the model):

    - `to_request(message)`: pure; the provider request (raise PermanentSendError for a message
      that can never be sent: no address, too long).
    - `budget(message, request)`: (Quota, key, cost) to spend from the shared rate limits before
      the call, or None.
    - `call(request)`: the I/O, nothing else; network errors become TransientSendError (the
      request cannot have left) or UnknownSendError (it may have).
    - `from_response(message, response)`: pure; a SendResult, or the SendError to raise.

    `send` strings them together; a channel overrides a step, not `send`.

    Optional capability, `update(message, provider_message_id, answered=None)`: re-render a
    message this channel sent, in place (Slack chat.update, a Teams card refresh). A channel that
    implements it sets `updates_in_place = True`; tasks.refresh then keeps a collapse leader's
    message showing its group's running count. Without it the channel keeps what it sent."""

    channel: str
    needs_address: bool = True
    dedups_by_key: bool = False
    updates_in_place: bool = False
    limits: RateLimits | None = None

    def to_request(self, message: Message) -> Req:
        raise NotImplementedError

    def budget(self, message: Message, request: Req) -> tuple[Quota, str, int] | None:
        return None

    def call(self, request: Req) -> Resp:
        raise NotImplementedError

    def from_response(self, message: Message, response: Resp) -> SendResult:
        raise NotImplementedError

    def update(
        self, message: Message, provider_message_id: str, answered: str | None = None
    ) -> None:
        """Set the sent message `provider_message_id` (as the send recorded it) to `message`'s
        content, with the catalog label `answered` in place of its buttons if answered. Raises
        SendErrors as `send` does (ThrottledError: the channel's budget says wait). An update
        sets the whole message, so repeating one is harmless (at-least-once is fine)."""
        raise NotImplementedError(f"channel {self.channel!r} cannot update a sent message")

    def send(self, message: Message) -> SendResult:
        request = self.to_request(message)
        spend = self.budget(message, request)
        if spend is not None and self.limits is not None:
            quota, key, cost = spend
            self.limits.take(quota, key, cost=cost, lane=message.lane)
        return self.from_response(message, self.call(request))


def can_update(adapter: object) -> bool:
    """Whether the adapter implements the in-place `update` capability (Channel.update)."""
    return bool(getattr(adapter, "updates_in_place", False)) and callable(
        getattr(adapter, "update", None)
    )
