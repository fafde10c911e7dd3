"""An app's webhook endpoint for clarion's outbound events: verifies Standard Webhooks signatures
and counts what arrives, and misbehaves on request, then recovers.

`script(mode, times)` queues misbehaviour for the next requests:
- `500`: answer 500 without taking the event (nothing counted as taken);
- `timeout`: hold the request for `hold` seconds (past the sender's timeout), then close, not taken;
- `drop`: take the event (counted), then close the connection without an answer.
Requests beyond the script are answered 204 when the signature is valid for one of `secrets`
(401 otherwise). Everything is counted here, at the receiver: arrivals per `webhook-id`, which
secrets each signature matched, and the taken events in arrival order, per stream.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Self

from clarion.standins.local_server import LocalServer

MODES = ("500", "timeout", "drop")


def signatures_of(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """The receiver's own computation (not clarion's code): v1,<base64 HMAC-SHA256>."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


@dataclass(frozen=True)
class Arrival:
    msg_id: str
    timestamp: str
    signature: str
    body: bytes
    matched: tuple[int, ...]  # indexes into the secrets that some signature matched
    answer: str  # 204, 401, 500, timeout, drop
    at: float

    @property
    def payload(self) -> dict[str, Any]:
        parsed = json.loads(self.body)
        assert isinstance(parsed, dict)
        return parsed

    @property
    def taken(self) -> bool:
        return self.answer in ("204", "drop")


@dataclass
class Endpoint:
    """The stand-in's state; safe to read from the test's thread."""

    secrets: list[str]
    hold: float = 3.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrivals: list[Arrival] = field(default_factory=list)
    _script: list[str] = field(default_factory=list)

    def script(self, mode: str, times: int = 1) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        with self.lock:
            self._script += [mode] * times

    def clear_script(self) -> None:
        with self.lock:
            self._script.clear()

    @property
    def scripted(self) -> int:
        with self.lock:
            return len(self._script)

    def _next(self) -> str | None:
        with self.lock:
            return self._script.pop(0) if self._script else None

    def record(self, arrival: Arrival) -> None:
        with self.lock:
            self.arrivals.append(arrival)

    def snapshot(self) -> list[Arrival]:
        with self.lock:
            return list(self.arrivals)

    def taken(self) -> list[Arrival]:
        return [a for a in self.snapshot() if a.taken]

    def counts(self) -> Counter[str]:
        """Arrivals per webhook-id, every answer included."""
        return Counter(a.msg_id for a in self.snapshot())


def _handler(state: Endpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            msg_id = self.headers.get("webhook-id", "")
            stamp = self.headers.get("webhook-timestamp", "")
            given = self.headers.get("webhook-signature", "")
            with state.lock:
                secrets = list(state.secrets)
            matched = tuple(
                i
                for i, secret in enumerate(secrets)
                if any(
                    hmac.compare_digest(signatures_of(secret, msg_id, stamp, body), g)
                    for g in given.split()
                )
            )
            mode = state._next() if matched else None
            answer = mode or ("204" if matched else "401")
            state.record(Arrival(msg_id, stamp, given, body, matched, answer, time.time()))
            if mode == "timeout":
                time.sleep(state.hold)
            if mode in ("timeout", "drop"):
                self.close_connection = True
                return
            status = int(answer)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


class FakeAppEndpoint:
    """`with FakeAppEndpoint([secret]) as app:` serves on 127.0.0.1; `app.url` takes events."""

    def __init__(self, secrets: list[str], *, hold: float = 3.0) -> None:
        self.state = Endpoint(list(secrets), hold=hold)
        self.server = LocalServer(_handler(self.state))

    @property
    def url(self) -> str:
        return self.server.base_url + "/events"

    def __enter__(self) -> Self:
        self.server.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)
