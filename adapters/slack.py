"""The Slack channel: a Block Kit DM to the recipient's Slack user id, updated in place once answered.

Pure parts: `to_blocks`, `answered_blocks`, `metadata`, `find_posted`, `error_for`. I/O: `SlackAdapter`
over the real slack_sdk `WebClient` (conversations.open, chat.postMessage with message metadata
carrying the delivery id, chat.update, conversations.history for crash reconciliation).

A 429 pauses the whole workspace's shared budget (adapters.ratelimit, keyed by a hash of the bot
token) until Retry-After has passed; while paused, sends are deferred (the attempt refunded) without
calling Slack. A recipient Slack says is gone goes on the suppression list (the Suppressions the
composition root hands in).

Three outcomes. chat.postMessage answered `ok` is sent; an error answer, or a failure before the
request was written (urllib's URLError: no connection), failed; a 5xx, a timeout waiting for the
answer or a connection dropped mid-answer is *unknown*: Slack may have posted it. Slack has no
idempotency key, but every message carries its delivery in message metadata, so the next attempt
first looks for it (`reconcile`) and posts only if it is not there.
"""

from __future__ import annotations

import http.client
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.web import SlackResponse

from clarion.adapters.base import Channel, Collaborators, Suppressions
from clarion.adapters.escape import slack_mrkdwn
from clarion.adapters.ratelimit import Quota, RateLimits
from clarion.catalog import Button
from clarion.errors import (
    DeferredSendError,
    PermanentSendError,
    SendError,
    ThrottledError,
    TransientSendError,
    UnknownSendError,
)
from clarion.records import Message, SendResult
from clarion.settings import Settings

log = logging.getLogger(__name__)

METADATA_EVENT = "clarion_delivery"
TRANSIENT_ERRORS = frozenset(
    {"ratelimited", "internal_error", "fatal_error", "service_unavailable", "request_timeout"}
)
# The recipient is gone or cannot be messaged: their address goes on the suppression list.
# (`account_inactive` is not here: Slack sends it when the *bot token's* user or workspace is
# deleted, which says nothing about the recipient.)
UNREACHABLE_ERRORS = frozenset({"user_not_found", "user_disabled", "cannot_dm_bot"})
DEFAULT_PAUSE = 30.0  # seconds, when a 429 comes without Retry-After
# Per workspace. Slack's chat.postMessage limit is about one message per second per channel with
# bursts, and "several hundred a minute" per workspace; a 429 pauses every worker (Retry-After).
SLACK_QUOTA = Quota("slack", ((1200, 60.0),), share=1.0, fail_open=True)
# chat.update is a Tier 3 method: about 50 calls a minute per workspace. In-place updates (a
# collapse group's count) are cosmetic, so a full or unreadable budget waits (fails closed).
SLACK_UPDATES_PER_MINUTE = 50
HISTORY_LIMIT = 15  # conversations.history's page cap for non-Marketplace apps
HISTORY_MARGIN = timedelta(minutes=5)  # clock differences between PostgreSQL and Slack
HISTORY_PAGES = 4  # conversations.history calls one reconciliation may make
HEADER_MAX, TEXT_MAX, BUTTON_MAX, BUTTONS_MAX = 150, 3000, 75, 25


# --- pure: Block Kit ----------------------------------------------------------------------------


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape(text: str) -> str:
    """Slack's mrkdwn control characters: no links, mentions or channel pings from content
    (adapters.escape.slack_mrkdwn, the one place channel escaping lives)."""
    return slack_mrkdwn(text)


def _plain(text: str, limit: int) -> dict[str, Any]:
    return {"type": "plain_text", "text": _cut(text, limit), "emoji": True}


def content_blocks(message: Message) -> list[dict[str, Any]]:
    """Header (title) and section (body) from the rendered content."""
    title = message.content.get("title", "").strip()
    body = (message.content.get("body") or message.content.get("text") or "").strip()
    blocks: list[dict[str, Any]] = []
    if title:
        blocks.append({"type": "header", "text": _plain(title, HEADER_MAX)})
    if body:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(escape(body), TEXT_MAX)}}
        )
    return blocks


