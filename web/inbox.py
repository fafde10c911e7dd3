"""The in-app inbox over HTTP: the feed, marks, and a live stream of server-sent events.

    GET  /v1/inbox/{user_id}          ?before=<id>&limit=<1..100>&archived=true
         -> {"items": [...], "unread": n, "next": <id>|null, "cursor": "<event id>"}
    POST /v1/inbox/{user_id}/mark     {"as": "seen"|"read"|"archived", "ids": [1, 2]}
                                      or {"as": "read", "all": true}
         -> {"changed": [ids], "unread": n}
    GET  /v1/inbox/{user_id}/stream   text/event-stream; resumes after Last-Event-ID (the header
         an EventSource sends on reconnect, or ?last_event_id=, e.g. the feed's `cursor`)

The three are FastAPI routes only to be in /openapi.json (security scheme InboxToken, the shapes of
web/api_models.py): each reads its own parameters, as FastAPI's would be checked before the token.

Every request carries a token from tasks.inbox.inbox_token(user_id, ttl), as
`Authorization: Bearer <token>` or `?token=` (an EventSource cannot set headers); a missing,
foreign or expired one is 401, checked before anything else is read. Bad input is a 400 naming
the field.

The stream sends `ready` (once, its id the starting point), `item` (a new item), `updated` (an
item changed: a collapse follower counted, marked on another page), each with the whole item as
JSON, and a `: ping` comment every CLARION_INBOX_HEARTBEAT seconds. After a resume an item may
come twice: clients keep the latest by (id, updated_at). Each web process holds one LISTEN
connection (NOTIFY from db.inbox) and wakes the streams of the user named; a stream then reads
its changes by cursor, so a missed notification costs at most a heartbeat, never an item.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from fastapi import Security
from fastapi.routing import APIRoute
from fastapi.security import APIKeyQuery, HTTPBearer
from pydantic import TypeAdapter
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from clarion import settings
from clarion.db import inbox as store
from clarion.db.engine import driver_args, engine
from clarion.db.inbox import Cursor, Item
from clarion.tasks import inbox
from clarion.validation import USER_ID_BYTES
from clarion.web.api_models import MAX_MARK_IDS, InboxFeed, InboxMarked, ItemId
from clarion.web.inbound import Refused, decode_json, read_body, refusal

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024
RECONNECT = 2.0  # seconds before the LISTEN connection is tried again


# --- the doors --------------------------------------------------------------------------------------


def _authorised(request: Request) -> str:
    """The user the path names, if the request's token is theirs; else Refused(401)."""
    user_id = request.path_params["user_id"]
    header = request.headers.get("authorization", "")
    token = header[7:] if header[:7].lower() == "bearer " else request.query_params.get("token")
    if not token or len(token) > 200 or not inbox.check_token(token, user_id):
        raise Refused(401, "missing or bad inbox token")
    if len(user_id.encode("utf-8", "surrogatepass")) > USER_ID_BYTES or "\x00" in user_id:
        raise Refused(400, "user_id: not a user id")
    return user_id


def _int(raw: str | None, field: str, low: int, high: int) -> int | None:
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 18) or not low <= int(raw) <= high:
        raise Refused(400, f"{field}: expected an integer from {low} to {high}")
    return int(raw)


async def list_feed(request: Request) -> Response:
    try:
        user_id = _authorised(request)
        query = request.query_params
        before = _int(query.get("before"), "before", 1, 2**63 - 1)
        limit = _int(query.get("limit"), "limit", 1, store.MAX_PAGE) or 50
        archived = query.get("archived", "false")
        if archived not in ("true", "false"):
            raise Refused(400, "archived: expected true or false")
    except Refused as error:
        return refusal(error, "inbox")
    page = await run_in_threadpool(
        inbox.feed, user_id, before_id=before, limit=limit, include_archived=archived == "true"
    )
    return JSONResponse(
        {
            "items": [i.to_json() for i in page.items],
            "unread": page.unread,
            "next": page.next,
            "cursor": page.cursor.encode(),
        }
    )


def _mark_body(raw: bytes) -> tuple[str, list[int] | None]:
    """(what, ids), ids None for every unread item."""
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise Refused(400, "body: expected an object")
    what = body.get("as")
    if what not in store.MARKS:
        raise Refused(400, f"as: expected one of {', '.join(store.MARKS)}")
    if body.get("all") is True:
        if what != "read" or "ids" in body:
            raise Refused(400, "all: only with as=read and no ids")
        return what, None
    ids = body.get("ids")
    if not isinstance(ids, list) or not 0 < len(ids) <= MAX_MARK_IDS:
        raise Refused(400, f"ids: expected a list of 1 to {MAX_MARK_IDS} item ids")
    for n, value in enumerate(ids):
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63):
            raise Refused(400, f"ids[{n}]: expected an item id")
    return what, ids


