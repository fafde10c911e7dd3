"""A local Bot Framework connector: the REST API a bot calls (v3 conversations), answering as told.

Point a conversation reference's serviceUrl (or an activity's) at `FakeConnector.url` and the real
botframework-connector / botbuilder SDKs talk to it:

    POST /v3/conversations/{id}/activities               send a message      -> {"id": "1:<number>"}
    POST /v3/conversations/{id}/activities/{activityId}  reply to one        -> {"id": "<activity id>"}
    PUT  /v3/conversations/{id}/activities/{activityId}  replace (update) one -> {"id": activityId}

`fail_next(429, retry_after=30)` scripts the next answers (a 2xx one comes without an id); `remove_bot(conversation)` makes every
call into that conversation answer 403 BotNotInConversationRoster, as Teams does after an uninstall;
a PUT of an activity this server never sent answers 404. It can also serve OpenID metadata and a key
set (`serve_keys`), for tests of Bot Framework token validation.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote

from clarion.standins.local_server import AnswerLoss, LocalServer, send_json


@dataclass(frozen=True)
class Call:
    method: str
    conversation_id: str
    activity_id: str | None  # the activity replaced (PUT) or replied to; None for a new message
    payload: dict[str, Any]
    headers: dict[str, str]
    status: int
    answer_id: str | None = None  # the id the server gave the new or replaced activity

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def card(self) -> dict[str, Any] | None:
        """The Adaptive Card this activity carries, if any."""
        for attachment in self.payload.get("attachments") or []:
            if attachment.get("contentType") == "application/vnd.microsoft.card.adaptive":
                return attachment.get("content")
        return None


class FakeConnector(LocalServer):
    """Serves on 127.0.0.1 in a background thread; records every call in `calls`."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.gone: set[str] = set()
        self.plan: deque[tuple[int, dict[str, str]]] = deque()
        self.known: set[tuple[str, str]] = (
            set()
        )  # (conversation, activity id) this server handed out
        self.documents: dict[str, dict] = {}  # GET path -> JSON (OpenID metadata, keys)
        self._ids = itertools.count(1_700_000_000_001)
        self._lock = threading.Lock()
        self.losses = (
            AnswerLoss()
        )  # lose the answer to an accepted call: losses.next("drop" | "late" | "5xx")
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                document = outer.documents.get(self.path)
                self._answer(200 if document is not None else 404, document or {}, {})

            def do_POST(self) -> None:  # noqa: N802
                self._handle("POST")

            def do_PUT(self) -> None:  # noqa: N802
                self._handle("PUT")

            def _handle(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]
                if (
                    len(parts) not in (4, 5)
                    or parts[:2] != ["v3", "conversations"]
                    or parts[3] != "activities"
                ):
                    return self._answer(
                        404, {"error": {"code": "NotFound", "message": self.path}}, {}
                    )
                payload = json.loads(body or b"{}")
                status, headers, answer = outer._decide(
                    method, parts[2], parts[4] if len(parts) == 5 else None
                )
                call = Call(
                    method,
                    parts[2],
                    parts[4] if len(parts) == 5 else None,
                    payload,
                    dict(self.headers.items()),
                    status,
                    answer.get("id"),
                )
                with outer._lock:
                    outer.calls.append(call)
                if call.ok and outer.losses.apply(self):
                    return
                self._answer(status, answer, headers)

            def _answer(self, status: int, payload: dict, headers: dict[str, str]) -> None:
                send_json(self, status, payload, headers)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)

    # --- what the test sets up -----------------------------------------------------------------

    def fail_next(self, status: int, *, retry_after: float | None = None, times: int = 1) -> None:
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        with self._lock:
            self.plan.extend([(status, headers)] * times)

    def remove_bot(self, conversation_id: str) -> None:
        self.gone.add(conversation_id)

    def serve_keys(self, jwks: dict[str, Any]) -> str:
        """Serve OpenID metadata naming `jwks` as the signing keys; returns the metadata URL."""
        self.documents["/keys"] = jwks
        self.documents["/openid"] = {
            "issuer": "https://api.botframework.com",
            "jwks_uri": f"{self.url}keys",
        }
        return f"{self.url}openid"

    # --- what the test reads -------------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.base_url + "/"

    @property
    def sent(self) -> list[Call]:
        """New messages (not replies) the server accepted."""
        return [c for c in self.calls if c.method == "POST" and c.activity_id is None and c.ok]

    @property
    def updates(self) -> list[Call]:
        return [c for c in self.calls if c.method == "PUT" and c.ok]

    @property
    def replies(self) -> list[Call]:
        return [c for c in self.calls if c.method == "POST" and c.activity_id is not None and c.ok]

    # --- answering -------------------------------------------------------------------------------

    def _decide(
        self, method: str, conversation: str, activity: str | None
    ) -> tuple[int, dict, dict]:
        with self._lock:
            if conversation in self.gone:
                return (
                    403,
                    {},
                    {
                        "error": {
                            "code": "BotNotInConversationRoster",
                            "message": "The bot is not part of the conversation roster.",
                        }
                    },
                )
            if self.plan:
                status, headers = self.plan.popleft()
                if status < 300:  # e.g. 202 Accepted with no id, as Teams sometimes answers
                    return status, headers, {}
                return (
                    status,
                    headers,
                    {"error": {"code": f"Http{status}", "message": "scripted failure"}},
                )
            if method == "PUT":
                if (conversation, activity) not in self.known:
                    return (
                        404,
                        {},
                        {"error": {"code": "ActivityNotFound", "message": "no such activity"}},
                    )
                return 200, {}, {"id": activity}
            new_id = f"1:{next(self._ids)}"  # as Teams' ids in 1:1 chats look: with a colon
            self.known.add((conversation, new_id))
            return 201, {}, {"id": new_id}
