"""Named statements for recurring series and the occurrence requests they create."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, overload

import psycopg
from sqlalchemy import Connection, text

from clarion.db import meta

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


# Through psycopg itself: all rows in one fetch (SQLAlchemy's result fetches them one by one). The
# due rows are taken (sorted, limited, locked) before their recipients are joined: PostgreSQL then
# probes or hashes the recipients of those rows only, never reads all of them (10,000 recipients:
# 3.8 -> 2.9 ms for 1,000 due).
_TAKE_DUE = """
    SELECT s.*, r.timezone, r.locale, r.country, r.workweek, r.subdivision
    FROM (
        SELECT CAST(ctid AS text) AS ctid, user_id, id, type_key, anchor_local, zone, every,
               max_count, until, calendar_policy, next_n, next_due_at, created_at
        FROM series
        WHERE state = 'active' AND next_due_at <= %(now)s
          AND (SELECT value FROM clarion_meta WHERE key = %(tzdata_key)s) = %(tzdata)s
        ORDER BY next_due_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ) s JOIN recipients r ON r.user_id = s.user_id
    ORDER BY s.next_due_at
    """


def take_due_series(
    conn: Connection, *, now: datetime, limit: int, tzdata: str
) -> Sequence[dict[str, Any]]:
    """Due active series, locked for this transaction; another ticker skips them (no double fire).
    None while the tz database release the deployment recorded is not `tzdata` (this process's):
    checked in the same statement, so a tick costs no round trip for it.

    Each row also carries what the tick needs of its recipient (tasks.arming.recipient_calendar:
    zone, country, working week, subdivision; and the locale), joined here: one round trip and
    no array of user ids to send (a third less time than a second query for 1,000). With each
    row's `ctid`, where fire_occurrences finds it again without an index lookup (a locked row
    stays where it is until this transaction changes it). Without `variables`: fire_occurrences
    copies them from the series row in SQL, so the tick never decodes and re-encodes one JSON
    document per series.

    The rows are all locked and received when this returns, but become dicts as they are read
    (DueRows), so the tick's first write starts before the last row is converted."""
    cursor = _raw(conn).execute(
        _TAKE_DUE, {"now": now, "limit": limit, "tzdata_key": meta.TZDATA, "tzdata": tzdata}
    )
    return DueRows(cursor)


class DueRows(Sequence[dict[str, Any]]):
    """The rows of an executed query as dicts, converted in order as far as they are read: the
    result is in client memory already, so reading it needs no round trip (and works inside a
    pipeline). About 2 us per row of the due query; a tick of 1,000 due starts writing ~2 ms
    earlier (bench/tick.py)."""

    def __init__(self, cursor: psycopg.Cursor[Any]) -> None:
        self._cursor = cursor
        self._keys = [column.name for column in cursor.description or ()]
        self._count = max(cursor.rowcount, 0)
        self._read: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        wanted = range(self._count)[index]  # IndexError as for a list
        last = (max(wanted) + 1 if wanted else 0) if isinstance(wanted, range) else wanted + 1
        if last > len(self._read):
            rows = self._cursor.fetchmany(last - len(self._read))
            self._read += [dict(zip(self._keys, row, strict=True)) for row in rows]
        return self._read[index]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def micros(at: datetime | None) -> int | None:
    """An instant as whole microseconds since the epoch: psycopg dumps a bigint[] many times faster
    than a timestamptz[] (and json.dumps a number faster than a text), and the SQL turns it back
    exactly (`_AT`)."""
    return None if at is None else (at - _EPOCH) // _MICROSECOND


_AT = "(timestamptz 'epoch' + {} * interval '1 microsecond')"


class Advance(NamedTuple):
    """Where one due series goes after this tick (state 'ended' when `ended`). `ctid`: where
    take_due_series found the row (in its partition, when partitioned)."""

    user_id: str
    series_id: int
    ctid: str
    next_n: int
    next_due_at: datetime | None
    ended: bool


class NewOccurrence(NamedTuple):
    """One occurrence request to record (pending, deferred, or routed when not sent), in the
    recipient's locale (None: the requests_pin_locale trigger reads it), and, when it is not sent
    as scheduled, the decision saying why (gate, outcome, reason, detail)."""

    user_id: str
    series_id: int
    occurrence_key: str
    lane: str
    template_version: int
    state: str
    due_at: datetime | None
    decision: tuple[str, str, str, str] | None = None
    locale: str | None = None