def button_element(message: Message, button: Button) -> dict[str, Any]:
    """One catalog button: label from the catalog, compact JSON value naming delivery and answer."""
    element = {
        "type": "button",
        "text": _plain(button.label, BUTTON_MAX),
        "value": message.button_value(button),
        "action_id": f"clarion:{button.key}",
    }
    if button.style in ("primary", "danger"):
        element["style"] = button.style
    return element


def to_blocks(message: Message) -> list[dict[str, Any]]:
    """The message as Block Kit: content, then one actions block with the catalog's buttons."""
    blocks = content_blocks(message)
    if message.buttons:
        blocks.append(
            {
                "type": "actions",
                "block_id": "clarion_answers",
                "elements": [button_element(message, b) for b in message.buttons[:BUTTONS_MAX]],
            }
        )
    return blocks


def answered_blocks(message: Message, label: str) -> list[dict[str, Any]]:
    """The same message with its buttons replaced by "Answered: <label>" (label from the catalog)."""
    return [
        *content_blocks(message),
        {"type": "context", "elements": [_plain(f"Answered: {label}", TEXT_MAX)]},
    ]


def fallback_text(message: Message) -> str:
    """The notification text (shown where blocks are not)."""
    parts = [
        message.content.get("title", ""),
        message.content.get("body") or message.content.get("text", ""),
    ]
    return _cut(
        escape("\n".join(p.strip() for p in parts if p and p.strip())) or message.type_key, TEXT_MAX
    )


def post_args(message: Message) -> dict[str, Any]:
    """What `send` gives chat.postMessage, but the DM channel (the provider request)."""
    return {
        "text": fallback_text(message),
        "blocks": to_blocks(message),
        "metadata": metadata(message),
        "unfurl_links": False,
        "unfurl_media": False,
    }


def metadata(message: Message) -> dict[str, Any]:
    """Message metadata: how reconciliation recognises this delivery's message later."""
    return {
        "event_type": METADATA_EVENT,
        "event_payload": {
            "delivery_id": message.delivery_id,
            "user_id": message.user_id,
            "idempotency_key": message.idempotency_key,
        },
    }


def find_posted(messages: list[dict[str, Any]], message: Message) -> str | None:
    """The ts of the message (from conversations.history) that carries this delivery's metadata."""
    for item in messages:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict) or meta.get("event_type") != METADATA_EVENT:
            continue
        payload = meta.get("event_payload") or {}
        if (
            str(payload.get("delivery_id")) == str(message.delivery_id)
            and payload.get("user_id") == message.user_id
            and item.get("ts")
        ):
            return str(item["ts"])
    return None


def message_ref(channel: str, ts: str) -> str:
    """The provider message id clarion stores: "<channel>:<ts>"."""
    return f"{channel}:{ts}"


def parse_ref(ref: str | None) -> tuple[str, str] | None:
    """(channel, ts) from a stored provider message id; None if it is not one of ours."""
    channel, sep, ts = (ref or "").partition(":")
    return (channel, ts) if sep and channel and ts else None


def retry_after(headers: dict[str, Any] | None) -> float | None:
    """The Retry-After header in seconds (any capitalisation), or None."""
    for name, value in (headers or {}).items():
        if name.lower() == "retry-after":
            value = value[0] if isinstance(value, list) and value else value
            try:
                return max(0.0, float(value))
            except (TypeError, ValueError):
                return None
    return None


def error_for(
    status: int, error: str | None, headers: dict[str, Any] | None, *, posting: bool = False
) -> SendError:
    """A Slack Web API failure as the SendError to raise. `posting`: the call posts a message,
    so a 5xx leaves its outcome unknown (Slack may have posted it before failing)."""
    reason = error if isinstance(error, str) and error.isidentifier() else f"http_{status}"
    detail = f"slack answered {status}: {str(error)[:200]}"
    if status == 429 or reason == "ratelimited":
        return ThrottledError("ratelimited", detail, retry_after(headers) or DEFAULT_PAUSE)
    if status >= 500 and posting:
        return UnknownSendError(reason, detail)
    if status >= 500 or reason in TRANSIENT_ERRORS:
        return TransientSendError(reason, detail, retry_after(headers))
    return PermanentSendError(reason, detail)


