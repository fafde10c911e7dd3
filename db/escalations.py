"""Named statements for escalation chains, and what a delivery's fate means for its chain.

A chain is one row (`escalations`) holding the timer of its next step. Every change to it is a
conditional update made while holding its row lock: the tick takes due rows `FOR UPDATE SKIP
LOCKED`, an acknowledgement and a confirmed failure lock the row (`FOR UPDATE`) before they
update it. So a step firing and an acknowledgement serialise: either the ack commits first and the
step never fires, or the step fires first and the ack then stops every later step.

Acknowledgements (`ACK_EVENTS`): a button answer, and receipts that a person acted: `read` (an
in-app item read, an SMS/chat read receipt) and `clicked`. An email `opened` is not one: mail
clients and scanners fetch the tracking pixel by themselves. Confirmed failures (`FAIL_EVENTS`):
a delivery failed for good (a provider refusal, a PermanentSendError, attempts used up), bounced,
undelivered, or an invalid push token. A failure brings the next step forward to now only when no
other delivery of that step's request is still alive (a second channel may yet reach them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from clarion.db import ledger
from clarion.db.schema import SENDING_STATES

GATE = "escalation"
ACK_EVENTS = frozenset({"answered", "read", "clicked"})
FAIL_EVENTS = frozenset({"failed", "bounced", "undelivered", "invalid_token"})
# A delivery that may still reach them: not yet sent, or sent and not reported failed.
LIVE_STATES = (
    "pending",
    *(s for s in SENDING_STATES if s not in ("bounced", "undelivered")),
)


@dataclass(frozen=True)
class Chain:
    """A chain whose next step is due, with what firing it needs."""

    user_id: str
    id: int
    request_id: int
    type_key: str
    steps: tuple[dict[str, Any], ...]  # {"type", "user", "after", "to"} for steps 2, 3, ...
    working_hours: str | None
    next_step: int
    due_at: datetime
    due_reason: str
    due_detail: str
    variables: dict[str, Any]

    @property
    def key(self) -> tuple[str, int]:
        return self.user_id, self.id


@dataclass(frozen=True)
class Locked:
    """A chain locked through one of its requests (or a delivery of one)."""

    chain_user: str
    chain_id: int
    origin_request: int
    state: str
    next_step: int
    due_at: datetime | None
    acked_at: datetime | None
    step: int  # the step the request belongs to
    request_id: int  # that request
    steps: int  # how many steps after the first the chain has


_START = text(
    """
    INSERT INTO escalations (user_id, request_id, type_key, steps, working_hours, next_step,
                             due_at, due_reason, due_detail, state, created_at, updated_at)
    VALUES (:u, :r, :type_key, CAST(:steps AS jsonb), :working_hours, 2, :due_at, :due_reason,
            :due_detail, 'waiting', :now, :now)
    ON CONFLICT (user_id, request_id) DO NOTHING
    RETURNING id
    """
)
_LINK = text(
    """
    INSERT INTO escalation_requests (user_id, request_id, chain_user, chain_id, step)
    SELECT * FROM unnest(CAST(:users AS text[]), CAST(:requests AS bigint[]),
                         CAST(:chain_users AS text[]), CAST(:chain_ids AS bigint[]),
                         CAST(:steps AS smallint[]))
    ON CONFLICT (user_id, request_id) DO NOTHING
    """
)


def start_chain(
    conn: Connection,
    key: tuple[str, int],
    *,
    type_key: str,
    steps: list[dict[str, Any]],
    working_hours: str | None,
    due_at: datetime,
    due_reason: str,
    due_detail: str,
    now: datetime,
) -> int | None:
    """Start the chain of request `key` (its step 1) with step 2 due at `due_at`; the chain id,
    or None if the request has one already (a re-routed request starts nothing twice)."""
    chain_id = conn.execute(
        _START,
        {
            "u": key[0],
            "r": key[1],
            "type_key": type_key,
            "steps": json.dumps(steps),
            "working_hours": working_hours,
            "due_at": due_at,
            "due_reason": due_reason,
            "due_detail": due_detail[:500],
            "now": now,
        },
    ).scalar()
    if chain_id is not None:
        link_requests(conn, [(key[0], key[1], key[0], chain_id, 1)])
    return chain_id


def link_requests(conn: Connection, links: list[tuple[str, int, str, int, int]]) -> None:
    """Record (user_id, request_id, chain_user, chain_id, step) for each step's request."""
    if not links:
        return
    users, requests, chain_users, chain_ids, steps = (list(c) for c in zip(*links, strict=True))
    conn.execute(
        _LINK,
        {
            "users": users,
            "requests": requests,
            "chain_users": chain_users,
            "chain_ids": chain_ids,
            "steps": steps,
        },
    )