async def mark(request: Request) -> Response:
    try:
        user_id = _authorised(request)
        what, ids = _mark_body(await read_body(request, MAX_BODY))
    except Refused as error:
        return refusal(error, "inbox")
    if ids is None:
        changed = await run_in_threadpool(inbox.mark_all_read, user_id)
    else:
        changed = await run_in_threadpool(inbox.mark, user_id, ids, what)
    unread = await run_in_threadpool(inbox.unread_count, user_id)
    return JSONResponse({"changed": changed, "unread": unread})


async def stream(request: Request) -> Response:
    try:
        user_id = _authorised(request)
        raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        since = Cursor.decode(raw) if raw else None
        if raw and since is None:
            raise Refused(400, "Last-Event-ID: not an event id of this stream")
    except Refused as error:
        return refusal(error, "inbox")
    return EventStream(
        _events(user_id, since, listener(), settings.get().inbox_heartbeat),
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class EventStream(StreamingResponse):
    media_type = "text/event-stream"


# --- the doors in the OpenAPI document --------------------------------------------------------------

TOKEN = "a token from `tasks.inbox.inbox_token(user_id, ttl)`"
SECURITY = [
    Security(HTTPBearer(auto_error=False, scheme_name="InboxToken", description=f"Bearer {TOKEN}")),
    Security(
        APIKeyQuery(
            name="token",
            auto_error=False,
            scheme_name="InboxTokenQuery",
            description=f"`?token=`, {TOKEN} (an EventSource cannot set headers)",
        )
    ),
]
REFUSAL = {"application/json": {"schema": {"$ref": "#/components/schemas/InboxRefusal"}}}
USER = {
    "name": "user_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[^/]+$"},  # one path segment, as the route reads it
    "examples": {"recipient": {"value": "user-42"}},
}
ITEM_ID = TypeAdapter(ItemId).json_schema()
EVENT_ID = {"type": "string", "pattern": r"^[0-9]{1,18}\.[0-9]{1,18}$"}  # Cursor.decode's


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def _door(
    path: str,
    endpoint: Any,
    method: str,
    *,
    summary: str,
    answer: str,
    refusals: tuple[int, ...],
    parameters: tuple[dict[str, Any], ...] = (),
    body: str | None = None,
    **route: Any,
) -> APIRoute:
    """One door as the document shows it: the token's scheme, its parameters and (by reference
    to a component schema) its body, its answer and its refusals' shape."""
    extra: dict[str, Any] = {"parameters": [USER, *parameters]}
    if body:
        schema = {"$ref": f"#/components/schemas/{body}"}
        extra["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    responses: dict[int | str, dict[str, Any]] = {200: {"description": answer}}
    responses.update({status: {"content": REFUSAL} for status in refusals})
    return APIRoute(
        path,
        endpoint,
        methods=[method],
        summary=summary,
        dependencies=SECURITY,
        responses=responses,
        openapi_extra=extra,
        **route,
    )


def routes() -> list[Route]:
    return [
        _door(
            "/v1/inbox/{user_id}",
            list_feed,
            "GET",
            summary="A page of the recipient's inbox and its unread count",
            answer="The page, newest first; `next` pages on, `cursor` opens the stream after it.",
            refusals=(400, 401),
            parameters=(
                _query("before", ITEM_ID, "Items older than this id (the last page's `next`)."),
                _query(
                    "limit",
                    {"type": "integer", "minimum": 1, "maximum": store.MAX_PAGE},
                    "At most this many items (default 50).",
                ),
                _query("archived", {"type": "boolean"}, "Include archived items (default false)."),
            ),
            response_model=InboxFeed,
        ),
        _door(
            "/v1/inbox/{user_id}/mark",
            mark,
            "POST",
            summary="Mark items seen, read or archived, or every unread item read",
            answer="The items this call changed, and the unread count after it.",
            refusals=(400, 401, 413),
            body="InboxMark",
            response_model=InboxMarked,
        ),
        _door(
            "/v1/inbox/{user_id}/stream",
            stream,
            "GET",
            summary="The recipient's inbox changes as server-sent events",
            answer="`ready` once (its id the starting point), then `item` (new) and `updated` "
            "(changed) events whose data is the whole InboxItem as JSON, and a `: ping` comment "
            "every CLARION_INBOX_HEARTBEAT seconds. It does not end.",
            refusals=(400, 401),
            parameters=(
                _query(
                    "last_event_id",
                    EVENT_ID,
                    "Resume after this event id (e.g. the feed's `cursor`); the header wins.",
                ),
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "schema": EVENT_ID,
                    "description": "What an EventSource sends when it reconnects.",
                },
            ),
            response_class=EventStream,
        ),
    ]


