"""What every channel adapter takes and returns. Adapters are thin: build the payload, do the I/O."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol


def idempotency_key(user_id: str, type_key: str, occurrence_key: str, channel: str) -> str:
    """The same for every attempt at one (user, type, occurrence, channel): receivers dedup on it."""
    raw = "\x1f".join((user_id, type_key, occurrence_key, channel)).encode()
    return "clk_" + hashlib.sha256(raw).hexdigest()[:40]


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
