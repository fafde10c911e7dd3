"""A local webhook receiver: verifies clarion's signature and counts arrivals per idempotency key.

Used by the demo, the tests and the benchmark as the far end of the webhook channel; also handy as
a stand-in for your own service during development (`clarion receiver --port 8099`).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from adapters.webhook import verify
from ops.local_server import AnswerLoss, LocalServer, send_json


@dataclass
class Arrivals:
    """What reached the receiver; safe to read from another thread."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    by_key: Counter = field(default_factory=Counter)
    occurrences: dict[str, set[str]] = field(default_factory=dict)  # "user/type/occ" -> keys
    deliveries: dict[str, int | None] = field(
        default_factory=dict
    )  # idempotency key -> delivery id
    contents: dict[str, dict] = field(default_factory=dict)  # idempotency key -> first content
    rejected: int = 0
    fail_next: int = 0  # answer this many of the next requests with 503 (nothing is taken)
    # lose the answer to a request that *was* taken (counted): `losses.next("drop" | "late" | "5xx")`
    losses: AnswerLoss = field(default_factory=AnswerLoss)
    latency: float = 0.0  # seconds before each answer
    first_at: dict[str, float] = field(default_factory=dict)  # key -> perf_counter() of arrival 1

    def record(self, key: str, payload: dict) -> bool:
        """Count one arrival; True if it is the first for its idempotency key."""
        occurrence = (
            f"{payload.get('user_id')}/{payload.get('type')}/{payload.get('occurrence_key')}"
        )
        with self.lock:
            self.by_key[key] += 1
            self.occurrences.setdefault(occurrence, set()).add(key)
            self.deliveries[key] = payload.get("delivery_id")
            self.contents.setdefault(key, payload.get("content") or {})
            self.first_at.setdefault(key, time.perf_counter())
            return self.by_key[key] == 1

    def take_failure(self) -> bool:
        with self.lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                return True
            return False

    @property
    def total(self) -> int:
        with self.lock:
            return sum(self.by_key.values())

    @property
    def unique(self) -> int:
        with self.lock:
            return len(self.by_key)

    @property
    def repeats(self) -> int:
        """Arrivals the receiver dropped because it had that idempotency key already."""
        with self.lock:
            return sum(n - 1 for n in self.by_key.values())


def _handler(secret: str, arrivals: Arrivals) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = (
            True  # headers and body go out as two writes; don't let them wait 40 ms
        )

        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if len(body) < length:  # the sender died mid-request: nothing arrived
                self.close_connection = True
                return None
            if arrivals.take_failure():
                return self._answer(503, {"error": "try later"})
            if not verify(secret, self.headers, body, now=time.time()):
                arrivals.rejected += 1
                return self._answer(401, {"error": "bad signature"})
            try:
                payload = json.loads(body)
            except ValueError:
                return self._answer(400, {"error": "not JSON"})
            first = arrivals.record(self.headers.get("Idempotency-Key", ""), payload)
            if arrivals.latency:
                time.sleep(arrivals.latency)
            if arrivals.losses.apply(self):
                return None
            self._answer(
                200 if first else 409, {"id": payload.get("delivery_id"), "duplicate": not first}
            )

        def _answer(self, status: int, payload: dict) -> None:
            send_json(self, status, payload)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class Receiver(LocalServer):
    """A receiver serving on 127.0.0.1 in a background thread."""

    def __init__(self, secret: str, port: int = 0, latency: float = 0.0) -> None:
        """`latency`: seconds each answer takes, after the arrival is counted (a real provider's)."""
        self.arrivals = Arrivals(latency=latency)
        super().__init__(_handler(secret, self.arrivals), port)

    @property
    def url(self) -> str:
        return self.base_url + "/hook"
