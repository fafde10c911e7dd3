"""A small HTTP/1.1 client for the webhook channel: POSTs on kept-alive connections, several in
flight at once from one thread (`post_many`: a batch's requests written, then their answers read
as they come, one wait for the lot instead of one per request).

Why not urllib3: a webhook send is one POST of a body clarion built, answered by a short status.
On that path urllib3 spent ~200 µs of CPU per request and http.client ~80 µs (it parses headers
with the email package); this client spends ~25 µs. What it keeps:

- TLS for https:// (`ssl.create_default_context()`: certificate and host name verified);
- one total timeout per request, on the wall clock: each connect, write and wait for the answer
  takes only what is left of it, so a server that trickles its answer cannot stretch it;
- no redirect followed and no retry: a 3xx is an answer like any other, a repeat is the ledger's
  decision;
- where a failure happened: `NotSent` (no byte of the request can have reached the server: the
  connection or the TLS handshake failed) or `NoAnswer` (the request may have been read: no
  complete answer came back).

An answer is framed by Content-Length, chunked encoding or the end of the connection; a body past
MAX_BODY is cut there (and its connection dropped). An idle kept-alive connection the server has
closed is noticed before reuse (it reads as ready) and replaced.
"""

from __future__ import annotations

import math
import select
import socket
import ssl
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from urllib.parse import quote, urlsplit

MAX_HEAD = 64 * 1024  # status line and headers of one answer
MAX_BODY = 1024 * 1024
_UNSAFE = frozenset(chr(c) for c in (*range(33), 127))  # whitespace and controls: no injection


class NotSent(Exception):
    """The request cannot have reached the server."""


