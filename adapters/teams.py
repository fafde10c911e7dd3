"""The Microsoft Teams channel: Adaptive Cards posted proactively into the 1:1 chat a user has with
the bot; buttons as Action.Execute (Universal Actions) with Action.Submit as the fallback.

Addressing. `addresses["teams"]` is the user's Teams id (`29:…`, their activities' `from.id`, which
is what a click arrives with). `addresses["teams_conversation"]` is the conversation reference
(`ConversationRef` as JSON: serviceUrl, conversation id, tenant id, bot id) that web.teams stores
when the user talks to the bot. A Message carries only addresses["teams"], so `send` loads the
reference with one primary-key read (db.teams); it checks the Teams id still matches, too.

Pure: to_card, answered_card, preferences_card, preferences_changes, to_activity, from_activity,
reference_from_activity, send_error, message_id. I/O: TeamsAdapter.send and update, through
botframework-connector's ConnectorClient against the reference's serviceUrl, and the
per-conversation budget in adapters.ratelimit (Teams allows 7 messages/s, 8/2 s, 60/30 s, 1800/h
per conversation). The adapter reaches the database only through the `ReferenceStore` it is given
by the composition root (tasks.runtime).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol
from urllib.parse import quote, unquote

import requests
from botbuilder.schema import (
    Activity,
    ActivityTypes,
    Attachment,
    ConversationAccount,
    ErrorResponseException,
)
from botframework.connector import ConnectorClient
from botframework.connector.auth import MicrosoftAppCredentials
from msrest.exceptions import ClientRequestError

from clarion.adapters.base import Channel, Collaborators
from clarion.adapters.escape import card_markdown, plain_text
from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.adapters.webhook import retry_after
from clarion.errors import (
    PermanentSendError,
    SendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult
from clarion.settings import Settings

log = logging.getLogger(__name__)

LOCAL_APP_ID = "none"  # CLARION_TEAMS_APP_ID=none: no Bot Framework auth (local development, tests)
CARD_CONTENT_TYPE = "application/vnd.microsoft.card.adaptive"
CLICK_VERB, CLICK_KEY = "clarion", "clarion"
PREFERENCES_VERB, PREFERENCES_KEY = "clarion_preferences", "clarion_preferences"
STYLES = {"primary": "positive", "danger": "destructive"}
GONE_STATUSES = frozenset({403, 404})  # the bot was removed from the conversation, or it is gone
TRANSIENT_STATUSES = frozenset({401, 408, 425, 429})  # 401: our token was refused; a new one may do
# (messages, seconds) per conversation; clarion spends 90% of each (adapters.ratelimit)
TEAMS_QUOTA = Quota("teams", ((7, 1.0), (8, 2.0), (60, 30.0), (1800, 3600.0)), fail_open=True)


def local_mode(app_id: str | None) -> bool:
    return (app_id or "").strip().lower() == LOCAL_APP_ID


# --- addressing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConversationRef:
    """Where a proactive message to one user goes."""

    service_url: str
    conversation_id: str
    tenant_id: str | None = None
    bot_id: str | None = None
    channel_id: str = "msteams"

    def to_json(self) -> str:
        return json.dumps(
            {
                "serviceUrl": self.service_url,
                "conversationId": self.conversation_id,
                "tenantId": self.tenant_id,
                "botId": self.bot_id,
                "channelId": self.channel_id,
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, raw: str | None) -> ConversationRef | None:
        try:
            data = json.loads(raw) if raw else None
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        url, conversation = data.get("serviceUrl"), data.get("conversationId")
        if not (
            isinstance(url, str)
            and url.startswith(("https://", "http://"))
            and isinstance(conversation, str)
            and conversation
        ):
            return None
        optional = {
            k: data.get(k) if isinstance(data.get(k), str) else None for k in ("tenantId", "botId")
        }
        return cls(
            url,
            conversation,
            optional["tenantId"],
            optional["botId"],
            data.get("channelId") or "msteams",
        )


def reference_from_activity(activity: Activity) -> ConversationRef | None:
    """The 1:1 conversation an incoming activity came from; None for group chats and channels."""
    conversation, sender = activity.conversation, activity.from_property
    if not (conversation and conversation.id and sender and sender.id and activity.service_url):
        return None
    if conversation.conversation_type != "personal":
        return None  # a nudge must never land in a channel or group chat
    channel_data = activity.channel_data if isinstance(activity.channel_data, dict) else {}
    tenant = conversation.tenant_id or (channel_data.get("tenant") or {}).get("id")
    bot = activity.recipient.id if activity.recipient else None
    return ConversationRef(
        activity.service_url, conversation.id, tenant, bot, activity.channel_id or "msteams"
    )


def message_id(conversation_id: str, activity_id: str) -> str:
    """The provider message id recorded on a delivery: "{conversation id}:{activity id}", the
    conversation id percent-encoded, since both ids may hold colons ("a:1…", "1:1…")."""
    return f"{quote(conversation_id, safe='')}:{activity_id}"


def split_message_id(value: str | None) -> tuple[str, str] | None:
    """(conversation id, activity id) from a recorded provider message id."""
    conversation, _, activity = (value or "").partition(":")
    return (unquote(conversation), activity) if conversation and activity else None


# --- cards (to the platform) ---------------------------------------------------------------------


def _card(body: list[dict], actions: list[dict] | None = None) -> dict[str, Any]:
    card: dict[str, Any] = {
        "type": "AdaptiveCard",
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "version": "1.4",
        "body": body,
    }
    if actions:
        card["actions"] = actions
    return card


def _action(
    title: str, verb: str, data: dict[str, Any], style: str | None = None
) -> dict[str, Any]:
    """Action.Execute (Universal Actions) falling back to Action.Submit on older clients."""
    fallback: dict[str, Any] = {"type": "Action.Submit", "title": title, "data": data}
    action: dict[str, Any] = {
        "type": "Action.Execute",
        "title": title,
        "verb": verb,
        "data": data,
        "fallback": fallback,
    }
    if style in STYLES:
        action["style"] = fallback["style"] = STYLES[style]
    return action


def _text(content: Mapping[str, str]) -> list[dict[str, Any]]:
    """Title and body as TextBlocks, escaped: rendered content is data, never card markdown."""
    blocks = []
    if content.get("title"):
        blocks.append(
            {
                "type": "TextBlock",
                "text": card_markdown(content["title"]),
                "weight": "Bolder",
                "size": "Medium",
                "wrap": True,
            }
        )
    if content.get("body"):
        blocks.append({"type": "TextBlock", "text": card_markdown(content["body"]), "wrap": True})
    return blocks


def to_card(message: Message) -> dict[str, Any]:
    """The nudge as an Adaptive Card: title and body, one action per catalog button."""
    actions = [
        _action(b.label, CLICK_VERB, {CLICK_KEY: message.button_value(b)}, b.style)
        for b in message.buttons
    ]
    return _card(_text(message.content), actions)


def answered_card(message: Message, label: str) -> dict[str, Any]:
    """The same card once answered: the actions give way to the answer's catalog label."""
    answered = {
        "type": "TextBlock",
        "text": f"Answered: {card_markdown(label)}",
        "weight": "Bolder",
        "color": "Good",
        "wrap": True,
    }
    return _card([*_text(message.content), answered])


