"""Named statements for the in-app inbox: the items the in_app channel stores, the feed over them,
marks (seen / read / archived), the collapse fold, and the changes a live stream sends.

One item per delivery (UNIQUE (user_id, delivery_id)): storing is `INSERT ... ON CONFLICT DO
NOTHING`, so storing a delivery again returns the item it already has (`Stored.new` False).
Every write notifies listeners on NOTIFY_CHANNEL in its own transaction (pg_notify is sent at
commit, and never for a rolled-back write), payload `{"u": user_id, "i": item_id}`.

Cursors. Each insert and change takes a revision (`rev`, from the inbox_revisions sequence) and
records its transaction id (`wxid`). Revisions are taken in one order and committed in another,
so "rev > R" alone would skip a lower revision that commits late. A cursor is therefore (R, X):
X is the oldest transaction still running when the reader last looked (pg_snapshot_xmin). Every
change with rev <= R or wxid < X has been seen; what may still come is rev > R or wxid >= X.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Connection, Row, TextClause, text

from clarion.db import receipts
from clarion.records import Receipt

NOTIFY_CHANNEL = "clarion_inbox"
MARKS = ("seen", "read", "archived")
MAX_PAGE = 100
_XID = "pg_current_xact_id()::text::bigint"
_COLUMNS = (
    "user_id, id, delivery_id, type_key, title, body, data, collapse_key, count, rev, "
    "created_rev, wxid, created_at, updated_at, seen_at, read_at, archived_at"
)


@dataclass(frozen=True)
class Item:
    user_id: str
    id: int
    delivery_id: int
    type_key: str
    title: str
    body: str
    data: dict[str, Any]
    collapse_key: str | None
    count: int  # members of its collapse group, itself included ("and count - 1 more")
    rev: int
    created_rev: int
    wxid: int
    created_at: datetime
    updated_at: datetime
    seen_at: datetime | None
    read_at: datetime | None
    archived_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        """What the feed and the stream show a client."""

        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value is not None else None

        return {
            "id": self.id,
            "type": self.type_key,
            "title": self.title,
            "body": self.body,
            "data": self.data,
            "count": self.count,
            "more": self.count - 1,  # the "and counting" marker: others folded into this one
            "created_at": iso(self.created_at),
            "updated_at": iso(self.updated_at),
            "seen_at": iso(self.seen_at),
            "read_at": iso(self.read_at),
            "archived_at": iso(self.archived_at),
        }


@dataclass(frozen=True)
class Stored:
    item_id: int
    new: bool  # False: this delivery was stored already (a repeat under its key)


@dataclass(frozen=True)
class Cursor:
    """A point in one user's inbox changes (see the module docstring)."""

    rev: int
    xmin: int

    def encode(self) -> str:
        return f"{self.rev}.{self.xmin}"

    @classmethod
    def decode(cls, raw: str) -> Cursor | None:
        rev, dot, xmin = raw.partition(".")
        if not (dot and rev.isascii() and rev.isdigit() and xmin.isascii() and xmin.isdigit()):
            return None
        if len(rev) > 18 or len(xmin) > 18:
            return None
        return cls(int(rev), int(xmin))


def _notify(conn: Connection, user_id: str, item_id: int | None) -> None:
    conn.execute(
        text("SELECT pg_notify(:channel, :payload)"),
        {"channel": NOTIFY_CHANNEL, "payload": json.dumps({"u": user_id, "i": item_id})},
    )


# --- storing --------------------------------------------------------------------------------------

# The leader of a collapse group starts at the group's count. FOR SHARE waits for a follower
# folding in right now (gates.apply: it updates the group row first), so its count is not lost.
_INSERT = text(
    f"""
    WITH grp AS (
        SELECT g.count FROM collapse_groups g
        JOIN deliveries d ON d.user_id = g.user_id AND d.request_id = g.leader_id
        WHERE g.user_id = :u AND g.collapse_key = :ck AND d.id = :d
        FOR SHARE OF g
    ), r AS (SELECT nextval('inbox_revisions') AS rev)
    INSERT INTO inbox_items (user_id, delivery_id, type_key, title, body, data, collapse_key,
                             count, rev, created_rev, wxid, created_at, updated_at)
    SELECT :u, :d, :type_key, :title, :body, CAST(:data AS jsonb), :ck,
           COALESCE((SELECT count FROM grp), 1), r.rev, r.rev, {_XID}, :now, :now
    FROM r
    ON CONFLICT (user_id, delivery_id) DO NOTHING
    RETURNING id
    """
)
_BY_DELIVERY = text("SELECT id FROM inbox_items WHERE user_id = :u AND delivery_id = :d")


