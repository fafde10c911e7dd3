"""The HTTP API under /v1 (FastAPI): ingest, request reports and preferences, with OpenAPI at
/openapi.json and human docs at /docs.

Why FastAPI rather than Starlette plus a schema library: it *is* a Starlette subclass (the Slack
and Teams routes keep working unchanged), and it derives the OpenAPI document from the same
pydantic models that check the bodies, so the docs cannot drift from what is enforced.

Every door here checks in the same order, and stops at the first refusal: the API key (401/403),
its rate (429), the Content-Type (415), the body's size (413), that it is JSON (400), its shape
(422), then notify()'s own checks (422). Bodies are read by hand, after the key is checked, rather
than declared as FastAPI body parameters: FastAPI parses a declared body *before* it runs the
dependencies that authenticate, so an anonymous caller could make us parse 5 MiB of JSON.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from clarion import clock
from clarion.db import activity
from clarion.db.api_keys import ApiKey
from clarion.db.engine import engine
from clarion.errors import ClarionError, InvalidRequest, UnknownRecipient
from clarion.tasks import recipients
from clarion.tasks.preferences import get_preferences, parse_setting, set_preferences
from clarion.web.activity_view import timeline
from clarion.web.api_auth import authorize, authorize_held, require, user_id_checked
from clarion.web.api_errors import (
    ApiError,
    AsciiJSONResponse,
    api_error_handler,
    from_pydantic,
    safe_field,
    validation_handler,
)
from clarion.web.api_ingest import Answer, idempotency_key, ingest, inline_recipient
from clarion.web.api_models import (
    Accepted,
    Batch,
    BatchAccepted,
    ErasedRecipient,
    Error,
    Event,
    InboxMark,
    InboxRefusal,
    Preferences,
    PreferencesPut,
    Recipient,
    RecipientPut,
    RequestReport,
)
from clarion.web.inbound import Refused, local_path, read_body

EVENT_BYTES = 256 * 1024
BATCH_BYTES = 5 * 1024 * 1024
PREFERENCES_BYTES = 64 * 1024
RECIPIENT_BYTES = 64 * 1024

router = APIRouter(prefix="/v1", default_response_class=AsciiJSONResponse)


def refusals(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": Error} for s in (401, 403, 422, 429, *statuses)}


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON: application/json (UTF-8), at most max_bytes."""
    media, _, params = (request.headers.get("content-type") or "").partition(";")
    charset = params.strip().lower().replace(" ", "")
    if media.strip().lower() != "application/json" or charset not in ("", "charset=utf-8"):
        raise ApiError(415, "unsupported_media_type", "Content-Type", "send application/json")
    try:
        raw = await read_body(request, max_bytes)
    except Refused as exc:
        code = "body_too_large" if exc.status == 413 else "invalid_header"
        raise ApiError(
            exc.status, code, "body" if exc.status == 413 else "Content-Length", exc.reason
        ) from exc
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ApiError(
            400, "invalid_json", "body", f"is not UTF-8 JSON ({type(exc).__name__})"
        ) from exc


def shaped(model: type[BaseModel], payload: Any) -> Any:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise from_pydantic(exc.errors(include_url=False, include_input=False)) from exc
    except RecursionError as exc:
        raise ApiError(422, "invalid_field", "body", "nests too deep") from exc


def modelled(model: type[BaseModel], body: Any, status: int = 200) -> Response:
    """`body` as `model` shows it (its fields, none more), with `status`."""
    return AsciiJSONResponse(model.model_validate(body).model_dump(mode="json"), status_code=status)


def _answer(answer: Answer) -> Response:
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else {}
    return Response(
        answer.content, status_code=answer.status, headers=headers, media_type="application/json"
    )


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


EventsWrite = Annotated[ApiKey, Depends(require("events:write"))]
RequestsRead = Annotated[ApiKey, Depends(require("requests:read"))]
PreferencesRead = Annotated[ApiKey, Depends(require("preferences:read"))]
PreferencesWrite = Annotated[ApiKey, Depends(require("preferences:write"))]
RecipientsRead = Annotated[ApiKey, Depends(require("recipients:read"))]
RecipientsWrite = Annotated[ApiKey, Depends(require("recipients:write"))]
RecipientsErase = Annotated[ApiKey, Depends(require("recipients:erase"))]
UserId = Annotated[str, Path(description="A registered recipient.", examples=["user-42"])]
RowId = Annotated[int, Path(ge=1, le=2**63 - 1, examples=[1])]  # a bigint identity in a path
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retry safely: the same key and body get the first answer again (24 h).",
    ),
]


