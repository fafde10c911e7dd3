"""Signed preferences links for app code and `clarion link`.

    from clarion.tasks import preferences_link
    url = preferences_link("user-42", ttl="7d")  # put it in an email footer, a chat message...

The link opens the recipient's preferences page (web/preferences.py) until it expires; whoever
holds it can change that recipient's optional notifications, so hand it to that recipient only.
Signed with CLARION_LINK_SECRET (clarion/links.py says how, and what it falls back to).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from clarion import clock, links, settings
from clarion import validation as check
from clarion.db import ledger
from clarion.db.engine import engine
from clarion.errors import UnknownRecipient

PURPOSE = "preferences"
PATH = "/preferences"
DEFAULT_TTL = "7d"


def preferences_token(
    user_id: str, *, ttl: str | float | timedelta = DEFAULT_TTL, now: datetime | None = None
) -> str:
    """The signed token of a preferences link for `user_id`, valid for `ttl` from `now`."""
    user = check.text("user_id", user_id, max_bytes=check.USER_ID_BYTES)
    expires = int((now or clock.now()).timestamp() + links.parse_ttl(ttl))
    return links.sign(links.link_key(settings.get()), PURPOSE, user, expires)


def preferences_link(
    user_id: str, *, ttl: str | float | timedelta = DEFAULT_TTL, now: datetime | None = None
) -> str:
    """The URL of `user_id`'s preferences page under CLARION_PUBLIC_URL, valid for `ttl` (seconds,
    a timedelta, or "30m", "12h", "7d", "2w"; at most 366 days). Raises UnknownRecipient for a user
    never registered, InvalidRequest for a bad ttl."""
    token = preferences_token(user_id, ttl=ttl, now=now)
    with engine().connect() as conn:
        if user_id not in ledger.recipient_locales(conn, [user_id]):
            raise UnknownRecipient(user_id)
    return f"{settings.get().public_url.rstrip('/')}{PATH}?t={token}"


def read_preferences_token(token: str, *, now: datetime | None = None) -> str:
    """The user id a preferences token names; BadLink or ExpiredLink (clarion.links) otherwise."""
    return links.verify(links.link_key(settings.get()), PURPOSE, token, now=now or clock.now())


def form_token(token: str) -> str:
    """The CSRF token of the page opened with `token`."""
    return links.form_token(links.link_key(settings.get()), token)


def check_form_token(token: str, given: str) -> bool:
    return links.check_form_token(links.link_key(settings.get()), token, given)
