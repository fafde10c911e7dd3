"""Named statements for the right to send: claim, begin a send, and settle it (sent, released,
unknown, failed); and the tick's republish of deliveries.

Leases are set and compared on PostgreSQL's clock (`clock_timestamp()`), never a worker's: a worker
whose clock runs fast cannot take over a live claim, and a statement returns the seconds the lease
has left so the worker can count them down on its own monotonic clock. Every settling statement is
conditional on the claim token; losing the claim is a normal return value (False / None).

Two columns carry what a send may have done: `send_started_at` (this attempt reached the provider
call) and `maybe_sent_at` (an earlier attempt may have sent, since then; NULL when nothing is owed).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from clarion.db.ledger import KEY_PAIRS, due_statement, key_params
from clarion.rows import ClaimedDelivery, Key


@dataclass(frozen=True)
class Lease:
    """The right to send one delivery, as this worker counts it down: PostgreSQL said how many
    seconds were left, and from then on the worker's monotonic clock measures them (a wall clock
    that jumps, or runs fast, cannot stretch a lease)."""

    token: str
    ends: float  # time.monotonic() at which the lease runs out

    @classmethod
    def granted(cls, token: str, seconds_left: float) -> Lease:
        return cls(token, time.monotonic() + seconds_left)

    def left(self) -> float:
        """Seconds still held (negative once it ran out)."""
        return self.ends - time.monotonic()


# The claim's RETURNING columns, in ClaimedDelivery's field order: rows become claims positionally.
_CLAIMED = tuple(name for name in ClaimedDelivery.__dataclass_fields__ if name != "claimed_at")


_LEASE = "clock_timestamp() + make_interval(secs => :lease)"


def _noting(
    settle: str, outcome: str, error: str, at: str, returning: str, *, unless: str = "false"
) -> str:
    """`settle` (an UPDATE of deliveries RETURNING user_id, id, request_id, attempts, platform
    AS row_platform) and, in the same statement, its attempt's row in delivery_attempts (0028),
    except where `unless` holds; the statement returns `returning` of each settled row."""
    return f"""
    WITH settled AS ({settle}), noted AS (
        INSERT INTO delivery_attempts (user_id, request_id, delivery_id, attempt, outcome,
            platform, error, at)
        SELECT user_id, request_id, id, attempts, {outcome}, row_platform, {error}, {at}
        FROM settled WHERE NOT ({unless})
    )
    SELECT {returning} FROM settled
    """


# The rows are claimed by their keys alone; what a send needs of their request and recipient is
# read after, one index probe each by the claimed row's own key (OFFSET 0 keeps each subquery a
# probe). Joined inside the UPDATE, a generic plan made while the tables were young read every
# delivery and request of each user (`user_id` alone in the index condition): 5,200 buffers per
# 100 rows, growing with every recipient's history.
_CLAIM = text(
    f"""
    WITH claimed AS (
        UPDATE deliveries d
        SET state = 'claimed', claim_token = :token, lease_until = {_LEASE}, due_at = {_LEASE},
            attempts = d.attempts + 1, taken_over = (d.state = 'claimed'), rounds = 0,
            maybe_sent_at = CASE WHEN d.state = 'claimed'
                                 THEN coalesce(d.maybe_sent_at, d.send_started_at)
                                 ELSE d.maybe_sent_at END,
            send_started_at = NULL, updated_at = :now
        FROM {KEY_PAIRS}
        WHERE d.user_id = k.user_id AND d.id = k.id AND d.attempts < :max_attempts
          AND ((d.state = 'pending' AND d.not_before <= greatest(CAST(:now AS timestamptz), clock_timestamp()))
               OR (d.state = 'claimed' AND d.lease_until < clock_timestamp()))
        RETURNING d.user_id, d.id, d.request_id, d.type_key, d.occurrence_key, d.channel, d.lane,
                  d.attempts, d.taken_over, d.maybe_sent_at, d.last_error,
                  extract(epoch FROM d.lease_until - clock_timestamp())::float8 AS lease_left
    )
    SELECT c.user_id, c.id, c.request_id, c.type_key, c.occurrence_key, c.channel, c.lane,
           c.attempts, c.taken_over, c.maybe_sent_at, c.last_error, r.template_version,
           r.variables, r.locale, rc.addresses, r.created_at AS requested_at, c.lease_left
    FROM claimed c
    CROSS JOIN LATERAL (
        SELECT template_version, variables, locale, created_at FROM requests
        WHERE user_id = c.user_id AND id = c.request_id OFFSET 0
    ) r
    CROSS JOIN LATERAL (SELECT addresses FROM recipients WHERE user_id = c.user_id OFFSET 0) rc
    """
)


def claim_deliveries(
    conn: Connection,
    keys: Iterable[Key],
    *,
    token: str,
    now: datetime,
    lease: float,
    max_attempts: int,
) -> list[ClaimedDelivery]:
    """Claim the deliveries that are free to send: pending and due (by `now` or PostgreSQL's clock,
    so a worker whose clock runs slow is not idle), or claimed with a lease lapsed on PostgreSQL's
    clock (never a worker's); never one that has used up its attempts.

    Row locks make this atomic: of many concurrent claimers exactly one gets each row, the others
    wait on its lock and then find the row taken. A takeover of an attempt that had reached the
    provider comes back with maybe_sent_at set: that attempt may have sent."""
    result = conn.execute(
        _CLAIM,
        {
            **key_params(keys),
            "token": token,
            "now": now,
            "lease": lease,
            "max_attempts": max_attempts,
        },
    )
    assert tuple(result.keys()) == _CLAIMED, "the claim's columns are ClaimedDelivery's fields"
    rows, answered = result.all(), time.monotonic()
    return [ClaimedDelivery(*row, claimed_at=answered) for row in rows]  # type: ignore[misc]


_EXHAUST = text(
    _noting(
        f"""
    UPDATE deliveries d
    SET state = 'failed', claim_token = NULL, lease_until = NULL, due_at = NULL,
        maybe_sent_at = coalesce(d.maybe_sent_at, CASE WHEN d.state = 'claimed' THEN d.send_started_at END),
        send_started_at = NULL, updated_at = :now
    FROM {KEY_PAIRS}
    WHERE d.user_id = k.user_id AND d.id = k.id AND d.attempts >= :max_attempts
      AND (d.state = 'pending' OR (d.state = 'claimed' AND d.lease_until < clock_timestamp()))
    RETURNING d.user_id, d.id, d.request_id, d.channel, d.lane, d.attempts, d.maybe_sent_at,
        d.last_error, d.platform AS row_platform""",
        "'exhausted'",
        "coalesce(last_error, '')",
        ":now",
        "user_id, id, request_id, channel, lane, attempts, maybe_sent_at, last_error",
    )
)


def exhaust_deliveries(
    conn: Connection, keys: Iterable[Key], *, now: datetime, max_attempts: int
) -> list[dict[str, Any]]:
    """Fail the rows among `keys` that may not be claimed again: attempts used up, and pending or
    abandoned by a worker that died (a takeover counts as an attempt)."""
    rows = conn.execute(
        _EXHAUST, {**key_params(keys), "now": now, "max_attempts": max_attempts}
    ).mappings()
    return [dict(r) for r in rows]


_BEGIN_SEND = text(
    """
    UPDATE deliveries
    SET send_started_at = clock_timestamp(),
        lease_until = greatest(lease_until, clock_timestamp() + make_interval(secs => :need)),
        due_at = greatest(lease_until, clock_timestamp() + make_interval(secs => :need))
    WHERE user_id = :user_id AND id = :id AND state = 'claimed' AND claim_token = :token
    RETURNING extract(epoch FROM lease_until - clock_timestamp())::float8
    """
)


def begin_send(conn: Connection, key: Key, *, token: str, need: float) -> Lease | None:
    """About to call the provider: record that this attempt reached the send, and extend the lease
    so that at least `need` seconds are left. Returns the lease (counted down from the seconds
    PostgreSQL says are left), or None if the claim is no longer ours (send nothing)."""
    left = conn.execute(
        _BEGIN_SEND, {"user_id": key[0], "id": key[1], "token": token, "need": need}
    ).scalar()
    return None if left is None else Lease.granted(token, float(left))


_MARK_SENT = text(
    _noting(
        """
    UPDATE deliveries
    SET state = 'sent', platform = :platform, provider_message_id = :message_id, sent_at = :now,
        claim_token = NULL, lease_until = NULL, due_at = NULL, last_error = NULL, updated_at = :now,
        send_started_at = NULL, maybe_sent_at = NULL
    WHERE user_id = :user_id AND id = :id AND state = 'claimed' AND claim_token = :token
    RETURNING user_id, id, request_id, attempts, platform AS row_platform""",
        "'sent'",
        "''",
        ":now",
        "id",
    )
)


def mark_sent(
    conn: Connection, key: Key, *, token: str, platform: str, message_id: str | None, now: datetime
) -> bool:
    """Record a send, only if our claim still stands. False: the claim was taken over."""
    row = conn.execute(
        _MARK_SENT,
        {
            "user_id": key[0],
            "id": key[1],
            "token": token,
            "platform": platform,
            "message_id": message_id,
            "now": now,
        },
    )
    return row.first() is not None


@dataclass(frozen=True)
class SentMark:
    """One send to record: the delivery, what the provider called it, and when it answered."""

    key: Key
    platform: str
    message_id: str | None
    sent_at: datetime


# Each row is found by its primary key alone (a probe, OFFSET 0 keeps it one) and then updated
# by (tableoid, ctid) with the claim's conditions checked on it. With the conditions beside the
# key, `state = 'claimed'` lets the planner use deliveries_one_send (user_id leads it; the state
# implies its predicate): a generic plan made while the table was young, or analyzed before a
# bulk load, did so, reading every sent row of each recipient per key (bench/history.py).
_MARK_SENT_MANY = text(
    _noting(
        """
    UPDATE deliveries d
    SET state = 'sent', platform = k.platform, provider_message_id = k.message_id,
        sent_at = k.sent_at, claim_token = NULL, lease_until = NULL, due_at = NULL,
        last_error = NULL, updated_at = k.sent_at, send_started_at = NULL, maybe_sent_at = NULL
    FROM (
        SELECT k.*, p.tableoid AS row_table, p.ctid AS row_ctid
        FROM unnest(CAST(:users AS text[]), CAST(:ids AS bigint[]), CAST(:platforms AS text[]),
                    CAST(:message_ids AS text[]), CAST(:sent_at AS timestamptz[]))
             AS k(user_id, id, platform, message_id, sent_at)
        CROSS JOIN LATERAL (
            SELECT tableoid, ctid FROM deliveries WHERE user_id = k.user_id AND id = k.id OFFSET 0
        ) p
    ) k
    WHERE d.tableoid = k.row_table AND d.ctid = k.row_ctid
      AND d.state = 'claimed' AND d.claim_token = :token
    RETURNING d.user_id, d.id, d.request_id, d.attempts, d.platform AS row_platform,
        d.sent_at AS row_at""",
        "'sent'",
        "''",
        "row_at",
        "user_id, id",
    )
)


def mark_sent_many(conn: Connection, marks: Sequence[SentMark], *, token: str) -> set[Key]:
    """Record many sends in one statement (group commit), each only if our claim on it still
    stands. Returns the keys recorded; a key missing was taken over (the caller records the
    possible duplicate)."""
    if not marks:
        return set()
    rows = conn.execute(
        _MARK_SENT_MANY,
        {
            "users": [m.key[0] for m in marks],
            "ids": [m.key[1] for m in marks],
            "platforms": [m.platform for m in marks],
            "message_ids": [m.message_id for m in marks],
            "sent_at": [m.sent_at for m in marks],
            "token": token,
        },
    )
    return {(user_id, id_) for user_id, id_ in rows}


# A release whose attempt is refunded (nothing was attempted: a throttle) notes no attempt.
_RELEASE = text(
    _noting(
        """
    UPDATE deliveries
    SET state = 'pending', claim_token = NULL, lease_until = NULL, not_before = :not_before,
        due_at = :not_before, last_error = :error, updated_at = :now, rounds = 0,
        maybe_sent_at = CASE WHEN :maybe_sent
                             THEN coalesce(maybe_sent_at, send_started_at, clock_timestamp())
                             ELSE maybe_sent_at END,
        send_started_at = NULL,
        attempts = attempts - CASE WHEN :refund THEN 1 ELSE 0 END
    WHERE user_id = :user_id AND id = :id AND state = 'claimed' AND claim_token = :token
    RETURNING user_id, id, request_id, attempts, platform AS row_platform""",
        "CASE WHEN :maybe_sent THEN 'unknown' ELSE 'retrying' END",
        ":error",
        ":now",
        "id",
        unless=":refund",
    )
)


def release_claim(
    conn: Connection,
    key: Key,
    *,
    token: str,
    not_before: datetime,
    error: str,
    now: datetime,
    refund_attempt: bool = False,
    maybe_sent: bool = False,
) -> bool:
    """Give a claim back, to be retried at `not_before` (the tick republishes it then).

    refund_attempt: nothing was attempted (a throttle, a catalog not deployed here yet).
    maybe_sent: this attempt may have reached the provider; the next one must reconcile first."""
    row = conn.execute(
        _RELEASE,
        {
            "user_id": key[0],
            "id": key[1],
            "token": token,
            "refund": refund_attempt,
            "maybe_sent": maybe_sent,
            "not_before": not_before,
            "error": error,
            "now": now,
        },
    )
    return row.first() is not None


_HOLD_UNKNOWN = text(
    _noting(
        """
    UPDATE deliveries
    SET state = 'unknown', claim_token = NULL, lease_until = NULL, due_at = NULL, last_error = :error,
        maybe_sent_at = coalesce(maybe_sent_at, send_started_at, clock_timestamp()),
        send_started_at = NULL, updated_at = :now
    WHERE user_id = :user_id AND id = :id AND state = 'claimed' AND claim_token = :token
    RETURNING user_id, id, request_id, attempts, platform AS row_platform""",
        "'held'",
        ":error",
        ":now",
        "request_id",
    )
)


def hold_unknown(conn: Connection, key: Key, *, token: str, error: str, now: datetime) -> bool:
    """Park a send whose outcome is unknown and may not be repeated: state `unknown`, for an
    operator (`clarion redrive --state unknown` sends it again under the same key)."""
    row = conn.execute(
        _HOLD_UNKNOWN, {"user_id": key[0], "id": key[1], "token": token, "error": error, "now": now}
    )
    return row.first() is not None


_FAIL = text(
    _noting(
        """
    UPDATE deliveries
    SET state = 'failed', claim_token = NULL, lease_until = NULL, due_at = NULL, last_error = :error,
        send_started_at = NULL, updated_at = :now
    WHERE user_id = :user_id AND id = :id AND state = 'claimed' AND claim_token = :token
    RETURNING user_id, id, request_id, attempts, platform AS row_platform, channel""",
        "'failed'",
        ":error",
        ":now",
        "request_id, channel",
    )
)


def fail_delivery(
    conn: Connection, key: Key, *, token: str, error: str, now: datetime
) -> tuple[int, str] | None:
    """Fail a claimed delivery for good; returns (request_id, channel) or None if the claim is gone."""
    row = conn.execute(
        _FAIL, {"user_id": key[0], "id": key[1], "token": token, "error": error, "now": now}
    ).first()
    return (row[0], row[1]) if row else None


_DUE_DELIVERIES = due_statement("deliveries")


def take_due_deliveries(
    conn: Connection, *, lane: str, now: datetime, again: float, cap: float, limit: int
) -> list[tuple[str, int, str]]:
    """One lane's deliveries to publish again: never picked up, retry time reached, or claim lease
    lapsed. Each is pushed `again` seconds on, doubling each time it comes round without progress
    (up to `cap`), so a backlog is not republished in full every few seconds."""
    return [
        (user_id, id_, lane_)
        for user_id, id_, lane_ in conn.execute(
            _DUE_DELIVERIES, {"now": now, "again": again, "cap": cap, "lane": lane, "limit": limit}
        )
    ]
