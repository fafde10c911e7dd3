"""Email's doors: SendGrid's Event Webhook and the one-click unsubscribe link (RFC 8058).

`POST /webhooks/sendgrid`: a body over 2 MiB gets 413; then SendGrid's ECDSA signature
(X-Twilio-Email-Event-Webhook-Signature over the -Timestamp header followed by the raw body,
checked by the SDK's EventWebhook with CLARION_SENDGRID_WEBHOOK_PUBLIC_KEY) — missing or wrong:
401, nothing parsed, nothing written; then the shape (a JSON array of event objects, each field
of the type SendGrid sends): 400 naming the field. The batch becomes receipts (adapters.sendgrid)
applied in one transaction (tasks.receipts.ingest). The timestamp's age is not checked: SendGrid
retries a batch for up to three days, and a replayed batch changes nothing (receipts are
idempotent: a repeat is recorded as `repeated`).

`GET /webhooks/email/unsubscribe?t=TOKEN` shows a page with one button (a link scanner that
follows the URL changes nothing); `POST` with `List-Unsubscribe=One-Click` (what mail clients send
for List-Unsubscribe-Post, and what the button sends) records an `unsubscribed` receipt, which
turns the type's category off for email (db.receipts). TOKEN is checked before anything else.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from clarion import clock, extras, settings
from clarion.adapters import sendgrid
from clarion.adapters.email_mime import ONE_CLICK, UNSUBSCRIBE_PATH, read_unsubscribe_token
from clarion.adapters.escape import html
from clarion.records import Receipt
from clarion.tasks import receipts as receipt_tasks
from clarion.web.inbound import Refused, clean, decode_json, read_body, refusal, text

if TYPE_CHECKING:  # the `sendgrid` extra; the unsubscribe pages work without it
    from sendgrid.helpers.eventwebhook import EventWebhook

log = logging.getLogger(__name__)

BODY_LIMIT = 2 << 20  # SendGrid posts batches of up to ~768 KB
MAX_EVENTS = 10_000
FORM_LIMIT = 4096
MAX_TIMESTAMP = 2**37  # seconds: far beyond any real event, within datetime's range
TEXT_FIELDS = (
    "email",
    "event",
    "sg_event_id",
    "sg_message_id",
    "type",
    "reason",
    "status",
    "response",
    "url",
    "bounce_classification",
    sendgrid.USER_ARG,
)
# User-facing text of the unsubscribe pages.
CONFIRM_TITLE = "Unsubscribe"
CONFIRM_TEXT = "Stop receiving emails like this one?"
CONFIRM_BUTTON = "Unsubscribe"
DONE_TEXT = "You are unsubscribed. Emails you must receive (receipts, security) still arrive."
BAD_LINK = "This unsubscribe link is not valid."
_verifiers: dict[tuple[int, str], EventWebhook] = {}


# --- the Event Webhook ---------------------------------------------------------------------------


def _verifier(public_key: str) -> EventWebhook:
    from sendgrid.helpers.eventwebhook import EventWebhook

    key = (os.getpid(), public_key)
    if key not in _verifiers:
        if len(_verifiers) > 4:  # keys changed (tests), or a fork: keep only what is used
            _verifiers.clear()
        _verifiers[key] = EventWebhook(public_key)
    return _verifiers[key]


def _keys() -> list[tuple[str, str]]:
    """(platform, public key) of each SendGrid account's Event Webhook: the second account
    (CLARION_SENDGRID_BACKUP_WEBHOOK_PUBLIC_KEY) names its receipts `sendgrid_backup`."""
    s = settings.get()
    both = [
        ("sendgrid", s.sendgrid_webhook_public_key),
        ("sendgrid_backup", s.sendgrid_backup_webhook_public_key),
    ]
    return [(platform, key) for platform, key in both if key]


def verify(verifier: EventWebhook, headers: Any, body: bytes) -> None:
    """SendGrid's signature over the timestamp and the raw body, or Refused(401)."""
    from sendgrid.helpers.eventwebhook import EventWebhookHeader

    signature = headers.get(EventWebhookHeader.SIGNATURE, "")
    timestamp = headers.get(EventWebhookHeader.TIMESTAMP, "")
    if not signature or not timestamp:
        raise Refused(401, "missing signature headers")
    if len(signature) > 512 or not (timestamp.isascii() and timestamp.isdigit()):
        raise Refused(401, "malformed signature headers")
    try:
        ok = verifier.verify_signature(body.decode("utf-8"), signature, timestamp)
    except (ValueError, TypeError):  # not base64, not DER, not UTF-8: not SendGrid's signature
        ok = False
    if not ok:
        raise Refused(401, "signature does not verify")


def verified_by(verifiers: list[tuple[str, EventWebhook]], headers: Any, body: bytes) -> str:
    """The account (platform) whose key verifies the batch; Refused(401) if none does."""
    refused = Refused(401, "no webhook key configured")
    for platform, verifier in verifiers:
        try:
            verify(verifier, headers, body)
        except Refused as error:
            refused = error
            continue
        return platform
    raise refused


