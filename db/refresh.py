"""Named statements for collapse in place: the updates owed to collapse leaders' messages.

A follower (collapse_groups.join_collapse) upserts its leader's row in `collapse_refreshes` with the
group's count and lowers `due_at`. The update job (tasks.refresh) takes due rows under a lease on
PostgreSQL's clock, reads the leaders' deliveries, sets their messages to the count of that
moment, then finishes the row: nothing more owed, or the closing update at the window's end. A
finished row keeps the group's count (db.interactions re-renders an answered leader with it) for
RETAIN after its window; then `forget_finished` deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text


@dataclass(frozen=True)
class OwedRefresh:
    """One leader whose message is owed its group's count."""

    user_id: str
    leader_id: int
    collapse_key: str
    count: int
    window_until: datetime

    @property
    def key(self) -> tuple[str, int]:
        return (self.user_id, self.leader_id)


@dataclass(frozen=True)
class LeaderDelivery:
    """One delivery of a leading request, with what re-rendering its message needs."""

    user_id: str
    request_id: int
    id: int
    channel: str
    state: str
    provider_message_id: str | None
    answer: str | None
    type_key: str
    occurrence_key: str
    template_version: int
    variables: dict[str, Any]
    lane: str
    addresses: dict[str, Any]
    locale: str | None = None  # pinned on the request (migration 0015)


_ANY_DUE = text(
    """
    SELECT EXISTS (
        SELECT 1 FROM collapse_refreshes
        WHERE due_at IS NOT NULL AND due_at <= :now
          AND (lease_until IS NULL OR lease_until <= clock_timestamp())
    )
    """
)


def any_due(conn: Connection, *, now: datetime) -> bool:
    """Is an update owed to some collapse leader's message now (the tick asks each second)?"""
    return bool(conn.execute(_ANY_DUE, {"now": now}).scalar())


_TAKE = text(
    """
    UPDATE collapse_refreshes r
    SET due_at = :retry_at, lease_until = clock_timestamp() + make_interval(secs => :lease)
    FROM (
        SELECT user_id, leader_id FROM collapse_refreshes
        WHERE due_at IS NOT NULL AND due_at <= :now
          AND (lease_until IS NULL OR lease_until <= clock_timestamp())
        ORDER BY due_at LIMIT :limit FOR UPDATE SKIP LOCKED
    ) due
    WHERE r.user_id = due.user_id AND r.leader_id = due.leader_id
    RETURNING r.user_id, r.leader_id, r.collapse_key, r.count, r.window_until
    """
)


def take_due(
    conn: Connection, *, now: datetime, retry_at: datetime, lease: float, limit: int
) -> list[OwedRefresh]:
    """Take up to `limit` due rows: leased for `lease` seconds (PostgreSQL's clock), and due
    again at `retry_at` should this job die before finishing them."""
    rows = conn.execute(
        _TAKE, {"now": now, "retry_at": retry_at, "lease": lease, "limit": limit}
    ).all()
    return sorted((OwedRefresh(*row) for row in rows), key=lambda o: o.key)


_LEADERS = text(
    """
    SELECT d.user_id, d.request_id, d.id, d.channel, d.state, d.provider_message_id, d.answer,
           q.type_key, q.occurrence_key, q.template_version, q.variables, q.lane, r.addresses,
           q.locale
    FROM unnest(CAST(:users AS text[]), CAST(:ids AS bigint[])) AS k(user_id, request_id)
    JOIN deliveries d ON d.user_id = k.user_id AND d.request_id = k.request_id
    JOIN requests q ON q.user_id = d.user_id AND q.id = d.request_id
    JOIN recipients r ON r.user_id = d.user_id
    ORDER BY d.user_id, d.request_id, d.channel
    """
)


def leader_deliveries(
    conn: Connection, keys: list[tuple[str, int]]
) -> dict[tuple[str, int], list[LeaderDelivery]]:
    """The deliveries of each leading request (user_id, request id), by request."""
    found: dict[tuple[str, int], list[LeaderDelivery]] = {key: [] for key in keys}
    if not keys:
        return found
    params = {"users": [u for u, _ in keys], "ids": [i for _, i in keys]}
    for row in conn.execute(_LEADERS, params):
        delivery = LeaderDelivery(*row)
        found[(delivery.user_id, delivery.request_id)].append(delivery)
    return found


_FINISH = text(
    """
    UPDATE collapse_refreshes SET shown = GREATEST(shown, :count), lease_until = NULL,
        due_at = CASE WHEN count > :count THEN due_at
                      WHEN window_until > :now THEN window_until END
    WHERE user_id = :user_id AND leader_id = :leader_id
    """
)


def finish(conn: Connection, owed: OwedRefresh, *, now: datetime) -> None:
    """The leader's messages show `owed.count`. Followers that came since keep their due time;
    else, while the window is open, one closing update is owed at its end; else nothing."""
    params = {"user_id": owed.user_id, "leader_id": owed.leader_id, "count": owed.count, "now": now}
    conn.execute(_FINISH, params)


_FORGET = text(
    """
    DELETE FROM collapse_refreshes r USING (
        SELECT user_id, leader_id FROM collapse_refreshes
        WHERE due_at IS NULL AND window_until < :before LIMIT :limit FOR UPDATE SKIP LOCKED
    ) done
    WHERE r.user_id = done.user_id AND r.leader_id = done.leader_id
    """
)


def forget_finished(conn: Connection, *, before: datetime, limit: int) -> int:
    """Delete up to `limit` finished rows whose window ended before `before`."""
    return conn.execute(_FORGET, {"before": before, "limit": limit}).rowcount


_AGAIN = text(
    "UPDATE collapse_refreshes SET lease_until = NULL, due_at = LEAST(due_at, :at) "
    "WHERE user_id = :user_id AND leader_id = :leader_id"
)


def again(conn: Connection, owed: OwedRefresh, *, at: datetime) -> None:
    """Not done (the leader is not sent yet, a budget is full): owed again no later than `at`."""
    conn.execute(_AGAIN, {"user_id": owed.user_id, "leader_id": owed.leader_id, "at": at})