# Sent through psycopg itself (pipelined, see `pipelined`): psycopg placeholders. The series to
# advance come as arrays (in binary, %(...)b: a third of the client's cost of text arrays), whose
# length PostgreSQL knows when it plans the join with `series` (by ctid, not a scan of the table);
# the occurrences, joined only with those, as one JSON document: psycopg writes a list parameter
# element by element in Python, json.dumps a whole batch in C (a fifth of the cost as arrays).
_FIRE = f"""
    WITH adv AS (
        UPDATE series s SET next_n = x.next_n, next_due_at = {_AT.format("x.next_due_at")},
            state = CASE WHEN x.ended THEN 'ended' ELSE s.state END, updated_at = %(now)s
        FROM unnest(CAST(%(ctids)b AS tid[]), CAST(%(users)b AS text[]), CAST(%(ids)b AS bigint[]),
                    CAST(%(ns)b AS int[]), CAST(%(dues)b AS bigint[]), CAST(%(ended)b AS boolean[]))
            AS x(ctid, user_id, series_id, next_n, next_due_at, ended)
        WHERE s.ctid = x.ctid AND s.user_id = x.user_id AND s.id = x.series_id
          AND s.state = 'active'
        RETURNING s.user_id, s.id, s.type_key, s.variables
    ), occ AS (
        SELECT * FROM json_to_recordset(CAST(%(occurrences)s AS json))
            AS o(user_id text, series_id bigint, occurrence_key text, lane text, template_version int,
                 state text, due_at bigint, locale text, gate text, outcome text, reason text,
                 detail text)
    ), ins AS (
        INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,
                              locale, state, due_at, created_at, routed_at)
        SELECT o.user_id, adv.type_key, o.occurrence_key, o.lane, o.template_version, adv.variables,
               o.locale, o.state, {_AT.format("o.due_at")}, %(now)s,
               CASE WHEN o.state = 'routed' THEN %(now)s END
        FROM occ o JOIN adv ON adv.user_id = o.user_id AND adv.id = o.series_id
        ON CONFLICT (user_id, type_key, occurrence_key) DO NOTHING
        RETURNING user_id, occurrence_key, id
    )
    INSERT INTO decisions (user_id, request_id, gate, outcome, reason, detail, decided_at)
    SELECT ins.user_id, ins.id, o.gate, o.outcome, o.reason, o.detail, %(now)s
    FROM ins JOIN occ o ON o.user_id = ins.user_id AND o.occurrence_key = ins.occurrence_key
    WHERE o.gate IS NOT NULL
    RETURNING gate, outcome, reason
    """


def fire_occurrences(
    conn: Connection,
    advances: Sequence[Advance],
    occurrences: Sequence[NewOccurrence],
    *,
    now: datetime,
) -> psycopg.Cursor[Any] | None:
    """The tick's writes for its due series, in one statement: advance each series still active
    (one cancelled or paused meanwhile is left alone, and fires nothing), record its occurrences
    once each (variables copied from the series row; one created before, by a second beat or a
    snooze, is left as it is), and the decisions of those created now that are not sent as
    scheduled. The cursor's rows are those decisions' (gate, outcome, reason), to read once the
    pipeline has synced (None: nothing was due)."""
    if not advances:
        return None
    return _raw(conn).execute(_FIRE, fire_parameters(advances, occurrences, now=now))


def fire_parameters(
    advances: Sequence[Advance], occurrences: Sequence[NewOccurrence], *, now: datetime
) -> dict[str, Any]:
    """The parameters of `_FIRE` for these rows."""
    return {
        "ctids": [a.ctid for a in advances],
        "users": [a.user_id for a in advances],
        "ids": [a.series_id for a in advances],
        "ns": [a.next_n for a in advances],
        "dues": [micros(a.next_due_at) for a in advances],
        "ended": [a.ended for a in advances],
        "occurrences": json.dumps([_occurrence_row(o) for o in occurrences], ensure_ascii=False),
        "now": now,
    }


def _occurrence_row(o: NewOccurrence) -> dict[str, Any]:
    gate, outcome, reason, detail = o.decision or (None, None, None, None)
    return {
        "user_id": o.user_id,
        "series_id": o.series_id,
        "occurrence_key": o.occurrence_key,
        "lane": o.lane,
        "template_version": o.template_version,
        "state": o.state,
        "due_at": micros(o.due_at),
        "locale": o.locale,
        "gate": gate,
        "outcome": outcome,
        "reason": reason,
        "detail": detail,
    }


def _raw(conn: Connection) -> psycopg.Connection[Any]:
    raw = conn.connection.dbapi_connection
    assert isinstance(raw, psycopg.Connection)
    return raw


@contextmanager
def pipelined(conn: Connection) -> Iterator[None]:
    """fire_occurrences inside does not wait for the server: the tick plans the next batch of
    due series while PostgreSQL writes the last one (psycopg pipeline mode; an error surfaces by
    the end of the block at the latest, and the caller's transaction rolls back as usual)."""
    with _raw(conn).pipeline():
        yield


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


_DEFERRED = """
    SELECT r.user_id, r.type_key, r.occurrence_key FROM requests r
    JOIN unnest(CAST(%(users)s AS text[]), CAST(%(types)s AS text[]), CAST(%(occs)s AS text[]))
        AS x(u, t, o) ON r.user_id = x.u AND r.type_key = x.t AND r.occurrence_key = x.o
    WHERE r.state = 'deferred'
    """


def deferred_occurrences(
    conn: Connection, keys: Sequence[tuple[str, str, str]]
) -> set[tuple[str, str, str]]:
    """Which of these (user_id, type_key, occurrence_key) requests are held to be sent later: an
    occurrence moved to a working day, a snoozed one. Through psycopg itself, so that it also
    runs inside `pipelined` (psycopg syncs the pipeline to fetch it)."""
    if not keys:
        return set()
    params = {
        "users": [k[0] for k in keys],
        "types": [k[1] for k in keys],
        "occs": [k[2] for k in keys],
    }
    return {(u, t, o) for u, t, o in _raw(conn).execute(_DEFERRED, params).fetchall()}
