"""The shapes of the HTTP API, as pydantic models: the OpenAPI document is generated from them,
and request bodies are checked against them for *shape* only (types, required and unknown members).
What a value may contain (lengths, NUL, lone surrogates, template variables, known types and
recipients) is checked by notify() and clarion.validation: one validation layer, the same for
Python callers and HTTP callers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

MAX_BATCH = 500
MAX_MARK_IDS = 500
Lane = Literal["transactional", "activation"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class RecipientPut(Strict):
    """A recipient's settings, as register_recipient() takes them. PUT replaces them all: a member
    left out takes its default (locale "en", the rest none)."""

    timezone: str = Field(description="An IANA zone name.", examples=["Europe/Berlin"])
    locale: str = Field(default="en", description="A BCP 47 language tag.", examples=["de-DE"])
    country: str | None = Field(
        default=None, description="ISO 3166-1 alpha-2: the holiday calendar.", examples=["de"]
    )
    org_id: str | None = Field(default=None, description="The recipient's organisation.")
    addresses: dict[str, str] | None = Field(
        default=None,
        description="Channel → the recipient's address on it (checked per channel).",
        examples=[{"email": "ann@example.com", "sms": "+4915112345678"}],
    )
    quiet_hours: list[str] | None = Field(
        default=None,
        description="A daily local window [start, end] as HH:MM.",
        examples=[["22:00", "07:00"]],
    )
    workweek: list[int] | None = Field(
        default=None, description="Working weekdays, Monday=0, when they differ from the country's."
    )
    subdivision: str | None = Field(
        default=None, description="ISO 3166-2 region code for regional holidays.", examples=["BY"]
    )
    attributes: dict[str, Any] | None = Field(
        default=None,
        description="The app's own fields: name → text, integer or boolean, up to 64; a "
        "broadcast segment filters on them (`attributes.<name>`). Unlike the other members, "
        "omitted or null keeps the stored ones; {} clears them.",
        examples=[{"plan": "pro", "seats": 12, "beta": True}],
    )


class Recipient(BaseModel):
    user_id: str
    timezone: str
    locale: str
    country: str | None
    org_id: str | None
    addresses: dict[str, str]
    quiet_hours: list[str] | None
    workweek: list[int] | None
    subdivision: str | None
    attributes: dict[str, str | int | bool]
    created_at: datetime
    updated_at: datetime


class ErasedRecipient(BaseModel):
    """What DELETE did. Repeating it is harmless: it answers the first erasure's time, with the
    rows it changed this time (zeros, unless something arrived since)."""

    user_id: str
    erased_at: datetime
    changed: dict[str, int] = Field(description="table → rows changed or removed by this call")


class Event(Strict):
    """One event for one recipient (the seed's request contract)."""

    event_id: str = Field(
        description="The producer's id of the event. Without dedup_key, a repeat of the same "
        "(user_id, type, event_id) is recognised and creates nothing (`new: false`). At most 512 "
        "bytes of UTF-8.",
        examples=["order-1042-paid"],
    )
    user_id: str = Field(description="A registered recipient.", examples=["user-42"])
    type: str = Field(description="A notification type of the catalog.", examples=["receipt"])
    variables: dict[str, Any] | None = Field(
        default=None,
        description="Template variables: JSON values, at most 16 levels deep and 64 KiB.",
        examples=[{"order": "A-1042"}],
    )
    dedup_key: str | None = Field(
        default=None,
        description="A semantic key that dedups across events: it replaces event_id as the "
        "request's occurrence key, so two events with the same dedup_key (same user and type) "
        "make one request. Keys starting with `series:` are reserved.",
    )
    priority: Lane | None = Field(
        default=None,
        description="The lane the caller expects. The lane is decided by the type's category in "
        "the catalog, never by the caller: a priority that differs from it is refused (422).",
    )
    recipient: RecipientPut | None = Field(
        default=None,
        description="Create or replace the recipient `user_id` in the same transaction as the "
        "event (as PUT /v1/users/{user_id}): a new user can be notified in one call.",
    )


class Batch(Strict):
    """Up to 500 events, accepted all together or not at all."""

    items: list[Event] = Field(min_length=1, max_length=MAX_BATCH)


class Accepted(BaseModel):
    request_id: int = Field(description="The request's id (unique per user_id).")
    user_id: str
    type: str
    event_id: str
    lane: Lane
    new: bool = Field(description="False: this occurrence was requested before; nothing new.")


class BatchAccepted(BaseModel):
    items: list[Accepted]


class Error(BaseModel):
    """Every refusal has this shape."""

    error: str = Field(description="A stable code, e.g. invalid_field, unauthorized.")
    field: str | None = Field(
        description="What to fix: a body member (`items[3].variables`), a header "
        "(`Authorization`, `Idempotency-Key`), `body`, or null."
    )
    reason: str


class Decision(BaseModel):
    decided_at: datetime
    gate: str
    outcome: str
    reason: str
    channel: str | None
    detail: str


class Attempt(BaseModel):
    """One settled attempt of a delivery and how it ended."""

    attempt: int = Field(description="Its number, from 1.")
    outcome: Literal["sent", "retrying", "unknown", "held", "failed", "exhausted"] = Field(
        description="sent: the provider took it; retrying: refused or unreachable, tried again "
        "later; unknown: its answer was lost (the next attempt checks first); held: lost and "
        "held for an operator; failed: failed for good; exhausted: no attempt left."
    )
    at: datetime
    platform: str | None = Field(description="The provider that took it (a sent attempt).")
    error: str = Field(description="What went wrong, in words; empty when sent.")


class Delivery(BaseModel):
    id: int
    channel: str
    state: str
    attempts: int
    sent_at: datetime | None
    platform: str | None
    last_error: str | None
    not_before: datetime | None
    next_attempt_at: datetime | None = Field(
        description="When a pending delivery is tried next (or a claimed one again, should its "
        "lease run out); null once it is settled."
    )
    created_at: datetime
    send_started_at: datetime | None = Field(
        description="When the current attempt reached the provider call."
    )
    maybe_sent_at: datetime | None = Field(
        description="An attempt whose answer was lost may have sent from this time on."
    )
    history: list[Attempt] = Field(description="Every settled attempt, in order.")


class Receipt(BaseModel):
    delivery_id: int | None
    received_at: datetime
    occurred_at: datetime
    channel: str
    event: str
    outcome: str
    detail: str


class Incident(BaseModel):
    """A delivery that may have reached the recipient twice (`possible_duplicate`, `repeat`)."""

    delivery_id: int | None
    channel: str
    kind: str
    detail: str
    created_at: datetime


class OutboundEvent(BaseModel):
    """An event about this request for apps' endpoints (docs/guides/outbound-events.md): its
    `webhook-id`, sequence and kind, and how many endpoints took it or still owe it."""

    id: str
    sequence: int
    kind: str
    delivery_id: int | None
    channel: str | None
    created_at: datetime
    taken: int
    pending: int


class Step(BaseModel):
    """One step of a request's story, as the support staff's activity page shows it
    (docs/operations/activity.md)."""

    at: datetime
    stage: Literal["request", "decision", "delivery", "receipt", "incident", "event"]
    channel: str | None
    what: str = Field(description="A short title.", examples=["Quiet hours: deferred"])
    reason: str = Field(description="The code: a decision's reason, a receipt's event, ...")
    words: str = Field(description="The reason in words.")
    detail: str


class RequestReport(BaseModel):
    """A request with its gate decisions, deliveries, receipts, incidents and outbound events
    (`clarion explain` over HTTP), and all of them as one time-ordered `timeline`: the same
    records and steps as the activity page."""

    id: int
    user_id: str
    type: str
    occurrence_key: str
    event_id: str | None = Field(description="The app's event id, when the request has one.")
    state: str
    created_at: datetime
    routed_at: datetime | None
    due_at: datetime | None
    decisions: list[Decision]
    deliveries: list[Delivery]
    receipts: list[Receipt]
    incidents: list[Incident]
    events: list[OutboundEvent]
    timeline: list[Step] = Field(description="Every step above in time order, with words.")


class PreferencesPut(Strict):
    """Settings to change: `all`, `category:<name>` or `type:<key>`, optionally `/<channel>`,
    each true, false or null (null removes the setting). Settings not named are kept."""

    settings: dict[str, bool | None] = Field(
        examples=[{"category:marketing": False, "type:weekly_digest/email": True}]
    )


class Preferences(BaseModel):
    user_id: str
    jurisdiction: str | None
    settings: dict[str, bool]
    types: dict[str, dict[str, dict[str, Any]]] = Field(
        description="type → channel → the resolved answer: enabled, and the rule (source) that decided."
    )


# --- the in-app inbox (web/inbox.py): its own token, and refusals of its own shape -----------------


class InboxItem(BaseModel):
    """An item of a recipient's inbox, as the feed lists it and the stream sends it."""

    id: int
    type: str
    title: str
    body: str
    data: dict[str, Any]
    count: int = Field(description="Members of its collapse group, itself included.")
    more: int = Field(description="count - 1: the others folded into this item (and counting).")
    created_at: datetime
    updated_at: datetime
    seen_at: datetime | None
    read_at: datetime | None
    archived_at: datetime | None


class InboxFeed(BaseModel):
    items: list[InboxItem] = Field(description="Newest first.")
    unread: int
    next: int | None = Field(
        description="Pass as `before` for the next, older page; null: no more."
    )
    cursor: str = Field(
        description="Open the stream from here (`last_event_id`): nothing after this page is missed."
    )


ItemId = Annotated[int, Field(ge=1, le=2**63 - 1)]


class InboxMarkIds(BaseModel):
    as_: Literal["seen", "read", "archived"] = Field(alias="as")
    ids: list[ItemId] = Field(min_length=1, max_length=MAX_MARK_IDS, examples=[[1]])


class InboxMarkAll(BaseModel):
    as_: Literal["read"] = Field(alias="as")
    all: Literal[True] = Field(description="Every unread item (no `ids` with it).")


class InboxMark(RootModel[InboxMarkIds | InboxMarkAll]):
    """Mark the named items, or every unread one as read."""


class InboxMarked(BaseModel):
    changed: list[int] = Field(description="The items this call changed (not those already so).")
    unread: int


class InboxRefusal(BaseModel):
    """Every refusal of the inbox doors has this shape."""

    error: str = Field(description="What was wrong, naming the field (`limit: expected ...`).")