@contextmanager
def slack_errors(*, posting: bool = False) -> Iterator[None]:
    """Translate slack_sdk and network errors into SendErrors at the boundary. urllib raises
    URLError when the request could not be written (no connection: failed); anything raised while
    waiting for the answer leaves a posting call's outcome unknown."""
    try:
        yield
    except SlackApiError as exc:
        response = exc.response
        raise error_for(
            response.status_code, response.get("error"), response.headers, posting=posting
        ) from exc
    except URLError as exc:
        raise TransientSendError("connection", str(exc)[:200]) from exc
    except (OSError, http.client.HTTPException) as exc:
        if posting:
            raise UnknownSendError("no_answer", str(exc)[:200]) from exc
        raise TransientSendError("connection", str(exc)[:200]) from exc


# --- I/O ------------------------------------------------------------------------------------------


def update_message(
    client: WebClient, message: Message, provider_message_id: str, label: str
) -> bool:
    """Replace a sent message's buttons with its answer (chat.update). False if Slack refused."""
    ref = parse_ref(provider_message_id)
    if ref is None:
        return False
    try:
        with slack_errors():
            client.chat_update(
                channel=ref[0],
                ts=ref[1],
                text=fallback_text(message),
                blocks=answered_blocks(message, label),
            )
    except SendError as error:
        log.warning("slack update failed: %s", error, extra={"action": "slack_update_failed"})
        return False
    return True


def update_quota(per_minute: int = SLACK_UPDATES_PER_MINUTE) -> Quota:
    """The workspace's chat.update budget (clarion spends 90% of it)."""
    return Quota("slack_update", ((per_minute, 60.0),))


@dataclass(frozen=True)
class SlackPost:
    """The provider request: chat.postMessage's arguments, but the DM channel (opened by `call`)."""

    message: Message
    args: dict[str, Any]


