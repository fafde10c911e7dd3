"""Delivering outbound events to apps' endpoints: the `events` queue's dispatch round.

Beat publishes `clarion.events` every tick to its own queue (`events`; run `clarion worker --lane
events`), so a slow or dead endpoint holds only that lane's processes, never sending. And at most
CLARION_EVENTS_PARALLEL of them (1) post to one endpoint at a time (a turn: a transaction-scoped
advisory lock, in a transaction kept open for the round): a round finding its turns taken skips
the endpoint at once, so an endpoint that hangs holds that many processes however many rounds beat publishes — in a `clarion worker` that consumes every
queue too, where the other processes of its pool go on sending. A round, per enabled endpoint
whose turn it gets: lease the sends that may go now (the oldest pending event of each delivery's
stream, due), POST each one signed (adapters/standard_webhooks.py), then record in one transaction
what was taken, the first failure with its next attempt, and give back the rest. It stops at an
endpoint's first failure (the others would most likely fail too) and goes on while there is work
and CLARION_EVENTS_ROUND seconds have not passed.

A failure waits `backoff(attempts)`: exponential from 5 s (CLARION_EVENTS_FIRST_RETRY), capped at
one hour, with jitter
(half of it random), so retries go on for as long as the endpoint fails; after
CLARION_EVENTS_DISABLE_AFTER (a day) of failures without one success the endpoint is disabled with
an `endpoint_disabled` alert, and its events wait for an operator (`clarion events endpoints
enable`, `clarion events replay --since`).

At least once: a process killed after the endpoint took an event and before "delivered" is
recorded leaves a lease that runs out; the event is sent again with the same `webhook-id`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery import shared_task
from sqlalchemy import Connection

from clarion import clock, faults, settings
from clarion.adapters import http1, standard_webhooks
from clarion.db import alerts, outbound
from clarion.db.engine import engine
from clarion.db.outbound import Endpoint, ReadySend

log = logging.getLogger(__name__)
MAX_DELAY = 3600.0  # the longest wait between two attempts at one event
DISABLED = "endpoint_disabled"
_pool: http1.Connections | None = None


def backoff(
    attempts: int, draw: Callable[[], float] = random.random, *, first: float = 5.0
) -> timedelta:
    """The wait after the `attempts`-th failed attempt: first × 2^(attempts-1) (CLARION_EVENTS_
    FIRST_RETRY, 5 s), at most an hour, of which the second half is random (so endpoints coming
    back are not hit all at once)."""
    ceiling = min(MAX_DELAY, first * 2 ** min(max(attempts, 1) - 1, 30))
    return timedelta(seconds=ceiling / 2 + draw() * ceiling / 2)


def message_id(event_id: int) -> str:
    """The event's stable id: `webhook-id` on every attempt and replay."""
    return f"evt_{event_id}"


def payload_data(send: ReadySend) -> dict[str, object]:
    """The ids the app knows, then what the event says."""
    return {
        "id": message_id(send.event_id),
        "sequence": send.event_id,
        "stream": send.stream,
        "user_id": send.user_id or None,  # '' for an event about no recipient (a broadcast)
        "type": send.type_key,
        "occurrence_key": send.occurrence_key,
        "request_id": send.request_id,
        "delivery_id": send.delivery_id,
        "channel": send.channel,
        **send.data,
    }


def request_for(endpoint: Endpoint, send: ReadySend, now: datetime) -> standard_webhooks.Outgoing:
    body = standard_webhooks.body_of(send.kind, send.created_at.isoformat(), payload_data(send))
    return standard_webhooks.to_request(
        endpoint.url,
        message_id(send.event_id),
        body,
        endpoint.signing_secrets(now),
        int(now.timestamp()),
    )


@dataclass
class Round:
    """What one round did for one endpoint."""

    taken: list[int] = field(default_factory=list)
    failed: list[tuple[int, str]] = field(default_factory=list)
    disabled: bool = False


def pool() -> http1.Connections:
    global _pool
    if _pool is None:
        _pool = http1.Connections(keep=4)
    return _pool


