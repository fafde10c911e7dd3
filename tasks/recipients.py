"""Recipients as the HTTP API and `clarion forget` see them: save (create or replace) in the
caller's transaction, read, and erase (db/erasure.py) with the server's address key."""

from __future__ import annotations

import logging
from datetime import time
from functools import partial
from typing import Any

from sqlalchemy import Connection

from clarion import clock, hashing, settings
from clarion.db import erasure, ledger
from clarion.db.engine import engine
from clarion.db.erasure import Erased
from clarion.tasks.producer import recipient_fields

log = logging.getLogger(__name__)


def checked(user_id: object, body: dict[str, Any]) -> dict[str, Any]:
    """register_recipient()'s checks over a body of its keyword arguments (InvalidField naming
    the first bad field). Absent keys take register_recipient()'s defaults."""
    return recipient_fields(
        user_id,
        timezone=body.get("timezone"),
        locale=body.get("locale", "en"),
        country=body.get("country"),
        org_id=body.get("org_id"),
        addresses=body.get("addresses"),
        quiet_hours=body.get("quiet_hours"),
        workweek=body.get("workweek"),
        subdivision=body.get("subdivision"),
        attributes=body.get("attributes"),
    )


def save(conn: Connection, fields: dict[str, Any]) -> bool:
    """Create or replace a recipient from checked fields; True if it is new (never registered, or
    erased since)."""
    live = ledger.is_live_recipient(conn, fields["user_id"])
    ledger.upsert_recipient(conn, **fields, now=clock.now())
    return not live


def _clock(value: time | None) -> str | None:
    return None if value is None else value.strftime("%H:%M")


def read(user_id: str) -> dict[str, Any] | None:
    """The recipient as the API shows it; None if unknown or erased."""
    with engine().connect() as conn:
        row = ledger.recipient(conn, user_id)
    if row is None:
        return None
    start, end = row.pop("quiet_start"), row.pop("quiet_end")
    row["quiet_hours"] = None if start is None else [_clock(start), _clock(end)]
    row["workweek"] = None if row["workweek"] is None else list(row["workweek"])
    row["addresses"] = dict(row["addresses"] or {})
    row["attributes"] = dict(row["attributes"] or {})
    return row


def forget(user_id: str) -> Erased | None:
    """Erase a recipient's personal data in one transaction (idempotent); None if unknown."""
    key = hashing.address_key(settings.get())
    with engine().begin() as conn:
        erased = erasure.erase(conn, user_id, hashed=partial(hashing.hashed, key), now=clock.now())
    if erased is not None:
        log.info(
            "recipient erased",
            extra={"action": "recipient_erased", "user_id": user_id, "changed": erased.changed},
        )
    return erased