def insert_item(
    conn: Connection,
    *,
    user_id: str,
    delivery_id: int,
    type_key: str,
    title: str,
    body: str,
    data: dict[str, Any],
    collapse_key: str | None,
    now: datetime,
) -> Stored:
    """Store one delivery's item (and notify), or find the one it already has."""
    params = {
        "u": user_id,
        "d": delivery_id,
        "type_key": type_key,
        "title": title,
        "body": body,
        "data": json.dumps(data),
        "ck": collapse_key,
        "now": now,
    }
    new_id = conn.execute(_INSERT, params).scalar()
    if new_id is not None:
        _notify(conn, user_id, new_id)
        return Stored(new_id, True)
    return Stored(conn.execute(_BY_DELIVERY, {"u": user_id, "d": delivery_id}).scalar_one(), False)


# --- the collapse fold ----------------------------------------------------------------------------

_FOLD = text(
    f"""
    UPDATE inbox_items i SET count = g.count, updated_at = :now,
        rev = nextval('inbox_revisions'), wxid = {_XID}
    FROM collapse_groups g
    JOIN deliveries d ON d.user_id = g.user_id AND d.request_id = g.leader_id
        AND d.channel = 'in_app'
    WHERE g.user_id = :u AND g.collapse_key = :key AND g.window_until > :now
        AND i.user_id = d.user_id AND i.delivery_id = d.id AND i.count < g.count
    RETURNING i.id
    """
)


def fold_follower(conn: Connection, user_id: str, *, key: str, now: datetime) -> int | None:
    """After a follower joined the group `key` (collapse_groups.join_collapse, same transaction, which
    holds the group row): the leader's item takes the group's count; its id, or None when the
    leader has no in-app item yet (it starts at the group's count when it is stored)."""
    item_id = conn.execute(_FOLD, {"u": user_id, "key": key, "now": now}).scalar()
    if item_id is not None:
        _notify(conn, user_id, item_id)
    return item_id


_RETITLE = text(
    f"""
    UPDATE inbox_items SET title = :title, body = :body, updated_at = :now,
        rev = nextval('inbox_revisions'), wxid = {_XID}
    WHERE user_id = :u AND id = :id AND (title <> :title OR body <> :body)
    RETURNING id
    """
)


_EXISTS = text("SELECT true FROM inbox_items WHERE user_id = :u AND id = :id")


def retitle_item(
    conn: Connection, user_id: str, item_id: int, *, title: str, body: str, now: datetime
) -> bool | None:
    """Set an item's title and body (a collapse leader re-rendered with its group's count) and
    notify open streams: True; False if it says that already; None if there is no such item."""
    params = {"u": user_id, "id": item_id, "title": title, "body": body, "now": now}
    if conn.execute(_RETITLE, params).scalar() is not None:
        _notify(conn, user_id, item_id)
        return True
    return False if conn.execute(_EXISTS, params).scalar() else None


# --- the feed -------------------------------------------------------------------------------------


@cache
def _page(before: bool, archived: bool) -> TextClause:
    """Predicates written out, not passed as parameters: the partial index must match a
    prepared statement too (DESIGN, "Known traps")."""
    where = ["user_id = :u"]
    if before:
        where.append("id < :before")
    if not archived:
        where.append("archived_at IS NULL")
    return text(
        f"SELECT {_COLUMNS} FROM inbox_items WHERE {' AND '.join(where)} "
        "ORDER BY id DESC LIMIT :limit"
    )


def list_items(
    conn: Connection,
    user_id: str,
    *,
    before_id: int | None = None,
    limit: int = 50,
    include_archived: bool = False,
) -> list[Item]:
    """The newest items first, older than `before_id` (the last id of the previous page)."""
    statement = _page(before_id is not None, include_archived)
    params = {"u": user_id, "before": before_id, "limit": max(1, min(limit, MAX_PAGE))}
    return [Item(*row) for row in conn.execute(statement, params)]


