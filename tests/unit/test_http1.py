"""adapters/http1.py against a scripted loopback server: framing, keep-alive, the total timeout,
no redirects, and where a failure counts as "not sent" or "no answer"."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import trustme

from clarion.adapters import http1

Script = Callable[[socket.socket, bytes], None]  # the connection, and the request it read


class Server:
    """Accepts connections; answers each request on them with `script` (the same for all)."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.connections = 0
        self.requests: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.listener.getsockname()[1]}/hook?x=1"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:  # the client refused our certificate: nothing more to read
                conn.close()
                return
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                while len(buf) < length:
                    buf += conn.recv(65536)
                self.requests.append(head + b"\r\n\r\n" + buf[:length])
                buf = buf[length:]
                try:
                    self.script(conn, self.requests[-1])
                except OSError:
                    return


@pytest.fixture
def serve() -> Iterator[Callable[[Script], Server]]:
    servers: list[Server] = []

    def start(script: Script, tls: ssl.SSLContext | None = None) -> Server:
        servers.append(Server(script, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.listener.close()


def answer(raw: bytes) -> Script:
    return lambda conn, request: conn.sendall(raw)


OK = b'HTTP/1.1 200 OK\r\nContent-Length: 11\r\nContent-Type: application/json\r\n\r\n{"id": "a"}'


def post(url: str, timeout: float = 2.0, pool: http1.Connections | None = None) -> http1.Answer:
    return (pool or http1.Connections()).post(url, {"X-Test": "1"}, b'{"n":1}', timeout)


def test_a_post_is_sent_whole_and_its_answer_read(serve) -> None:
    server = serve(answer(OK))
    got = post(server.url)
    assert (got.status, got.body, got.headers["Content-Type"]) == (
        200,
        b'{"id": "a"}',
        "application/json",
    )
    [request] = server.requests
    assert request.startswith(b"POST /hook?x=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nX-Test: 1\r\n" in request and request.endswith(b'\r\n\r\n{"n":1}')


def test_connections_are_kept_alive_and_reused(serve) -> None:
    server = serve(answer(OK))
    pool = http1.Connections()
    for _ in range(3):
        assert post(server.url, pool=pool).status == 200
    assert server.connections == 1 and len(server.requests) == 3


def test_a_connection_the_server_closed_while_idle_is_replaced(serve) -> None:
    def once(conn: socket.socket, request: bytes) -> None:
        conn.sendall(OK)
        conn.shutdown(socket.SHUT_RDWR)  # closes after answering, without saying so

    server = serve(once)
    pool = http1.Connections()
    assert post(server.url, pool=pool).status == 200
    time.sleep(0.05)  # the FIN reaches the idle connection
    assert post(server.url, pool=pool).status == 200
    assert server.connections == 2


def test_a_chunked_answer_with_trailers_and_an_interim_100(serve) -> None:
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n"
        b'4;ext=1\r\n{"id\r\n7\r\n": "b"}\r\n0\r\nX-Trailer: t\r\n\r\n'
    )
    server = serve(answer(raw))
    pool = http1.Connections()
    got = post(server.url, pool=pool)
    assert (got.status, got.body, got.headers["Retry-After"]) == (201, b'{"id": "b"}', "3")
    assert post(server.url, pool=pool).status == 201 and server.connections == 1


def test_an_answer_framed_by_the_end_of_the_connection(serve) -> None:
    def close_framed(conn: socket.socket, request: bytes) -> None:
        conn.sendall(b"HTTP/1.1 202 Accepted\r\nConnection: close\r\n\r\nqueued")
        conn.shutdown(socket.SHUT_RDWR)

    server = serve(close_framed)
    pool = http1.Connections()
    assert post(server.url, pool=pool).body == b"queued"
    assert post(server.url, pool=pool).status == 202 and server.connections == 2


def test_a_redirect_is_an_answer_not_followed(serve) -> None:
    server = serve(
        answer(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n")
    )
    got = post(server.url)
    assert (got.status, got.headers["Location"]) == (302, "/elsewhere")
    assert len(server.requests) == 1


def test_a_body_past_the_cap_is_cut_and_its_connection_dropped(serve, monkeypatch) -> None:
    monkeypatch.setattr(http1, "MAX_BODY", 10)
    server = serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n" + b"x" * 30))
    pool = http1.Connections()
    assert post(server.url, pool=pool).body == b"x" * 10
    post(server.url, pool=pool)
    assert server.connections == 2


def test_a_trickling_answer_cannot_stretch_the_total_timeout(serve) -> None:
    def trickle(conn: socket.socket, request: bytes) -> None:
        for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
            conn.sendall(bytes([byte]))
            time.sleep(0.05)  # each read gets a byte well within any per-read timeout

    server = serve(trickle)
    started = time.monotonic()
    with pytest.raises(http1.NoAnswer, match="timed out"):
        post(server.url, timeout=0.4)
    assert time.monotonic() - started < 0.7


@pytest.mark.parametrize(
    "raw", [b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort", b""]
)
def test_a_request_answered_badly_or_not_at_all_has_no_answer(serve, raw: bytes) -> None:
    def bad(conn: socket.socket, request: bytes) -> None:
        conn.sendall(raw)
        conn.shutdown(socket.SHUT_RDWR)

    with pytest.raises(
        http1.NoAnswer, match=r"^ValueError: (not an HTTP/1\.x status line|answer cut short)"
    ):
        post(serve(bad).url)


def test_a_refused_connection_is_not_sent() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(http1.NotSent, match=r"^ConnectionRefusedError: "):
        post(f"http://127.0.0.1:{port}/hook")


@pytest.mark.parametrize(
    "url",
    [
        "ftp://h/x",
        "http://",
        "http:///path",
        "http://h:99999/",
        "http://h/a b",
        "http://h/\r\nX: y",
    ],
)
def test_a_malformed_url_is_refused_before_anything_is_sent(url: str) -> None:
    with pytest.raises(
        ValueError, match=r"^(not an http\(s\) URL with a host: |Port out of range)"
    ):
        http1.target(url)


def test_the_request_target_is_escaped_and_the_host_kept() -> None:
    where = http1.target("https://user@bücher.example:8443/ä/b?q=ü")
    assert where.origin == ("https", "xn--bcher-kva.example", 8443)
    assert where.head == "POST /%C3%A4/b?q=%C3%BC HTTP/1.1\r\nHost: xn--bcher-kva.example:8443\r\n"


# --- TLS: a local CA (trustme), a server certificate for 127.0.0.1 -----------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _server_tls(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    return context


def _trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()  # what the client uses, with the test CA added
    ca.configure_trust(context)
    return context


def test_https_is_verified_and_kept_alive(serve, ca) -> None:
    server = serve(answer(OK), _server_tls(ca, "127.0.0.1"))
    pool = http1.Connections(tls=_trusting(ca))
    assert [post(server.url, pool=pool).status for _ in range(3)] == [200, 200, 200]
    assert server.connections == 1 and len(server.requests) == 3


def test_a_certificate_nobody_vouches_for_is_not_sent_to(serve, ca) -> None:
    server = serve(answer(OK), _server_tls(ca, "127.0.0.1"))
    with pytest.raises(http1.NotSent, match="CERTIFICATE_VERIFY_FAILED"):
        post(server.url)  # the default context: the system's CAs, not the test's
    assert server.requests == []


def test_a_certificate_for_another_host_is_not_sent_to(serve, ca) -> None:
    server = serve(answer(OK), _server_tls(ca, "hooks.example.com"))
    with pytest.raises(http1.NotSent, match="IP address mismatch|doesn't match|hostname"):
        post(server.url, pool=http1.Connections(tls=_trusting(ca)))
    assert server.requests == []