def preferences_card(
    choices: Sequence[tuple[str, str, bool]], note: str | None = None
) -> dict[str, Any]:
    """A card with one toggle per (type key, label, enabled) and a Save action."""
    body: list[dict[str, Any]] = [
        {
            "type": "TextBlock",
            "text": "Which nudges would you like to get?",
            "weight": "Bolder",
            "wrap": True,
        }
    ]
    body += [
        {
            "type": "Input.Toggle",
            "id": f"type:{key}",
            "title": label,
            "value": str(on).lower(),
            "valueOn": "true",
            "valueOff": "false",
        }
        for key, label, on in choices
    ]
    if note:
        body.append(
            {"type": "TextBlock", "text": card_markdown(note), "isSubtle": True, "wrap": True}
        )
    return _card(body, [_action("Save", PREFERENCES_VERB, {PREFERENCES_KEY: "save"}, "primary")])


def preferences_changes(
    data: Mapping[str, Any], choices: Sequence[tuple[str, str, bool]]
) -> dict[str, bool | None]:
    """The settings a submitted preferences card asks for: only the offered types, only changes.
    A type-wide setting, clearing any Teams-only one, so the toggle is what the user gets."""
    changes: dict[str, bool | None] = {}
    for key, _label, enabled in choices:
        wanted = _toggle(data.get(f"type:{key}"))
        if wanted is not None and wanted != enabled:
            changes[f"type:{key}"] = wanted
            changes[f"type:{key}/teams"] = None
    return changes


