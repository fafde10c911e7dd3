"""Acknowledging an escalation chain over HTTP (tasks/escalation_ack.py).

- `POST /v1/requests/{request_id}/ack?user_id=U` with an API key holding `escalations:write`:
  the app says "acknowledged" (a webhook-only chain has no button to press). 200 with the outcome
  (`acked`, `ack_after_finish`, `already_acked`: repeating it changes nothing), 404 when the
  request belongs to no chain.
- `GET /ack?t=TOKEN`: the signed link (`{{ ack_link }}` in a step's message) shows a small page
  with one button; pressing it (`POST /ack?t=TOKEN`) acknowledges and says so. A GET never
  acknowledges: mail scanners and chat unfurlers fetch links by themselves, and one of them
  must not silence a page. The token is the credential (signed, expiring, for this purpose only),
  so the form carries nothing else. Bad or expired links get a page in words (403 / 410).
"""

from __future__ import annotations

import html
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Route

from clarion.db.api_keys import ApiKey
from clarion.errors import NotInChain
from clarion.links import BadLink, ExpiredLink
from clarion.tasks import escalation_ack
from clarion.web.api_auth import require, user_id_checked
from clarion.web.api_errors import ApiError, AsciiJSONResponse
from clarion.web.api_models import Error

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", default_response_class=AsciiJSONResponse)
EscalationsWrite = Annotated[ApiKey, Depends(require("escalations:write"))]


class Acknowledged(BaseModel):
    user_id: str
    request_id: int
    outcome: str  # acked | ack_after_finish | already_acked


@router.post(
    "/requests/{request_id}/ack",
    response_model=Acknowledged,
    responses={s: {"model": Error} for s in (401, 403, 404, 422, 429)},
    summary="Acknowledge the escalation chain a request belongs to (scope escalations:write)",
)
def post_ack(
    request_id: Annotated[int, Path(ge=1, le=2**63 - 1, examples=[1])],
    user_id: Annotated[
        str,
        Query(description="The recipient: request ids are unique per user.", examples=["user-42"]),
    ],
    key: EscalationsWrite,
) -> dict[str, Any]:
    user = user_id_checked(user_id)
    try:
        outcome = escalation_ack.acknowledge(
            user, request_id, by=f"API key {key.name} ({key.prefix})"
        )
    except NotInChain as exc:
        raise ApiError(404, "not_found", "request_id", str(exc)) from exc
    return {"user_id": user, "request_id": request_id, "outcome": outcome}


HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the link is a credential
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; form-action 'self'; frame-ancestors 'none'",
}
SAID = {
    "ask": ("Acknowledge this alert?", "Nobody else will be paged for it once you do."),
    "acked": ("Acknowledged", "Thank you. Nobody else will be paged for this alert."),
    "already_acked": ("Already acknowledged", "Nobody else will be paged for this alert."),
    "ack_after_finish": ("Acknowledged", "Every step of this alert had already been sent."),
    "bad": ("This link does not work", "It may have been cut short. Nothing was changed."),
    "expired": ("This link has expired", "Nothing was changed."),
    "gone": ("Nothing to acknowledge", "This link names no alert we know. Nothing was changed."),
}


def _page(status: int, said: str, token: str | None = None) -> HTMLResponse:
    title, text = SAID[said]
    form = (
        f'<form method="post" action="?t={html.escape(token)}">'
        '<button type="submit">Acknowledge</button></form>'
        if token
        else ""
    )
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title></head><body><h1>{title}</h1><p>{text}</p>{form}</body></html>"
    )
    return HTMLResponse(body, status_code=status, headers=HEADERS)


async def ack_page(request: Request) -> Response:
    """GET shows the button, POST acknowledges; the token is checked first, nothing else read."""
    token = request.query_params.get("t", "")
    try:
        user, request_id = escalation_ack.read_ack_token(token)
    except ExpiredLink:
        return _page(410, "expired")
    except BadLink:
        return _page(403, "bad")
    if request.method == "GET":
        return _page(200, "ask", token)
    try:
        outcome = await run_in_threadpool(
            escalation_ack.acknowledge, user, request_id, by="signed link"
        )
    except NotInChain:
        return _page(404, "gone")
    log.info("escalation acknowledged by link", extra={"action": "escalation_link_ack"})
    return _page(200, outcome)


def routes() -> list[Route]:
    return [Route(escalation_ack.PATH, ack_page, methods=["GET", "POST"])]