@router.post(
    "/events",
    status_code=202,
    response_model=Accepted,
    responses=refusals(400, 413, 415),
    openapi_extra=body_doc(Event),
    summary="Request one notification (scope events:write)",
)
async def post_event(request: Request, key: EventsWrite, idem: IdempotencyKey = None) -> Response:
    payload = await read_json(request, EVENT_BYTES)
    event = shaped(Event, payload)
    answer = await ingest(key, idempotency_key(idem), "/v1/events", payload, [event], batch=False)
    return _answer(answer)


@router.post(
    "/events/batch",
    status_code=202,
    response_model=BatchAccepted,
    responses=refusals(400, 413, 415),
    openapi_extra=body_doc(Batch),
    summary="Request up to 500 notifications, all or none (scope events:write)",
)
async def post_events(request: Request, key: EventsWrite, idem: IdempotencyKey = None) -> Response:
    payload = await read_json(request, BATCH_BYTES)
    batch = shaped(Batch, payload)
    answer = await ingest(
        key, idempotency_key(idem), "/v1/events/batch", payload, batch.items, batch=True
    )
    return _answer(answer)


async def _served_first(request: Request) -> Response:
    """POST /v1/events and /v1/events/batch as plain Starlette routes, ahead of FastAPI's: the
    same functions and checks in the same order, without FastAPI's per-request dependency solving
    (about a third of a request's CPU when measured). FastAPI's routes stay for the OpenAPI
    document. A key this process has cached, with a unit of its rate reserved here
    (api_auth.Reserve), is checked on the event loop with no I/O; otherwise the check (a database
    read, a Redis round trip) runs on asyncio's own executor, lighter than anyio's threads."""
    header = request.headers.get("authorization")
    key = authorize_held(header, "events:write")
    if key is None:
        loop = asyncio.get_running_loop()
        key = await loop.run_in_executor(None, authorize, header, "events:write")
    idem = request.headers.get("idempotency-key")
    door = post_events if request.url.path.endswith("/batch") else post_event
    return await door(request, key, idem)


SERVED_FIRST = [
    Route("/v1/events", _served_first, methods=["POST"]),
    Route("/v1/events/batch", _served_first, methods=["POST"]),
]


def _not_found(user_id: str) -> ApiError:
    return ApiError(404, "unknown_recipient", "user_id", f"unknown recipient {user_id[:80]!r}")


@router.get(
    "/requests/{request_id}",
    response_model=RequestReport,
    responses=refusals(404),
    summary="A request, its decisions, deliveries, receipts, incidents and outbound events "
    "(scope requests:read)",
)
def get_request(
    request_id: RowId,
    user_id: Annotated[
        str,
        Query(description="The recipient: request ids are unique per user.", examples=["user-42"]),
    ],
    key: RequestsRead,
) -> dict[str, Any]:
    user = user_id_checked(user_id)
    with engine().connect() as conn:
        found = activity.request(conn, user, request_id)
    if found is None:
        raise ApiError(404, "not_found", "request_id", f"no request {request_id} for this user_id")
    body = asdict(found)
    steps = [asdict(s) for s in timeline(found, clock.now())]
    return {**body, "type": body.pop("type_key"), "event_id": found.event_id, "timeline": steps}


@router.get(
    "/users/{user_id:path}/preferences",
    response_model=Preferences,
    responses=refusals(404),
    summary="A recipient's settings and the resolved type × channel matrix (preferences:read)",
)
def get_user_preferences(user_id: UserId, key: PreferencesRead) -> dict[str, Any]:
    user = user_id_checked(user_id)
    try:
        return get_preferences(user)
    except UnknownRecipient as exc:
        raise _not_found(user) from exc


@router.put(
    "/users/{user_id:path}/preferences",
    response_model=Preferences,
    responses=refusals(400, 404, 413, 415),
    openapi_extra=body_doc(PreferencesPut),
    summary="Change settings; null removes one, settings not named are kept (preferences:write)",
)
async def put_user_preferences(
    request: Request, user_id: UserId, key: PreferencesWrite
) -> Response:
    user = user_id_checked(user_id)
    changes = shaped(PreferencesPut, await read_json(request, PREFERENCES_BYTES)).settings
    body = await run_in_threadpool(_set_preferences, user, changes)
    return modelled(Preferences, body)


def _set_preferences(user: str, changes: dict[str, bool | None]) -> dict[str, Any]:
    """Merge, not replace: a client that sends only what it changes must not re-subscribe the
    recipient to everything it left out (a replacing PUT's failure mode sends unwanted mail)."""
    for name, enabled in changes.items():
        try:
            parse_setting(name, enabled)
        except InvalidRequest as exc:
            raise ApiError(422, "invalid_field", safe_field(f"settings.{name}"), str(exc)) from exc
    try:
        set_preferences(user, changes)
        return get_preferences(user)
    except UnknownRecipient as exc:
        raise _not_found(user) from exc