def _toggle(raw: object) -> bool | None:
    if isinstance(raw, bool):
        return raw
    return (
        {"true": True, "false": False}.get(raw) if isinstance(raw, str) else None
    )  # not 1 == True


def card_attachment(card: dict[str, Any]) -> Attachment:
    return Attachment(content_type=CARD_CONTENT_TYPE, content=card)


def to_activity(card: dict[str, Any], ref: ConversationRef, summary: str | None = None) -> Activity:
    """The message activity that carries a card into the referenced conversation."""
    return Activity(
        type=ActivityTypes.message,
        summary=plain_text(summary) if summary else None,
        attachments=[card_attachment(card)],
        conversation=ConversationAccount(id=ref.conversation_id, tenant_id=ref.tenant_id),
        channel_id=ref.channel_id,
        service_url=ref.service_url,
    )


# --- actions (from the platform) -----------------------------------------------------------------


@dataclass(frozen=True)
class TeamsAction:
    """Something a Teams user did that clarion answers."""

    kind: str  # click | preferences_open | preferences_save
    via: str  # execute (an adaptiveCard/action invoke) | submit (a message with a value) | text
    user: str  # the sender's Teams id (from.id)
    value: Any = None  # click: the raw button value; preferences_save: the card's data


def from_activity(activity: Activity, command: str | None = "preferences") -> TeamsAction | None:
    """Clarion's own payloads in an incoming activity; None for anything else (the host's)."""
    user = str(getattr(activity.from_property, "id", None) or "")
    if activity.type == ActivityTypes.invoke and activity.name == "adaptiveCard/action":
        action = activity.value.get("action") if isinstance(activity.value, dict) else None
        return (
            _from_data(action.get("verb"), action.get("data"), "execute", user)
            if isinstance(action, dict)
            else None
        )
    if activity.type != ActivityTypes.message:
        return None
    if isinstance(activity.value, dict):
        return _from_data(None, activity.value, "submit", user)
    text = re.sub(r"<at>.*?</at>", "", activity.text or "").strip().lower()
    return TeamsAction("preferences_open", "text", user) if command and text == command else None


def _from_data(verb: object, data: object, via: str, user: str) -> TeamsAction | None:
    fields = data if isinstance(data, dict) else {}
    if verb == CLICK_VERB or CLICK_KEY in fields:
        return TeamsAction("click", via, user, fields.get(CLICK_KEY))
    if verb == PREFERENCES_VERB or PREFERENCES_KEY in fields:
        if fields.get(PREFERENCES_KEY) == "open":
            return TeamsAction("preferences_open", via, user)
        return TeamsAction("preferences_save", via, user, fields)
    return None


# --- provider answers ----------------------------------------------------------------------------


def send_error(
    status: int, headers: Mapping[str, str], body: str, *, posting: bool = False
) -> SendError:
    """A connector failure as the error to raise: 429 throttled; 401, 408, 425 transient; a 5xx
    transient, or unknown when the call posts a message (it may have been posted); else permanent."""
    try:
        error = json.loads(body or "{}").get("error") or {}
        detail = f"{error.get('code', '')}: {error.get('message', '')}".strip(": ")
    except (ValueError, AttributeError):
        detail = ""
    detail = (detail or body or "")[:200]
    hint = retry_after(headers.get("Retry-After"))
    if status == 429:
        return ThrottledError(f"http_{status}", detail, hint)
    if status >= 500 and posting:
        return UnknownSendError(f"http_{status}", detail)
    if status in TRANSIENT_STATUSES or status >= 500:
        return TransientSendError(f"http_{status}", detail, hint)
    return PermanentSendError(f"http_{status}", detail)