_TAKE_DUE = text(
    """
    SELECT e.user_id, e.id, e.request_id, e.type_key, e.steps, e.working_hours, e.next_step,
           e.due_at, e.due_reason, e.due_detail, q.variables
    FROM escalations e JOIN requests q ON q.user_id = e.user_id AND q.id = e.request_id
    WHERE e.state = 'waiting' AND e.due_at <= :now
    ORDER BY e.due_at LIMIT :limit
    FOR UPDATE OF e SKIP LOCKED
    """
)


def take_due(conn: Connection, *, now: datetime, limit: int) -> list[Chain]:
    """Chains whose next step is due, locked; a chain another transaction holds (an ack being
    written, another tick) is skipped and comes round at the next tick if still due."""
    return [
        Chain(
            r.user_id,
            r.id,
            r.request_id,
            r.type_key,
            tuple(r.steps),
            r.working_hours,
            r.next_step,
            r.due_at,
            r.due_reason,
            r.due_detail,
            dict(r.variables),
        )
        for r in conn.execute(_TAKE_DUE, {"now": now, "limit": limit})
    ]


_ADVANCE = text(
    """
    UPDATE escalations SET next_step = :to_step, due_at = :due_at, due_reason = 'no_ack',
        due_detail = '', updated_at = :now,
        state = CASE WHEN CAST(:due_at AS timestamptz) IS NULL THEN 'finished' ELSE 'waiting' END
    WHERE user_id = :u AND id = :id AND state = 'waiting' AND next_step = :from_step
    """
)


def advance(
    conn: Connection,
    key: tuple[str, int],
    *,
    from_step: int,
    due_at: datetime | None,
    now: datetime,
) -> bool:
    """Step `from_step` fired: the timer moves to the next step (due_at None: it was the last,
    the chain is finished). False if the chain was not waiting on that step."""
    params = {
        "u": key[0],
        "id": key[1],
        "from_step": from_step,
        "to_step": from_step + 1,
        "due_at": due_at,
        "now": now,
    }
    return conn.execute(_ADVANCE, params).rowcount == 1


_LOCK_BY_REQUEST = text(
    """
    SELECT e.user_id, e.id, e.request_id, e.state, e.next_step, e.due_at, e.acked_at, l.step,
           l.request_id, jsonb_array_length(e.steps)
    FROM escalation_requests l
    JOIN escalations e ON e.user_id = l.chain_user AND e.id = l.chain_id
    WHERE l.user_id = :u AND l.request_id = :r
    FOR UPDATE OF e
    """
)
_REQUEST_OF = text("SELECT request_id FROM deliveries WHERE user_id = :u AND id = :id")


def lock_by_request(conn: Connection, user_id: str, request_id: int) -> Locked | None:
    """The chain request (user_id, request_id) belongs to, locked; None if it belongs to none."""
    row = conn.execute(_LOCK_BY_REQUEST, {"u": user_id, "r": request_id}).first()
    return Locked(*row) if row is not None else None


def lock_by_delivery(conn: Connection, user_id: str, delivery_id: int) -> Locked | None:
    request_id = conn.execute(_REQUEST_OF, {"u": user_id, "id": delivery_id}).scalar()
    return None if request_id is None else lock_by_request(conn, user_id, request_id)


_ACK = text(
    """
    UPDATE escalations SET state = CASE WHEN state = 'waiting' THEN 'acked' ELSE state END,
        due_at = NULL, acked_at = :now, acked_by = :by, updated_at = :now
    WHERE user_id = :u AND id = :id AND acked_at IS NULL
    """
)
_HURRY = text(
    """
    UPDATE escalations SET due_at = :now, due_reason = :reason, due_detail = :detail,
        updated_at = :now
    WHERE user_id = :u AND id = :id AND state = 'waiting' AND next_step = :next_step
        AND due_at > :now
    """
)
_LIVE = text(
    """
    SELECT id, channel, state FROM deliveries
    WHERE user_id = :u AND request_id = :r AND state = ANY(CAST(:live AS text[]))
    ORDER BY id
    """
)


def decide(
    conn: Connection,
    chain: tuple[str, int],
    outcome: str,
    reason: str,
    detail: str,
    now: datetime,
    *,
    channel: str | None = None,
    delivery_id: int | None = None,
) -> None:
    """One escalation decision on request `chain` = (user_id, request_id) (clarion explain)."""
    ledger.insert_decisions(
        conn,
        [
            ledger.Decision(
                chain[0], chain[1], GATE, outcome, reason, detail[:500], channel, delivery_id
            )
        ],
        now=now,
    )


