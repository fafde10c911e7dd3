"""A local Slack Web API: the wire format the real slack_sdk speaks, for tests and the demo (no internet).

Point a client at it with `WebClient(token=FakeSlack.TOKEN, base_url=server.api_url)`. It answers
POST /api/<method> with form or JSON bodies exactly as Slack does (HTTP 200 and {"ok": true, ...}
or {"ok": false, "error": ...}; 429 with Retry-After), and keeps what it was sent: DM channels,
messages with their metadata, updates, ephemeral replies and published Home views.

Methods: auth.test, conversations.open, chat.postMessage, chat.update, chat.postEphemeral,
conversations.history (metadata only with include_all_metadata), views.publish.
Failures on demand: `fail(method, error, status=200, retry_after=None, times=1)` and
`deactivate(user)` (conversations.open then answers user_disabled). Rate limits on demand:
`limit("chat.update", 50, 60.0)` answers 429 `ratelimited` with Retry-After to calls past 50 in
any 60 s (on the fake's `now` clock), as Slack's Tier 3 does; `throttled(method)` counts them. Lost answers on demand:
`losses.next("drop" | "late" | "5xx", match="chat.postMessage")` performs the call (the message is
posted) and then loses its answer, as a timeout or a dropped connection does.

Slack's other side, for clarion's endpoint: `signed(...)` headers (v0= HMAC-SHA256 of
"v0:{timestamp}:{body}"), `block_actions(...)` and `event_callback(...)` bodies, and `serving(app)`
to run an ASGI app on a real local port.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlencode

import uvicorn

from clarion.standins.local_server import AnswerLoss, LocalServer

JSON_FIELDS = ("blocks", "metadata", "view", "attachments")


@dataclass(frozen=True)
class Call:
    method: str
    params: dict[str, Any]
    token: str | None
    status: int
    answer: dict[str, Any]


@dataclass
class Failure:
    error: str
    status: int = 200
    retry_after: float | None = None
    times: int = 1


@dataclass
class Posted:
    channel: str
    ts: str
    text: str
    blocks: list[dict]
    metadata: dict | None
    updates: list[list[dict]] = field(default_factory=list)  # blocks of each chat.update, in order
    update_texts: list[str] = field(default_factory=list)  # text of each chat.update, in order
    at: float = field(default_factory=time.perf_counter)  # when it was posted


def _truthy(value: Any) -> bool:
    return value in (True, 1, "1", "true", "True")


def _parse(content_type: str, body: bytes, query: str) -> dict[str, Any]:
    params: dict[str, Any] = dict(parse_qsl(query))
    if body and "json" in content_type:
        params.update(json.loads(body))
    elif body:
        params.update(parse_qsl(body.decode()))
    for name in JSON_FIELDS:
        if isinstance(params.get(name), str) and params[name][:1] in "[{":
            params[name] = json.loads(params[name])
    return params


class FakeSlack(LocalServer):
    TOKEN = "xoxb-clarion-test"
    TEAM = "T0CLARION"
    BOT_USER = "UCLARIONBOT"

    def __init__(self, now: Callable[[], float] = time.time, host: str = "127.0.0.1") -> None:
        self.now = now
        self.calls: list[Call] = []
        self.messages: dict[str, list[Posted]] = {}  # channel -> messages, oldest first
        self.views: dict[str, dict] = {}  # user -> last published Home view
        self.deactivated: set[str] = set()
        self.failures: dict[str, list[Failure]] = {}
        self.losses = AnswerLoss()
        self.limits: dict[str, tuple[int, float]] = {}  # method -> (calls, per seconds)
        self._recent: dict[str, list[float]] = {}  # method -> times of its accepted calls
        self._counter = itertools.count(1)
        self.lock = threading.Lock()
        super().__init__(self._handler(), host=host)

    # --- control and inspection ----------------------------------------------------------------

    @property
    def url(self) -> str:
        return self.base_url

    @property
    def api_url(self) -> str:
        return self.url + "/api/"

    def fail(
        self,
        method: str,
        error: str,
        *,
        status: int = 200,
        retry_after: float | None = None,
        times: int = 1,
    ) -> None:
        """Answer the next `times` calls of `method` with this error (429 + Retry-After, say)."""
        with self.lock:
            self.failures.setdefault(method, []).append(Failure(error, status, retry_after, times))

    def limit(self, method: str, calls: int, seconds: float) -> None:
        """Answer 429 ratelimited to calls of `method` past `calls` in any `seconds`."""
        with self.lock:
            self.limits[method] = (calls, seconds)

    def throttled(self, method: str) -> int:
        """How many calls of `method` were answered 429."""
        with self.lock:
            return sum(1 for c in self.calls if c.method == method and c.status == 429)

    def deactivate(self, user: str) -> None:
        with self.lock:
            self.deactivated.add(user)

    def called(self, method: str, *, ok: bool | None = None) -> list[Call]:
        with self.lock:
            return [
                c
                for c in self.calls
                if c.method == method and (ok is None or c.answer.get("ok") == ok)
            ]

    def posts(self) -> list[Posted]:
        with self.lock:
            return sorted(
                (m for ms in self.messages.values() for m in ms), key=lambda m: float(m.ts)
            )

    def message(self, channel: str, ts: str) -> Posted | None:
        with self.lock:
            return next((m for m in self.messages.get(channel, []) if m.ts == ts), None)

    # --- the API ---------------------------------------------------------------------------------

    def answer(
        self, method: str, params: dict[str, Any], token: str | None
    ) -> tuple[int, dict, dict]:
        """(status, headers, body) for one call; records it."""
        with self.lock:
            status, headers, body = self._answer(method, params, token)
            self.calls.append(Call(method, params, token, status, body))
        return status, headers, body

    def _answer(
        self, method: str, params: dict[str, Any], token: str | None
    ) -> tuple[int, dict, dict]:
        queued = self.failures.get(method) or []
        if queued:
            failure = queued[0]
            failure.times -= 1
            if failure.times <= 0:
                queued.pop(0)
            headers = (
                {"Retry-After": str(int(failure.retry_after))}
                if failure.retry_after is not None
                else {}
            )
            return failure.status, headers, {"ok": False, "error": failure.error}
        if token != self.TOKEN:
            return 200, {}, {"ok": False, "error": "invalid_auth" if token else "not_authed"}
        if method in self.limits:
            calls, seconds = self.limits[method]
            now = self.now()
            recent = [t for t in self._recent.get(method, []) if t > now - seconds]
            if len(recent) >= calls:
                wait = max(1, int(recent[0] + seconds - now + 1))
                return 429, {"Retry-After": str(wait)}, {"ok": False, "error": "ratelimited"}
            self._recent[method] = [*recent, now]
        handler = getattr(self, "_" + method.replace(".", "_"), None)
        if handler is None:
            return 200, {}, {"ok": False, "error": "unknown_method"}
        return 200, {}, handler(params)

    @staticmethod
    def _error(error: str) -> dict:
        return {"ok": False, "error": error}

    def _auth_test(self, params: dict) -> dict:
        return {
            "ok": True,
            "url": "https://clarion-test.slack.com/",
            "team": "Clarion test",
            "user": "clarion",
            "team_id": self.TEAM,
            "user_id": self.BOT_USER,
            "bot_id": "BCLARION",
        }

    def _conversations_open(self, params: dict) -> dict:
        users = str(params.get("users") or "")
        if not users or "," in users:
            return self._error("not_enough_users" if not users else "invalid_user_combination")
        if not users.startswith(("U", "W")):
            return self._error("user_not_found")
        if users in self.deactivated:
            return self._error("user_disabled")
        channel = "D" + users
        self.messages.setdefault(channel, [])
        return {"ok": True, "channel": {"id": channel}}

    def _chat_postMessage(self, params: dict) -> dict:  # noqa: N802 - the Slack method name
        channel = str(params.get("channel") or "")
        if channel not in self.messages:
            return self._error("channel_not_found")
        if not (params.get("text") or params.get("blocks")):
            return self._error("no_text")
        ts = f"{self.now():.0f}.{next(self._counter):06d}"
        posted = Posted(
            channel, ts, params.get("text", ""), params.get("blocks") or [], params.get("metadata")
        )
        self.messages[channel].append(posted)
        return {"ok": True, "channel": channel, "ts": ts, "message": self._wire(posted, True)}

    def _chat_update(self, params: dict) -> dict:
        posted = next(
            (
                m
                for m in self.messages.get(str(params.get("channel")), [])
                if m.ts == params.get("ts")
            ),
            None,
        )
        if posted is None:
            return self._error("message_not_found")
        posted.blocks = params.get("blocks") or posted.blocks
        posted.text = params.get("text", posted.text)
        posted.updates.append(posted.blocks)
        posted.update_texts.append(posted.text)
        return {"ok": True, "channel": posted.channel, "ts": posted.ts, "text": posted.text}

    def _chat_postEphemeral(self, params: dict) -> dict:  # noqa: N802 - the Slack method name
        if not params.get("channel") or not params.get("user"):
            return self._error("channel_not_found")
        return {"ok": True, "message_ts": f"{self.now():.0f}.{next(self._counter):06d}"}

    def _conversations_history(self, params: dict) -> dict:
        channel = str(params.get("channel") or "")
        if channel not in self.messages:
            return self._error("channel_not_found")
        oldest = float(params.get("oldest") or 0)
        limit = min(int(params.get("limit") or 100), 999)
        found = [m for m in reversed(self.messages[channel]) if float(m.ts) > oldest]
        with_metadata = _truthy(params.get("include_all_metadata"))
        return {
            "ok": True,
            "messages": [self._wire(m, with_metadata) for m in found[:limit]],
            "has_more": len(found) > limit,
        }

    def _views_publish(self, params: dict) -> dict:
        view = params.get("view")
        if not params.get("user_id") or not isinstance(view, dict):
            return self._error("invalid_arguments")
        self.views[str(params["user_id"])] = view
        return {"ok": True, "view": {"id": "V1", **view}}

    def _wire(self, posted: Posted, with_metadata: bool) -> dict:
        message: dict[str, Any] = {
            "type": "message",
            "user": self.BOT_USER,
            "bot_id": "BCLARION",
            "ts": posted.ts,
            "text": posted.text,
            "blocks": posted.blocks,
        }
        if with_metadata and posted.metadata:
            message["metadata"] = posted.metadata
        return message

    # --- HTTP --------------------------------------------------------------------------------------

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                path, _, query = self.path.partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                params = _parse(self.headers.get("Content-Type", ""), body, query)
                auth = self.headers.get("Authorization", "")
                token = (
                    auth.removeprefix("Bearer ")
                    if auth.startswith("Bearer ")
                    else params.get("token")
                )
                method = path.removeprefix("/api/")
                status, headers, answer = fake.answer(method, params, token)
                if fake.losses.apply(self):
                    return
                data = json.dumps(answer).encode()
                self.send_response(status)
                for name, value in {
                    "Content-Type": "application/json; charset=utf-8",
                    **headers,
                }.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST  # noqa: N815 - Slack accepts GET with a query string too

            def log_message(self, *args: object) -> None:
                pass

        return Handler


# --- Slack's side of clarion's endpoint: signed requests ------------------------------------------


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """Slack's request signature: v0= HMAC-SHA256 of "v0:{timestamp}:{body}"."""
    base = f"v0:{timestamp}:".encode() + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def signed(
    secret: str, body: bytes, *, content_type: str, at: float | None = None
) -> dict[str, str]:
    """Headers for a request as Slack sends it (timestamp `at`, default now)."""
    timestamp = str(int(time.time() if at is None else at))
    return {
        "Content-Type": content_type,
        "X-Slack-Request-Timestamp": timestamp,
        "X-Slack-Signature": sign(secret, timestamp, body),
    }


