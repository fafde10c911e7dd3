"""Slack's side of clarion's door: the request signature, and the shapes of the bodies clarion reads.

`verify` checks `X-Slack-Signature` (v0= HMAC-SHA256 of "v0:{timestamp}:{raw body}" with the
signing secret) and a timestamp within five minutes, on the raw bytes and before anything is
decoded: a header of any shape (missing, non-numeric, non-ASCII, huge) is a 401, never an error.

`parse` then reads a verified body: JSON for the Events API, a form with `payload=<JSON>` for
interactivity, `ssl_check=1` for Slack's certificate check. What clarion handles (url_verification,
event_callback, block_actions) becomes a typed envelope whose `to_bolt()` is the only body Bolt sees:
rebuilt from checked fields, so neither Bolt's context builders and matchers nor clarion's listeners
meet a field of an unexpected type. Anything malformed is a 400 naming the field.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from clarion.web.inbound import Refused, decode_json, ident, json_value, obj, text

BODY_LIMIT = 64 * 1024
MAX_SKEW = 300  # seconds between Slack's timestamp and ours (Slack's own rule)
MAX_ACTIONS = 25  # an actions block holds at most 25 elements
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")


def verify(secret: str, headers: Mapping[str, str], body: bytes, *, now: float) -> None:
    """Raise Refused(401) unless Slack signed exactly this body within the last five minutes."""
    timestamp = headers.get("x-slack-request-timestamp") or ""
    signature = headers.get("x-slack-signature") or ""
    if not _TIMESTAMP.fullmatch(timestamp) or not _SIGNATURE.fullmatch(signature):
        raise Refused(401, "missing or malformed signature headers")
    if abs(now - int(timestamp)) > MAX_SKEW:
        raise Refused(401, "stale timestamp")
    base = b"v0:" + timestamp.encode("ascii") + b":" + body
    expected = "v0=" + hmac.new(secret.encode("utf-8"), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise Refused(401, "bad signature")


# --- envelopes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SslCheck:
    """Slack checking the endpoint's certificate: answered 200, nothing else."""


@dataclass(frozen=True)
class Unhandled:
    """A well-formed body of a kind clarion has no listener for (a slash command, a modal)."""

    kind: str


@dataclass(frozen=True)
class UrlVerification:
    challenge: str

    def to_bolt(self) -> dict[str, Any]:
        return {"type": "url_verification", "challenge": self.challenge}


@dataclass(frozen=True)
class Event:
    type: str
    user: str | None = None
    tab: str | None = None
    channel: str | None = None
    bot_id: str | None = None

    def to_bolt(self) -> dict[str, Any]:
        fields = {
            "user": self.user,
            "tab": self.tab,
            "channel": self.channel,
            "bot_id": self.bot_id,
        }
        return {"type": self.type, **{k: v for k, v in fields.items() if v is not None}}


@dataclass(frozen=True)
class EventCallback:
    event: Event
    team_id: str | None = None
    api_app_id: str | None = None
    event_id: str | None = None

    def to_bolt(self) -> dict[str, Any]:
        body = {
            "type": "event_callback",
            "event": self.event.to_bolt(),
            "team_id": self.team_id,
            "api_app_id": self.api_app_id,
            "event_id": self.event_id,
        }
        return {k: v for k, v in body.items() if v is not None}


@dataclass(frozen=True)
class Action:
    action_id: str
    value: Any = None  # free-form (a button value is untrusted data, judged by handle_click)
    block_id: str | None = None
    type: str | None = None

    def to_bolt(self) -> dict[str, Any]:
        action = {
            "action_id": self.action_id,
            "value": self.value,
            "block_id": self.block_id,
            "type": self.type,
        }
        return {k: v for k, v in action.items() if v is not None}


@dataclass(frozen=True)
class BlockActions:
    user_id: str
    actions: tuple[Action, ...]
    team_id: str | None = None
    api_app_id: str | None = None
    channel_id: str | None = None
    message_ts: str | None = None

    def to_bolt(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": "block_actions",
            "user": {"id": self.user_id},
            "actions": [a.to_bolt() for a in self.actions],
        }
        if self.team_id:
            body["team"] = {"id": self.team_id}
            body["user"]["team_id"] = self.team_id
        if self.api_app_id:
            body["api_app_id"] = self.api_app_id
        if self.channel_id:
            body["channel"] = {"id": self.channel_id}
            body["container"] = {
                "type": "message",
                "channel_id": self.channel_id,
                **({"message_ts": self.message_ts} if self.message_ts else {}),
            }
        return body