@shared_task(name="clarion.events")
def dispatch_task() -> dict[int, int]:
    """One round over every enabled endpoint; events taken per endpoint."""
    return {k: len(v.taken) for k, v in dispatch().items()}


def dispatch(now: Callable[[], datetime] = clock.now) -> dict[int, Round]:
    """One round over every enabled endpoint whose turns are not all taken (`now`: the clock,
    injected by tests)."""
    with engine().connect() as conn:
        enabled = [e for e in outbound.endpoints(conn) if e.enabled]
    done = {}
    for e in enabled:
        with engine().connect() as holder:  # its transaction holds the turn until rolled back
            turn = outbound.take_turn(holder, e.id, turns=settings.get().events_parallel)
            try:
                if turn is None:  # as many processes as allowed are posting to it: leave it
                    log.debug("endpoint %s busy", e.id, extra={"action": "event_endpoint_busy"})
                    continue
                done[e.id] = endpoint_round(e, now)
            finally:
                holder.rollback()
    return done


def endpoint_round(endpoint: Endpoint, now: Callable[[], datetime]) -> Round:
    s = settings.get()
    done = Round()
    started = time.monotonic()
    while time.monotonic() - started < s.events_round:
        at = now()
        lease = at + timedelta(seconds=s.events_timeout * (s.events_batch + 1))
        with engine().begin() as conn:
            ready = outbound.claim_ready(
                conn, endpoint.id, now=at, lease_until=lease, limit=s.events_batch
            )
        if not ready:
            break
        if not _post_batch(endpoint, ready, now, done, s.events_timeout):
            break
    return done


def _post_batch(
    endpoint: Endpoint,
    ready: list[ReadySend],
    now: Callable[[], datetime],
    done: Round,
    timeout: float,
) -> bool:
    """POST the leased sends in order until one fails; record it all. False after a failure."""
    taken: list[int] = []
    failure: tuple[ReadySend, str] | None = None
    for send in ready:
        error = standard_webhooks.call(pool(), request_for(endpoint, send, now()), timeout)
        if error is not None:
            failure = (send, error)
            break
        faults.hit("events.after_post")
        taken.append(send.event_id)
    at = now()
    with engine().begin() as conn:
        outbound.mark_delivered(conn, endpoint.id, taken, now=at)
        if taken:
            outbound.note_success(conn, endpoint.id)
        tried = len(taken) + (failure is not None)
        outbound.release(conn, endpoint.id, [r.event_id for r in ready[tried:]])
        if failure is not None:
            done.disabled = _failed(conn, endpoint, failure, at)
    done.taken += taken
    if failure is not None:
        done.failed.append((failure[0].event_id, failure[1]))
    return failure is None


def _failed(
    conn: Connection, endpoint: Endpoint, failure: tuple[ReadySend, str], at: datetime
) -> bool:
    """Back the event off; disable the endpoint (and alert) after a day of failures."""
    send, error = failure
    wait = backoff(send.attempts + 1, first=settings.get().events_first_retry)
    outbound.mark_failed(conn, endpoint.id, send.event_id, next_at=at + wait, error=error)
    since = outbound.note_failure(conn, endpoint.id, now=at) or at
    log.info(
        "endpoint %s refused event %s: %s",
        endpoint.id,
        send.event_id,
        error,
        extra={"action": "event_post_failed", "endpoint": endpoint.id},
    )
    limit = settings.get().events_disable_after
    if (at - since).total_seconds() < limit:
        return False
    reason = f"failing since {since.isoformat()}: {error}"
    if outbound.disable(conn, endpoint.id, reason=reason, now=at) is None:
        return False
    hours = (at - since).total_seconds() / 3600
    alerts.open_alert(
        conn,
        DISABLED,
        f"endpoint:{endpoint.id}",
        value=round(hours, 1),
        detail=f"{endpoint.url} disabled after {hours:.0f} h of failures ({error[:200]})",
        now=at,
    )
    log.warning(
        "endpoint %s disabled after %.0f h of failures",
        endpoint.id,
        hours,
        extra={"action": "endpoint_disabled", "endpoint": endpoint.id},
    )
    return True
