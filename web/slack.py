"""Slack: clarion's handlers for button clicks and the App Home preferences tab.

Two ways in:
  - `register(app)` adds the handlers to a host's existing Bolt `App` (reuse its bot endpoint);
  - `routes()` serves clarion's own `POST /slack/events`: it checks the size, then Slack's signature
    (CLARION_SLACK_SIGNING_SECRET) on the raw body, then the body's shape (web/slack_envelope.py),
    and hands the checked envelope to a Bolt App talking to CLARION_SLACK_API_URL with
    CLARION_SLACK_TOKEN.

Every click is untrusted input handed to `tasks.interactions.handle_click`; the message is then
updated in place with the catalog's label of the answer recorded, whoever's click won.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any

from slack_bolt import App
from slack_bolt.adapter.starlette.handler import to_starlette_response
from slack_bolt.request import BoltRequest
from slack_sdk import WebClient
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from clarion import settings
from clarion.adapters.slack import update_message
from clarion.db.chat import user_for_address
from clarion.db.engine import engine
from clarion.gates.preferences import LOCKED_CATEGORIES
from clarion.records import Message
from clarion.tasks import runtime
from clarion.tasks.interactions import Click, handle_click
from clarion.tasks.preferences import get_preferences, set_preferences
from clarion.web.inbound import Refused, read_body, refusal
from clarion.web.slack_envelope import (
    BODY_LIMIT,
    BlockActions,
    SslCheck,
    Unhandled,
    parse,
    read_block_actions,
    read_event,
    verify,
)

log = logging.getLogger(__name__)

CLICK = re.compile(r"^clarion:")
TOGGLE = re.compile(r"^clarion_pref:")
NOT_FOR_YOU = "This button isn't for you, or it is no longer valid."
MAX_HOME_ROWS = 90  # a Home tab holds at most 100 blocks
ENDPOINT_TIMEOUT = 2  # seconds for each Slack call made while answering a request


# --- registering on a Bolt App ----------------------------------------------------------------------


def register(app: App) -> App:
    """Add clarion's handlers to a Bolt App: answer buttons (action_id ^clarion:), the App Home
    tab listing the recipient's nudge types, and its on/off toggles (action_id ^clarion_pref:)."""
    app.action(CLICK)(on_click)
    app.action(TOGGLE)(on_toggle)
    app.event("app_home_opened")(on_home_opened)
    return app


def on_click(ack: Any, body: dict, client: WebClient) -> None:
    """A button on one of clarion's messages: validate, record, and show the answer in place."""
    ack()
    envelope = _block_actions(body)
    if envelope is None:
        return
    click = handle_click("slack", envelope.user_id, envelope.actions[0].value)
    if click.outcome in ("accepted", "repeated"):
        show_answer(client, click)
    else:
        _tell(client, envelope, NOT_FOR_YOU)


def _block_actions(body: Any) -> BlockActions | None:
    """The click's checked shape; None (logged) for a payload clarion cannot read. On clarion's own
    endpoint the body was already checked; a host's Bolt App hands over Slack's body as it came."""
    try:
        return read_block_actions(body if isinstance(body, dict) else {})
    except Refused as error:
        log.info("slack interaction ignored: %s", error.reason, extra={"action": "slack_malformed"})
        return None


def show_answer(client: WebClient, click: Click) -> bool:
    """chat.update the clicked delivery's message with the recorded answer's catalog label."""
    target = click.target or {}
    try:
        message = message_for(target)
        if message is None or not click.label or target.get("platform") != "slack":
            return False
        return update_message(client, message, target.get("provider_message_id") or "", click.label)
    except Exception:  # a click must never reach Slack as an error
        log.exception("answer not shown", extra={"action": "slack_answer_not_shown"})
        return False


def message_for(target: dict[str, Any]) -> Message | None:
    """Re-render the delivery's message server-side (content and buttons from the catalog)."""
    ntype = runtime.catalog().get(target.get("type_key", ""))
    version = target.get("template_version")
    if ntype is None or version not in ntype.templates:
        return None
    return Message(
        delivery_id=target["id"],
        user_id=target["user_id"],
        type_key=ntype.key,
        occurrence_key=target["occurrence_key"],
        channel="slack",
        content=ntype.render(version, "slack", target.get("variables") or {}, target.get("locale")),
        address=(target.get("addresses") or {}).get("slack"),
        buttons=ntype.templates[version].buttons,
    )


def _tell(client: WebClient, envelope: BlockActions, text: str) -> None:
    if not envelope.channel_id:
        return
    try:
        client.chat_postEphemeral(channel=envelope.channel_id, user=envelope.user_id, text=text)
    except Exception:  # best effort: the click was already judged and recorded
        log.warning("ephemeral reply failed", extra={"action": "slack_ephemeral_failed"})


# --- App Home: preferences ----------------------------------------------------------------------------


def on_home_opened(event: dict, client: WebClient) -> None:
    """Publish the Home tab: the recipient's nudge types with on/off toggles."""
    try:
        opened = read_event(event if isinstance(event, dict) else {})
    except Refused as error:
        log.info("slack event ignored: %s", error.reason, extra={"action": "slack_malformed"})
        return
    if (opened.tab or "home") == "home" and opened.user:
        publish_home(client, opened.user)