def network_error(exc: Exception, *, posting: bool) -> SendError:
    """A requests/msrest network failure: failed if no connection was made (the request cannot
    have left), unknown for a posting call once it may have been written (read timeout, reset)."""
    inner = getattr(exc, "inner_exception", None) or exc
    if isinstance(inner, requests.ConnectTimeout) or (
        isinstance(inner, requests.ConnectionError) and "NewConnectionError" in repr(inner)
    ):
        return TransientSendError("connection", str(inner)[:200])
    if posting:
        return UnknownSendError("no_answer", str(inner)[:200])
    return TransientSendError("connection", str(inner)[:200])


# --- the adapter ---------------------------------------------------------------------------------


class ReferenceStore(Protocol):
    def reference(self, user_id: str, teams_user: str) -> ConversationRef | None: ...

    def gone(self, user_id: str, teams_user: str, detail: str) -> None: ...


def credentials_for(
    app_id: str | None, password: str | None, tenant_id: str | None
) -> MicrosoftAppCredentials:
    """The bot's outbound credentials; none at all in local mode (no Authorization header)."""
    if local_mode(app_id):
        return MicrosoftAppCredentials.empty()
    return MicrosoftAppCredentials(app_id, password, channel_auth_tenant=tenant_id)


@dataclass(frozen=True)
class TeamsPost:
    """The provider request: the card activity, and the stored conversation it goes to."""

    message: Message
    ref: ConversationRef  # read through the ReferenceStore: the budget is the conversation's
    activity: Activity


class TeamsSent(NamedTuple):
    """The provider response: the activity id Teams gave the posted card (if it said)."""

    conversation_id: str
    activity_id: str | None


