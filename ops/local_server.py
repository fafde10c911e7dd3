"""An HTTP server on 127.0.0.1 in a background thread: the base of clarion's local stand-ins
(the webhook receiver, the fake Slack Web API) and of the tests' fake providers."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client killed mid-request (as the chaos tests do) is not news


class LocalServer:
    """Serve `handler` on a free (or given) local port from `with` until the block ends."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0) -> None:
        self.server = _Server(("127.0.0.1", port), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: object,
              headers: dict[str, str] | None = None) -> None:
    """Answer a request with a JSON body (and extra headers)."""
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)
