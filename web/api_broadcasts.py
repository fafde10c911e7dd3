"""Topics and broadcasts over HTTP (tasks/audiences.py, tasks/broadcasts.py).

- `PUT /v1/topics/{topic}/subscribers` and `DELETE …` with `{"user_ids": [...]}` (up to
  MAX_IDS a call; scope topics:write): join or leave in bulk; the answer counts what changed.
- `POST /v1/broadcasts` (broadcasts:write): start one (202), or with `"dry_run": true` plan it and
  write nothing (200). `Idempotency-Key` makes a retry return the first broadcast (the key is kept
  per API key, for as long as the broadcast).
- `GET /v1/broadcasts/{id}` (broadcasts:read): progress; `POST /v1/broadcasts/{id}/cancel`
  (broadcasts:write): stop it; `requested` then says how many recipients it reached first.

Bodies are read by hand after the key is checked, as in web/api.py, and refused in its shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from clarion.db.api_keys import ApiKey
from clarion.errors import UnknownBroadcast, UnknownRecipient
from clarion.tasks import audiences, broadcasts
from clarion.web.api import IdempotencyKey, RowId, body_doc, read_json, refusals, shaped
from clarion.web.api_auth import require
from clarion.web.api_errors import ApiError, AsciiJSONResponse

TOPIC_BYTES = 4 * 1024 * 1024  # MAX_IDS ids of the longest kind fit
BROADCAST_BYTES = 256 * 1024

router = APIRouter(prefix="/v1", default_response_class=AsciiJSONResponse)
TopicsWrite = Annotated[ApiKey, Depends(require("topics:write"))]
BroadcastsWrite = Annotated[ApiKey, Depends(require("broadcasts:write"))]
BroadcastsRead = Annotated[ApiKey, Depends(require("broadcasts:read"))]
Topic = Annotated[str, Path(description="A topic key.", examples=["newsletter"])]


class Subscribers(BaseModel):
    model_config = {"extra": "forbid", "strict": True}
    user_ids: list[str] = Field(
        description=f"1 to {audiences.MAX_IDS} registered recipients.", examples=[["user-42"]]
    )


class SubscribersChanged(BaseModel):
    topic: str
    changed: int  # joined now (PUT) or left now (DELETE)


class BroadcastPost(BaseModel):
    model_config = {"extra": "forbid", "strict": True}
    type: str = Field(examples=["newsletter"])
    audience: dict[str, Any] = Field(
        description='{"topic": key} and/or {"segment": {field: value or [values]}}; segment '
        "fields: country, locale, org, timezone, subdivision, and attributes.<name> for a "
        "recipient's custom attribute (compared as text: true, 12); an attribute no recipient "
        "was ever given is refused.",
        examples=[
            {"topic": "newsletter", "segment": {"country": ["DE", "AT"]}},
            {"segment": {"attributes.plan": ["pro", "team"], "attributes.beta": True}},
        ],
    )
    variables: dict[str, Any] | None = None
    at: str | None = Field(
        default=None,
        description="Omitted: now. An ISO 8601 instant with its offset, or HH:MM: that wall "
        "time in each recipient's own zone.",
        examples=["09:00", "2027-03-01T08:00:00+00:00"],
    )
    passed: Literal["tomorrow", "skip"] = Field(
        default="tomorrow", description="Recipients whose HH:MM already passed today."
    )
    dry_run: bool = Field(default=False, description="Plan and count; write nothing.")


class BroadcastStarted(BaseModel):
    id: int
    new: bool
    planned: int
    skipped: int
    first_at: datetime | None


class BroadcastProgress(BaseModel):
    id: int
    type: str
    state: str
    audience: dict[str, Any]
    at_local: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    next_at: datetime | None
    planned: int
    skipped: int
    requested: int
    sent: int
    waiting: int
    suppressed: dict[str, int]


class BroadcastDryRun(BaseModel):
    planned: int
    skipped: int
    deliver: int
    by_channel: dict[str, int]
    by_reason: dict[str, int]


MODELS = (Subscribers, BroadcastPost)


def _members(change: Callable[[str, list[str]], int]) -> Callable[..., Awaitable[dict[str, Any]]]:
    async def door(request: Request, topic: Topic, key: TopicsWrite) -> dict[str, Any]:
        body = shaped(Subscribers, await read_json(request, TOPIC_BYTES))
        try:
            changed = await run_in_threadpool(change, topic, body.user_ids)
        except UnknownRecipient as exc:
            raise ApiError(422, "unknown_recipient", "user_ids", str(exc)) from exc
        return {"topic": topic, "changed": changed}

    return door


for _method, _change, _summary in (
    ("PUT", audiences.subscribe, "Add recipients to a topic, in bulk (scope topics:write)"),
    ("DELETE", audiences.unsubscribe, "Remove recipients from a topic, in bulk (topics:write)"),
):
    router.add_api_route(
        "/topics/{topic}/subscribers",
        _members(_change),
        methods=[_method],
        response_model=SubscribersChanged,
        responses=refusals(400, 413, 415),
        openapi_extra=body_doc(Subscribers),
        summary=_summary,
        name=f"{_method.lower()}_subscribers",
    )


@router.post(
    "/broadcasts",
    status_code=202,
    response_model=BroadcastStarted,
    responses={**refusals(400, 413, 415), 200: {"model": BroadcastDryRun}},
    openapi_extra=body_doc(BroadcastPost),
    summary="Start a broadcast to an audience, or dry-run it (scope broadcasts:write)",
)
async def post_broadcast(
    request: Request, key: BroadcastsWrite, idem: IdempotencyKey = None
) -> Response:
    body = shaped(BroadcastPost, await read_json(request, BROADCAST_BYTES))
    at = body.at
    if body.dry_run:
        plan = await run_in_threadpool(
            lambda: broadcasts.dry_run_broadcast(
                body.type, body.audience, body.variables, at=at, passed=body.passed
            )
        )
        return AsciiJSONResponse(plan.as_json(), status_code=200)
    started = await run_in_threadpool(
        lambda: broadcasts.broadcast(
            body.type,
            body.audience,
            body.variables,
            at=at,
            passed=body.passed,
            idempotency_key=None if idem is None else f"{key.prefix}:{idem}",
        )
    )
    shown = BroadcastStarted.model_validate(started, from_attributes=True).model_dump(mode="json")
    headers = {} if started.new else {"Idempotent-Replayed": "true"}
    return AsciiJSONResponse(shown, status_code=202, headers=headers)


def _shown(broadcast_id: int, *, cancel: bool = False) -> dict[str, Any]:
    try:
        if cancel:
            broadcasts.cancel_broadcast(broadcast_id)
        return broadcasts.broadcast_progress(broadcast_id).as_json()
    except UnknownBroadcast as exc:
        raise ApiError(404, "not_found", "broadcast_id", str(exc)) from exc


@router.get(
    "/broadcasts/{broadcast_id}",
    response_model=BroadcastProgress,
    responses=refusals(404),
    summary="A broadcast's progress: planned, requested, sent, suppressed by reason "
    "(broadcasts:read)",
)
def get_broadcast(broadcast_id: RowId, key: BroadcastsRead) -> dict[str, Any]:
    return _shown(broadcast_id)


@router.post(
    "/broadcasts/{broadcast_id}/cancel",
    response_model=BroadcastProgress,
    responses=refusals(404),
    summary="Stop a broadcast; `requested` is how many it reached first (broadcasts:write)",
)
def cancel_broadcast(broadcast_id: RowId, key: BroadcastsWrite) -> dict[str, Any]:
    return _shown(broadcast_id, cancel=True)