def on_toggle(ack: Any, body: dict, client: WebClient) -> None:
    """A Home-tab toggle: turn one type on or off (every channel), through set_preferences."""
    ack()
    envelope = _block_actions(body)
    if envelope is None:
        return
    action = envelope.actions[0]
    key = action.action_id.removeprefix("clarion_pref:")
    user = _clarion_user(envelope.user_id)
    if user is None or action.value not in ("on", "off"):
        return
    try:
        # a Slack-only setting would hide the one shown here, so the toggle clears it
        set_preferences(user, {f"type:{key}": action.value == "on", f"type:{key}/slack": None})
    except Exception as exc:  # an unknown or locked type from a forged payload: nothing changes
        log.info("preference toggle refused: %s", exc, extra={"action": "slack_toggle_refused"})
    publish_home(client, envelope.user_id)


def publish_home(client: WebClient, slack_user: str) -> None:
    """views.publish the Home tab for this Slack user (best effort; never raises)."""
    try:
        user = _clarion_user(slack_user)
        view = home_view(_home_rows(user) if user else None)
        client.views_publish(user_id=slack_user, view=view)
    except Exception:
        log.exception("home tab not published", extra={"action": "slack_home_failed"})


def _clarion_user(slack_user: str) -> str | None:
    if not slack_user:
        return None
    try:
        with engine().connect() as conn:
            return user_for_address(conn, "slack", slack_user)
    except Exception:
        log.exception("recipient lookup failed", extra={"action": "slack_user_lookup_failed"})
        return None


def _home_rows(user: str) -> list[tuple[str, bool, bool]]:
    """(type key, enabled on Slack, locked) for every type that can reach this user on Slack."""
    catalog, prefs = runtime.catalog(), get_preferences(user)["types"]
    return [
        (
            key,
            bool(prefs[key]["slack"]["enabled"]),
            catalog.types[key].category in LOCKED_CATEGORIES,
        )
        for key in sorted(prefs)
        if "slack" in prefs[key]
    ]


def home_view(rows: list[tuple[str, bool, bool]] | None) -> dict[str, Any]:
    """The Home tab (pure). rows=None: this Slack user is not a clarion recipient."""
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "Your nudges"}}
    ]
    if rows is None:
        blocks.append(
            {
                "type": "section",
                "text": {
                    "type": "plain_text",
                    "text": "There are no nudges for this Slack account.",
                },
            }
        )
        return {"type": "home", "blocks": blocks}
    blocks.append(
        {
            "type": "context",
            "elements": [
                {"type": "plain_text", "text": "Turn a kind of nudge off or on, everywhere."}
            ],
        }
    )
    for key, enabled, locked in rows[:MAX_HOME_ROWS]:
        name = key.replace("_", " ").capitalize()
        state = "Always on" if locked else ("On" if enabled else "Off")
        section: dict[str, Any] = {
            "type": "section",
            "block_id": f"pref_{key}"[:255],
            "text": {"type": "mrkdwn", "text": f"*{name}*\n{state}"},
        }
        if not locked:
            section["accessory"] = {
                "type": "button",
                "action_id": f"clarion_pref:{key}"[:255],
                "text": {"type": "plain_text", "text": "Turn off" if enabled else "Turn on"},
                "value": "off" if enabled else "on",
            }
        blocks.append(section)
    return {"type": "home", "blocks": blocks}


# --- clarion's own endpoint -------------------------------------------------------------------------------

_apps: dict[tuple, App] = {}


def build_app(s: settings.Settings) -> App:
    """A Bolt App for clarion's own endpoint, with clarion's handlers registered. The endpoint
    verifies Slack's signature itself, on the raw body, before anything is parsed; Bolt gets the
    checked envelope re-encoded, so its own check (over the raw body) is off."""
    # Listeners finish (click judged, message updated) before Slack gets its answer, which it wants
    # within 3 s: handle_click is one short transaction, and Slack calls get 2 s. An update that
    # times out leaves the answer recorded; the next click on the message updates it again.
    client = WebClient(token=s.slack_token, base_url=s.slack_api_url, timeout=ENDPOINT_TIMEOUT)
    app = App(
        client=client,
        signing_secret=s.slack_signing_secret,
        token_verification_enabled=False,
        request_verification_enabled=False,
        process_before_response=True,
    )
    return register(app)


def own_app() -> tuple[App, str] | None:
    """This process's Bolt App and signing secret; None when Slack is not configured."""
    s = settings.get()
    if not (s.slack_token and s.slack_signing_secret):
        return None
    key = (os.getpid(), s.slack_token, s.slack_signing_secret, s.slack_api_url)
    if key not in _apps:
        _apps.clear()
        _apps[key] = build_app(s)
    return _apps[key], s.slack_signing_secret


async def events(request: Request) -> Response:
    """POST /slack/events: Events API and interactivity. Size (413), then Slack's signature (401),
    then the shape of the body (400), and only then Bolt and clarion's listeners."""
    configured = own_app()
    if configured is None:
        return JSONResponse({"error": "slack is not configured"}, status_code=404)
    app, secret = configured
    try:
        body = await read_body(request, BODY_LIMIT)
        verify(secret, request.headers, body, now=time.time())
        envelope = parse(body, request.headers.get("content-type", ""))
    except Refused as error:
        return refusal(error, "slack")
    if isinstance(envelope, SslCheck):
        return Response(status_code=200)
    if isinstance(envelope, Unhandled):
        log.debug(
            "slack request not handled", extra={"action": "slack_unhandled", "kind": envelope.kind}
        )
        return JSONResponse({"error": "unhandled request"}, status_code=404)
    bolt_request = BoltRequest(
        body=json.dumps(envelope.to_bolt()), headers={"content-type": "application/json"}
    )
    # Bolt's App is synchronous; dispatch off the event loop (its Starlette handler would block it).
    response = await run_in_threadpool(app.dispatch, bolt_request)
    return to_starlette_response(response)


def routes() -> list[Route]:
    """The Slack routes mounted by web.app."""
    return [Route("/slack/events", events, methods=["POST"])]
