"""What every channel adapter takes and returns. Adapters are thin: build the payload, do the I/O."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Protocol

from catalog import Button

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
        return json.dumps({"u": self.user_id, "d": self.delivery_id, "a": self.answer}, separators=(",", ":"))


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

    def button_value(self, button: Button) -> str:
        return ButtonValue(self.user_id, self.delivery_id, button.key).encode()

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.user_id, self.type_key, self.occurrence_key, self.channel)


@dataclass(frozen=True)
class SendResult:
    platform: str
    provider_message_id: str | None = None


class Adapter(Protocol):
    channel: str
    needs_address: bool

    def send(self, message: Message) -> SendResult:
        """Hand the message to the provider. Raises TransientSendError or PermanentSendError."""
        ...


class ChatAdapter(Adapter, Protocol):
    """Channels with buttons (Slack, Teams) also update a sent message in place, and may find a
    message an earlier, crashed attempt already posted."""

    def update(self, message: Message, provider_message_id: str, answered: str | None) -> None:
        """Re-render the sent message; `answered` is the catalog label of the recorded answer."""
        ...

    def reconcile(self, message: Message) -> SendResult | None:
        """The earlier attempt's message, if the provider has it (a rare, rate-limited path)."""
        ...