# Declared after the preferences routes: `{user_id:path}` would otherwise take `.../preferences`.
@router.get(
    "/users/{user_id:path}",
    response_model=Recipient,
    responses=refusals(404),
    summary="A recipient's settings; 404 when unknown or erased (scope recipients:read)",
)
def getuser_id_checked(user_id: UserId, key: RecipientsRead) -> dict[str, Any]:
    user = user_id_checked(user_id)
    found = recipients.read(user)
    if found is None:
        raise _not_found(user)
    return found


@router.put(
    "/users/{user_id:path}",
    response_model=Recipient,
    responses={**refusals(400, 413, 415), 201: {"model": Recipient}},
    openapi_extra=body_doc(RecipientPut),
    summary="Create (201) or replace (200) a recipient, as register_recipient() (recipients:write)",
)
async def putuser_id_checked(request: Request, user_id: UserId, key: RecipientsWrite) -> Response:
    user = user_id_checked(user_id)
    body = shaped(RecipientPut, await read_json(request, RECIPIENT_BYTES))
    fields = inline_recipient(user, body, "", member="")
    assert fields is not None
    created, found = await run_in_threadpool(_save_recipient, fields)
    return modelled(Recipient, found, 201 if created else 200)


def _save_recipient(fields: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    with engine().begin() as conn:
        created = recipients.save(conn, fields)
    found = recipients.read(fields["user_id"])
    assert found is not None  # just written; erasure of it in between would be a 404 race
    return created, found


@router.delete(
    "/users/{user_id:path}",
    response_model=ErasedRecipient,
    responses=refusals(404),
    summary="Erase a recipient's personal data; keys and hashed suppressions stay (recipients:erase)",
)
def deleteuser_id_checked(user_id: UserId, key: RecipientsErase) -> dict[str, Any]:
    user = user_id_checked(user_id)
    erased = recipients.forget(user)
    if erased is None:
        raise _not_found(user)
    return {"user_id": user, "erased_at": erased.erased_at, "changed": erased.changed}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Routing's 404/405 under /v1 in the API's shape; elsewhere FastAPI's default."""
    assert isinstance(exc, StarletteHTTPException)
    if not local_path(request).startswith("/v1/"):
        return await http_exception_handler(request, exc)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "refused")
    return AsciiJSONResponse(
        {"error": code, "field": None, "reason": str(exc.detail)},
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


def openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, plus the models it cannot see: request bodies (read by hand) and the
    inbox's refusal (named by reference: its stream's answer is not JSON)."""
    if app.openapi_schema is None:
        doc = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        from clarion.web.api_broadcasts import MODELS as broadcast_models
        from clarion.web.api_events import BODIES

        for model in (
            Event,
            Batch,
            PreferencesPut,
            RecipientPut,
            InboxMark,
            InboxRefusal,
            *BODIES,
            *broadcast_models,
        ):
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
        app.openapi_schema = doc
    return app.openapi_schema


def application(routes: Sequence[BaseRoute], *, docs: bool = True) -> FastAPI:
    """The ASGI app: `routes` (Slack, Teams, /healthz) and the /v1 API, docs at /docs (with
    docs=False, no /docs nor /openapi.json: `clarion web --admin-bind` serves them elsewhere)."""
    app = FastAPI(
        title="clarion",
        version="1",
        description="Notifications that cannot double-send. See docs/guides/http-api.md.",
        routes=list(routes),
        openapi_url="/openapi.json" if docs else None,
        docs_url="/docs" if docs else None,
        redoc_url=None,
        # FastAPI's native OpenTelemetry asks the global providers on every request, reading
        # os.environ each time: 14% of an ingest request's CPU when measured with nothing
        # configured. clarion exports Prometheus metrics; a host app traces at its own level.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.include_router(router)
    from clarion.web.escalation_ack import router as escalations  # it builds on this module

    app.include_router(escalations)
    from clarion.web.api_events import router as webhook_endpoints  # builds on this module too

    app.include_router(webhook_endpoints)
    from clarion.web.api_broadcasts import router as broadcasts  # it builds on this module

    app.include_router(broadcasts)
    app.router.routes[0:0] = SERVED_FIRST
    app.add_exception_handler(ClarionError, api_error_handler)
    app.add_exception_handler(RequestValidationError, validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]
    return app