Envelope = SslCheck | Unhandled | UrlVerification | EventCallback | BlockActions


# --- reading ------------------------------------------------------------------------------------


def parse(body: bytes, content_type: str) -> Envelope:
    """A verified body as the envelope clarion acts on. Raises Refused(400) on anything malformed."""
    try:
        decoded = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(400, "body is not UTF-8") from exc
    if "json" in content_type.lower() or decoded.lstrip().startswith("{"):
        return _from_payload(decode_json(decoded))
    try:
        form = dict(parse_qsl(decoded, keep_blank_values=True, errors="strict", max_num_fields=50))
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refused(400, "body is not a form") from exc
    if "payload" in form:
        return _from_payload(decode_json(form["payload"], "payload"))
    if form.get("ssl_check") == "1":
        return SslCheck()
    return Unhandled("command" if "command" in form else "form")


def _from_payload(payload: Any) -> Envelope:
    if not isinstance(payload, dict):
        raise Refused(400, "payload: expected an object")
    kind = text(payload, "type", "type", required=True, max_len=64)
    if kind == "url_verification":
        return UrlVerification(
            text(payload, "challenge", "challenge", required=True, max_len=256) or ""
        )
    if kind == "event_callback":
        return read_event_callback(payload)
    if kind == "block_actions":
        return read_block_actions(payload)
    return Unhandled(kind or "")


def read_event(event: Mapping[str, Any], field: str = "event") -> Event:
    """An Events API event (the part clarion's listeners read)."""
    return Event(
        type=text(event, "type", f"{field}.type", required=True, max_len=64) or "",
        user=ident(event, "user", f"{field}.user"),
        tab=text(event, "tab", f"{field}.tab", max_len=32),
        channel=ident(event, "channel", f"{field}.channel"),
        bot_id=ident(event, "bot_id", f"{field}.bot_id"),
    )


def read_event_callback(payload: Mapping[str, Any]) -> EventCallback:
    event = obj(payload, "event", "event", required=True) or {}
    return EventCallback(
        read_event(event),
        team_id=ident(payload, "team_id", "team_id"),
        api_app_id=ident(payload, "api_app_id", "api_app_id"),
        event_id=ident(payload, "event_id", "event_id"),
    )


def read_block_actions(payload: Mapping[str, Any]) -> BlockActions:
    """A block_actions interaction: who clicked, where, and which actions (at least one)."""
    user = obj(payload, "user", "user", required=True) or {}
    team = obj(payload, "team", "team") or {}
    container = obj(payload, "container", "container") or {}
    channel = obj(payload, "channel", "channel") or {}
    actions = payload.get("actions")
    if not isinstance(actions, list) or not 1 <= len(actions) <= MAX_ACTIONS:
        raise Refused(400, f"actions: expected a list of 1 to {MAX_ACTIONS} objects")
    return BlockActions(
        user_id=ident(user, "id", "user.id", required=True) or "",
        actions=tuple(_action(a, f"actions[{i}]") for i, a in enumerate(actions)),
        team_id=ident(team, "id", "team.id") or ident(user, "team_id", "user.team_id"),
        api_app_id=ident(payload, "api_app_id", "api_app_id"),
        channel_id=ident(container, "channel_id", "container.channel_id")
        or ident(channel, "id", "channel.id"),
        message_ts=ident(container, "message_ts", "container.message_ts"),
    )


def _action(action: Any, field: str) -> Action:
    if not isinstance(action, dict):
        raise Refused(400, f"{field}: expected an object")
    return Action(
        action_id=text(action, "action_id", f"{field}.action_id", required=True, max_len=255) or "",
        value=json_value(action.get("value"), f"{field}.value"),
        block_id=text(action, "block_id", f"{field}.block_id", max_len=255),
        type=text(action, "type", f"{field}.type", max_len=64),
    )
