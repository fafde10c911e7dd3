"""Apps' webhook endpoints for outbound events, under /v1/webhook-endpoints (scope webhooks:manage).

- `POST /v1/webhook-endpoints` registers one: its URL, the event kinds it wants (`*`: all) and an
  optional `whsec_` secret (else one is made). 201 with the secret: the only time it is shown,
  until a rotation.
- `GET /v1/webhook-endpoints` lists them, `GET /v1/webhook-endpoints/{id}` shows one.
- `PATCH /v1/webhook-endpoints/{id}` changes the URL, kinds or description, enables (an endpoint
  disabled after a day of failures) or disables, and `rotate_secret: true` makes a new secret while
  the previous one keeps signing for `overlap_seconds` (default CLARION_EVENTS_OVERLAP).
- `DELETE /v1/webhook-endpoints/{id}`: gone, with the events it had not taken.

The checks are tasks/event_endpoints.py's, shared with `clarion events endpoints`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from clarion.db.api_keys import ApiKey
from clarion.db.schema import EVENT_KINDS
from clarion.errors import UnknownEndpoint
from clarion.tasks import event_endpoints
from clarion.web.api import RowId, body_doc, modelled, read_json, refusals, shaped
from clarion.web.api_auth import require
from clarion.web.api_errors import ApiError, AsciiJSONResponse
from clarion.web.api_models import Strict

BODY_BYTES = 64 * 1024  # above the most the models allow, escaped: a 413 is never a shape error
router = APIRouter(prefix="/v1", default_response_class=AsciiJSONResponse)
Manage = Annotated[ApiKey, Depends(require("webhooks:manage"))]
Kind = Annotated[str, Field(max_length=64)]
KINDS_DOC = f"Event kinds wanted, or ['*'] for all: {', '.join(EVENT_KINDS)}."


class EndpointCreate(Strict):
    url: str = Field(examples=["https://app.example/clarion-events"], max_length=2000)
    kinds: list[Kind] = Field(description=KINDS_DOC, examples=[["delivery.bounced"]], max_length=50)
    description: str = Field(default="", max_length=500)
    secret: str | None = Field(
        default=None,
        max_length=200,
        description="A Standard Webhooks secret (whsec_…); omitted: one is made.",
    )


class EndpointPatch(Strict):
    url: str | None = Field(default=None, max_length=2000)
    kinds: list[Kind] | None = Field(default=None, description=KINDS_DOC, max_length=50)
    description: str | None = Field(default=None, max_length=500)
    enabled: bool | None = Field(
        default=None, description="true re-enables (and clears the alert); false disables."
    )
    rotate_secret: bool = Field(default=False, description="Make a new secret; shown once.")
    overlap_seconds: int | None = Field(
        default=None, ge=0, le=30 * 86400, description="How long the old secret still signs."
    )


class WebhookEndpoint(BaseModel):
    id: int
    url: str
    kinds: list[str]
    description: str
    enabled: bool
    disabled_reason: str
    failing_since: datetime | None
    previous_secret_until: datetime | None
    created_at: datetime
    updated_at: datetime
    secret: str | None = Field(default=None, description="Only when created or rotated.")


class WebhookEndpoints(BaseModel):
    items: list[WebhookEndpoint]


def _gone(exc: UnknownEndpoint) -> ApiError:
    return ApiError(404, "not_found", "endpoint_id", str(exc))


@router.post(
    "/webhook-endpoints",
    status_code=201,
    response_model=WebhookEndpoint,
    responses=refusals(400, 413, 415),
    openapi_extra=body_doc(EndpointCreate),
    summary="Register an endpoint for outbound events (scope webhooks:manage)",
)
async def post_endpoint(request: Request, key: Manage) -> Response:
    body = shaped(EndpointCreate, await read_json(request, BODY_BYTES))
    made = await run_in_threadpool(
        event_endpoints.create,
        body.url,
        body.kinds,
        description=body.description,
        secret=body.secret,
    )
    return modelled(WebhookEndpoint, event_endpoints.shown(made, with_secret=True), 201)


@router.get(
    "/webhook-endpoints",
    response_model=WebhookEndpoints,
    responses=refusals(),
    summary="The endpoints for outbound events (scope webhooks:manage)",
)
def list_endpoints(key: Manage) -> dict[str, Any]:
    return {"items": [event_endpoints.shown(e) for e in event_endpoints.listed()]}


@router.get(
    "/webhook-endpoints/{endpoint_id}",
    response_model=WebhookEndpoint,
    responses=refusals(404),
    summary="One endpoint for outbound events (scope webhooks:manage)",
)
def get_endpoint(endpoint_id: RowId, key: Manage) -> dict[str, Any]:
    try:
        return event_endpoints.shown(event_endpoints.get(endpoint_id))
    except UnknownEndpoint as exc:
        raise _gone(exc) from exc


@router.patch(
    "/webhook-endpoints/{endpoint_id}",
    response_model=WebhookEndpoint,
    responses=refusals(400, 404, 413, 415),
    openapi_extra=body_doc(EndpointPatch),
    summary="Change, enable, disable or rotate the secret of an endpoint (scope webhooks:manage)",
)
async def patch_endpoint(request: Request, endpoint_id: RowId, key: Manage) -> Response:
    body = shaped(EndpointPatch, await read_json(request, BODY_BYTES))
    try:
        changed = await run_in_threadpool(
            lambda: event_endpoints.change(
                endpoint_id,
                url=body.url,
                kinds=body.kinds,
                description=body.description,
                enabled=body.enabled,
                rotate=body.rotate_secret,
                overlap=body.overlap_seconds,
            )
        )
    except UnknownEndpoint as exc:
        raise _gone(exc) from exc
    return modelled(WebhookEndpoint, event_endpoints.shown(changed, with_secret=body.rotate_secret))


@router.delete(
    "/webhook-endpoints/{endpoint_id}",
    status_code=204,
    responses=refusals(404),
    summary="Remove an endpoint and the events it had not taken (scope webhooks:manage)",
)
def delete_endpoint(endpoint_id: RowId, key: Manage) -> Response:
    try:
        event_endpoints.remove(endpoint_id)
    except UnknownEndpoint as exc:
        raise _gone(exc) from exc
    return Response(status_code=204)


BODIES = (EndpointCreate, EndpointPatch)  # documented by web.api.openapi (bodies read by hand)
