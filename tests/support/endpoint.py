"""A stand-in provider for the webhook channel that records what it was sent and answers as told.

`ops.receiver.Receiver` is the real far end (signature check, dedup on the idempotency key); this
one is for what that receiver cannot do: answer a fixed status, hand back the rendered content, or
run a hook while a send is in flight (to change the ledger under a worker's feet, without sleeping).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Call:
    path: str
    headers: dict[str, str]
    payload: dict


Respond = Callable[[Call], int]


class Endpoint:
    """Serves on 127.0.0.1 in a background thread; `respond(call)` returns the HTTP status."""

    def __init__(self, respond: Respond = lambda call: 200) -> None:
        self.calls: list[Call] = []
        self.errors: list[BaseException] = []
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                call = Call(self.path, dict(self.headers.items()), json.loads(body or b"{}"))
                with lock:
                    outer.calls.append(call)
                try:
                    status = respond(call)
                except BaseException as exc:  # surfaced by the test through `errors`
                    outer.errors.append(exc)
                    status = 500
                data = json.dumps({"id": f"m-{len(outer.calls)}"}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def __enter__(self) -> Endpoint:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
