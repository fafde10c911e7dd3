"""POST /v1/events: checked events → request rows, written together with the requests arriving
meanwhile, each request answered only once its rows are durable; then the route task is published
by this process's publishing thread, off the request's path (a lost publish is the beat tick's to
redo).

A plain request (no Idempotency-Key, no inline recipient) is checked on the event loop and its rows
join the group's one multi-row INSERT, auto-committed on one of the loop's own connections
(db/loop_commit.py, tasks/producer.insert_grouped; the group's new requests handed to the
publishing thread once). A request with either runs notify_many() with its Idempotency-Key row in
a savepoint of a transaction shared on writer threads (db/group_commit.py), and hands its own
publish over.

Idempotency (Stripe's semantics and draft-ietf-httpapi-idempotency-key-header's):
- keys are scoped per API key; a key is 1-255 printable ASCII characters;
- the same key with the same request (method, path and body, compared as canonical JSON) gets the
  first answer again, status and body, with `Idempotent-Replayed: true`;
- the same key with a different request is a 422 naming `Idempotency-Key`;
- a request refused for its content stores nothing (the transaction rolls back), so the caller can
  correct it and retry under the same key;
- a second request under a key whose first request is still running waits for it and then gets
  its answer (the draft allows a 409 here; waiting gives the caller one answer instead of a retry
  loop, and costs one blocked connection for as long as a notify_many() transaction takes);
- rows are kept RETENTION (24 h): later, the key is free again. The request itself is still
  recognised by its event_id/dedup_key forever (`new: false`): retention only bounds how long the
  *identical answer* is replayed. Each idempotent request purges up to 100 expired rows.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
from pydantic import BaseModel
from sqlalchemy import Connection

from clarion import clock, settings
from clarion import validation as check
from clarion.db import idempotency
from clarion.db.api_keys import ApiKey
from clarion.db.engine import engine
from clarion.db.group_commit import GroupCommit
from clarion.db.ledger import NewRequest
from clarion.db.loop_commit import LoopCommit
from clarion.errors import ClarionError, InvalidField, UnknownRecipient
from clarion.tasks import notify_many, recipients, runtime
from clarion.tasks.producer import (
    Enqueued,
    checked_requests,
    insert_grouped,
    publish_in_background,
)
from clarion.web.api_errors import ApiError, ascii_json, contract_field, from_clarion, item_index
from clarion.web.api_models import Event

RETENTION = timedelta(hours=24)
MAX_IDEMPOTENCY_KEY = 255
ACCEPTED = 202


async def _write_rows(
    conn: psycopg.AsyncConnection[Any], groups: Sequence[list[NewRequest]]
) -> list[list[Enqueued] | UnknownRecipient]:
    """The plain requests of one group, in one INSERT; their rows wait `stray_after` for the
    publish before the tick takes them (as notify()'s own commits do)."""
    now = clock.now()
    stray = now + timedelta(seconds=settings.get().stray_after)
    return await insert_grouped(conn, groups, now=now, due_at=stray)


def _publish_rows(done: list[tuple[list[NewRequest], list[Enqueued]]]) -> None:
    """The route tasks of a committed group's new requests: one hand-off to the publishing
    thread for the whole group, from the writer thread (not one per request from the loop)."""
    publish_in_background(
        [
            (row.user_id, made.request_id, row.lane)
            for rows, results in done
            for row, made in zip(rows, results, strict=True)
            if made.new
        ]
    )


# Concurrent plain requests share statements on the event loop (db/loop_commit.py): one
# auto-committed INSERT (insert_grouped_requests; what follows it only reads) answers many.
ROWS: LoopCommit[list[NewRequest], list[Enqueued]] = LoopCommit(
    _write_rows, connections=4, committed=_publish_rows
)
# The others (an Idempotency-Key row, an inline recipient) share transactions on writer threads,
# each in a savepoint of its own (db/group_commit.py).
WRITER = GroupCommit(engine, writers=4)


@dataclass(frozen=True)
class Answer:
    status: int
    content: str  # the JSON body, rendered once: a replay sends these very bytes
    replayed: bool = False


def idempotency_key(value: str | None) -> str | None:
    """The header's value, checked: 1-255 printable ASCII characters."""
    if value is None:
        return None
    if not 0 < len(value) <= MAX_IDEMPOTENCY_KEY or not all(" " <= c <= "~" for c in value):
        raise ApiError(
            400,
            "invalid_header",
            "Idempotency-Key",
            f"must be 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII characters",
        )
    return value


def fingerprint(method: str, path: str, payload: Any) -> str:
    """What "the same request" means: method, path and the body as canonical JSON (key order and
    whitespace do not matter; values do)."""
    try:
        body = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, "invalid_json", "body", "cannot be read as JSON") from exc
    return hashlib.sha256(f"{method} {path}\n{body}".encode("ascii")).hexdigest()


def notify_item(event: Event, prefix: str) -> dict[str, Any]:
    """The notify_many() item for an event. With a dedup_key, the dedup key is the occurrence key
    and event_id is only checked (as notify() would check it)."""
    if event.dedup_key is not None:
        try:
            check.occurrence_key(event.event_id, None)
        except InvalidField as exc:
            raise from_clarion(exc, prefix) from exc
    return {
        "user_id": event.user_id,
        "type_key": event.type,
        "event_id": None if event.dedup_key is not None else event.event_id,
        "occurrence_key": event.dedup_key,
        "variables": event.variables,
    }