_UNREAD = text(
    "SELECT count(*) FROM inbox_items "
    "WHERE user_id = :u AND read_at IS NULL AND archived_at IS NULL"
)


def unread_count(conn: Connection, user_id: str) -> int:
    unread: int = conn.execute(_UNREAD, {"u": user_id}).scalar_one()
    return unread


# --- marks ----------------------------------------------------------------------------------------

_SET = {
    "seen": "seen_at = :now",
    "read": "read_at = :now, seen_at = COALESCE(seen_at, :now)",
    "archived": "archived_at = :now",
}


@cache
def _mark(what: str, every_unread: bool) -> TextClause:
    which = (
        "read_at IS NULL AND archived_at IS NULL"
        if every_unread
        else f"id = ANY(CAST(:ids AS bigint[])) AND {what}_at IS NULL"
    )
    return text(
        f"""
        UPDATE inbox_items SET {_SET[what]}, updated_at = :now,
            rev = nextval('inbox_revisions'), wxid = {_XID}
        WHERE user_id = :u AND {which}
        RETURNING id, delivery_id
        """
    )


def mark(conn: Connection, user_id: str, ids: list[int], what: str, *, now: datetime) -> list[int]:
    """Mark the user's items seen, read or archived; the ids that changed (an item already so
    marked, or another user's, is left alone). Read items record a `read` receipt."""
    if what not in MARKS:
        raise ValueError(f"not a mark: {what!r}")
    rows = conn.execute(_mark(what, False), {"u": user_id, "ids": list(ids), "now": now}).all()
    return _marked(conn, user_id, rows, what, now)


def mark_all_read(conn: Connection, user_id: str, *, now: datetime) -> list[int]:
    """Every unread, unarchived item of the user read; the ids that changed."""
    rows = conn.execute(_mark("read", True), {"u": user_id, "now": now}).all()
    return _marked(conn, user_id, rows, "read", now)


def _marked(
    conn: Connection, user_id: str, rows: Sequence[Row[int, int]], what: str, now: datetime
) -> list[int]:
    if what == "read":
        for item_id, delivery_id in rows:
            receipts.apply_receipt(conn, read_receipt(user_id, item_id, delivery_id, now), now=now)
    if rows:
        _notify(conn, user_id, None)
    return [row[0] for row in rows]


def read_receipt(user_id: str, item_id: int, delivery_id: int, now: datetime) -> Receipt:
    """The receipt an item read in the inbox is: the delivery moves sent → read."""
    return Receipt(
        channel="in_app",
        event="read",
        provider_message_id=str(item_id),
        occurred_at=now,
        user_id=user_id,
        delivery_id=delivery_id,
        event_id=f"inbox:{item_id}:read",
    )


# --- changes, for the live stream -----------------------------------------------------------------

_XMIN = text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")
_HEAD = text("SELECT COALESCE(max(rev), 0) FROM inbox_items WHERE user_id = :u")
_CHANGES = text(
    f"SELECT {_COLUMNS} FROM inbox_items WHERE user_id = :u AND (rev > :rev OR wxid >= :xmin) "
    "ORDER BY rev LIMIT :limit"
)


def head(conn: Connection, user_id: str) -> Cursor:
    """A cursor at "now": changes after it are what a stream opened now has to send."""
    xmin = conn.execute(_XMIN).scalar_one()
    return Cursor(conn.execute(_HEAD, {"u": user_id}).scalar_one(), xmin)


def changes(
    conn: Connection, user_id: str, since: Cursor, *, limit: int = MAX_PAGE
) -> tuple[list[Item], Cursor]:
    """Items changed after `since`, oldest revision first, and the cursor after them. Some may
    have been seen already (those selected by wxid): the caller drops what it sent (by id, rev).
    A full page (`limit` items) means more may follow: ask again from the returned cursor (rows
    not returned have a higher revision than every row that was)."""
    xmin = conn.execute(_XMIN).scalar_one()  # before the rows: a conservative point
    items = [
        Item(*row)
        for row in conn.execute(
            _CHANGES, {"u": user_id, "rev": since.rev, "xmin": since.xmin, "limit": limit}
        )
    ]
    rev = max([since.rev, *(i.rev for i in items)])
    return items, Cursor(rev, xmin)
