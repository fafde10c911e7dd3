"""Twilio's webhooks: message status callbacks and inbound messages (STOP / START / HELP).

Both doors check, in this order, before anything is used: the body's size (413), the
`X-Twilio-Signature` (the SDK's RequestValidator with CLARION_TWILIO_AUTH_TOKEN, or the second account's
CLARION_TWILIO_BACKUP_AUTH_TOKEN, over the full
public URL Twilio called — CLARION_PUBLIC_URL, the path and the query — and the form
parameters): missing or wrong, 401 and nothing written. Then the fields (400 naming the field).

- `POST /webhooks/twilio/status`: MessageStatus as a receipt (adapters.sms.status_receipt) for
  the delivery named in the callback URL's query (`u`, `d`: clarion put them there), into
  tasks.receipts.ingest. Statuses clarion does not track are answered 204 and ignored.
- `POST /webhooks/twilio/inbound`: a body that is a keyword (STOP, START, HELP and synonyms)
  goes to tasks.receipts.keyword; the answer is TwiML — empty, or a short help text for HELP.

Unset CLARION_TWILIO_AUTH_TOKEN: both answer 404.
"""

from __future__ import annotations

import logging
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import ImmutableMultiDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from twilio.request_validator import SIGNATURE_HEADER, RequestValidator
from twilio.twiml.messaging_response import MessagingResponse

from clarion import clock, settings
from clarion.adapters.sms import HELP_REPLY, keyword_of, status_receipt
from clarion.records import Keyword
from clarion.tasks import receipts
from clarion.web.inbound import IDENT, Refused, clean, local_path, read_body, refusal

log = logging.getLogger(__name__)

BODY_LIMIT = 64 * 1024
TWIML = "application/xml"


def public_url(request: Request) -> str:
    """The URL Twilio called, as it signed it: the configured public base (which carries a host
    app's mount prefix), the path below clarion's root, and the raw query."""
    query = request.scope.get("query_string", b"").decode("latin-1")
    base = settings.get().public_url.rstrip("/")
    return f"{base}{local_path(request)}" + (f"?{query}" if query else "")


async def verified_form(
    request: Request, tokens: list[tuple[str, str]]
) -> tuple[str, ImmutableMultiDict[str, str]]:
    """The provider whose account signed the request (`_tokens`), and its form parameters;
    Refused (413, 401, 400) otherwise."""
    signature = request.headers.get(SIGNATURE_HEADER)
    if not signature:
        raise Refused(401, f"no {SIGNATURE_HEADER}")
    body = await read_body(request, BODY_LIMIT)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(401, "signature does not match") from exc  # nothing Twilio signs
    form = ImmutableMultiDict(parse_qsl(text, keep_blank_values=True))
    for provider, token in tokens:
        if RequestValidator(token).validate(public_url(request), form, signature):
            return provider, form
    raise Refused(401, "signature does not match")


def _field(form: ImmutableMultiDict[str, str], name: str, *, required: bool = True) -> str | None:
    value = form.get(name)
    if value is None or value == "":
        if required:
            raise Refused(400, f"{name}: missing")
        return None
    return clean(value, name, max_len=1600)


def _sid(form: ImmutableMultiDict[str, str], name: str) -> str:
    value = _field(form, name) or ""
    if not IDENT.fullmatch(value):
        raise Refused(400, f"{name}: not an id")
    return value


def _delivery(request: Request) -> tuple[str | None, int | None]:
    """(user id, delivery id) from the callback URL's query (signed with it)."""
    user, delivery = request.query_params.get("u"), request.query_params.get("d")
    if user is None and delivery is None:
        return None, None
    if not (user and delivery and delivery.isascii() and delivery.isdigit() and len(delivery) < 19):
        raise Refused(400, "query: u and d must name a delivery")
    return clean(user, "u", max_len=256), int(delivery)


def _tokens() -> list[tuple[str, str]]:
    """(provider, auth token) of each Twilio account clarion sends through: the provider names a
    callback's receipt (its `platform`), `sms` with one account, `twilio` / `twilio_backup` with
    two (adapters.failover records a send's platform the same way)."""
    s = settings.get()
    if not s.twilio_backup_auth_token:
        return [("sms", s.twilio_auth_token)] if s.twilio_auth_token else []
    both = [("twilio", s.twilio_auth_token), ("twilio_backup", s.twilio_backup_auth_token)]
    return [(provider, token) for provider, token in both if token]


async def status(request: Request) -> Response:
    """POST /webhooks/twilio/status: one message's status, as a receipt."""
    tokens = _tokens()
    if not tokens:
        return Response(status_code=404)
    try:
        provider, form = await verified_form(request, tokens)
        user_id, delivery_id = _delivery(request)
        receipt = status_receipt(
            _field(form, "MessageStatus") or "",
            _sid(form, "MessageSid"),
            now=clock.now(),
            to=_field(form, "To", required=False),
            error_code=_field(form, "ErrorCode", required=False),
            user_id=user_id,
            delivery_id=delivery_id,
            platform=provider,
        )
    except Refused as error:
        return refusal(error, "twilio")
    if receipt is None:
        log.debug("twilio status ignored", extra={"action": "sms_status_ignored"})
        return Response(status_code=204)
    await run_in_threadpool(receipts.ingest, [receipt])
    return Response(status_code=204)


async def inbound(request: Request) -> Response:
    """POST /webhooks/twilio/inbound: a reply to one of clarion's numbers; TwiML back."""
    tokens = _tokens()
    if not tokens:
        return Response(status_code=404)
    try:
        _, form = await verified_form(request, tokens)
        sender = _field(form, "From") or ""
        body = _field(form, "Body", required=False) or ""
    except Refused as error:
        return refusal(error, "twilio")
    reply = MessagingResponse()
    word = keyword_of(body)
    if word is not None:
        keyword = Keyword("sms", sender, word, clock.now(), detail=body.strip()[:40])
        await run_in_threadpool(receipts.keyword, keyword)
    if word == "help":
        reply.message(HELP_REPLY)
    return Response(str(reply), media_type=TWIML)


def routes() -> list[Route]:
    """The Twilio routes mounted by web.app."""
    return [
        Route("/webhooks/twilio/status", status, methods=["POST"]),
        Route("/webhooks/twilio/inbound", inbound, methods=["POST"]),
    ]
