"""Apps' webhook endpoints: registered, changed, rotated, enabled and replayed — one set of checks
for the HTTP API (web/api_events.py) and the CLI (`clarion events ...`).

A URL is http(s) with a host; kinds are those of db.schema.EVENT_KINDS (`*` is all of them); a
secret is generated (`whsec_` + base64 of 32 random bytes) unless one is given. Rotating makes a
new secret and keeps the previous one signing for an overlap (CLARION_EVENTS_OVERLAP, a day by
default), so a receiver can deploy the new one without dropping events. Enabling clears a
disabled endpoint's failure streak and its `endpoint_disabled` alert; its waiting events go out.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from clarion import clock, settings
from clarion.adapters import http1, standard_webhooks
from clarion.db import alerts, outbound
from clarion.db.engine import engine
from clarion.db.outbound import Endpoint
from clarion.db.schema import EVENT_KINDS
from clarion.errors import InvalidField, InvalidRequest, UnknownEndpoint
from clarion.tasks.events import DISABLED

MAX_URL = 2000
MAX_DESCRIPTION = 500


def checked_url(url: str) -> str:
    if len(url) > MAX_URL:
        raise InvalidField("url", f"is longer than {MAX_URL} characters")
    try:
        http1.target(url)
    except ValueError as exc:
        raise InvalidField("url", f"must be http(s) with a host: {url[:100]!r}") from exc
    return url


def checked_kinds(kinds: Iterable[str]) -> list[str]:
    listed = list(dict.fromkeys(kinds))
    if "*" in listed:
        return list(EVENT_KINDS)
    unknown = [k for k in listed if k not in EVENT_KINDS]
    if not listed or unknown:
        shown = ", ".join(repr(k[:40]) for k in unknown[:5])
        raise InvalidField(
            "kinds",
            (f"unknown event kind {shown}" if unknown else "give at least one event kind")
            + f"; known: {', '.join(EVENT_KINDS)} (or * for all)",
        )
    return listed


def checked_description(description: str) -> str:
    if len(description) > MAX_DESCRIPTION:
        raise InvalidField("description", f"is longer than {MAX_DESCRIPTION} characters")
    return description


def _found(endpoint: Endpoint | None, endpoint_id: int) -> Endpoint:
    if endpoint is None:
        raise UnknownEndpoint(endpoint_id)
    return endpoint


def create(
    url: str, kinds: Iterable[str], *, description: str = "", secret: str | None = None
) -> Endpoint:
    if secret is not None:
        try:
            standard_webhooks.key_of(secret)
        except InvalidRequest as exc:
            raise InvalidField("secret", str(exc)) from exc
    with engine().begin() as conn:
        return outbound.create_endpoint(
            conn,
            url=checked_url(url),
            kinds=checked_kinds(kinds),
            secret=secret or standard_webhooks.new_secret(),
            description=checked_description(description),
            now=clock.now(),
        )


def listed() -> list[Endpoint]:
    with engine().connect() as conn:
        return outbound.endpoints(conn)


def get(endpoint_id: int) -> Endpoint:
    with engine().connect() as conn:
        return _found(outbound.endpoint(conn, endpoint_id), endpoint_id)


def remove(endpoint_id: int) -> None:
    with engine().begin() as conn:
        if not outbound.delete_endpoint(conn, endpoint_id):
            raise UnknownEndpoint(endpoint_id)


def change(
    endpoint_id: int,
    *,
    url: str | None = None,
    kinds: Iterable[str] | None = None,
    description: str | None = None,
    enabled: bool | None = None,
    rotate: bool = False,
    overlap: float | None = None,
) -> Endpoint:
    """Apply a PATCH: each given field, in one transaction. `enabled=False` disables by hand."""
    now = clock.now()
    fields: dict[str, Any] = {
        "url": checked_url(url) if url is not None else None,
        "kinds": checked_kinds(kinds) if kinds is not None else None,
        "description": checked_description(description) if description is not None else None,
    }
    with engine().begin() as conn:
        found = _found(outbound.change_endpoint(conn, endpoint_id, now=now, **fields), endpoint_id)
        if rotate:
            keep = settings.get().events_overlap if overlap is None else overlap
            if keep < 0:
                raise InvalidField("overlap_seconds", "must be 0 or more")
            found = _found(
                outbound.rotate_secret(
                    conn,
                    endpoint_id,
                    secret=standard_webhooks.new_secret(),
                    until=now + timedelta(seconds=keep),
                    now=now,
                ),
                endpoint_id,
            )
        if enabled is True:
            found = _found(outbound.enable(conn, endpoint_id, now=now), endpoint_id)
            alerts.clear_alert(conn, DISABLED, f"endpoint:{endpoint_id}", now=now)
        elif enabled is False:
            found = outbound.disable(conn, endpoint_id, reason="disabled by hand", now=now) or found
    return found


def replay(since: datetime, endpoint_ids: Iterable[int] | None = None) -> int:
    """Send every event since `since` again to these endpoints (default: all); enables none."""
    now = clock.now()
    with engine().begin() as conn:
        ids = (
            list(endpoint_ids)
            if endpoint_ids is not None
            else [e.id for e in outbound.endpoints(conn)]
        )
        for endpoint_id in ids:
            _found(outbound.endpoint(conn, endpoint_id), endpoint_id)
        return outbound.replay(conn, ids, since=since, now=now)


def shown(endpoint: Endpoint, *, with_secret: bool = False) -> dict[str, Any]:
    """The endpoint as the API and the CLI show it; its secret only when asked (create, rotate)."""
    out: dict[str, Any] = {
        "id": endpoint.id,
        "url": endpoint.url,
        "kinds": list(endpoint.kinds),
        "description": endpoint.description,
        "enabled": endpoint.enabled,
        "disabled_reason": endpoint.disabled_reason,
        "failing_since": endpoint.failing_since,
        "previous_secret_until": endpoint.previous_until,
        "created_at": endpoint.created_at,
        "updated_at": endpoint.updated_at,
    }
    if with_secret:
        out["secret"] = endpoint.secret
    return out
