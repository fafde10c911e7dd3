"""Named statements for recurring series and the occurrence requests they create."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

_INSERT = text(
    """
    INSERT INTO series (user_id, series_key, type_key, anchor_local, zone, every, max_count, until,
                        calendar_policy, variables, state, next_n, next_due_at, created_at, updated_at)
    VALUES (:user_id, :series_key, :type_key, :anchor_local, :zone, :every, :max_count, :until,
            :calendar_policy, CAST(:variables AS jsonb), 'active', :next_n, :next_due_at, :now, :now)
    ON CONFLICT (user_id, series_key) DO NOTHING
    RETURNING id
    """
)
_FIND = text("SELECT * FROM series WHERE user_id = :user_id AND series_key = :series_key")


def insert_series(
    conn: Connection, *, now: datetime, **fields: Any
) -> tuple[int, dict[str, Any] | None]:
    """Arm a series once per (user, series_key): (id, None) when new, else (id, the series armed
    before under that key) for the caller to compare. A concurrent arm of the same key waits for
    the first to commit and then finds it."""
    params = {**fields, "variables": json.dumps(fields["variables"]), "now": now}
    row = conn.execute(_INSERT, params).first()
    if row is not None:
        return row[0], None
    existing = dict(conn.execute(_FIND, params).mappings().one())
    return existing["id"], existing


_TAKE_DUE = text(
    """
    SELECT user_id, id, series_key, type_key, anchor_local, zone, every, max_count, until,
           calendar_policy, variables, next_n, next_due_at, created_at
    FROM series WHERE state = 'active' AND next_due_at <= :now
    ORDER BY next_due_at LIMIT :limit FOR UPDATE SKIP LOCKED
    """
)


def take_due_series(conn: Connection, *, now: datetime, limit: int) -> list[dict[str, Any]]:
    """Due active series, locked for this transaction; another ticker skips them (no double fire)."""
    return [dict(r) for r in conn.execute(_TAKE_DUE, {"now": now, "limit": limit}).mappings()]


_ADVANCE_MANY = text(
    """
    UPDATE series s SET next_n = x.n, next_due_at = x.due,
        state = CASE WHEN x.ended THEN 'ended' ELSE s.state END, updated_at = :now
    FROM unnest(CAST(:users AS text[]), CAST(:ids AS bigint[]), CAST(:ns AS int[]),
                CAST(:dues AS timestamptz[]), CAST(:ended AS boolean[])) AS x(u, i, n, due, ended)
    WHERE s.user_id = x.u AND s.id = x.i AND s.state = 'active'
    """
)


def advance_many(
    conn: Connection, rows: list[tuple[str, int, int, datetime | None, bool]], *, now: datetime
) -> None:
    """Move many series on in one statement: (user_id, id, next_n, next_due_at, ended) each; a series
    no longer active (cancelled or paused meanwhile) is left alone."""
    if rows:
        conn.execute(
            _ADVANCE_MANY,
            {
                "users": [r[0] for r in rows],
                "ids": [r[1] for r in rows],
                "ns": [r[2] for r in rows],
                "dues": [r[3] for r in rows],
                "ended": [r[4] for r in rows],
                "now": now,
            },
        )


_SET_STATE = text(
    """
    UPDATE series SET state = :to_state, next_due_at = CASE WHEN :to_state = 'active'
        THEN CAST(:next_due_at AS timestamptz) ELSE next_due_at END,
        next_n = coalesce(CAST(:next_n AS integer), next_n), updated_at = :now
    WHERE user_id = :user_id AND id = :id AND state = ANY(CAST(:from_states AS text[]))
    RETURNING id
    """
)


def set_series_state(
    conn: Connection,
    key: tuple[str, int],
    *,
    from_states: Sequence[str],
    to_state: str,
    now: datetime,
    next_due_at: datetime | None = None,
    next_n: int | None = None,
) -> bool:
    """Move a series between states; False if it was not in one of `from_states`."""
    return (
        conn.execute(
            _SET_STATE,
            {
                "user_id": key[0],
                "id": key[1],
                "from_states": list(from_states),
                "to_state": to_state,
                "next_due_at": next_due_at,
                "next_n": next_n,
                "now": now,
            },
        ).first()
        is not None
    )


_LOCK_ACTIVE = text(
    "SELECT * FROM series WHERE user_id = :user_id AND id = :id AND state = 'active' FOR UPDATE"
)


def lock_active_series(conn: Connection, key: tuple[str, int]) -> dict[str, Any] | None:
    """The series if it is active, row-locked for this transaction (a concurrent cancel waits, or
    has already won and we see it no longer active); None otherwise."""
    row = conn.execute(_LOCK_ACTIVE, {"user_id": key[0], "id": key[1]}).mappings().first()
    return dict(row) if row else None


_DROP_UNROUTED = text(
    """
    UPDATE requests r SET state = 'routed', routed_at = :now, due_at = NULL
    FROM series s
    WHERE s.user_id = :user_id AND s.id = :id
      AND r.user_id = s.user_id AND r.type_key = s.type_key AND r.occurrence_key LIKE :prefix
      AND r.state IN ('pending', 'deferred')
    RETURNING r.id
    """
)


def drop_unrouted_occurrences(
    conn: Connection, key: tuple[str, int], *, now: datetime
) -> list[int]:
    """Resolve a series' occurrences that were not routed yet (e.g. held by a snooze) without
    sending them: the ids of those requests, for the caller to record why."""
    params = {"user_id": key[0], "id": key[1], "prefix": f"series:{key[1]}:%", "now": now}
    return [r[0] for r in conn.execute(_DROP_UNROUTED, params)]


_GET = text("SELECT * FROM series WHERE user_id = :user_id AND id = :id")
_OF_USER = text("SELECT * FROM series WHERE user_id = :user_id ORDER BY id")


def get_series(conn: Connection, key: tuple[str, int]) -> dict[str, Any] | None:
    row = conn.execute(_GET, {"user_id": key[0], "id": key[1]}).mappings().first()
    return dict(row) if row else None


def series_of(conn: Connection, user_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(_OF_USER, {"user_id": user_id}).mappings()]


_INSERT_OCCURRENCES = text(
    """
    INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,
                          state, due_at, created_at, routed_at)
    SELECT u, t, o, l, v, CAST(vars AS jsonb), s, d, :now, CASE WHEN s = 'routed' THEN :now END
    FROM unnest(CAST(:users AS text[]), CAST(:types AS text[]), CAST(:occs AS text[]),
                CAST(:lanes AS text[]), CAST(:versions AS int[]), CAST(:vars AS text[]),
                CAST(:states AS text[]), CAST(:dues AS timestamptz[])) AS x(u, t, o, l, v, vars, s, d)
    ON CONFLICT (user_id, type_key, occurrence_key) DO NOTHING
    RETURNING occurrence_key, id
    """
)


def insert_occurrences(
    conn: Connection, rows: Sequence[dict[str, Any]], *, now: datetime
) -> dict[str, int]:
    """Create occurrence requests (pending, deferred, or routed for missed/skipped ones), once each.

    Returns occurrence_key → request id for those created now; an occurrence created before (by a
    second beat, or a snooze) is left as it is."""
    if not rows:
        return {}
    cols = {
        "users": "user_id",
        "types": "type_key",
        "occs": "occurrence_key",
        "lanes": "lane",
        "versions": "template_version",
        "states": "state",
        "dues": "due_at",
    }
    params = {name: [r[col] for r in rows] for name, col in cols.items()}
    params["vars"] = [json.dumps(r["variables"]) for r in rows]
    return {occ: id_ for occ, id_ in conn.execute(_INSERT_OCCURRENCES, {**params, "now": now})}


_SNOOZE = text(
    """
    INSERT INTO requests AS r (user_id, type_key, occurrence_key, lane, template_version, variables,
                               state, due_at, created_at)
    VALUES (:user_id, :type_key, :occ, :lane, :version, CAST(:variables AS jsonb), 'deferred', :until, :now)
    ON CONFLICT (user_id, type_key, occurrence_key) DO UPDATE
        SET state = 'deferred', due_at = GREATEST(r.due_at, CAST(:until AS timestamptz))
        WHERE r.state IN ('pending', 'deferred')
    RETURNING id
    """
)


def snooze_occurrence(
    conn: Connection,
    *,
    user_id: str,
    type_key: str,
    occurrence_key: str,
    lane: str,
    version: int,
    variables: dict[str, Any],
    until: datetime,
    now: datetime,
) -> int | None:
    """Hold one occurrence until `until` (created early if the tick has not reached it), or later
    if it was already held longer: never earlier. None if it was already routed."""
    row = conn.execute(
        _SNOOZE,
        {
            "user_id": user_id,
            "type_key": type_key,
            "occ": occurrence_key,
            "lane": lane,
            "version": version,
            "variables": json.dumps(variables),
            "until": until,
            "now": now,
        },
    ).first()
    return row[0] if row else None


_DEFERRED = text(
    """
    SELECT r.user_id, r.type_key, r.occurrence_key FROM requests r
    JOIN unnest(CAST(:users AS text[]), CAST(:types AS text[]), CAST(:occs AS text[]))
        AS x(u, t, o) ON r.user_id = x.u AND r.type_key = x.t AND r.occurrence_key = x.o
    WHERE r.state = 'deferred'
    """
)


def deferred_occurrences(
    conn: Connection, keys: Sequence[tuple[str, str, str]]
) -> set[tuple[str, str, str]]:
    """Which of these (user_id, type_key, occurrence_key) requests are held to be sent later: an
    occurrence moved to a working day, a snoozed one."""
    if not keys:
        return set()
    params = {
        "users": [k[0] for k in keys],
        "types": [k[1] for k in keys],
        "occs": [k[2] for k in keys],
    }
    return {(u, t, o) for u, t, o in conn.execute(_DEFERRED, params)}
