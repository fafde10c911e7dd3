"""A stand-in provider for the webhook channel that records what it was sent and answers as told.

`standins.receiver.Receiver` is the real far end (signature check, dedup on the idempotency key); this
one is for what that receiver cannot do: answer a fixed status, hand back the rendered content, or
run a hook while a send is in flight (to change the ledger under a worker's feet, without sleeping).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from clarion.standins.local_server import LocalServer, send_json


@dataclass(frozen=True)
class Call:
    path: str
    headers: dict[str, str]
    payload: dict


Respond = Callable[[Call], int]


class Endpoint(LocalServer):
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
                send_json(self, status, {"id": f"m-{len(outer.calls)}"})

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return self.base_url + "/hook"