def check_priority(event: Event, prefix: str) -> str | None:
    """The type's lane; a priority naming another lane is refused. Why refuse instead of ignore:
    a producer that believes its campaign is urgent has a wrong idea of the type, and ignoring it
    would hide that; obeying it would let any caller jump the transactional lane."""
    ntype = runtime.catalog().get(event.type)
    if ntype is None:
        return None  # notify() names the unknown type
    if event.priority is not None and event.priority != ntype.lane:
        raise ApiError(
            422,
            "invalid_field",
            contract_field("priority", prefix),
            f"type {event.type!r} is in the {ntype.lane} lane (set by the catalog); "
            f"send priority {ntype.lane!r} or leave it out",
        )
    return ntype.lane


def inline_recipient(
    user_id: str, body: BaseModel | None, prefix: str, member: str = "recipient"
) -> dict[str, Any] | None:
    """The checked recipient fields of an event's `recipient` (or, member "", a PUT's body); a bad
    one is a 422 naming `<member>.<field>` under `prefix` (the user id itself as `user_id`)."""
    if body is None:
        return None
    try:
        return recipients.checked(user_id, body.model_dump())
    except InvalidField as exc:
        inner = prefix if exc.field == "user_id" or not member else contract_field(member, prefix)
        raise from_clarion(exc, inner) from exc


def _prefix(batch: bool, index: int | None) -> str:
    return f"items[{index}]" if batch and index is not None else ""


def _refusal(exc: ClarionError, events: list[Event], batch: bool) -> ApiError:
    index = item_index(exc)
    if index is None and isinstance(exc, UnknownRecipient):
        index = next((i for i, e in enumerate(events) if e.user_id == exc.user_id), None)
    return from_clarion(exc, _prefix(batch, index) or ("items" if batch else ""))


async def ingest(
    key: ApiKey, idem: str | None, where: str, payload: Any, events: list[Event], *, batch: bool
) -> Answer:
    """Accept the events, all or none; replay the stored answer for a used Idempotency-Key."""
    if any(e.recipient is not None for e in events) and "recipients:write" not in key.scopes:
        raise ApiError(
            403,
            "forbidden",
            "Authorization",
            "an event with a `recipient` needs the scope recipients:write as well",
        )
    lanes = [check_priority(e, _prefix(batch, i)) for i, e in enumerate(events)]
    items = [notify_item(e, _prefix(batch, i)) for i, e in enumerate(events)]
    people = [
        inline_recipient(e.user_id, e.recipient, _prefix(batch, i)) for i, e in enumerate(events)
    ]
    if idem is None and not any(people):
        try:
            rows = checked_requests(items)
            results = await ROWS.submit_rows(rows)
        except ClarionError as exc:
            raise _refusal(exc, events, batch) from exc
        answer, _ = _accepted(events, results, lanes, batch=batch)  # published by the writer
        return answer
    else:
        mark = fingerprint("POST", where, payload) if idem is not None else ""

        def write(conn: Connection) -> tuple[Answer, list[tuple[str, int, str]]]:
            return _write(conn, key, idem, mark, people, items, events, lanes, batch=batch)

        answer, fresh = await asyncio.wrap_future(WRITER.submit(write))
    publish_in_background(fresh)
    return answer


def _accepted(
    events: list[Event], results: list[Enqueued], lanes: list[str | None], *, batch: bool
) -> tuple[Answer, list[tuple[str, int, str]]]:
    """The 202 for written requests, and the new ones to publish."""
    accepted = [
        {
            "request_id": r.request_id,
            "user_id": e.user_id,
            "type": e.type,
            "event_id": e.event_id,
            "lane": lane,
            "new": r.new,
        }
        for e, r, lane in zip(events, results, lanes, strict=True)
    ]
    fresh = [
        (e.user_id, r.request_id, str(lane))
        for e, r, lane in zip(events, results, lanes, strict=True)
        if r.new
    ]
    body = ascii_json({"items": accepted} if batch else accepted[0]).decode("ascii")
    return Answer(ACCEPTED, body), fresh


def _write(
    conn: Connection,
    key: ApiKey,
    idem: str | None,
    mark: str,
    people: list[dict[str, Any] | None],
    items: list[dict[str, Any]],
    events: list[Event],
    lanes: list[str | None],
    *,
    batch: bool,
) -> tuple[Answer, list[tuple[str, int, str]]]:
    """One request's rows, in the group's transaction: (its answer, the requests to publish)."""
    now = clock.now()
    if idem is not None:
        stored = idempotency.claim(
            conn, key.id, idem, fingerprint=mark, now=now, expires_at=now + RETENTION
        )
        if stored is not None:
            if stored.fingerprint != mark:
                raise ApiError(
                    422,
                    "idempotency_mismatch",
                    "Idempotency-Key",
                    "this key was used for a different request; use a new key per request",
                )
            return Answer(stored.status, stored.response, replayed=True), []
    for fields in people:
        if fields is not None:
            recipients.save(conn, fields)
    try:
        results = notify_many(items, connection=conn)
    except ClarionError as exc:
        raise _refusal(exc, events, batch) from exc
    answer, fresh = _accepted(events, results, lanes, batch=batch)
    stray = now + timedelta(seconds=settings.get().stray_after)
    idempotency.postpone(conn, [(u, i) for u, i, _ in fresh], due_at=stray)
    if idem is not None:
        idempotency.answer(conn, key.id, idem, status=ACCEPTED, response=answer.content)
        idempotency.purge(conn, now=now)
    return answer, fresh
