"""Acknowledging an escalation chain from outside a delivery: the app through the API
(`POST /v1/requests/{id}/ack`), or the person through a signed link in any channel.

    from clarion.tasks.escalation_ack import acknowledge, ack_link
    acknowledge("user-42", request_id, by="api key ops-bot")  # -> "acked" | ... ; NotInChain
    ack_link("user-42", request_id)  # https://…/ack?t=…, valid 7 days

A request of any step names its chain. Every step request clarion fires carries the variable
`ack_link` (a link for that step's own request), so a step's template can show
`{{ ack_link }}` if the type declares it (`defaults: {ack_link: ""}`). The link is signed like the
preferences links (clarion/links.py, purpose `escalation-ack`): it names the user and the request
and cannot open anything else.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from clarion import clock, links, settings
from clarion.db import escalations as store
from clarion.db.engine import engine
from clarion.errors import NotInChain

PURPOSE = "escalation-ack"
PATH = "/ack"
DEFAULT_TTL = "7d"


def acknowledge(user_id: str, request_id: int, *, by: str, now: datetime | None = None) -> str:
    """Stop the chain request (user_id, request_id) belongs to: `acked` (its later steps are not
    sent), `ack_after_finish` (nothing was left to stop) or `already_acked` (idempotent).
    Raises NotInChain when the request belongs to no chain (or does not exist)."""
    with engine().begin() as conn:
        outcome = store.acknowledge(conn, user_id, request_id, by[:300], now or clock.now())
    if outcome is None:
        raise NotInChain(user_id, request_id)
    return outcome


def ack_token(
    user_id: str,
    request_id: int,
    *,
    ttl: str | float | timedelta = DEFAULT_TTL,
    now: datetime | None = None,
) -> str:
    """The signed token of an acknowledgement link for (user_id, request_id)."""
    expires = int((now or clock.now()).timestamp() + links.parse_ttl(ttl))
    key = links.link_key(settings.get())
    return links.sign(key, PURPOSE, f"{request_id}:{user_id}", expires)


def ack_link(
    user_id: str,
    request_id: int,
    *,
    ttl: str | float | timedelta = DEFAULT_TTL,
    now: datetime | None = None,
) -> str:
    """The URL under CLARION_PUBLIC_URL that acknowledges the chain of (user_id, request_id)."""
    token = ack_token(user_id, request_id, ttl=ttl, now=now)
    return f"{settings.get().public_url.rstrip('/')}{PATH}?t={token}"


def read_ack_token(token: str, *, now: datetime | None = None) -> tuple[str, int]:
    """(user_id, request_id) of a token ack_token made; BadLink or ExpiredLink otherwise."""
    subject = links.verify(links.link_key(settings.get()), PURPOSE, token, now=now or clock.now())
    request, _, user = subject.partition(":")
    if not (request.isascii() and request.isdigit() and user):
        raise links.BadLink("malformed acknowledgement link")  # only a key holder could sign it
    return user, int(request)
