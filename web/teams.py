"""Microsoft Teams: clarion's bot endpoint (POST /api/messages) and the handler a host's bot calls.

`handle_teams_activity(turn_context)` is the whole of clarion's Teams behaviour; a host's own
ActivityHandler calls it first and stops if it returns True. It

- remembers the 1:1 conversation of a known recipient (for proactive sends; `remember_conversation`),
- answers button clicks: Action.Execute arrives as an `adaptiveCard/action` invoke, Action.Submit as
  a message whose value holds the card data; both go to tasks.interactions.handle_click, and an
  accepted or repeated click shows the catalog label in place (update_activity, and the invoke
  response card); a forged, foreign or malformed one changes nothing,
- shows and saves a preferences card ("preferences" in the chat).

It acts only on turns the adapter authenticated (a Bot Framework token), or on any turn when clarion
runs in local mode: an anonymous activity could name any user and any serviceUrl.

`ClarionCloudAdapter` works around botbuilder 4.17.1's CloudAdapter.process, which answers every
invoke that has a response body with HTTP 500 (it serializes the already-serialized body again:
`'dict' object has no attribute 'is_xml_model'`), and answers 401 to any request that fails Bot
Framework authentication. The endpoint answers 404 while CLARION_TEAMS_APP_ID is unset; with
CLARION_TEAMS_APP_ID=none there is no authentication (local only: anyone who can reach the endpoint
may then act as any Teams user; `clarion web` warns and binds only loopback addresses unless told,
and an anonymous activity replaces a stored conversation only from the stored one's origin).
Before botbuilder sees an activity, `handle` checks size, token and shape (web/teams_envelope.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from aiohttp.web import HTTPUnsupportedMediaType, json_response
from aiohttp.web import Response as AiohttpResponse
from botbuilder.core import ActivityHandler, Bot, BotAdapter, InvokeResponse, TurnContext
from botbuilder.core.serializer_helper import serializer_helper
from botbuilder.integration.aiohttp import CloudAdapter, ConfigurationBotFrameworkAuthentication
from botbuilder.schema import Activity, ActivityTypes
from botframework.connector.auth import AuthenticationConstants
from msrest.serialization import Model
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from clarion import clock, settings
from clarion.adapters.teams import (
    TeamsAction,
    answered_card,
    card_attachment,
    from_activity,
    local_mode,
    preferences_card,
    preferences_changes,
    reference_from_activity,
    split_message_id,
)
from clarion.db import teams as store
from clarion.db.engine import engine
from clarion.errors import ClarionError
from clarion.gates.preferences import LOCKED_CATEGORIES
from clarion.records import Message
from clarion.tasks import runtime
from clarion.tasks.interactions import Click, handle_click
from clarion.tasks.preferences import get_preferences, set_preferences
from clarion.web.inbound import Refused, decode_json, read_body, refusal
from clarion.web.teams_envelope import BODY_LIMIT, check_bearer, probe, read_activity

log = logging.getLogger(__name__)

HELP = 'I send your growth-plan nudges. Send "preferences" to choose which ones you get.'
NOT_VALID = "This button can't be used any more."
UNKNOWN_USER = "I don't have you on my list yet, so there is nothing to set."
LOCAL_MODE_WARNING = (
    "CLARION_TEAMS_APP_ID=none: Teams requests are NOT authenticated; anyone who can reach "
    "/api/messages can act as any Teams user (local development only)"
)


# --- the adapter -----------------------------------------------------------------------------------


def _json_body(body: Any) -> Any:
    """An invoke response body as JSON: models are serialized once, plain data is left alone."""
    return serializer_helper(body) if isinstance(body, Model) else body


class ClarionCloudAdapter(CloudAdapter):
    """CloudAdapter whose invoke responses are serialized once, with a framework-neutral `handle`
    that checks size, token and shape before botbuilder sees an activity (web/teams_envelope.py).
    `require_token`: refuse a request without a JWT-shaped bearer token before parsing it (every
    deployment but local mode)."""

    def __init__(self, bot_framework_authentication: Any, *, require_token: bool = False) -> None:
        super().__init__(bot_framework_authentication)
        self.require_token = require_token

    async def handle(self, body: bytes, auth_header: str | None, bot: Bot) -> tuple[int, Any]:
        """Authenticate and run one POSTed activity: (HTTP status, JSON body or None)."""
        try:
            auth, activity = await self._admit(body, auth_header or None)
        except Refused as error:
            log.info(
                "teams request refused: %s",
                error.reason,
                extra={"action": "teams_refused", "status": error.status, "reason": error.reason},
            )
            return error.status, {"error": error.reason}
        response = await self.process_activity(auth, activity, bot.on_turn)
        if response is None:
            return 201, None
        return int(response.status), _json_body(response.body)

    async def _admit(self, body: bytes, auth_header: str | None) -> tuple[Any, Activity]:
        """Size, token shape, Bot Framework authentication, then JSON and the activity's shape. The
        token names the serviceUrl it was issued for, so authentication reads that (and channelId)
        from the body first; a body that is not JSON is refused as unauthenticated (no serviceUrl
        matches) unless authentication is off, and as malformed only then."""
        if len(body) > BODY_LIMIT:
            raise Refused(413, f"body over {BODY_LIMIT} bytes")
        if self.require_token or auth_header is not None:
            check_bearer(auth_header)
        data: Any = None
        malformed: Refused | None = None
        try:
            data = decode_json(body)
        except Refused as error:
            malformed = error
        try:
            auth = await self.bot_framework_authentication.authenticate_request(
                probe(data), auth_header
            )
        except Exception as exc:  # PermissionError, a bad JWT, an unreachable key set: all 401
            raise Refused(401, f"not authenticated: {str(exc)[:120]}") from exc
        if malformed is not None:
            raise malformed
        return auth, read_activity(data)

    async def process(
        self, request: Any, bot: Bot, ws_response: Any = None
    ) -> AiohttpResponse | None:
        """The aiohttp entry point, fixed (for hosts that serve their bot with aiohttp)."""
        if request.method != "POST":
            return await super().process(request, bot, ws_response)
        if "application/json" not in request.headers.get("Content-Type", ""):
            raise HTTPUnsupportedMediaType()
        if (request.content_length or 0) > BODY_LIMIT:
            return AiohttpResponse(status=413)
        status, body = await self.handle(
            await request.read(), request.headers.get("Authorization"), bot
        )
        return (
            json_response(body, status=status)
            if body is not None
            else AiohttpResponse(status=status)
        )


class _AuthConfig:
    """The configuration object botbuilder's ConfigurationBotFrameworkAuthentication reads."""

    def __init__(self, s: settings.Settings, openid_metadata_url: str | None) -> None:
        local = local_mode(s.teams_app_id)
        self.APP_ID = "" if local else s.teams_app_id
        self.APP_PASSWORD = "" if local else s.teams_app_password
        if s.teams_tenant_id and not local:
            self.APP_TYPE, self.APP_TENANTID = "SingleTenant", s.teams_tenant_id
        if (
            openid_metadata_url
        ):  # another key source (tests, sovereign clouds): the public-cloud rest
            self.TO_BOT_FROM_CHANNEL_OPENID_METADATA_URL = openid_metadata_url
            self.TO_BOT_FROM_CHANNEL_TOKEN_ISSUER = (
                AuthenticationConstants.TO_BOT_FROM_CHANNEL_TOKEN_ISSUER
            )
            self.TO_CHANNEL_FROM_BOT_LOGIN_URL = (
                AuthenticationConstants.TO_CHANNEL_FROM_BOT_LOGIN_URL
            )
            self.TO_CHANNEL_FROM_BOT_OAUTH_SCOPE = (
                AuthenticationConstants.TO_CHANNEL_FROM_BOT_OAUTH_SCOPE
            )
            self.TO_BOT_FROM_EMULATOR_OPENID_METADATA_URL = (
                AuthenticationConstants.TO_BOT_FROM_EMULATOR_OPENID_METADATA_URL
            )
            self.OAUTH_URL = AuthenticationConstants.OAUTH_URL


