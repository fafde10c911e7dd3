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


# --- post_many: several requests in flight on one thread --------------------------------------


def test_requests_posted_together_are_all_in_flight_at_once(serve) -> None:
    """The server answers none until it holds all four: a client that waited for each answer
    before writing the next request would time out."""
    arrived = threading.Barrier(4, timeout=5)

    def together(conn: socket.socket, request: bytes) -> None:
        arrived.wait()
        conn.sendall(OK)

    server = serve(together)
    pool = http1.Connections()
    requests = [(server.url, {"X-N": str(n)}, b"{}") for n in range(4)]
    answers = pool.post_many(requests, timeout=3)
    assert [a.status for a in answers if isinstance(a, http1.Answer)] == [200] * 4
    assert server.connections == 4 and sorted(
        r.split(b"X-N: ")[1][:1] for r in server.requests
    ) == [
        b"0",
        b"1",
        b"2",
        b"3",
    ]
    assert len(pool._idle[http1.target(server.url).origin]) == 4  # all kept alive for the next


def test_each_request_of_many_ends_on_its_own(serve) -> None:
    """A refused connection, a malformed URL, an answer that never comes and a good answer, in one
    call: each request gets its own outcome, in the order given, within the one timeout."""
    fast = serve(answer(OK))
    silent = serve(lambda conn, request: time.sleep(2))  # reads the request, never answers
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    started = time.monotonic()
    got = http1.Connections().post_many(
        [
            (refused, {}, b"1"),
            ("ftp://h/x", {}, b"2"),
            (silent.url, {}, b"3"),
            (fast.url, {}, b"4"),
        ],
        timeout=0.4,
    )
    assert time.monotonic() - started < 1.0
    assert [type(g).__name__ for g in got] == ["NotSent", "ValueError", "NoAnswer", "Answer"]
    assert "timed out" in str(got[2]) and isinstance(got[3], http1.Answer) and got[3].status == 200
    assert len(silent.requests) == 1  # the silent server had the request: its outcome is unknown


def test_an_answer_split_across_reads_is_put_together(serve) -> None:
    """Two answers arriving a few bytes at a time, interleaved: each is read whole once its last
    byte came, from its own connection."""

    def dribble(conn: socket.socket, request: bytes) -> None:
        body = request.rpartition(b"\r\n\r\n")[2]
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        for i in range(0, len(raw), 7):
            conn.sendall(raw[i : i + 7])
            time.sleep(0.01)

    server = serve(dribble)
    got = http1.Connections().post_many(
        [(server.url, {}, b"first"), (server.url, {}, b"second")], timeout=3
    )
    assert [g.body for g in got if isinstance(g, http1.Answer)] == [b"first", b"second"]


def test_https_requests_in_flight_together_are_read_whole(serve, ca) -> None:
    """A TLS socket read without blocking: what it has decrypted is drained before the next poll."""
    big = b"y" * 100_000  # several TLS records
    server = serve(
        answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(big), big)),
        _server_tls(ca, "127.0.0.1"),
    )
    pool = http1.Connections(tls=_trusting(ca))
    for _ in range(2):
        got = pool.post_many([(server.url, {}, b"{}")] * 3, timeout=3)
        assert [g.body == big for g in got if isinstance(g, http1.Answer)] == [True] * 3
    assert server.connections == 3 and len(server.requests) == 6
