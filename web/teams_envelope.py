"""Teams' side of clarion's door: the bearer token's shape, and the shape of the activities clarion reads.

The order at /api/messages is: size (413), a bearer token of a JWT's shape unless clarion runs in
local mode (401, before the body is parsed), the Bot Framework's own token check (401; it needs the
activity's channelId and serviceUrl, read here with `probe`), then `read_activity` (400 naming the
field). Only the checked activity, rebuilt from the fields clarion and botbuilder use, is handed
to botbuilder: an invoke whose value is not an object, an account that is a string or a serviceUrl
that is not a URL never reaches a handler.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from botbuilder.schema import Activity, ChannelAccount

from clarion.web.inbound import Refused, ident, json_value, obj, text

BODY_LIMIT = 256 * 1024
MAX_TOKEN = 16 * 1024
MAX_MESSAGE = 28 * 1024  # Teams' own cap on a message
CARD_ACTION = "adaptiveCard/action"
_BEARER = re.compile(r"Bearer [A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


def check_bearer(header: str | None) -> None:
    """Raise Refused(401) unless the Authorization header carries a JWT-shaped bearer token."""
    if not header or len(header) > MAX_TOKEN or not _BEARER.fullmatch(header):
        raise Refused(401, "missing or malformed bearer token")


def probe(data: Any) -> Activity:
    """The few fields Bot Framework authentication reads, taken defensively from unchecked JSON."""
    fields = data if isinstance(data, dict) else {}

    def string(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    recipient = fields.get("recipient")
    if not isinstance(recipient, dict):
        recipient = {}
    return Activity(
        channel_id=string(fields.get("channelId")),
        service_url=string(fields.get("serviceUrl")),
        recipient=ChannelAccount(
            id=string(recipient.get("id")), role=string(recipient.get("role"))
        ),
    )


def read_activity(data: Any) -> Activity:
    """The activity as clarion acts on it. Raises Refused(400) on anything malformed."""
    if not isinstance(data, dict):
        raise Refused(400, "activity: expected an object")
    kind = text(data, "type", "type", required=True, max_len=64)
    name = text(data, "name", "name", max_len=256)
    checked: dict[str, Any] = {
        "type": kind,
        "name": name,
        "id": ident(data, "id", "id"),
        "channelId": ident(data, "channelId", "channelId"),
        "serviceUrl": service_url(data),
        "replyToId": ident(data, "replyToId", "replyToId"),
        "text": text(data, "text", "text", max_len=MAX_MESSAGE),
        "locale": text(data, "locale", "locale", max_len=64),
        "from": _account(data, "from"),
        "recipient": _account(data, "recipient"),
        "conversation": _conversation(data),
        "channelData": _channel_data(data),
        "value": json_value(data.get("value"), "value"),
    }
    if kind == "invoke" and name == CARD_ACTION:
        _card_action(checked["value"])
    try:
        return Activity().deserialize({k: v for k, v in checked.items() if v is not None})
    except Exception as exc:  # msrest should accept every checked shape; never let it be a 500
        raise Refused(400, f"activity: {type(exc).__name__}") from exc


def service_url(data: Mapping[str, Any]) -> str:
    """serviceUrl: required, an http(s) URL with a host (replies and proactive sends go there)."""
    url = text(data, "serviceUrl", "serviceUrl", required=True, max_len=2048) or ""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port or 0) >= 0
    except ValueError:  # a bad port, a bad IPv6 literal
        ok = False
    if not ok or not url.isprintable():
        raise Refused(400, "serviceUrl: not an http(s) URL")
    return url


def _account(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    account = obj(data, key, key)
    if account is None:
        return None
    fields = {
        "id": ident(account, "id", f"{key}.id"),
        "name": text(account, "name", f"{key}.name", max_len=256),
        "aadObjectId": ident(account, "aadObjectId", f"{key}.aadObjectId"),
        "role": text(account, "role", f"{key}.role", max_len=32),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _conversation(data: Mapping[str, Any]) -> dict[str, Any] | None:
    conversation = obj(data, "conversation", "conversation")
    if conversation is None:
        return None
    fields = {
        "id": ident(conversation, "id", "conversation.id"),
        "conversationType": text(
            conversation, "conversationType", "conversation.conversationType", max_len=32
        ),
        "tenantId": ident(conversation, "tenantId", "conversation.tenantId"),
    }
    return {k: v for k, v in fields.items() if v is not None}


def _channel_data(data: Mapping[str, Any]) -> dict[str, Any] | None:
    channel_data = obj(data, "channelData", "channelData")
    tenant = obj(channel_data, "tenant", "channelData.tenant") if channel_data else None
    tenant_id = ident(tenant, "id", "channelData.tenant.id") if tenant else None
    return {"tenant": {"id": tenant_id}} if tenant_id else None


def _card_action(value: Any) -> None:
    """An adaptiveCard/action invoke: value {"action": {"verb": str, "data": object | str}}."""
    if not isinstance(value, dict):
        raise Refused(400, "value: expected an object")
    action = obj(value, "action", "value.action", required=True) or {}
    text(action, "verb", "value.action.verb", max_len=256)
    text(action, "type", "value.action.type", max_len=64)
    if action.get("data") is not None and not isinstance(action["data"], dict | str):
        raise Refused(400, "value.action.data: expected an object or a string")
