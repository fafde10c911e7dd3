"""The in-app inbox for app code and the web door: the feed, marks, signed user tokens, and the
store the in_app adapter writes through (handed to it by tasks.runtime). No SQL here: db.inbox.

    from clarion.tasks.inbox import feed, mark, inbox_token
    page = feed("user-42")                  # newest first; page.next is the cursor for older
    mark("user-42", [page.items[0].id], "read")  # the delivery moves sent -> read (a receipt)
    inbox_token("user-42", ttl=3600)        # for GET /v1/inbox/user-42/stream?token=...
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from clarion import clock, settings
from clarion.adapters.inapp import InboxRequest, Stored, StoreFailed
from clarion.db import inbox
from clarion.db.engine import engine
from clarion.db.inbox import Cursor, Item

log = logging.getLogger(__name__)
TOKEN_PREFIX = "inb1"


@dataclass(frozen=True)
class Page:
    items: list[Item]
    unread: int
    next: int | None  # pass as `before_id` for the next (older) page; None: no more
    cursor: Cursor  # open the stream from here and nothing between the page and it is missed


def feed(
    user_id: str, *, before_id: int | None = None, limit: int = 50, include_archived: bool = False
) -> Page:
    """One page of the user's inbox, newest first, with the unread count."""
    with engine().connect() as conn:
        cursor = inbox.head(conn, user_id)  # first: what commits after the page is streamed
        items = inbox.list_items(
            conn, user_id, before_id=before_id, limit=limit, include_archived=include_archived
        )
        unread = inbox.unread_count(conn, user_id)
    full = len(items) == max(1, min(limit, inbox.MAX_PAGE))
    return Page(items, unread, items[-1].id if items and full else None, cursor)


def unread_count(user_id: str) -> int:
    with engine().connect() as conn:
        return inbox.unread_count(conn, user_id)


def mark(user_id: str, ids: list[int], what: str) -> list[int]:
    """Mark items seen, read or archived (db.inbox.MARKS); the ids that changed. Reading an
    item records a `read` receipt for its delivery, in the same transaction."""
    with engine().begin() as conn:
        return inbox.mark(conn, user_id, ids, what, now=clock.now())


def mark_all_read(user_id: str) -> list[int]:
    with engine().begin() as conn:
        return inbox.mark_all_read(conn, user_id, now=clock.now())


# --- signed user tokens -----------------------------------------------------------------------------


def _signature(user_id: str, expires: int) -> str:
    key = settings.get().webhook_secret.encode()
    digest = hmac.new(key, f"inbox\x1f{user_id}\x1f{expires}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def inbox_token(user_id: str, ttl: float = 3600) -> str:
    """A token that lets its holder read and mark `user_id`'s inbox until `ttl` seconds from
    now (HMAC-SHA256 with CLARION_WEBHOOK_SECRET). Hand it to that user's page only."""
    expires = int(clock.now().timestamp() + ttl)
    return f"{TOKEN_PREFIX}.{expires}.{_signature(user_id, expires)}"


def check_token(token: str, user_id: str) -> bool:
    """Is `token` one inbox_token(user_id, ...) made, and not expired?"""
    prefix, _, rest = token.partition(".")
    expires, _, signature = rest.partition(".")
    if prefix != TOKEN_PREFIX or not (expires.isascii() and expires.isdigit()) or len(expires) > 12:
        return False
    expected = _signature(user_id, int(expires)).encode()
    fresh = int(expires) > clock.now().timestamp()
    return hmac.compare_digest(expected, signature.encode("utf-8", "surrogateescape")) and fresh


# --- the adapter's store ----------------------------------------------------------------------------


class LedgerInbox:
    """The in_app adapter's provider: inbox_items in clarion's database. An error before the
    COMMIT is sent means the transaction rolled back (nothing stored); one during it means the
    commit may have happened."""

    def put(self, request: InboxRequest) -> Stored:
        try:
            conn = engine().connect()
        except DBAPIError as exc:
            raise StoreFailed(f"no connection: {exc}", committing=False) from exc
        try:
            try:
                tx = conn.begin()
                stored = inbox.insert_item(
                    conn,
                    user_id=request.user_id,
                    delivery_id=request.delivery_id,
                    type_key=request.type_key,
                    title=request.title,
                    body=request.body,
                    data=request.data,
                    collapse_key=request.collapse_key,
                    now=clock.now(),
                )
            except DBAPIError as exc:
                raise StoreFailed(f"not stored: {exc}", committing=False) from exc
            try:
                tx.commit()
            except DBAPIError as exc:
                raise StoreFailed(f"commit unanswered: {exc}", committing=True) from exc
            return Stored(stored.item_id, stored.new)
        finally:
            try:
                conn.close()
            except Exception:  # a dead connection may not even close cleanly
                log.debug("inbox connection not closed cleanly", exc_info=True)

    def retitle(self, request: InboxRequest, item_id: int) -> bool:
        try:
            with engine().begin() as conn:
                changed = inbox.retitle_item(
                    conn,
                    request.user_id,
                    item_id,
                    title=request.title,
                    body=request.body,
                    now=clock.now(),
                )
            return changed is not None
        except DBAPIError as exc:
            raise StoreFailed(f"not updated: {exc}", committing=True) from exc