def build_adapter(
    s: settings.Settings | None = None, *, openid_metadata_url: str | None = None
) -> ClarionCloudAdapter:
    """The adapter for these settings: Bot Framework authentication unless the app id is "none"."""
    s = s or settings.get()
    local = local_mode(s.teams_app_id)
    if local:
        log.warning(LOCAL_MODE_WARNING, extra={"action": "teams_local_mode"})
    return ClarionCloudAdapter(
        ConfigurationBotFrameworkAuthentication(_AuthConfig(s, openid_metadata_url)),
        require_token=not local,
    )


# --- what clarion does with an activity ----------------------------------------------------------


def _authenticated(turn_context: TurnContext) -> bool:
    """Did the adapter authenticate this turn (a Bot Framework token with claims)?"""
    identity = turn_context.turn_state.get(BotAdapter.BOT_IDENTITY_KEY)
    return not (
        identity is None
        or not identity.claims
        or identity.authentication_type == AuthenticationConstants.ANONYMOUS_AUTH_TYPE
    )


def _trusted(turn_context: TurnContext) -> bool:
    """Did an authenticated channel send this turn? Anonymous turns count only in local mode."""
    return _authenticated(turn_context) or local_mode(settings.get().teams_app_id)


def _store_reference(teams_user: str, reference: str, only_from: str | None) -> store.Remembered:
    with engine().begin() as conn:
        remembered = store.remember_conversation(
            conn, teams_user, reference, now=clock.now(), only_from=only_from
        )
        if remembered.accepted:  # they can talk to the bot, so it is installed
            store.lift_deactivation(conn, teams_user)
    return remembered


