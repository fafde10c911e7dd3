"""The console channel: prints the message. For the demo and local development."""

from __future__ import annotations

import sys
from typing import TextIO

from clarion.adapters.base import Channel, Collaborators
from clarion.adapters.escape import plain_text
from clarion.records import Message, SendResult
from clarion.settings import Settings


def to_line(message: Message) -> str:
    """One printed line; plain text (no terminal escape sequences or bidi overrides)."""
    title = plain_text(message.content.get("title", ""))
    body = plain_text(message.content.get("body", ""))
    return f"[console] to {message.user_id} ({message.type_key}): {title} — {body}"


class ConsoleAdapter(Channel[str, None]):
    channel = "console"
    needs_address = False
    dedups_by_key = False  # printing has no unknown outcome

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> ConsoleAdapter:
        return cls()

    def to_request(self, message: Message) -> str:
        return to_line(message)

    def call(self, request: str) -> None:
        print(request, file=self.stream or sys.stdout, flush=True)

    def from_response(self, message: Message, response: None) -> SendResult:
        return SendResult(platform="console")
