"""Slack: clarion's handlers for button clicks and the App Home preferences tab.

Two ways in:
  - `register(app)` adds the handlers to a host's existing Bolt `App` (reuse its bot endpoint);
  - `routes()` serves clarion's own `POST /slack/events` (a Bolt App verifying Slack's signature
    with CLARION_SLACK_SIGNING_SECRET, talking to CLARION_SLACK_API_URL with CLARION_SLACK_TOKEN).

Every click is untrusted input handed to `tasks.interactions.handle_click`; the message is then
updated in place with the catalog's label of the answer recorded, whoever's click won.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from slack_bolt import App
from slack_bolt.adapter.starlette.handler import to_bolt_request, to_starlette_response
from slack_sdk import WebClient
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from adapters.base import Message
from adapters.slack import update_message
from clarion import settings
from db.chat import user_for_address
from db.engine import engine
from gates.preferences import LOCKED_CATEGORIES
from tasks import runtime
from tasks.interactions import Click, handle_click
from tasks.preferences import get_preferences, set_preferences

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


def on_click(ack: Any, body: dict, action: dict, client: WebClient) -> None:
    """A button on one of clarion's messages: validate, record, and show the answer in place."""
    ack()
    slack_user = str((body.get("user") or {}).get("id") or "")
    click = handle_click("slack", slack_user, action.get("value"))
    if click.outcome in ("accepted", "repeated"):
        show_answer(client, click)
    else:
        _tell(client, body, slack_user, NOT_FOR_YOU)


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
    return Message(delivery_id=target["id"], user_id=target["user_id"], type_key=ntype.key,
                   occurrence_key=target["occurrence_key"], channel="slack",
                   content=ntype.render(version, "slack", target.get("variables") or {}),
                   address=(target.get("addresses") or {}).get("slack"),
                   buttons=ntype.templates[version].buttons)


def _tell(client: WebClient, body: dict, slack_user: str, text: str) -> None:
    channel = (body.get("container") or {}).get("channel_id") or (body.get("channel") or {}).get("id")
    if not (channel and slack_user):
        return
    try:
        client.chat_postEphemeral(channel=channel, user=slack_user, text=text)
    except Exception:  # best effort: the click was already judged and recorded
        log.warning("ephemeral reply failed", extra={"action": "slack_ephemeral_failed"})


# --- App Home: preferences ----------------------------------------------------------------------------


def on_home_opened(event: dict, client: WebClient) -> None:
    """Publish the Home tab: the recipient's nudge types with on/off toggles."""
    if event.get("tab", "home") == "home" and event.get("user"):
        publish_home(client, str(event["user"]))


def on_toggle(ack: Any, body: dict, action: dict, client: WebClient) -> None:
    """A Home-tab toggle: turn one type on or off (every channel), through set_preferences."""
    ack()
    slack_user = str((body.get("user") or {}).get("id") or "")
    key = str(action.get("action_id") or "").removeprefix("clarion_pref:")
    value = action.get("value")
    user = _clarion_user(slack_user)
    if user is None or value not in ("on", "off"):
        return
    try:
        # a Slack-only setting would hide the one shown here, so the toggle clears it
        set_preferences(user, {f"type:{key}": value == "on", f"type:{key}/slack": None})
    except Exception as exc:  # an unknown or locked type from a forged payload: nothing changes
        log.info("preference toggle refused: %s", exc, extra={"action": "slack_toggle_refused"})
    publish_home(client, slack_user)


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
    return [(key, bool(prefs[key]["slack"]["enabled"]), catalog.types[key].category in LOCKED_CATEGORIES)
            for key in sorted(prefs) if "slack" in prefs[key]]


def home_view(rows: list[tuple[str, bool, bool]] | None) -> dict[str, Any]:
    """The Home tab (pure). rows=None: this Slack user is not a clarion recipient."""
    blocks: list[dict[str, Any]] = [{"type": "header", "text": {"type": "plain_text", "text": "Your nudges"}}]
    if rows is None:
        blocks.append({"type": "section", "text": {"type": "plain_text",
                                                   "text": "There are no nudges for this Slack account."}})
        return {"type": "home", "blocks": blocks}
    blocks.append({"type": "context", "elements": [{"type": "plain_text",
                                                   "text": "Turn a kind of nudge off or on, everywhere."}]})
    for key, enabled, locked in rows[:MAX_HOME_ROWS]:
        name = key.replace("_", " ").capitalize()
        state = "Always on" if locked else ("On" if enabled else "Off")
        section: dict[str, Any] = {"type": "section", "block_id": f"pref_{key}"[:255],
                                   "text": {"type": "mrkdwn", "text": f"*{name}*\n{state}"}}
        if not locked:
            section["accessory"] = {"type": "button", "action_id": f"clarion_pref:{key}"[:255],
                                    "text": {"type": "plain_text", "text": "Turn off" if enabled else "Turn on"},
                                    "value": "off" if enabled else "on"}
        blocks.append(section)
    return {"type": "home", "blocks": blocks}


# --- clarion's own endpoint -------------------------------------------------------------------------------

_apps: dict[tuple, App] = {}


def build_app(s: settings.Settings) -> App:
    """A Bolt App for clarion's own endpoint, with clarion's handlers registered."""
    # Listeners finish (click judged, message updated) before Slack gets its answer, which it wants
    # within 3 s: handle_click is one short transaction, and Slack calls get 2 s. An update that
    # times out leaves the answer recorded; the next click on the message updates it again.
    client = WebClient(token=s.slack_token, base_url=s.slack_api_url, timeout=ENDPOINT_TIMEOUT)
    app = App(client=client, signing_secret=s.slack_signing_secret, token_verification_enabled=False,
              process_before_response=True)
    return register(app)


def own_app() -> App | None:
    """This process's Bolt App for the current settings; None when Slack is not configured."""
    s = settings.get()
    if not (s.slack_token and s.slack_signing_secret):
        return None
    key = (os.getpid(), s.slack_token, s.slack_signing_secret, s.slack_api_url)
    if key not in _apps:
        _apps.clear()
        _apps[key] = build_app(s)
    return _apps[key]


async def events(request: Request) -> Response:
    """POST /slack/events: Events API and interactivity, verified by Bolt (bad signature: 401)."""
    app = own_app()
    if app is None:
        return JSONResponse({"error": "slack is not configured"}, status_code=404)
    body = await request.body()
    # Bolt's App is synchronous; dispatch off the event loop (its Starlette handler would block it).
    response = await run_in_threadpool(app.dispatch, to_bolt_request(request, body))
    return to_starlette_response(response)


def routes() -> list[Route]:
    """The Slack routes mounted by web.app."""
    return [Route("/slack/events", events, methods=["POST"])]