class SlackAdapter(Channel[SlackPost, SlackResponse]):
    channel = "slack"
    needs_address = True  # the recipient's Slack user id
    dedups_by_key = False  # no idempotency key: an unknown send is reconciled through metadata
    updates_in_place = True  # chat.update

    def __init__(
        self,
        client: WebClient,
        *,
        workspace: str = "",
        limits: RateLimits | None = None,
        suppressions: Suppressions | None = None,
        quota: Quota = SLACK_QUOTA,
        updates: Quota | None = None,
    ) -> None:
        self.client = client
        self.workspace = workspace  # the budget key: a hash of the bot token
        self.limits = limits
        self.suppressions = suppressions
        self.quota = quota
        self.updates = updates or update_quota()
        self._dms: dict[
            str, str
        ] = {}  # user id -> DM channel id (stable; saves conversations.open)

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> SlackAdapter:
        """The adapter for the configured workspace (CLARION_SLACK_TOKEN, CLARION_SLACK_API_URL)."""
        # No SDK retries: a retried chat.postMessage can post twice; the ledger retries instead.
        client = WebClient(
            token=s.slack_token,
            base_url=s.slack_api_url,
            timeout=int(s.webhook_timeout),
            retry_handlers=[],
        )
        return cls(
            client,
            workspace=s.slack_token or "",
            limits=parts.limits,
            suppressions=parts.suppressions,
            updates=update_quota(s.slack_updates_per_minute),
        )

    def to_request(self, message: Message) -> SlackPost:
        return SlackPost(message, post_args(message))

    def budget(self, message: Message, request: SlackPost) -> tuple[Quota, str, int]:
        """The workspace's shared budget: paused by a 429 (every worker waits it out)."""
        return self.quota, self.workspace, 1

    def call(self, request: SlackPost) -> SlackResponse:
        """Open the DM and post the message (three outcomes: see the module docstring)."""
        try:
            with slack_errors():
                channel = self._dm(request.message)
            with slack_errors(posting=True):
                return self.client.chat_postMessage(channel=channel, **request.args)
        except SendError as error:
            self._failed(request.message, error, pause=True)
            raise

    def from_response(self, message: Message, response: SlackResponse) -> SendResult:
        return SendResult(
            platform="slack",
            provider_message_id=message_ref(str(response["channel"]), str(response["ts"])),
        )

    def update(
        self, message: Message, provider_message_id: str, answered: str | None = None
    ) -> None:
        """chat.update the sent message to `message`'s content: with the recorded answer in place
        of the buttons, or with its buttons (a collapse leader showing its running count). Spends
        the workspace's chat.update budget first; a 429 pauses that budget for every worker.
        Raises SendErrors (PermanentSendError for a message Slack no longer has)."""
        ref = parse_ref(provider_message_id)
        if ref is None:
            raise PermanentSendError(
                "bad_message_id", f"not a Slack message: {provider_message_id!r}"
            )
        if self.limits is not None:
            self.limits.take(self.updates, self.workspace, lane=message.lane)
        blocks = answered_blocks(message, answered) if answered else to_blocks(message)
        try:
            with slack_errors():
                self.client.chat_update(
                    channel=ref[0], ts=ref[1], text=fallback_text(message), blocks=blocks
                )
        except ThrottledError as error:
            if self.limits is not None:
                self.limits.pause(self.updates, self.workspace, error.retry_after or DEFAULT_PAUSE)
            raise

    def reconcile(self, message: Message, since: datetime) -> SendResult | None:
        """Look for this delivery's message (by its metadata) among what the DM received since the
        earlier attempt began. Slack cannot be asked now (a 429, an outage): DeferredSendError —
        "not known yet", to be asked again later, never a new post. UnknownSendError: it cannot
        be found out (the DM got too many messages since)."""
        try:
            with slack_errors():
                channel = self._dm(message)
                ts = self._find(channel, message, since - HISTORY_MARGIN)
        except SendError as error:
            self._failed(
                message, error, pause=False
            )  # history has its own limit; posting is not paused
            if isinstance(error, PermanentSendError | UnknownSendError):
                raise
            raise DeferredSendError(
                "reconcile_pending", str(error), getattr(error, "retry_after", None)
            ) from error
        log.info(
            "slack reconcile",
            extra={
                "action": "slack_reconciled" if ts else "slack_not_found",
                "delivery": message.delivery_id,
            },
        )
        return (
            SendResult(platform="slack", provider_message_id=message_ref(channel, ts))
            if ts
            else None
        )

    def _find(self, channel: str, message: Message, oldest: datetime) -> str | None:
        cursor = None
        for _ in range(HISTORY_PAGES):
            page = self.client.conversations_history(
                channel=channel,
                include_all_metadata=True,
                limit=HISTORY_LIMIT,
                oldest=f"{oldest.timestamp():.6f}",
                cursor=cursor,
            )
            ts = find_posted(page.get("messages") or [], message)
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if ts or not (page.get("has_more") and cursor):
                return ts
        # Too many messages to look through: whether it was posted stays unknown.
        raise UnknownSendError(
            "history_too_long", f"more than {HISTORY_PAGES} pages since {oldest}"
        )

    def _dm(self, message: Message) -> str:
        address = message.address
        if not address:
            raise PermanentSendError("no_address", f"{message.user_id} has no slack address")
        if address not in self._dms:
            if len(self._dms) > 10_000:
                self._dms.clear()
            self._dms[address] = self.client.conversations_open(users=address)["channel"]["id"]
        return self._dms[address]

    def _failed(self, message: Message, error: SendError, *, pause: bool) -> None:
        if isinstance(error, PermanentSendError):
            self._dms.pop(message.address or "", None)  # a stale DM id is not trusted again
        if pause and error.reason == "ratelimited" and self.limits is not None:
            retry_after = getattr(error, "retry_after", None)  # a ThrottledError's (see classify)
            self.limits.pause(self.quota, self.workspace, retry_after or DEFAULT_PAUSE)
            log.warning("slack paused", extra={"action": "slack_paused", "seconds": retry_after})
        if error.reason in UNREACHABLE_ERRORS and self.suppressions and message.address:
            try:
                self.suppressions.suppress(
                    message.user_id,
                    "slack",
                    message.address,
                    "deactivated",
                    f"slack: {error.reason}",
                )
            except Exception:  # the delivery still fails for good; the next one will try again
                log.exception("suppression not recorded", extra={"action": "slack_suppress_failed"})
