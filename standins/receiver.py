"""A local webhook receiver: verifies clarion's signature and counts arrivals per idempotency key.

Used by the demo, the tests and the benchmark as the far end of the webhook channel; also handy as
a stand-in for your own service during development (`clarion receiver --port 8099`).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import BinaryIO, Self, cast

from clarion.adapters.webhook import verify
from clarion.standins.local_server import AnswerLoss, send_json

MAX_LINE = 65536
MAX_HEADERS = 100


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
    # sender's address -> perf_counter() of each of its arrivals (which host sent what, when)
    senders: dict[str, list[float]] = field(default_factory=dict)

    def record(self, key: str, payload: dict, sender: str = "") -> bool:
        """Count one arrival (from address `sender`); True if it is the first for its key."""
        occurrence = (
            f"{payload.get('user_id')}/{payload.get('type')}/{payload.get('occurrence_key')}"
        )
        with self.lock:
            self.by_key[key] += 1
            self.occurrences.setdefault(occurrence, set()).add(key)
            self.deliveries[key] = payload.get("delivery_id")
            self.contents.setdefault(key, payload.get("content") or {})
            now = time.perf_counter()
            self.first_at.setdefault(key, now)
            self.senders.setdefault(sender, []).append(now)
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


class _Exchange:
    """One request's answer, written through the part of BaseHTTPRequestHandler that
    standins.local_server's send_json and AnswerLoss use (path, close_connection, the send_* calls)."""

    def __init__(self, conn: socket.socket, path: str) -> None:
        self.conn = conn
        self.path = path
        self.close_connection = False
        self.wfile = self
        self._head: list[str] = []

    def send_response(self, status: int) -> None:
        self._head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]

    def send_header(self, name: str, value: str) -> None:
        self._head.append(f"{name}: {value}")

    def end_headers(self) -> None:
        self._head.append("\r\n")

    def write(self, data: bytes) -> None:
        self.conn.sendall("\r\n".join(self._head).encode("latin-1") + data)

    def json(self, status: int, payload: object) -> None:
        send_json(cast(BaseHTTPRequestHandler, self), status, payload)


def _read_request(rfile: BinaryIO) -> tuple[str, str, dict[str, str], bytes] | None:
    """(method, path, headers, body) of the next request; None: the connection ended (or the
    sender died mid-request: nothing arrived)."""
    line = rfile.readline(MAX_LINE)
    parts = line.split()
    if len(parts) != 3:
        return None
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADERS):
        raw = rfile.readline(MAX_LINE)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().title()] = value.strip()
    try:
        length = int(headers.get("Content-Length") or 0)
    except ValueError:
        return None
    body = rfile.read(length) if length > 0 else b""
    if len(body) < length:
        return None
    keep = parts[2] == b"HTTP/1.1" and headers.get("Connection", "").lower() != "close"
    if not keep:
        headers["Connection"] = "close"
    return parts[0].decode("latin-1"), parts[1].decode("latin-1"), headers, body


class Receiver:
    """A receiver serving on 127.0.0.1 (or `host`) from `with` until the block ends: a thread per kept-alive
    connection, each request parsed with no more than the signature check needs (the benchmark
    counts its CPU with clarion's)."""

    def __init__(
        self, secret: str, port: int = 0, latency: float = 0.0, host: str = "127.0.0.1"
    ) -> None:
        """`latency`: seconds each answer takes, after the arrival is counted (a real provider's).
        `host`: the address to serve on (a multi-host test's receiver host)."""
        self.arrivals = Arrivals(latency=latency)
        self.secret = secret
        self.host = host
        self.listener = socket.create_server((host, port))
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.listener.getsockname()[1]}"

    @property
    def url(self) -> str:
        return self.base_url + "/hook"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self.listener.close()
        self.thread.join(5)
        with self._lock:
            for conn in self._open:  # a stopped receiver answers no kept-alive connection either
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn, str(peer[0])), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        try:
            with conn, conn.makefile("rb") as rfile:
                while (request := _read_request(rfile)) is not None:
                    if not self._answer(conn, peer, *request):
                        return
        except OSError:
            pass  # a client killed mid-request (as the chaos tests do) is not news
        finally:
            with self._lock:
                self._open.discard(conn)

    def _answer(
        self,
        conn: socket.socket,
        peer: str,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
    ) -> bool:
        """Answer one request; False: close the connection."""
        exchange = _Exchange(conn, path)
        arrivals = self.arrivals
        if method != "POST":
            exchange.json(501, {"error": "POST only"})
        elif arrivals.take_failure():
            exchange.json(503, {"error": "try later"})
        elif not verify(self.secret, headers, body, now=time.time()):
            arrivals.rejected += 1
            exchange.json(401, {"error": "bad signature"})
        elif not isinstance(payload := _json(body), dict):
            exchange.json(400, {"error": "not a JSON object"})
        else:
            first = arrivals.record(headers.get("Idempotency-Key", ""), payload, peer)
            if arrivals.latency:
                time.sleep(arrivals.latency)
            if not arrivals.losses.apply(cast(BaseHTTPRequestHandler, exchange)):
                exchange.json(
                    200 if first else 409,
                    {"id": payload.get("delivery_id"), "duplicate": not first},
                )
        return not exchange.close_connection and headers.get("Connection") != "close"


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None
