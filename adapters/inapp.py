"""The in-app channel: the message becomes an item in the recipient's inbox (PostgreSQL), shown
by the feed API and pushed to open pages over server-sent events (web/inbox.py).

The "provider" is the inbox store the composition root hands in (Collaborators.inbox,
tasks.inbox.LedgerInbox): one item per delivery, stored idempotently by delivery id, so a send
repeated under its key finds the item it stored and adds nothing (`dedups_by_key`; the repeat is
reported as `repeat=True`, like a webhook's 409). Three outcomes:

- the store committed: sent, `provider_message_id` = the item id;
- it failed before the commit (no connection, a statement error): failed, retried
  (TransientSendError): the transaction was rolled back, nothing was stored;
- the connection was lost during COMMIT: unknown (UnknownSendError): the item may or may not
  be there, and sending again under the key is safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from clarion.adapters.base import Channel, Collaborators
from clarion.adapters.escape import plain_text
from clarion.errors import PermanentSendError, TransientSendError, UnknownSendError
from clarion.records import Message, SendResult
from clarion.settings import Settings

MAX_TITLE = 1000
MAX_BODY = 20000


@dataclass(frozen=True)
class InboxRequest:
    """One item to store: what the feed shows, keyed by its delivery."""

    user_id: str
    delivery_id: int
    type_key: str
    title: str
    body: str
    data: dict[str, Any]
    collapse_key: str | None


@dataclass(frozen=True)
class Stored:
    item_id: int
    new: bool  # False: the store had this delivery already


class StoreFailed(Exception):
    """The store did not confirm. `committing`: the connection was lost during COMMIT, so the
    item may be stored; otherwise the transaction never committed and nothing was."""

    def __init__(self, detail: str, *, committing: bool) -> None:
        super().__init__(detail)
        self.committing = committing


class InboxStore(Protocol):
    def put(self, request: InboxRequest) -> Stored:
        """Store the item (notifying open streams) or find it; raises StoreFailed."""
        ...

    def retitle(self, request: InboxRequest, item_id: int) -> bool:
        """Set the stored item's title and body to the request's (notifying open streams);
        False if there is no such item. Raises StoreFailed."""
        ...


def to_request(message: Message) -> InboxRequest:
    """The pure part: the item for one message. `title` and `body` are the rendered content;
    the other rendered fields and what a page needs to link it go in `data`."""
    content = dict(message.content)
    # plain text (adapters.escape.plain_text): a feed client shows it as text, never as markup
    title, body = plain_text(content.pop("title", "")), plain_text(content.pop("body", ""))
    if not (title or body):
        raise PermanentSendError("empty", f"type {message.type_key} renders no title or body")
    if len(title) > MAX_TITLE or len(body) > MAX_BODY:
        raise PermanentSendError("too_long", f"title/body over {MAX_TITLE}/{MAX_BODY} characters")
    data: dict[str, Any] = {"occurrence_key": message.occurrence_key, "category": message.category}
    if content:
        data["content"] = content
    if message.buttons:
        data["buttons"] = [
            {"key": b.key, "label": b.label, "value": message.button_value(b)}
            for b in message.buttons
        ]
    return InboxRequest(
        message.user_id,
        message.delivery_id,
        message.type_key,
        title,
        body,
        data,
        message.collapse_key,
    )


def from_response(stored: Stored) -> SendResult:
    """The pure part: a stored item as a send; a delivery stored already is a repeat."""
    return SendResult(
        platform="in_app", provider_message_id=str(stored.item_id), repeat=not stored.new
    )


class InAppAdapter(Channel[InboxRequest, Stored]):
    channel = "in_app"
    needs_address = False  # the inbox is the user's own
    dedups_by_key = True  # one item per delivery: storing it again finds the first
    updates_in_place = True  # the item's title and body (its count is kept by the router)

    def __init__(self, store: InboxStore) -> None:
        self.store = store

    @classmethod
    def from_settings(cls, s: Settings, parts: Collaborators) -> InAppAdapter:
        """Needs no settings: the inbox is in clarion's database."""
        return cls(parts.inbox)

    def to_request(self, message: Message) -> InboxRequest:
        return to_request(message)

    def call(self, request: InboxRequest) -> Stored:
        try:
            return self.store.put(request)
        except StoreFailed as exc:
            if exc.committing:
                raise UnknownSendError("commit_lost", str(exc)[:200]) from exc
            raise TransientSendError("store_failed", str(exc)[:200]) from exc

    def from_response(self, message: Message, response: Stored) -> SendResult:
        return from_response(response)

    def update(
        self, message: Message, provider_message_id: str, answered: str | None = None
    ) -> None:
        """Re-render the stored item's title and body (`provider_message_id` is its id). The
        answer is not shown in the text: the item's buttons carry it."""
        if not provider_message_id.isdigit():
            raise PermanentSendError("bad_message_id", f"not an item id: {provider_message_id!r}")
        try:
            found = self.store.retitle(self.to_request(message), int(provider_message_id))
        except StoreFailed as exc:  # an update is safe to repeat: retried either way
            raise TransientSendError("store_failed", str(exc)[:200]) from exc
        if not found:
            raise PermanentSendError("no_item", f"no inbox item {provider_message_id}")