async def remember_conversation(turn_context: TurnContext) -> bool:
    """Store the 1:1 conversation reference of a known recipient who sent this activity, so that
    nudges can reach them proactively. True if a stored reference changed. Never raises.
    An authenticated activity may replace a stored reference; in local mode an anonymous one
    only if it comes from the stored reference's origin (a first reference is always stored)."""
    reference = reference_from_activity(turn_context.activity)
    if reference is None or not _trusted(turn_context):
        return False
    only_from = (
        None if _authenticated(turn_context) else (store.origin(reference.service_url) or "")
    )
    try:
        remembered = await asyncio.to_thread(
            _store_reference, turn_context.activity.from_property.id, reference.to_json(), only_from
        )
    except Exception:
        log.exception("teams conversation not stored", extra={"action": "teams_reference_error"})
        return False
    if remembered.refused:
        log.warning(
            "unauthenticated teams activity from another origin: conversation kept",
            extra={"action": "teams_reference_refused", "users": remembered.refused},
        )
    if remembered.changed:
        log.info(
            "teams conversation stored",
            extra={"action": "teams_reference_stored", "users": remembered.changed},
        )
    return bool(remembered.changed)


async def handle_teams_activity(
    turn_context: TurnContext, *, command: str | None = "preferences"
) -> bool:
    """Clarion's part of a Teams turn; True if the activity was clarion's (the host stops there).
    `command` is the chat word that opens the preferences card (None: no chat command)."""
    await remember_conversation(turn_context)
    action = from_activity(turn_context.activity, command)
    if action is None:
        return False
    if not _trusted(turn_context):  # anyone could have sent it, as anyone: act on nothing
        log.warning(
            "unauthenticated teams action ignored",
            extra={"action": "teams_untrusted", "kind": action.kind},
        )
        if action.via == "execute":
            await _respond(turn_context, _message_response(NOT_VALID))
        return True
    try:
        if action.kind == "click":
            await _on_click(turn_context, action)
        else:
            await _on_preferences(turn_context, action)
    except Exception:  # a bug or an outage must not surface as a Teams error; the click is recorded
        log.exception(
            "teams action failed", extra={"action": "teams_action_error", "kind": action.kind}
        )
        if action.via == "execute":
            await _respond(
                turn_context, _message_response("Something went wrong. Please try again later.")
            )
    return True


async def _on_click(turn_context: TurnContext, action: TeamsAction) -> None:
    click = await asyncio.to_thread(handle_click, "teams", action.user, action.value)
    card = await asyncio.to_thread(_answered, click)
    if card is not None and click.target is not None:  # _answered gives a card only with a target
        await _refresh(turn_context, click.target, card)
    if action.via == "execute":
        await _respond(turn_context, _card_response(card) if card else _message_response(NOT_VALID))


def _answered(click: Click) -> dict | None:
    """The answered card for an accepted or repeated click, rendered from the catalog."""
    if click.outcome not in ("accepted", "repeated") or not click.target or not click.label:
        return None
    target = click.target
    ntype = runtime.catalog().get(target["type_key"])
    version = target["template_version"]
    if ntype is None or version not in ntype.templates:
        return None
    message = Message(
        delivery_id=target["id"],
        user_id=target["user_id"],
        type_key=target["type_key"],
        occurrence_key=target["occurrence_key"],
        channel="teams",
        content=ntype.render(version, "teams", target["variables"] or {}, target.get("locale")),
        buttons=ntype.templates[version].buttons,
    )
    return answered_card(message, click.label)


async def _refresh(turn_context: TurnContext, target: dict, card: dict) -> None:
    """Replace the delivery's card in this conversation; the answer stands even if this fails."""
    ids = split_message_id(target.get("provider_message_id"))
    conversation = turn_context.activity.conversation
    if ids is None or conversation is None or ids[0] != conversation.id:
        return
    update = Activity(type=ActivityTypes.message, id=ids[1], attachments=[card_attachment(card)])
    try:
        await turn_context.update_activity(update)
    except Exception:
        log.warning(
            "teams card not updated", extra={"action": "teams_update_failed"}, exc_info=True
        )


