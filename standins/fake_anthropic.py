"""A local Anthropic Messages API (`POST /v1/messages`), as the official SDK speaks it, for the
digest summariser's tests: point the SDK's base_url (ANTHROPIC_BASE_URL) at `fake.url`.

Answers the next calls as told (`answer(mode, times)`), then `ok`:
- ok: 200 with one text block (`fake.line`), stop_reason end_turn
- stall: holds the request `stall_seconds` before answering ok (past any digest timeout)
- 5xx: 529 overloaded_error (the API's error body)
- refusal: 200 with stop_reason "refusal" and no text
- garbage: 200 with a body that is not JSON
Every call is counted by the mode it got (`fake.calls`), with the API key it carried (x-api-key or
a bearer token: SDK versions differ).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler

from clarion.standins.local_server import LocalServer, send_json

MODES = ("ok", "stall", "5xx", "refusal", "garbage")


class FakeAnthropic(LocalServer):
    """The Messages API on 127.0.0.1; `calls` counts requests per mode answered."""

    def __init__(self, line: str = "Three sellers answered about your listings") -> None:
        self.line = line
        self.stall_seconds = 5.0
        self.calls: Counter[str] = Counter()
        self.keys: list[str] = []
        self.bodies: list[dict] = []
        self._plan: list[str] = []
        self._lock = threading.Lock()
        super().__init__(_handler(self))

    @property
    def url(self) -> str:
        return self.base_url

    def answer(self, mode: str, times: int = 1) -> None:
        """Answer the next `times` calls with `mode` (one of MODES)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        with self._lock:
            self._plan += [mode] * times

    def take(self, body: dict, key: str) -> str:
        with self._lock:
            mode = self._plan.pop(0) if self._plan else "ok"
            self.calls[mode] += 1
            self.keys.append(key)
            self.bodies.append(body)
            return mode


def _message(model: str, text: str | None, stop_reason: str) -> dict:
    content = [{"type": "text", "text": text}] if text is not None else []
    return {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 10},
    }


def _handler(fake: FakeAnthropic) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.split("?")[0] != "/v1/messages":
                send_json(self, 404, {"type": "error", "error": {"type": "not_found_error"}})
                return
            body = json.loads(raw or b"{}")
            bearer = self.headers.get("authorization", "").removeprefix("Bearer ")
            key = self.headers.get("x-api-key") or bearer  # the SDK sends one or the other
            mode = fake.take(body, key)
            model = str(body.get("model", ""))
            if mode == "stall":
                time.sleep(fake.stall_seconds)
            if mode == "5xx":
                error = {"type": "overloaded_error", "message": "Overloaded"}
                send_json(self, 529, {"type": "error", "error": error})
            elif mode == "refusal":
                send_json(self, 200, _message(model, None, "refusal"))
            elif mode == "garbage":
                data = b"<html>not json"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            else:
                send_json(self, 200, _message(model, fake.line, "end_turn"))

        def log_message(self, *args: object) -> None:
            pass

    return Handler
