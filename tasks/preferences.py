"""Recipients' preferences: set them, and read them back resolved for every type and channel.

Settings are written as "scope[:key][/channel]" → on/off (None clears):
    set_preferences("u1", {"all": False,                      # unsubscribe from everything optional
                           "category:marketing/email": True,  # but marketing e-mail is welcome
                           "type:stalled_plan": False})       # and never this nudge
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection

from clarion import clock
from clarion.db import gating, ledger
from clarion.db.engine import engine, in_transaction
from clarion.errors import InvalidRequest, UnknownRecipient
from clarion.gates import preferences as resolution
from clarion.scheduling.zones import country_of
from clarion.tasks import runtime

Row = tuple[str, str, str, bool | None]


def parse_setting(name: str, enabled: Any) -> Row:
    """'type:x/email' → ('type', 'x', 'email', enabled), checked against the catalog."""
    catalog = runtime.catalog()
    if enabled is not None and not isinstance(enabled, bool):
        raise InvalidRequest(f"{name}: the value must be true, false or null, not {enabled!r}")
    target, _, channel = str(name).partition("/")
    scope, _, key = target.partition(":")
    channel = channel or "*"
    if channel != "*" and channel not in catalog.channels:
        raise InvalidRequest(f"{name}: unknown channel {channel!r}")
    if scope == "all" and not key:
        return "all", "*", channel, enabled
    if scope == "category" and key in {t.category for t in catalog.types.values()}:
        if key in resolution.LOCKED_CATEGORIES and enabled is False:
            raise InvalidRequest(f"{name}: {key} notifications cannot be turned off")
        return "category", key, channel, enabled
    if scope == "type" and (ntype := catalog.get(key)) is not None:
        if ntype.category in resolution.LOCKED_CATEGORIES and enabled is False:
            raise InvalidRequest(f"{name}: {key} is {ntype.category} and cannot be turned off")
        return "type", key, channel, enabled
    raise InvalidRequest(
        f"unknown preference {name!r}; use all, category:<name> or type:<key>, "
        "optionally followed by /<channel>"
    )


def set_preferences(
    user_id: str, settings: Mapping[str, bool | None], *, connection: Connection | None = None
) -> None:
    """Change some of a recipient's settings; all are validated before any is written."""
    rows = [parse_setting(name, value) for name, value in settings.items()]
    in_transaction(connection, lambda conn: _write(conn, user_id, rows))


def _write(conn: Connection, user_id: str, rows: list[Row]) -> None:
    if user_id not in ledger.recipient_locales(conn, [user_id]):
        raise UnknownRecipient(user_id)
    gating.set_preferences(conn, user_id, rows, now=clock.now())


def get_preferences(user_id: str) -> dict[str, Any]:
    """The recipient's own settings, and the resolved answer for every type × channel with its rule."""
    catalog = runtime.catalog()
    with engine().connect() as conn:
        recipient = ledger.recipient(conn, user_id)  # None when unknown or erased
        if recipient is None:
            raise UnknownRecipient(user_id)
        rows = gating.preferences_of(conn, [user_id]).get(user_id, [])
    country = country_of(recipient["country"], recipient["timezone"])
    settings = {_name(r.scope, r.key, r.channel): r.enabled for r in rows}
    types = {
        t.key: {c: vars(resolution.resolve(t, c, rows, country)) for c in t.channels}
        for t in catalog.types.values()
    }
    return {"user_id": user_id, "jurisdiction": country, "settings": settings, "types": types}


def _name(scope: str, key: str, channel: str) -> str:
    base = "all" if scope == "all" else f"{scope}:{key}"
    return base if channel == "*" else f"{base}/{channel}"