class NoAnswer(Exception):
    """The request may have reached the server; no complete answer came back."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # names in Title-Case ("Retry-After"); repeats joined by ", "
    body: bytes


@dataclass(frozen=True)
class Target:
    origin: tuple[str, str, int]  # scheme, host, port: what a kept-alive connection serves
    head: str  # request line and Host header


@lru_cache(maxsize=1024)
def target(url: str) -> Target:
    """The parsed URL; ValueError for anything but a well-formed http(s) URL with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or _UNSAFE.intersection(url):
        raise ValueError(f"not an http(s) URL with a host: {url!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)  # ValueError: a bad port
    host = parts.hostname.encode("idna").decode("ascii")
    path = quote(parts.path or "/", safe="/%!$&'()*+,;=:@~-._")
    if parts.query:
        path += "?" + quote(parts.query, safe="/%!$&'()*+,;=:@~-._?")
    netloc = parts.netloc.rpartition("@")[2].encode("idna").decode("ascii")
    return Target((parts.scheme, host, port), f"POST {path} HTTP/1.1\r\nHost: {netloc}\r\n")


class Connections:
    """Kept-alive connections per origin (up to `keep` idle each), shared by a process's threads."""

    def __init__(self, *, keep: int = 8, tls: ssl.SSLContext | None = None) -> None:
        self.keep = keep
        self._tls = tls
        self._idle: dict[tuple[str, str, int], list[socket.socket]] = {}
        self._lock = threading.Lock()

    def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float) -> Answer:
        """POST `body` to `url` within `timeout` seconds in all. ValueError: a malformed URL."""
        answer = self.post_many([(url, headers, body)], timeout)[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def post_many(
        self, requests: Sequence[tuple[str, dict[str, str], bytes]], timeout: float
    ) -> list[Answer | NotSent | NoAnswer | ValueError]:
        """POST each (url, headers, body) on a connection of its own, all in flight at once, each
        within `timeout` seconds in all; the answers are read as they come (one wait for the lot,
        not one per request). Each request ends in its Answer or its exception (ValueError: a
        malformed URL), in the order given."""
        deadline = time.monotonic() + timeout
        ends: list[Answer | NotSent | NoAnswer | ValueError | None] = [None] * len(requests)
        waiting: dict[int, _Exchange] = {}  # by file descriptor
        for i, (url, headers, body) in enumerate(requests):
            try:
                exchange = self._write(i, target(url), headers, body, deadline)
            except (NotSent, NoAnswer, ValueError) as exc:
                ends[i] = exc
            else:
                waiting[exchange.sock.fileno()] = exchange
        poller = select.poll()
        for fd in waiting:
            poller.register(fd, select.POLLIN)
        while waiting:
            left = deadline - time.monotonic()
            ready = poller.poll(max(0, math.ceil(left * 1000)))  # what came is read, even late
            if not ready and left <= 0:
                for exchange in waiting.values():  # past the deadline: no complete answer came
                    exchange.sock.close()
                    ends[exchange.index] = NoAnswer("TimeoutError: timed out")
                break
            for fd, _ in ready:
                exchange = waiting[fd]
                try:
                    done = exchange.read()
                except (OSError, ValueError) as exc:  # ValueError: not HTTP
                    poller.unregister(fd)
                    del waiting[fd]
                    exchange.sock.close()
                    ends[exchange.index] = NoAnswer(f"{type(exc).__name__}: {exc}")
                    continue
                if done is None:
                    continue  # more of the answer is on its way
                poller.unregister(fd)
                del waiting[fd]
                answer, reusable = done
                if reusable:  # left non-blocking: the next _write sets its timeout
                    self._give(exchange.origin, exchange.sock)
                else:
                    exchange.sock.close()
                ends[exchange.index] = answer
        return [end if end is not None else NoAnswer("no answer") for end in ends]

    def _write(
        self, index: int, where: Target, headers: dict[str, str], body: bytes, deadline: float
    ) -> _Exchange:
        sock = self._take(where.origin) or self._connect(where.origin, deadline)
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request = f"{where.head}Content-Length: {len(body)}\r\n{lines}\r\n".encode() + body
        try:
            sock.settimeout(_left(deadline))
            sock.sendall(request)
            sock.setblocking(False)  # the answer is read as it comes (post_many's poll)
        except OSError as exc:  # TimeoutError is an OSError
            sock.close()
            raise NoAnswer(f"{type(exc).__name__}: {exc}") from exc
        return _Exchange(index, where.origin, sock)

    def _take(self, origin: tuple[str, str, int]) -> socket.socket | None:
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                if not idle:
                    return None
                sock = idle.pop()
            poller = select.poll()
            poller.register(sock, select.POLLIN)
            if not poller.poll(0):  # nothing to read: still open, nothing unasked for
                return sock
            sock.close()  # closed by the server (or it sent something unasked): not reusable

    def _give(self, origin: tuple[str, str, int], sock: socket.socket) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < self.keep:
                idle.append(sock)
                return
        sock.close()

    def _connect(self, origin: tuple[str, str, int], deadline: float) -> socket.socket:
        scheme, host, port = origin
        sock = None
        try:
            sock = socket.create_connection((host, port), timeout=_left(deadline))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context()
                sock.settimeout(_left(deadline))
                sock = self._tls.wrap_socket(sock, server_hostname=host)
            return sock
        except OSError as exc:  # refused, unreachable, timed out, TLS refused: nothing was sent
            if sock is not None:
                sock.close()
            raise NotSent(f"{type(exc).__name__}: {exc}") from exc


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _Incomplete(Exception):
    """The answer so far is not whole: wait for more of it (not an error)."""


@dataclass(eq=False)
class _Exchange:
    """One request written on `sock`, its answer not yet whole."""

    index: int  # its place in post_many's list
    origin: tuple[str, str, int]
    sock: socket.socket
    received: bytearray = field(default_factory=bytearray)
    ended: bool = False  # the server closed the connection

    def read(self) -> tuple[Answer, bool] | None:
        """Take what the socket holds; the answer and whether the connection can be reused, or
        None while it is incomplete. A TLS socket is drained of what it has decrypted too."""
        while len(self.received) <= MAX_HEAD + MAX_BODY:
            try:
                chunk = self.sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            if not chunk:
                self.ended = True
                break
            self.received += chunk
        try:
            return _read_answer(_Reader(self.received, self.ended))
        except _Incomplete:
            if len(self.received) > MAX_HEAD + MAX_BODY:
                raise ValueError("answer too long") from None
            return None


class _Reader:
    """An answer parsed from the bytes received so far (a copy: a parse that needs more bytes is
    started again once they came)."""

    def __init__(self, received: bytes | bytearray, ended: bool) -> None:
        self.buf = bytearray(received)
        self.ended = ended

    def fill(self) -> bool:
        """False at the end of the connection; _Incomplete while more may come."""
        if self.ended:
            return False
        raise _Incomplete

    def until(self, mark: bytes, limit: int) -> bytes:
        """Up to and including `mark`, at most `limit` bytes."""
        while (end := self.buf.find(mark)) < 0:
            if len(self.buf) > limit or not self.fill():
                raise ValueError("answer cut short or too long")
        return self.take(end + len(mark))

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self.fill():
                raise ValueError("answer cut short")
        return self.take(n)

    def take(self, n: int) -> bytes:
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


def _read_answer(reader: _Reader) -> tuple[Answer, bool]:
    """The final answer (1xx interim answers skipped) and whether the connection can be reused."""
    while True:
        head = reader.until(b"\r\n\r\n", MAX_HEAD).decode("latin-1").split("\r\n")[:-2]
        version, _, rest = head[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {head[0][:80]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in head[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ValueError(f"malformed header line: {line[:80]!r}")
            name, value = name.strip().title(), value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        if not 100 <= status < 200:
            break
        if status == 101:
            raise ValueError("the server switched protocols")
    reusable = version == "HTTP/1.1" and "close" not in headers.get("Connection", "").lower()
    length = headers.get("Content-Length")
    if status in (204, 304):
        body = b""
    elif "chunked" in headers.get("Transfer-Encoding", "").lower():
        body, complete = _chunked(reader)
        reusable = reusable and complete
    elif length is not None:
        n = int(length)  # ValueError: not HTTP
        if n < 0:
            raise ValueError("negative Content-Length")
        body = reader.exact(min(n, MAX_BODY))
        reusable = reusable and n <= MAX_BODY
    else:  # framed by the end of the connection
        while len(reader.buf) <= MAX_BODY and reader.fill():
            pass
        body, reusable = reader.take(MAX_BODY), False
    return Answer(status, headers, body), reusable and not reader.buf


def _chunked(reader: _Reader) -> tuple[bytes, bool]:
    """A chunked body (cut at MAX_BODY: then False, the rest is not read)."""
    body = bytearray()
    while True:
        size = int(reader.until(b"\r\n", MAX_HEAD).split(b";", 1)[0].strip(), 16)
        if size < 0:
            raise ValueError("negative chunk size")
        if size == 0:
            while reader.until(b"\r\n", MAX_HEAD) != b"\r\n":  # trailers
                pass
            return bytes(body), True
        if len(body) + size > MAX_BODY:
            body += reader.exact(min(size, MAX_BODY - len(body)))
            return bytes(body), False
        body += reader.exact(size)
        reader.exact(2)  # the chunk's CRLF
