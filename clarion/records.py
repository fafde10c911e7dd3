"""The records clarion's layers pass each other: a rendered message, what a provider answered, what
a provider reported later. db/, gates/, adapters/ and tasks/ all import them from here, so none of
them needs another to know a shape. Frozen dataclasses; nothing here does I/O."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from clarion.catalog import Button, NotificationType

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
    # The provider that reported ("sms", "sendgrid"), set by its parser: such a report naming a
    # delivery proves the provider took that message. None for clarion's own doors (unsubscribe).
    platform: str | None = None

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