def delivery_event(
    conn: Connection, user_id: str, delivery_id: int, event: str, detail: str, now: datetime
) -> str | None:
    """What a delivery event means for its chain, applied in the caller's transaction: an
    acknowledgement stops the chain, a confirmed failure brings the next step forward. Returns
    the decision's reason, or None (no chain, or an event that means nothing to one)."""
    if event not in ACK_EVENTS and event not in FAIL_EVENTS:
        return None
    chain = lock_by_delivery(conn, user_id, delivery_id)
    if chain is None:
        return None
    what = f"{event} on delivery {delivery_id} (step {chain.step})" + (
        f": {detail}" if detail else ""
    )
    if event in ACK_EVENTS:
        return _acknowledge(conn, chain, what, now)
    return hurry(conn, chain, "step_failed", what, now, live_on=(user_id, chain.request_id))


def _acknowledge(conn: Connection, chain: Locked, what: str, now: datetime) -> str | None:
    if chain.acked_at is not None:
        return None  # acknowledged before: the chain stopped then
    conn.execute(_ACK, {"u": chain.chain_user, "id": chain.chain_id, "by": what[:300], "now": now})
    origin = (chain.chain_user, chain.origin_request)
    if chain.state == "waiting":
        decide(
            conn,
            origin,
            "stop",
            "acked",
            f"acknowledged: {what}; step {chain.next_step} and later are not sent",
            now,
        )
        return "acked"
    decide(
        conn, origin, "stop", "ack_after_finish", f"acknowledged after the last step: {what}", now
    )
    return "ack_after_finish"


def _not_hurried(conn: Connection, chain: Locked, what: str, now: datetime) -> str | None:
    """Why a failure escalates nothing: the chain has no step left, or is already past this one.
    (After an ack, nothing is recorded: the ack's own decision says why.)"""
    origin = (chain.chain_user, chain.origin_request)
    if chain.state == "finished":
        decide(conn, origin, "stop", "no_further_step", f"{what}; the chain has no step left", now)
        return "no_further_step"
    if chain.state == "waiting":
        decide(
            conn,
            origin,
            "wait",
            "step_superseded",
            f"{what}; the chain is already waiting on step {chain.next_step} (due at "
            f"{chain.due_at.isoformat() if chain.due_at else '?'})",
            now,
        )
        return "step_superseded"
    return None


def hurry(
    conn: Connection,
    chain: Locked,
    reason: str,
    what: str,
    now: datetime,
    *,
    live_on: tuple[str, int] | None = None,
) -> str | None:
    """Bring the chain's next step forward to now, because the current step cannot reach anyone
    (reason step_failed | step_not_delivered). Only for the step the chain is waiting on, and
    (with live_on = the step's request) only when none of its deliveries is still alive."""
    origin = (chain.chain_user, chain.origin_request)
    if chain.state != "waiting" or chain.step != chain.next_step - 1:
        return _not_hurried(conn, chain, what, now)
    if live_on is not None:
        live = conn.execute(
            _LIVE, {"u": live_on[0], "r": live_on[1], "live": list(LIVE_STATES)}
        ).all()
        if live:
            shown = ", ".join(f"{r.channel} delivery {r.id} ({r.state})" for r in live)
            decide(
                conn,
                origin,
                "wait",
                "other_channel_live",
                f"{what}; still alive: {shown}: step {chain.next_step} stays due at "
                f"{chain.due_at.isoformat() if chain.due_at else '?'}",
                now,
            )
            return "other_channel_live"
    params = {
        "u": chain.chain_user,
        "id": chain.chain_id,
        "next_step": chain.next_step,
        "reason": reason,
        "detail": what[:500],
        "now": now,
    }
    if conn.execute(_HURRY, params).rowcount != 1:
        return None  # due already
    decide(
        conn,
        origin,
        "hurry",
        reason,
        f"{what}: step {chain.next_step} is due now instead of "
        f"{chain.due_at.isoformat() if chain.due_at else '?'}",
        now,
    )
    return reason


def acknowledge(
    conn: Connection, user_id: str, request_id: int, by: str, now: datetime
) -> str | None:
    """An acknowledgement from outside any delivery (the API, a signed link) of the chain that
    request (user_id, request_id) belongs to (any step's request), under the chain's row lock:
    `acked` (later steps are not sent), `ack_after_finish`, `already_acked`; None: no chain."""
    chain = lock_by_request(conn, user_id, request_id)
    if chain is None:
        return None
    return _acknowledge(conn, chain, by, now) or "already_acked"
