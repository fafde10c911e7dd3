"""An HTTP server on 127.0.0.1 in a background thread: the base of clarion's local stand-ins
(the webhook receiver, the fake Slack Web API) and of the tests' fake providers."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self, cast


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's listen backlog is 5: a campaign's senders connecting at once on a loaded host
    # overflow it, and a provider's server does not refuse connections like that
    request_queue_size = 128

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.open_sockets: set[socket.socket] = set()  # accepted connections not yet closed
        self.accepted = 0  # connections accepted since start (kept-alive clients reuse theirs)

    def get_request(self):
        sock, address = super().get_request()
        self.open_sockets.add(sock)
        self.accepted += 1
        return sock, address

    def shutdown_request(self, request) -> None:
        self.open_sockets.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        pass  # a client killed mid-request (as the chaos tests do) is not news


class LocalServer:
    """Serve `handler` on a free (or given) local port from `with` until the block ends; on
    127.0.0.1 unless `host` names another address (a multi-host test's receiver host)."""

    def __init__(
        self, handler: type[BaseHTTPRequestHandler], port: int = 0, host: str = "127.0.0.1"
    ) -> None:
        self.server = _Server((host, port), handler)
        self.thread = self._thread()
        self.listening = False

    def _thread(self) -> threading.Thread:
        return threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def refuse(self) -> None:
        """An outage before anything is sent: stop listening and close every kept-alive
        connection, so each new request is refused at connect, until `reopen`."""
        if not self.listening:
            return
        self.listening = False
        self.server.shutdown()
        self.server.server_close()
        for sock in list(self.server.open_sockets):
            with contextlib.suppress(OSError):  # closed by the client already
                sock.shutdown(socket.SHUT_RDWR)

    def reopen(self) -> None:
        """Listen again on the same port (after `refuse`)."""
        if self.listening:
            return
        self.server = _Server(self.server.server_address[:2], self.server.RequestHandlerClass)
        self.thread = self._thread()
        self.thread.start()
        self.listening = True

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        # An AF_INET address: the host is text (typeshed also allows the bytes of AF_UNIX).
        return f"http://{cast(str, host)}:{port}"

    def __enter__(self) -> Self:
        self.thread.start()
        self.listening = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.refuse()


def send_json(
    handler: BaseHTTPRequestHandler,
    status: int,
    payload: object,
    headers: dict[str, str] | None = None,
) -> None:
    """Answer a request with a JSON body (and extra headers)."""
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


LOSS_MODES = ("drop", "late", "5xx")


class AnswerLoss:
    """Scripted losses of an answer *after* the request was accepted — the third outcome of a
    send, on purpose: `drop` closes the connection without answering, `late` answers only after
    `delay` seconds (past the client's timeout), `5xx` answers 500 although the request was taken.
    Thread-safe; each scripted loss is used once."""

    def __init__(self) -> None:
        self._queue: list[tuple[str, float, str | None]] = []
        self._lock = threading.Lock()
        self.applied: list[str] = []

    def next(
        self, mode: str, *, times: int = 1, delay: float = 2.0, match: str | None = None
    ) -> None:
        """Lose the answer of the next `times` accepted requests (whose path contains `match`)."""
        if mode not in LOSS_MODES:
            raise ValueError(f"unknown loss mode {mode!r}; modes: {', '.join(LOSS_MODES)}")
        with self._lock:
            self._queue.extend([(mode, delay, match)] * times)

    def _take(self, path: str) -> tuple[str, float] | None:
        with self._lock:
            for i, (mode, delay, match) in enumerate(self._queue):
                if match is None or match in path:
                    del self._queue[i]
                    self.applied.append(mode)
                    return mode, delay
        return None

    def apply(
        self, handler: BaseHTTPRequestHandler, lost: Callable[[], None] | None = None
    ) -> bool:
        """Call once the request was accepted. True: the answer was lost or replaced, and the
        handler must not answer; False: answer as usual (perhaps late). `lost` runs before the
        client can see anything, so what the fake records is there when the client's call ends."""
        taken = self._take(handler.path)
        if taken is None:
            return False
        mode, delay = taken
        if mode == "late":
            time.sleep(delay)
            return False
        if lost is not None:
            lost()
        if mode == "5xx":
            send_json(handler, 500, {"ok": False, "error": "internal_error"})
            return True
        handler.close_connection = True  # drop: no status line, the connection just closes
        return True