async def _on_preferences(turn_context: TurnContext, action: TeamsAction) -> None:
    card, text = await asyncio.to_thread(_preferences, action)
    if action.via == "execute":
        await _respond(turn_context, _card_response(card) if card else _message_response(text))
        return
    reply_to = turn_context.activity.reply_to_id
    if card is not None and action.kind == "preferences_save" and reply_to:
        update = Activity(
            type=ActivityTypes.message, id=reply_to, attachments=[card_attachment(card)]
        )
        await _reply(turn_context.update_activity(update))
        return
    reply = (
        Activity(type=ActivityTypes.message, attachments=[card_attachment(card)]) if card else text
    )
    await _reply(turn_context.send_activity(reply))


async def _reply(call: Awaitable[Any]) -> None:
    """A reply into the conversation: the connector refusing it (or being unreachable) is the
    connector's answer, logged as a warning; what the activity asked for is already done."""
    try:
        await call
    except Exception as exc:
        log.warning(
            "teams reply failed: %s", type(exc).__name__, extra={"action": "teams_reply_failed"}
        )


def _preferences(action: TeamsAction) -> tuple[dict | None, str]:
    """(the preferences card to show, or None and a text to say instead)."""
    with engine().connect() as conn:
        users = store.users_for_teams_user(conn, action.user)
    if not users:
        return None, UNKNOWN_USER
    user_id, note = users[0], None
    choices = _choices(user_id)
    if action.kind == "preferences_save":
        changes = preferences_changes(action.value or {}, choices)
        try:
            if changes:
                set_preferences(user_id, changes)
            note = "Saved."
        except ClarionError as exc:
            note = f"Not saved: {exc}"
        choices = _choices(user_id)
    return preferences_card(choices, note), ""


def _choices(user_id: str) -> list[tuple[str, str, bool]]:
    """(type key, label, enabled on Teams) for every type a recipient may switch off on Teams."""
    resolved = get_preferences(user_id)["types"]
    return [
        (t.key, t.label(), resolved[t.key]["teams"]["enabled"])  # a plain-text toggle title
        for t in runtime.catalog().types.values()
        if "teams" in t.channels and t.category not in LOCKED_CATEGORIES
    ]


def _card_response(card: dict) -> dict:
    return {"statusCode": 200, "type": "application/vnd.microsoft.card.adaptive", "value": card}


def _message_response(text: str) -> dict:
    return {"statusCode": 200, "type": "application/vnd.microsoft.activity.message", "value": text}


async def _respond(turn_context: TurnContext, body: dict) -> None:
    """Answer the invoke (the adapter returns it as the HTTP response)."""
    await turn_context.send_activity(
        Activity(type=ActivityTypes.invoke_response, value=InvokeResponse(status=200, body=body))
    )


class ClarionBot(ActivityHandler):
    """Clarion's own bot, for deployments without one: clarion's actions, else a short help text."""

    async def on_turn(self, turn_context: TurnContext) -> None:
        if await handle_teams_activity(turn_context):
            return
        await super().on_turn(turn_context)

    async def on_message_activity(self, turn_context: TurnContext) -> None:
        await _reply(turn_context.send_activity(HELP))

    async def on_invoke_activity(self, turn_context: TurnContext) -> InvokeResponse:
        """An invoke that is not clarion's (those were answered in handle_teams_activity): there is
        nothing here for it. 404, where botbuilder would answer 501 (or run sign-in handlers this
        bot does not have)."""
        return InvokeResponse(status=404)


# --- the endpoint --------------------------------------------------------------------------------


def routes(*, adapter: ClarionCloudAdapter | None = None, bot: Bot | None = None) -> list[Route]:
    """POST /api/messages; 404 while CLARION_TEAMS_APP_ID is unset. The adapter is built from the
    settings on the first request."""
    built: dict[str, Any] = {}

    def parts() -> tuple[ClarionCloudAdapter, Bot]:
        if not built:
            built.update(adapter=adapter or build_adapter(), bot=bot or ClarionBot())
        return built["adapter"], built["bot"]

    async def messages(request: Request) -> Response:
        if adapter is None and not settings.get().teams_app_id:
            return Response(
                status_code=404
            )  # Teams is off: never run without authentication by default
        try:
            body = await read_body(request, BODY_LIMIT)
        except Refused as error:
            return refusal(error, "teams")
        if "application/json" not in request.headers.get("content-type", ""):
            return Response(status_code=415)
        the_adapter, the_bot = parts()
        try:
            status, answer = await the_adapter.handle(
                body, request.headers.get("authorization"), the_bot
            )
        except Exception:
            log.exception("teams turn failed", extra={"action": "teams_turn_error"})
            return Response(status_code=500)
        return (
            JSONResponse(answer, status_code=status)
            if answer is not None
            else Response(status_code=status)
        )

    return [Route("/api/messages", messages, methods=["POST"])]