# --- the stream -------------------------------------------------------------------------------------


def frame(event: str, data: Any, event_id: str | None = None) -> str:
    """One server-sent event (data as one line of JSON: no newline can split it)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _head(user_id: str) -> Cursor:
    with engine().connect() as conn:
        return store.head(conn, user_id)


def _changes(user_id: str, since: Cursor) -> tuple[list[Item], Cursor]:
    with engine().connect() as conn:
        return store.changes(conn, user_id, since)


async def _events(
    user_id: str, since: Cursor | None, hub: Listener, heartbeat: float
) -> AsyncIterator[str]:
    wake = await hub.subscribe(user_id)  # listening before the start point is read: no gap
    try:
        cursor = since if since is not None else await run_in_threadpool(_head, user_id)
        yield "retry: 2000\n" + frame("ready", {"user_id": user_id}, cursor.encode())
        sent: dict[int, tuple[int, int]] = {}  # item id -> (rev, wxid) this connection sent
        while True:
            wake.clear()
            full = True
            while full:
                items, cursor = await run_in_threadpool(_changes, user_id, cursor)
                full = len(items) == store.MAX_PAGE
                for item in items:
                    if sent.get(item.id, (0, 0))[0] == item.rev:
                        continue  # selected again only because its writer might have been late
                    sent[item.id] = (item.rev, item.wxid)
                    kind = "item" if item.created_rev == item.rev else "updated"
                    yield frame(kind, item.to_json(), Cursor(item.rev, cursor.xmin).encode())
            for item_id in [k for k, (_, wxid) in sent.items() if wxid < cursor.xmin]:
                del sent[item_id]  # no query can select it again without a new revision
            try:
                await asyncio.wait_for(wake.wait(), heartbeat)
            except TimeoutError:
                yield ": ping\n\n"
    finally:
        hub.unsubscribe(user_id, wake)


class Listener:
    """One LISTEN connection for the streams open on one event loop; runs while any is open."""

    def __init__(self) -> None:
        self.waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        self.ready = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def subscribe(self, user_id: str) -> asyncio.Event:
        wake = asyncio.Event()
        self.waiters[user_id].add(wake)
        if self.task is None or self.task.done():
            self.ready.clear()
            self.task = asyncio.create_task(self._run())
        await self.ready.wait()
        return wake

    def unsubscribe(self, user_id: str, wake: asyncio.Event) -> None:
        self.waiters[user_id].discard(wake)
        if not self.waiters[user_id]:
            del self.waiters[user_id]
        if not self.waiters and self.task is not None:
            self.task.cancel()
            self.task = None

    def wake(self, user_id: str | None) -> None:
        for users in [self.waiters.get(user_id, set())] if user_id else self.waiters.values():
            for event in users:
                event.set()

    async def _run(self) -> None:
        # LISTEN needs a session: a transaction pooler's connection would hear nothing
        direct = settings.get().listen_database_url
        if direct is None and settings.get().database_pooler == "transaction":
            log.warning(
                "no LISTEN behind a transaction pooler: set CLARION_LISTEN_DATABASE_URL; "
                "in-app streams see new items at their heartbeat only",
                extra={"action": "inbox_unlisten"},
            )
            self.ready.set()
            return
        direct = direct or settings.get().urls()[0]
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **driver_args(direct), autocommit=True
                ) as conn:
                    await conn.execute(f"LISTEN {store.NOTIFY_CHANNEL}")
                    self.ready.set()
                    self.wake(None)  # whatever was missed while not listening
                    async for note in conn.notifies():
                        self.wake(_user_of(note.payload))
            except psycopg.Error as exc:
                log.warning(
                    "inbox listener lost its connection: %s",
                    exc,
                    extra={"action": "inbox_unlisten"},
                )
            self.ready.set()  # streams fall back to their heartbeat until it is back
            await asyncio.sleep(RECONNECT)


def _user_of(payload: str) -> str | None:
    with contextlib.suppress(ValueError, AttributeError):
        user = json.loads(payload).get("u")
        return user if isinstance(user, str) else None
    return None


_listeners: dict[asyncio.AbstractEventLoop, Listener] = {}


def listener() -> Listener:
    """This event loop's listener."""
    loop = asyncio.get_running_loop()
    for gone in [k for k in _listeners if k.is_closed()]:
        del _listeners[gone]
    if loop not in _listeners:
        _listeners[loop] = Listener()
    return _listeners[loop]
