"""Named statements for digests: an item joins its open window, the digest's route closes it.

Joining is one upsert on the partial unique index of open windows: concurrent items for one
(recipient, digest type, key) meet there, and the database puts each in exactly one window. The
window's digest request is created with it (deferred until the window's due time, so the beat tick
finds it like any deferred request). Closing is a conditional update (`state IN ('open', 'full')`)
made by the route that has just resolved that request (so only one route closes it): an item and
the close meet on the window's row lock; the item either got in first (and is in the items the
close returns) or finds no open window and opens the next one.

Lock order: a route holds the digest request's row (resolve-once), then the window's. An item holds
the window's row and never waits for the request's: making a full window's request due now skips a
request row that is locked, since whoever holds it is routing or taking that request already.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from clarion.db.ledger import KEY_PAIRS, key_params
from clarion.errors import ClarionError
from clarion.rows import Key


@dataclass(frozen=True)
class Joined:
    """The window an item joined: its digest request, items so far, and when it flushes."""

    digest_id: int
    request_id: int
    count: int
    state: str  # open | full
    due_at: datetime
    opened: bool  # this item opened the window


@dataclass(frozen=True)
class Closed:
    """A window its digest's route has just closed, with every item it holds."""

    user_id: str
    digest_id: int
    request_id: int
    digest_type: str
    digest_key: str
    opened_at: datetime
    items: list[dict[str, Any]]

    @classmethod
    def from_row(cls, row: Any) -> Closed:
        return cls(**dict(row))


_JOIN = text(
    """
    INSERT INTO digests AS d (user_id, digest_type, digest_key, state, opened_at, due_at,
                              max_items, count, items)
    VALUES (:user_id, :digest_type, :digest_key,
            CASE WHEN :max_items <= 1 THEN 'full' ELSE 'open' END,
            :now, :due_at, :max_items, 1, jsonb_build_array(CAST(:item AS jsonb)))
    ON CONFLICT (user_id, digest_type, digest_key) WHERE state = 'open' DO UPDATE SET
        count = d.count + 1,
        items = d.items || excluded.items,
        state = CASE WHEN d.count + 1 >= d.max_items THEN 'full' ELSE 'open' END
    RETURNING id, request_id, count, state, due_at
    """
)
_OPEN_REQUEST = text(
    """
    INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,
                          state, due_at, created_at)
    VALUES (:user_id, :type_key, :occ, :lane, :version, '{}'::jsonb, 'deferred', :due_at, :now)
    ON CONFLICT (user_id, type_key, occurrence_key) DO NOTHING
    RETURNING id
    """
)
_LINK = text("UPDATE digests SET request_id = :request_id WHERE user_id = :user_id AND id = :id")
_FLUSH_NOW = text(
    """
    UPDATE requests r SET due_at = :now
    FROM (SELECT user_id, id FROM requests
          WHERE user_id = :user_id AND id = :id AND state = 'deferred' AND due_at > :now
          FOR UPDATE SKIP LOCKED) k
    WHERE r.user_id = k.user_id AND r.id = k.id
    """
)


def join(
    conn: Connection,
    user_id: str,
    *,
    digest_type: str,
    digest_key: str,
    lane: str,
    version: int,
    item: dict[str, Any],
    max_items: int,
    due_at: datetime,
    now: datetime,
) -> Joined:
    """Put `item` in the recipient's open window (opening one, with its digest request, if none is
    open). A window that becomes full has its digest request made due now."""
    params = {
        "user_id": user_id,
        "digest_type": digest_type,
        "digest_key": digest_key,
        "item": json.dumps(item, default=str),
        "max_items": max_items,
        "due_at": due_at,
        "now": now,
    }
    row = conn.execute(_JOIN, params).one()
    digest_id, request_id, count, state, window_due = row
    opened = request_id is None
    if opened:
        request_id = None
        for attempt in range(10):  # a producer may have taken `digest:<id>` as its own key
            request_id = conn.execute(
                _OPEN_REQUEST,
                {
                    "user_id": user_id,
                    "type_key": digest_type,
                    "occ": f"digest:{digest_id}" + (f"+{attempt}" if attempt else ""),
                    "lane": lane,
                    "version": version,
                    "due_at": now if state == "full" else window_due,
                    "now": now,
                },
            ).scalar()
            if request_id is not None:
                break
        if request_id is None:
            raise ClarionError(f"no free occurrence key for digest {digest_id} of {user_id!r}")
        conn.execute(_LINK, {"user_id": user_id, "id": digest_id, "request_id": request_id})
    elif state == "full":
        conn.execute(_FLUSH_NOW, {"user_id": user_id, "id": request_id, "now": now})
    return Joined(digest_id, request_id, count, state, window_due, opened)


_CLOSE = text(
    f"""
    UPDATE digests d SET state = 'closed', closed_at = :now
    FROM {KEY_PAIRS}
    WHERE d.user_id = k.user_id AND d.request_id = k.id AND d.state IN ('open', 'full')
    RETURNING d.user_id, d.id AS digest_id, d.request_id, d.digest_type, d.digest_key,
              d.opened_at, d.items
    """
)


def close(conn: Connection, keys: Iterable[Key], *, now: datetime) -> list[Closed]:
    """Close the windows of the digest requests `keys` (resolved by the caller's transaction);
    returns each with its items. A window closed already (by an earlier route) is not returned."""
    params = {**key_params(keys), "now": now}
    if not params["ids"]:
        return []
    return [Closed.from_row(r) for r in conn.execute(_CLOSE, params).mappings()]


_STORE = text(
    "UPDATE requests SET variables = CAST(:variables AS jsonb) WHERE user_id = :user_id AND id = :id"
)


def store_variables(conn: Connection, key: Key, variables: dict[str, Any]) -> None:
    """Write a closed digest's variables on its request, for the route and the deliveries."""
    conn.execute(
        _STORE,
        {"user_id": key[0], "id": key[1], "variables": json.dumps(variables, default=str)},
    )


_OPEN_WINDOWS = text(
    "SELECT digest_type, digest_key, state, count, due_at, request_id FROM digests "
    "WHERE user_id = :user_id AND state <> 'closed' ORDER BY id"
)


def open_windows(
    conn: Connection, user_id: str
) -> list[tuple[str, str, str, int, datetime, int | None]]:
    """The recipient's windows not yet flushed (for explain and the demo)."""
    return [
        (dtype, dkey, state, n, due, request_id)
        for dtype, dkey, state, n, due, request_id in conn.execute(
            _OPEN_WINDOWS, {"user_id": user_id}
        )
    ]