def parse_events(body: bytes) -> list[dict[str, Any]]:
    """The batch's checked shape: the fields clarion reads, each of the type SendGrid sends."""
    data = decode_json(body)
    if not isinstance(data, list):
        raise Refused(400, "body: expected a JSON array of events")
    if len(data) > MAX_EVENTS:
        raise Refused(400, f"body: more than {MAX_EVENTS} events")
    events = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise Refused(400, f"[{i}]: expected an object")
        event: dict[str, Any] = {}
        for name in TEXT_FIELDS:
            value = text(item, name, f"[{i}].{name}", required=name == "event")
            if value is not None:
                event[name] = value
        stamp = item.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, int) or not 0 <= stamp < MAX_TIMESTAMP:
            raise Refused(400, f"[{i}].timestamp: expected a unix time in seconds")
        event["timestamp"] = stamp
        delivery = item.get(sendgrid.DELIVERY_ARG)
        if delivery is not None:
            if isinstance(delivery, bool) or not isinstance(delivery, str | int):
                raise Refused(400, f"[{i}].{sendgrid.DELIVERY_ARG}: expected a delivery id")
            event[sendgrid.DELIVERY_ARG] = clean(str(delivery), f"[{i}].{sendgrid.DELIVERY_ARG}")
        events.append(event)
    return events


async def sendgrid_events(request: Request) -> Response:
    """POST /webhooks/sendgrid (see the module docstring)."""
    keys = _keys()
    if not keys:
        return JSONResponse({"error": "the sendgrid webhook is not configured"}, status_code=404)
    if not extras.installed("sendgrid"):
        log.error("no sendgrid SDK", extra={"action": "sendgrid_sdk_missing"})
        return JSONResponse(
            {"error": "the sendgrid webhook needs `pip install 'clarion[sendgrid]'`"},
            status_code=503,
        )
    try:
        verifiers = [(platform, _verifier(key)) for platform, key in keys]
    except ValueError:
        log.error("bad webhook key", extra={"action": "sendgrid_key_invalid"})
        return JSONResponse({"error": "the webhook key is misconfigured"}, status_code=503)
    try:
        body = await read_body(request, BODY_LIMIT)
        platform = verified_by(verifiers, request.headers, body)
        events = parse_events(body)
    except Refused as error:
        return refusal(error, "sendgrid")
    found = sendgrid.receipts(events, platform)
    outcomes = await run_in_threadpool(receipt_tasks.ingest, found)
    log.info(
        "sendgrid events",
        extra={"action": "sendgrid_events", "events": len(events), "receipts": len(found)},
    )
    return JSONResponse({"received": len(events), "outcomes": dict(outcomes)})


# --- one-click unsubscribe ----------------------------------------------------------------------------


def _token(request: Request) -> tuple[str, int, str]:
    """(user_id, delivery_id, token) of the request's link, or Refused(400)."""
    token = request.query_params.get("t", "")
    found = read_unsubscribe_token(settings.get().webhook_secret, token)
    if found is None:
        raise Refused(400, "bad unsubscribe token")
    return found[0], found[1], token


def _page(body: str, status: int = 200) -> HTMLResponse:
    return HTMLResponse(
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html(CONFIRM_TITLE)}</title>'
        f"</head><body>{body}</body></html>",
        status_code=status,
        headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"},
    )


async def unsubscribe_page(request: Request) -> Response:
    """GET: a confirmation page; nothing changes until its button POSTs."""
    try:
        _, _, token = _token(request)
    except Refused as error:
        refusal(error, "email_unsubscribe")
        return _page(f"<p>{html(BAD_LINK)}</p>", status=error.status)
    action = html(f"?t={token}")  # this same path: right under any prefix clarion is mounted at
    name, _, value = ONE_CLICK.partition("=")
    return _page(
        f"<p>{html(CONFIRM_TEXT)}</p>"
        f'<form method="post" action="{action}">'
        f'<input type="hidden" name="{html(name)}" value="{html(value)}">'
        f'<button type="submit">{html(CONFIRM_BUTTON)}</button></form>'
    )


async def unsubscribe(request: Request) -> Response:
    """POST List-Unsubscribe=One-Click: an `unsubscribed` receipt for the link's delivery."""
    try:
        user_id, delivery_id, _ = _token(request)
        body = await read_body(request, FORM_LIMIT)
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        if form.get("List-Unsubscribe") != ["One-Click"]:
            raise Refused(400, f"body: expected {ONE_CLICK}")
    except Refused as error:
        refusal(error, "email_unsubscribe")
        return _page(f"<p>{html(BAD_LINK)}</p>", status=error.status)
    receipt = Receipt(
        channel="email",
        event="unsubscribed",
        provider_message_id=None,
        occurred_at=clock.now(),
        detail="one-click unsubscribe",
        user_id=user_id,
        delivery_id=delivery_id,
    )
    outcomes = await run_in_threadpool(receipt_tasks.ingest, [receipt])
    log.info(
        "email unsubscribe",
        extra={"action": "email_unsubscribed", "outcome": next(iter(outcomes), "")},
    )
    return _page(f"<p>{html(DONE_TEXT)}</p>")


def routes() -> list[Route]:
    """The email routes mounted by web.app."""
    return [
        Route("/webhooks/sendgrid", sendgrid_events, methods=["POST"]),
        Route(UNSUBSCRIBE_PATH, unsubscribe_page, methods=["GET"]),
        Route(UNSUBSCRIBE_PATH, unsubscribe, methods=["POST"]),
    ]