class TeamsAdapter(Channel[TeamsPost, TeamsSent]):
    """Teams has no idempotency key and no cheap way to find a bot's earlier message in a
    conversation (no metadata search; history reads need Graph permissions), so a send whose
    outcome is unknown can be neither reconciled nor deduplicated: tasks.send.outcomes holds it
    (at-most-once types) or sends it again with an incident (at-least-once types)."""

    channel = "teams"
    needs_address = True
    dedups_by_key = False
    updates_in_place = True  # update_activity, within the conversation's budget

    def __init__(
        self,
        *,
        credentials: MicrosoftAppCredentials,
        store: ReferenceStore,
        limits: RateLimits | None = None,
        quota: Quota = TEAMS_QUOTA,
        timeout: float = 10.0,
        max_wait: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.credentials = credentials
        self.store = store
        self.limits = limits
        self.quota = quota
        self.timeout = timeout
        self.max_wait = max_wait  # longer waits for the budget go back to the queue as a retry
        self.sleep = sleep
        self._local = threading.local()

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> TeamsAdapter:
        """Wiring: the reference store comes from the composition root (tasks.runtime)."""
        return cls(
            credentials=credentials_for(s.teams_app_id, s.teams_app_password, s.teams_tenant_id),
            store=parts.references,
            limits=parts.limits,
            timeout=s.webhook_timeout,
        )

    def to_request(self, message: Message) -> TeamsPost:
        """The card activity for the recipient's stored conversation (the reference is read
        through the store first: the budget is the conversation's)."""
        ref = self._reference(message)
        activity = to_activity(to_card(message), ref, message.content.get("title"))
        return TeamsPost(message, ref, activity)

    def spend(self, message: Message, request: TeamsPost) -> None:
        self._throttle(request.ref.conversation_id, message.lane)

    def call(self, request: TeamsPost) -> TeamsSent:
        ref, activity = request.ref, request.activity
        sent = self._invoke(
            request.message,
            ref,
            lambda c: c.conversations.send_to_conversation(ref.conversation_id, activity),
            posting=True,
        )
        return TeamsSent(ref.conversation_id, sent.id if sent else None)

    def from_response(self, message: Message, response: TeamsSent) -> SendResult:
        return SendResult(
            platform="teams",
            provider_message_id=message_id(response.conversation_id, response.activity_id)
            if response.activity_id
            else None,
        )

    def update(
        self, message: Message, provider_message_id: str, answered: str | None = None
    ) -> None:
        """Replace the sent card: answered (with the catalog label), or with its buttons and the
        content re-rendered (a collapse leader's running count). Spends the conversation's
        budget like a send; raises SendErrors."""
        ids = split_message_id(provider_message_id)
        if ids is None:
            raise PermanentSendError(
                "bad_message_id", f"not a Teams message id: {provider_message_id!r}"
            )
        ref = replace(self._reference(message), conversation_id=ids[0])
        card = answered_card(message, answered) if answered else to_card(message)
        activity = to_activity(card, ref, message.content.get("title"))
        activity.id = ids[1]
        self._throttle(ref.conversation_id, message.lane)
        self._invoke(
            message, ref, lambda c: c.conversations.update_activity(ids[0], ids[1], activity)
        )

    def _reference(self, message: Message) -> ConversationRef:
        if not message.address:
            raise PermanentSendError("no_address", "recipient has no teams address")
        ref = self.store.reference(message.user_id, message.address)
        if ref is None:
            raise PermanentSendError(
                "no_conversation",
                f"{message.address} has not talked to the bot yet "
                "(no stored conversation reference)",
            )
        return ref

    def _invoke(
        self,
        message: Message,
        ref: ConversationRef,
        operation: Callable[[ConnectorClient], Any],
        *,
        posting: bool = False,
    ) -> Any:
        """One connector call; its errors become SendErrors (a 429 pauses the conversation)."""
        try:
            return operation(self._client(ref.service_url))
        except ErrorResponseException as exc:
            raise self._failed(message, ref, exc.response, posting) from exc
        except (ClientRequestError, requests.RequestException) as exc:
            raise network_error(exc, posting=posting) from exc
        except PermissionError as exc:  # no token for the bot's credentials (AAD said no)
            raise TransientSendError("token", str(exc)[:200]) from exc

    def _failed(
        self, message: Message, ref: ConversationRef, response: requests.Response, posting: bool
    ) -> SendError:
        error = send_error(response.status_code, response.headers, response.text, posting=posting)
        if response.status_code == 429 and self.limits is not None:
            wait = getattr(error, "retry_after", None) or 1.0
            self.limits.pause(self.quota, ref.conversation_id, wait)
        if response.status_code in GONE_STATUSES:
            self.store.gone(message.user_id, message.address or "", str(error))
        log.info("teams send failed", extra={"action": "teams_send_failed", "reason": error.reason})
        return error

    def _throttle(self, conversation: str, lane: str | None = None) -> None:
        """Spend from the conversation's budget; a short wait is slept here, a longer one goes
        back to the queue (ThrottledError: the attempt is refunded)."""
        if self.limits is None:
            return
        for _ in range(3):
            try:
                self.limits.take(self.quota, conversation, lane=lane)
                return
            except ThrottledError as full:
                wait = full.retry_after or 0.0
                if wait > self.max_wait:
                    raise
                self.sleep(wait)
        self.limits.take(self.quota, conversation, lane=lane)

    def _client(self, service_url: str) -> ConnectorClient:
        clients = self._local.__dict__.setdefault("clients", {})
        if service_url not in clients:
            client = ConnectorClient(self.credentials, base_url=service_url)
            # Retries are the ledger's job (and a 429 must reach it): msrest would otherwise retry
            # 5xx three times and sleep through a Retry-After inside this worker thread.
            policy = client.config.retry_policy
            policy.retries = 0
            policy.policy.status_forcelist = frozenset()
            policy.policy.respect_retry_after_header = False
            policy.policy.raise_on_status = False
            client.config.connection.timeout = self.timeout
            clients[service_url] = client
        return clients[service_url]