def block_actions(
    user: str,
    value: Any,
    *,
    action_id: str,
    channel: str = "D0",
    ts: str = "1.000001",
    team: str = FakeSlack.TEAM,
) -> bytes:
    """A form-encoded block_actions interaction (payload=<JSON>), as Slack posts a button click."""
    payload = {
        "type": "block_actions",
        "team": {"id": team, "domain": "clarion-test"},
        "user": {"id": user, "team_id": team},
        "api_app_id": "ACLARION",
        "token": "legacy",
        "container": {
            "type": "message",
            "message_ts": ts,
            "channel_id": channel,
            "is_ephemeral": False,
        },
        "channel": {"id": channel, "name": "directmessage"},
        "trigger_id": "1.2.3",
        "message": {"type": "message", "ts": ts, "text": ""},
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "clarion_answers",
                "value": value,
                "action_ts": f"{time.time():.6f}",
            }
        ],
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def event_callback(event: dict[str, Any], *, team: str = FakeSlack.TEAM) -> bytes:
    """An Events API delivery (JSON), e.g. app_home_opened."""
    return json.dumps(
        {
            "token": "legacy",
            "team_id": team,
            "api_app_id": "ACLARION",
            "event": event,
            "type": "event_callback",
            "event_id": f"Ev{time.time_ns()}",
            "event_time": int(time.time()),
        }
    ).encode()


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free local port, in a thread; yields its base URL."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
