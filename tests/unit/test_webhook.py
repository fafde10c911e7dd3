"""adapters/webhook.py: signing, the pure request/response converters, and send() over loopback HTTP."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from clarion import records
from clarion.adapters.webhook import (
    FAILED_STATUSES,
    WebhookAdapter,
    from_response,
    sign,
    to_request,
    verify,
)
from clarion.errors import (
    PermanentSendError,
    SendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult

SECRET = "s3cret"
NOW = 1_700_000_000.0

MESSAGE = Message(
    delivery_id=41,
    user_id="u-1",
    type_key="receipt",
    occurrence_key="event:e-1",
    channel="webhook",
    content={"title": "Receipt 7", "body": "Thanks."},
)


def signed(body: bytes, *, secret: str = SECRET, timestamp: str | None = None) -> dict[str, str]:
    ts = str(int(NOW)) if timestamp is None else timestamp
    return {"X-Clarion-Timestamp": ts, "X-Clarion-Signature": sign(secret, ts, body)}


# --- sign / verify ------------------------------------------------------------------------------


def test_sign_format() -> None:
    signature = sign(SECRET, "1700000000", b"{}")
    assert signature.startswith("v1=") and len(signature) == 3 + 64
    assert signature == sign(SECRET, "1700000000", b"{}")
    assert signature != sign(SECRET, "1700000001", b"{}")
    assert signature != sign("other", "1700000000", b"{}")


def test_verify_round_trip_with_to_request() -> None:
    headers, body = to_request(MESSAGE, SECRET, NOW)
    assert verify(SECRET, headers, body, now=NOW)


@pytest.mark.parametrize(
    ("case", "headers", "body", "now", "ok"),
    [
        ("fresh", signed(b"payload"), b"payload", NOW, True),
        ("299s later", signed(b"payload"), b"payload", NOW + 299, True),
        ("exactly 300s", signed(b"payload"), b"payload", NOW + 300, True),
        ("clock skew back", signed(b"payload"), b"payload", NOW - 300, True),
        ("tampered body", signed(b"payload"), b"payloae", NOW, False),
        ("extra byte", signed(b"payload"), b"payload ", NOW, False),
        ("wrong secret", signed(b"payload", secret="other"), b"payload", NOW, False),
        ("stale 301s", signed(b"payload"), b"payload", NOW + 301, False),
        ("stale an hour", signed(b"payload"), b"payload", NOW + 3600, False),
        ("future 301s", signed(b"payload"), b"payload", NOW - 301, False),
        ("float timestamp", signed(b"payload", timestamp="1700000000.0"), b"payload", NOW, False),
        ("word timestamp", signed(b"payload", timestamp="yesterday"), b"payload", NOW, False),
        ("empty timestamp", signed(b"payload", timestamp=""), b"payload", NOW, False),
        ("no headers", {}, b"payload", NOW, False),
        ("no signature", {"X-Clarion-Timestamp": str(int(NOW))}, b"payload", NOW, False),
        (
            "timestamp swapped after signing",
            {**signed(b"payload"), "X-Clarion-Timestamp": str(int(NOW) + 1)},
            b"payload",
            NOW,
            False,
        ),
        (
            "v0 prefix",
            {
                **signed(b"x"),
                "X-Clarion-Signature": "v0=" + signed(b"x")["X-Clarion-Signature"][3:],
            },
            b"x",
            NOW,
            False,
        ),
    ],
)
def test_verify(case: str, headers: dict[str, str], body: bytes, now: float, ok: bool) -> None:
    assert verify(SECRET, headers, body, now=now) is ok


def test_verify_custom_tolerance() -> None:
    headers = signed(b"x")
    assert verify(SECRET, headers, b"x", now=NOW + 10, tolerance=10)
    assert not verify(SECRET, headers, b"x", now=NOW + 11, tolerance=10)


@pytest.mark.parametrize("signature", ["v1=é", "v1=" + "ä" * 64])
def test_verify_rejects_non_ascii_signature(signature: str) -> None:
    headers = {**signed(b"x"), "X-Clarion-Signature": signature}
    assert verify(SECRET, headers, b"x", now=NOW) is False


# --- to_request ---------------------------------------------------------------------------------


def test_to_request_headers_and_body() -> None:
    headers, body = to_request(replace(MESSAGE, attempt=3), SECRET, NOW + 0.9)
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Clarion-Timestamp"] == "1700000000"
    assert headers["X-Clarion-Signature"] == sign(SECRET, "1700000000", body)
    assert headers["Idempotency-Key"] == records.idempotency_key(
        "u-1", "receipt", "event:e-1", "webhook"
    )
    assert headers["Idempotency-Key"] == MESSAGE.idempotency_key
    assert json.loads(body) == {
        "delivery_id": 41,
        "user_id": "u-1",
        "type": "receipt",
        "occurrence_key": "event:e-1",
        "channel": "webhook",
        "attempt": 3,
        "content": {"title": "Receipt 7", "body": "Thanks."},
    }


def test_to_request_body_is_deterministic() -> None:
    reordered = replace(MESSAGE, content={"body": "Thanks.", "title": "Receipt 7"})
    assert to_request(MESSAGE, SECRET, NOW)[1] == to_request(reordered, SECRET, NOW)[1]


def test_idempotency_key_is_the_same_across_attempts() -> None:
    first, _ = to_request(MESSAGE, SECRET, NOW)
    retry, _ = to_request(
        replace(MESSAGE, attempt=2, delivery_id=99, content={"body": "v2"}), SECRET, NOW + 600
    )
    assert first["Idempotency-Key"] == retry["Idempotency-Key"]
    assert first["X-Clarion-Signature"] != retry["X-Clarion-Signature"]


@pytest.mark.parametrize(
    "changed",
    [
        {"channel": "console"},
        {"occurrence_key": "event:e-2"},
        {"occurrence_key": "series:1:1"},
        {"user_id": "u-2"},
        {"type_key": "nudge"},
    ],
)
def test_idempotency_key_differs_per_identity(changed: dict[str, Any]) -> None:
    other = replace(MESSAGE, **changed)
    assert (
        to_request(other, SECRET, NOW)[0]["Idempotency-Key"]
        != to_request(MESSAGE, SECRET, NOW)[0]["Idempotency-Key"]
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("ab", "c", "o", "w"), ("a", "bc", "o", "w")),  # field boundaries are not lost
        (("u", "t", "o", "webhook"), ("u", "t", "o", "Webhook")),
    ],
)
def test_idempotency_key_separates_fields(a: tuple, b: tuple) -> None:
    assert records.idempotency_key(*a) != records.idempotency_key(*b)
    assert records.idempotency_key(*a).startswith("clk_") and len(records.idempotency_key(*a)) == 44


# --- from_response ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "body", "message_id"),
    [
        (200, b'{"id": "m-1"}', "m-1"),
        (201, b'{"id": 17}', "17"),
        (202, b"", None),
        (204, b"", None),
        (409, b'{"error": "duplicate"}', None),
        (409, b'{"id": "m-1"}', "m-1"),
        (200, b"not json", None),
        (200, b'["a list"]', None),
        (200, b'"a string"', None),
        (200, b"\xff\xfe", None),
    ],
)
def test_from_response_success(status: int, body: bytes, message_id: str | None) -> None:
    assert from_response(status, {}, body) == SendResult(
        platform="webhook", provider_message_id=message_id, repeat=status == 409
    )


def test_a_provider_id_is_cleaned_before_it_is_stored() -> None:
    result = from_response(200, {}, json.dumps({"id": "m\u0000-\ud800" + "x" * 600}).encode())
    assert result.provider_message_id is not None
    assert "\x00" not in result.provider_message_id and len(result.provider_message_id) == 512
    result.provider_message_id.encode("utf-8")  # no lone surrogate left


@pytest.mark.parametrize(
    ("status", "retry_after_header", "retry_after"),
    [
        (408, None, None),
        (425, None, None),
        (429, "7", 7.0),
        (429, "1.5", 1.5),
        (429, "-3", 0.0),
        (429, "Wed, 21 Oct 2015 07:28:00 GMT", None),  # HTTP-date form is not parsed
        (429, "", None),
    ],
)
def test_from_response_failed_but_worth_retrying(
    status: int, retry_after_header: str | None, retry_after: float | None
) -> None:
    headers = {} if retry_after_header is None else {"Retry-After": retry_after_header}
    with pytest.raises(TransientSendError, match=rf"^http_{status}: busy$") as caught:
        from_response(status, headers, b"busy")
    error = caught.value
    assert isinstance(error, ThrottledError) == (status == 429)  # a 429 refunds the attempt
    assert error.reason == f"http_{status}"
    assert error.detail == "busy"
    assert error.retry_after == retry_after


@pytest.mark.parametrize(
    ("status", "retry_after_header", "retry_after"),
    [(500, None, None), (502, "30", 30.0), (503, "120", 120.0), (504, "0", 0.0), (599, None, None)],
)
def test_a_5xx_leaves_the_outcome_unknown(
    status: int, retry_after_header: str | None, retry_after: float | None
) -> None:
    headers = {} if retry_after_header is None else {"Retry-After": retry_after_header}
    with pytest.raises(UnknownSendError, match=rf"^http_{status}: busy$") as caught:
        from_response(status, headers, b"busy")
    error = caught.value
    assert error.reason == f"http_{status}"
    assert error.detail == "busy"
    assert error.retry_after == retry_after


@pytest.mark.parametrize("status", [301, 400, 401, 403, 404, 410, 413, 422])
def test_from_response_permanent(status: int) -> None:
    with pytest.raises(PermanentSendError, match=rf"^http_{status}: no$") as caught:
        from_response(status, {"Retry-After": "5"}, b"no")
    assert caught.value.reason == f"http_{status}"
    assert not isinstance(caught.value, TransientSendError)


def test_failed_statuses_table() -> None:
    assert frozenset({408, 425, 429}) == FAILED_STATUSES


def test_from_response_detail_is_truncated_and_decoded() -> None:
    with pytest.raises(PermanentSendError, match=r"^http_400: ") as caught:
        from_response(400, {}, b"\xff" + b"x" * 500)
    assert caught.value.detail == "\ufffd" + "x" * 199
    assert str(caught.value).startswith("http_400: ")


# --- send() against a loopback server -----------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0


@dataclass
class Receiver:
    url: str
    replies: dict[str, Reply]
    received: list[tuple[str, dict[str, str], bytes]]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    replies: dict[str, Reply] = {}
    received: list[tuple[str, dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.path, dict(self.headers.items()), body))
            reply = replies.get(self.path, Reply(404))
            time.sleep(reply.delay)
            try:
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    yield Receiver(f"http://127.0.0.1:{server.server_address[1]}", replies, received)
    server.shutdown()
    server.server_close()
    thread.join(5)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def adapter(default_url: str | None = None, timeout: float = 5.0) -> WebhookAdapter:
    return WebhookAdapter(secret=SECRET, timeout=timeout, default_url=default_url)


def test_send_success_is_signed_and_keyed(receiver: Receiver) -> None:
    receiver.replies["/hook"] = Reply(
        201, {"Content-Type": "application/json"}, b'{"id": "prov-9"}'
    )
    result = adapter().send(replace(MESSAGE, config={"url": receiver.url + "/hook"}))
    assert result == SendResult(platform="webhook", provider_message_id="prov-9", repeat=False)
    [(path, headers, body)] = receiver.received
    assert path == "/hook"
    assert headers["Idempotency-Key"] == MESSAGE.idempotency_key
    assert verify(SECRET, headers, body, now=time.time())
    assert json.loads(body)["delivery_id"] == MESSAGE.delivery_id


def test_send_uses_default_url_and_config_url_wins(receiver: Receiver) -> None:
    receiver.replies["/default"] = Reply(204)
    receiver.replies["/typed"] = Reply(200, body=b'{"id": "t"}')
    hook = adapter(default_url=receiver.url + "/default")
    assert hook.send(MESSAGE) == SendResult("webhook", None, repeat=False)
    assert hook.send(replace(MESSAGE, config={"url": receiver.url + "/typed"})) == SendResult(
        "webhook", "t", repeat=False
    )
    assert [path for path, _, _ in receiver.received] == ["/default", "/typed"]


def test_send_retries_carry_the_same_idempotency_key(receiver: Receiver) -> None:
    receiver.replies["/hook"] = Reply(409)
    hook = adapter(default_url=receiver.url + "/hook")
    hook.send(MESSAGE)
    hook.send(replace(MESSAGE, attempt=2))
    keys = {headers["Idempotency-Key"] for _, headers, _ in receiver.received}
    assert keys == {MESSAGE.idempotency_key}
    assert [json.loads(body)["attempt"] for _, _, body in receiver.received] == [1, 2]


def test_send_503_is_unknown_with_hint(receiver: Receiver) -> None:
    receiver.replies["/hook"] = Reply(503, {"Retry-After": "12"}, b"maintenance")
    with pytest.raises(UnknownSendError, match=r"^http_503: maintenance$") as caught:
        adapter(default_url=receiver.url + "/hook").send(MESSAGE)
    assert (caught.value.reason, caught.value.detail, caught.value.retry_after) == (
        "http_503",
        "maintenance",
        12.0,
    )


def test_send_410_is_permanent(receiver: Receiver) -> None:
    receiver.replies["/hook"] = Reply(410, body=b"gone")
    with pytest.raises(PermanentSendError, match="http_410: gone"):
        adapter(default_url=receiver.url + "/hook").send(MESSAGE)


def test_a_read_timeout_leaves_the_outcome_unknown(receiver: Receiver) -> None:
    receiver.replies["/slow"] = Reply(200, delay=1.0)
    started = time.monotonic()
    with pytest.raises(UnknownSendError, match=r"^no_answer: TimeoutError: ") as caught:
        adapter(default_url=receiver.url + "/slow", timeout=0.2).send(MESSAGE)
    assert caught.value.reason == "no_answer"
    assert len(receiver.received) == 1  # the request had arrived: it may well have been taken
    assert time.monotonic() - started < 0.9


def test_send_connection_refused_is_failed_not_unknown() -> None:
    with pytest.raises(
        TransientSendError, match=r"^connection: ConnectionRefusedError: "
    ) as caught:
        adapter(default_url=f"http://127.0.0.1:{closed_port()}/hook").send(MESSAGE)
    assert caught.value.reason == "connection"
    assert caught.value.retry_after is None
    assert isinstance(caught.value.__cause__, Exception)


@pytest.mark.parametrize("config", [{}, {"url": ""}, {"url": None}])
def test_send_without_url_is_permanent(config: dict) -> None:
    with pytest.raises(
        PermanentSendError, match=r"^no_url: type receipt has no webhook url$"
    ) as caught:
        adapter(default_url=None).send(replace(MESSAGE, config=config))
    assert caught.value.reason == "no_url"
    assert "receipt" in caught.value.detail
    assert isinstance(caught.value, SendError)


@pytest.mark.parametrize("url", ["ftp://example.invalid/hook", "not a url", "http://"])
def test_send_to_a_malformed_url_is_permanent(url: str) -> None:
    with pytest.raises(PermanentSendError, match=r"^bad_url: ") as caught:
        adapter(default_url=None).send(replace(MESSAGE, config={"url": url}))
    assert caught.value.reason == "bad_url"


def test_send_many_ends_each_message_on_its_own_with_the_calls_in_flight_together(
    receiver: Receiver,
) -> None:
    """Five messages in one send_many: each gets the outcome send would have given it, in order;
    the three that reached the receiver were there at the same time (each answer waits 0.3 s,
    and the lot took well under the 0.9 s they would take one after another)."""
    receiver.replies["/ok"] = Reply(201, body=b'{"id": "p-1"}', delay=0.3)
    receiver.replies["/gone"] = Reply(410, body=b"gone", delay=0.3)
    receiver.replies["/busy"] = Reply(503, {"Retry-After": "4"}, b"later", delay=0.3)
    urls = [
        receiver.url + "/ok",
        None,  # no url: refused before any call
        receiver.url + "/gone",
        f"http://127.0.0.1:{closed_port()}/hook",
        receiver.url + "/busy",
    ]
    messages = [
        replace(MESSAGE, delivery_id=i, config={} if url is None else {"url": url})
        for i, url in enumerate(urls)
    ]
    started = time.monotonic()
    outcomes = adapter().send_many(messages)
    assert time.monotonic() - started < 0.8
    assert outcomes[0] == SendResult(platform="webhook", provider_message_id="p-1", repeat=False)
    assert [type(o).__name__ for o in outcomes[1:]] == [
        "PermanentSendError",
        "PermanentSendError",
        "TransientSendError",
        "UnknownSendError",
    ]
    reasons = [o.reason for o in outcomes[1:] if isinstance(o, SendError)]
    assert reasons == ["no_url", "http_410", "connection", "http_503"]
    assert sorted(json.loads(body)["delivery_id"] for _, _, body in receiver.received) == [0, 2, 4]
