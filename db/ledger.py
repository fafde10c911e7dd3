"""Named statements for the send ledger. All SQL that touches requests, deliveries and incidents.

Every function takes an open SQLAlchemy Connection (the caller owns the transaction) and `now`.
Losing a race is a normal return value (None, False, or a shorter list), never an exception.
Keys are (user_id, id) pairs; batch statements take them as two parallel arrays.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time
from functools import cache
from typing import Any

import psycopg
from sqlalchemy import Connection, CursorResult, TextClause, text

from clarion.rows import CreatedDelivery, DueRequest, Key, Recipient, ResolvedRequest

KEY_PAIRS = "unnest(CAST(:users AS text[]), CAST(:ids AS bigint[])) AS k(user_id, id)"


def dicts(result: CursorResult[Any]) -> list[dict[str, Any]]:
    """A result's rows as dicts, fetched at once: half the client's time of `.mappings()`, which
    also fetches row by row."""
    keys = tuple(result.keys())
    return [dict(zip(keys, row, strict=True)) for row in result.all()]


def key_params(keys: Iterable[Key]) -> dict[str, list[str] | list[int]]:
    users: list[str] = []
    ids: list[int] = []
    for user_id, id_ in keys:
        users.append(user_id)
        ids.append(id_)
    return {"users": users, "ids": ids}


# --- recipients -------------------------------------------------------------------------------

# `inserted` comes from a look before the upsert, not `xmax = 0`: a partitioned table
# (db/partitioning.py) cannot return system columns. Two first registrations of one id at the same
# moment may both say inserted; the row is the same either way.
_UPSERT_RECIPIENT = text(
    """
    WITH prior AS (SELECT 1 FROM recipients WHERE user_id = :user_id)
    INSERT INTO recipients (user_id, timezone, locale, country, org_id, addresses, quiet_start,
                            quiet_end, workweek, subdivision, attributes, created_at, updated_at)
    VALUES (:user_id, :timezone, :locale, :country, :org_id, CAST(:addresses AS jsonb), :quiet_start,
            :quiet_end, CAST(:workweek AS smallint[]), :subdivision,
            coalesce(CAST(:attributes AS jsonb), '{}'::jsonb), :now, :now)
    ON CONFLICT (user_id) DO UPDATE SET
        timezone = excluded.timezone, locale = excluded.locale, country = excluded.country,
        org_id = excluded.org_id, quiet_start = excluded.quiet_start,
        -- the Teams conversation clarion learned (db/teams.py) outlives a re-registration that
        -- keeps the same Teams id and names no conversation of its own
        addresses = excluded.addresses || CASE
            WHEN excluded.addresses->'teams_conversation' IS NULL
                 AND excluded.addresses->>'teams' = recipients.addresses->>'teams'
                 AND recipients.addresses->'teams_conversation' IS NOT NULL
            THEN jsonb_build_object('teams_conversation', recipients.addresses->'teams_conversation')
            ELSE '{}'::jsonb END,
        quiet_end = excluded.quiet_end, workweek = excluded.workweek, subdivision = excluded.subdivision,
        -- none given: the stored ones stay (an event's inline recipient names none)
        attributes = coalesce(CAST(:attributes AS jsonb), recipients.attributes),
        updated_at = excluded.updated_at, erased_at = NULL
    RETURNING NOT EXISTS (SELECT 1 FROM prior) AS inserted
    """
)


def upsert_recipient(
    conn: Connection,
    *,
    user_id: str,
    timezone: str,
    locale: str,
    country: str | None,
    org_id: str | None,
    addresses: dict[str, str],
    quiet_start: time | None = None,
    quiet_end: time | None = None,
    workweek: list[int] | None = None,
    subdivision: str | None = None,
    attributes: Mapping[str, str | int | bool] | None = None,
    now: datetime,
) -> bool:
    """Create or replace a recipient (an erased one becomes a new registration); True if the
    row was inserted rather than updated. `attributes` None keeps the stored ones; their names
    join recipient_attribute_names (what a broadcast segment may filter on)."""
    if attributes:
        conn.execute(_ATTRIBUTE_NAMES, {"names": sorted(attributes), "now": now})
    inserted: bool = conn.execute(
        _UPSERT_RECIPIENT,
        {
            "user_id": user_id,
            "timezone": timezone,
            "locale": locale,
            "country": country,
            "org_id": org_id,
            "addresses": json.dumps(addresses),
            "quiet_start": quiet_start,
            "quiet_end": quiet_end,
            "workweek": workweek,
            "subdivision": subdivision,
            "attributes": None if attributes is None else json.dumps(attributes),
            "now": now,
        },
    ).scalar_one()
    return inserted


_ATTRIBUTE_NAMES = text(
    """
    INSERT INTO recipient_attribute_names (name, created_at)
    SELECT n, :now FROM unnest(CAST(:names AS text[])) n ON CONFLICT (name) DO NOTHING
    """
)
_KNOWN_ATTRIBUTES = text(
    "SELECT name FROM recipient_attribute_names WHERE name = ANY(CAST(:names AS text[]))"
)


def known_attributes(conn: Connection, names: Iterable[str]) -> set[str]:
    """Which of these custom attribute names some recipient was ever given."""
    return {r[0] for r in conn.execute(_KNOWN_ATTRIBUTES, {"names": list(names)})}


# Joined with the ids, not `user_id = ANY(:users)`: once psycopg prepares a statement, PostgreSQL
# may run its generic plan, which tests = ANY by walking the array for every row it reads (5 ms for
# 500 ids against 1,000 recipients; a join is 0.6 ms, and an index probe per id on a large table).
THESE_USERS = "JOIN unnest(CAST(:users AS text[])) AS these(user_id) USING (user_id)"

_RECIPIENTS = text(
    "SELECT user_id, timezone, locale, country, org_id, addresses, quiet_start, quiet_end, workweek, "
    f"subdivision FROM recipients {THESE_USERS}"
)


def recipients(conn: Connection, user_ids: Iterable[str]) -> dict[str, Recipient]:
    """Recipients by user id; unknown ids are simply absent."""
    rows = conn.execute(_RECIPIENTS, {"users": list(set(user_ids))}).all()
    return {row[0]: Recipient.from_row(row) for row in rows}


# One index probe per id (LATERAL ... OFFSET 0), not a join the planner may turn around: with a filter
# on recipients (erased_at IS NULL) the generic plan PostgreSQL switches to after five runs of a
# prepared statement estimated one live recipient and ten ids, and scanned the ids once per
# recipient: 114 ms per 500 ids against 1,000 recipients (pg_stat_statements, bench/throughput.py,
# the producer's notify_many), 0.5 ms as probes; the probes' cost follows the ids, not the table.
_LOCALES = text(
    "SELECT these.user_id, r.locale FROM unnest(CAST(:users AS text[])) AS these(user_id) "
    "CROSS JOIN LATERAL (SELECT locale FROM recipients WHERE user_id = these.user_id "
    "AND erased_at IS NULL OFFSET 0) r"
)


def recipient_locales(conn: Connection, user_ids: Iterable[str]) -> dict[str, str]:
    """Which of these user ids are registered, with their locales (unknown and erased ids are
    absent)."""
    rows = conn.execute(_LOCALES, {"users": list(set(user_ids))}).all()
    return {user_id: locale for user_id, locale in rows}


_RECIPIENT = text(
    "SELECT user_id, timezone, locale, country, org_id, addresses, quiet_start, quiet_end, workweek, "
    "subdivision, attributes, created_at, updated_at FROM recipients WHERE user_id = :u AND erased_at IS NULL"
)
_RECIPIENT_STATE = text("SELECT erased_at IS NULL FROM recipients WHERE user_id = :u FOR UPDATE")


def recipient(conn: Connection, user_id: str) -> dict[str, Any] | None:
    """One registered recipient's row; None if unknown or erased."""
    found = dicts(conn.execute(_RECIPIENT, {"u": user_id}))
    return found[0] if found else None


def is_live_recipient(conn: Connection, user_id: str) -> bool:
    """True if the recipient exists and is not erased; locks its row until the transaction ends."""
    return bool(conn.execute(_RECIPIENT_STATE, {"u": user_id}).scalar())


# --- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewRequest:
    user_id: str
    type_key: str
    occurrence_key: str
    lane: str
    template_version: int
    variables: dict[str, Any]


# The rows travel as one JSON array: psycopg dumps a Python list as an array parameter in Python,
# element by element (a quarter of a 500-event HTTP batch's CPU when measured); json.dumps is C.
_INSERT_REQUESTS = text(
    """
    INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version, variables,
                          locale, state, due_at, created_at)
    SELECT u, t, o, l, v, vars, loc, 'pending', :due_at, :now
    FROM jsonb_to_recordset(CAST(:rows AS jsonb))
         AS x(u text, t text, o text, l text, v int, vars jsonb, loc text)
    ON CONFLICT (user_id, type_key, occurrence_key) DO NOTHING
    RETURNING user_id, type_key, occurrence_key, id
    """
)

_EXISTING_REQUESTS = text(
    """
    SELECT r.user_id, r.type_key, r.occurrence_key, r.id FROM requests r
    JOIN unnest(CAST(:users AS text[]), CAST(:types AS text[]), CAST(:occs AS text[])) AS x(u, t, o)
      ON r.user_id = x.u AND r.type_key = x.t AND r.occurrence_key = x.o
    """
)


def insert_requests(
    conn: Connection,
    rows: Sequence[NewRequest],
    *,
    now: datetime,
    due_at: datetime,
    locales: Mapping[str, str] | None = None,
) -> list[tuple[int, bool]]:
    """Insert requests, one per occurrence; returns (request id, is_new) in input order.

    A repeated occurrence (in the table already, or twice in `rows`) maps to the existing id.
    `locales`: the recipients' locales, if the caller has read them (recipient_locales), pinned on
    the rows as they are written; else the requests_pin_locale trigger reads each one.
    """
    locales = locales or {}
    listed = [
        {
            "u": r.user_id,
            "t": r.type_key,
            "o": r.occurrence_key,
            "l": r.lane,
            "v": r.template_version,
            "vars": r.variables,
            "loc": locales.get(r.user_id),
        }
        for r in rows
    ]
    params = {"rows": json.dumps(listed), "now": now, "due_at": due_at}
    created = {(u, t, o): i for u, t, o, i in conn.execute(_INSERT_REQUESTS, params)}
    ids = _with_existing(conn, rows, created)
    result, seen = [], set()
    for r in rows:
        occurrence = (r.user_id, r.type_key, r.occurrence_key)
        result.append((ids[occurrence], occurrence in created and occurrence not in seen))
        seen.add(occurrence)
    return result


def _with_existing(
    conn: Connection, rows: Sequence[NewRequest], created: dict[tuple[str, str, str], int]
) -> dict[tuple[str, str, str], int]:
    """`created` (the ids an INSERT … ON CONFLICT DO NOTHING returned), plus the ids of the rows'
    occurrences that were already there, read only when some row was not created."""
    ids = dict(created)
    if len(created) < len(rows):
        ids.update({(u, t, o): i for u, t, o, i in conn.execute(_EXISTING_REQUESTS, _keys(rows))})
    return ids


def _keys(rows: Sequence[NewRequest]) -> dict[str, list[str]]:
    return {
        "users": [r.user_id for r in rows],
        "types": [r.type_key for r in rows],
        "occs": [r.occurrence_key for r in rows],
    }


# insert_grouped_requests(): the recipients' check, their locales and the INSERT in one round
# trip. A group naming a recipient that is unknown or erased inserts nothing (`bad`, with the
# first such user id of the group); the others' rows go in key order (code points, as Python
# sorts), so that two writers inserting the same keys wait instead of deadlocking.
_INSERT_GROUPED = text(
    """
    WITH x AS (
        SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb))
            AS x(n int, g int, u text, t text, o text, l text, v int, vars jsonb)
    ), known AS (  -- one index probe per id, as _LOCALES (a generic plan cannot turn it around)
        SELECT these.u AS user_id, rc.locale FROM (SELECT DISTINCT u FROM x) these
        CROSS JOIN LATERAL (SELECT locale FROM recipients WHERE user_id = these.u
                            AND erased_at IS NULL OFFSET 0) rc
    ), bad AS (
        SELECT DISTINCT ON (x.g) x.g, x.u FROM x LEFT JOIN known k ON k.user_id = x.u
        WHERE k.user_id IS NULL ORDER BY x.g, x.n
    ), ins AS (
        INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,
                              variables, locale, state, due_at, created_at)
        SELECT x.u, x.t, x.o, x.l, x.v, x.vars, k.locale, 'pending', :due_at, :now
        FROM x JOIN known k ON k.user_id = x.u
        WHERE x.g NOT IN (SELECT g FROM bad)
        ORDER BY x.u COLLATE "C", x.t COLLATE "C", x.o COLLATE "C", x.n
        ON CONFLICT (user_id, type_key, occurrence_key) DO NOTHING
        RETURNING user_id, type_key, occurrence_key, id
    )
    SELECT NULL::int AS g, user_id, type_key, occurrence_key, id FROM ins
    UNION ALL
    SELECT g, u, NULL, NULL, NULL FROM bad
    """
)
# One group's outcome: (request id, is_new) per row in its order, or the user id refusing it.
GroupMade = list[tuple[int, bool]] | str


async def insert_grouped_requests(
    conn: psycopg.AsyncConnection[Any],
    groups: Sequence[Sequence[NewRequest]],
    *,
    now: datetime,
    due_at: datetime,
) -> list[GroupMade]:
    """Many callers' requests in one statement with the check of their recipients, on an
    auto-committing psycopg AsyncConnection (the web's event loop writes with one,
    db/loop_commit.py; the INSERT is its own transaction): per group, (request id, is_new) per row
    in its order, or the user id that refuses the group (unknown or erased; the group writes
    nothing). A repeated occurrence, in the table or in an earlier row of the groups, maps to the
    existing id with is_new False, as if the groups came one by one."""
    listed = [
        {
            "n": n,
            "g": g,
            "u": r.user_id,
            "t": r.type_key,
            "o": r.occurrence_key,
            "l": r.lane,
            "v": r.template_version,
            "vars": r.variables,
        }
        for n, (g, r) in enumerate((g, r) for g, group in enumerate(groups) for r in group)
    ]
    params = {"rows": json.dumps(listed), "now": now, "due_at": due_at}
    created: dict[tuple[str, str, str], int] = {}
    bad: dict[int, str] = {}
    inserted = await (await conn.execute(_driver_sql(_INSERT_GROUPED), params)).fetchall()
    for g, u, t, o, i in inserted:
        if g is None:
            created[(u, t, o)] = i
        else:
            bad[g] = u
    kept = [r for g, group in enumerate(groups) if g not in bad for r in group]
    ids = dict(created)
    if len(created) < len(kept):
        existing = await conn.execute(_driver_sql(_EXISTING_REQUESTS), _keys(kept))
        ids.update({(u, t, o): i for u, t, o, i in await existing.fetchall()})
    out: list[GroupMade] = []
    seen: set[tuple[str, str, str]] = set()
    for g, group in enumerate(groups):
        if g in bad:
            out.append(bad[g])
            continue
        made = []
        for r in group:
            occurrence = (r.user_id, r.type_key, r.occurrence_key)
            made.append((ids[occurrence], occurrence in created and occurrence not in seen))
            seen.add(occurrence)
        out.append(made)
    return out


@cache
def _driver_sql(statement: TextClause) -> str:
    """A text() statement as psycopg takes it (`%(name)s` parameters)."""
    from sqlalchemy.dialects.postgresql.psycopg import dialect

    return str(statement.compile(dialect=dialect()))  # type: ignore[no-untyped-call]


_FIND_REQUEST = text(
    "SELECT id FROM requests WHERE user_id = :user_id AND type_key = :type_key AND occurrence_key = :occ"
)


def find_request(conn: Connection, user_id: str, type_key: str, occurrence_key: str) -> int | None:
    """The id of the request for this occurrence, if there is one (for previews and explain)."""
    return conn.execute(
        _FIND_REQUEST, {"user_id": user_id, "type_key": type_key, "occ": occurrence_key}
    ).scalar()


_RESOLVE_REQUESTS = text(
    f"""
    UPDATE requests r SET state = 'routed', routed_at = :now, due_at = NULL
    FROM {KEY_PAIRS}
    WHERE r.user_id = k.user_id AND r.id = k.id AND r.state = 'pending'
    RETURNING r.user_id, r.id, r.type_key, r.occurrence_key, r.lane, r.template_version, r.variables,
              r.locale, r.created_at
    """
)


def resolve_requests(
    conn: Connection, keys: Iterable[Key], *, now: datetime
) -> list[ResolvedRequest]:
    """Resolve-once: move pending requests to routed. Only the caller that moves a row may route it."""
    result = conn.execute(_RESOLVE_REQUESTS, {**key_params(keys), "now": now})
    return [ResolvedRequest.from_row(row) for row in result.all()]


_UNRESOLVE_REQUESTS = text(
    f"""
    UPDATE requests r SET state = 'pending', routed_at = NULL, due_at = :due_at
    FROM {KEY_PAIRS}
    WHERE r.user_id = k.user_id AND r.id = k.id AND r.state = 'routed'
    """
)


def unresolve_requests(conn: Connection, keys: Iterable[Key], *, due_at: datetime) -> None:
    """Put requests resolved in this transaction back, to be routed at `due_at` (by a worker whose
    catalog has their type: a rolling deploy)."""
    conn.execute(_UNRESOLVE_REQUESTS, {**key_params(keys), "due_at": due_at})


def due_statement(table: str, also_set: str = "") -> TextClause:
    """The tick's take of one lane's due rows of `table` (requests or deliveries): each is pushed
    :again seconds on, doubling with every round it makes without progress (up to :cap); rows
    another tick holds are skipped. The rows are found again by (tableoid, ctid), which the lock
    pins: a TID lookup per row in the right partition, where a join on (user_id, id) over a
    hash-partitioned table is costed as a probe of every partition and may become a hash join
    over all of them."""
    return text(
        f"""
        UPDATE {table} t
        SET {also_set}
            due_at = CAST(:now AS timestamptz)
                     + make_interval(secs => least(:cap, :again * power(2, least(t.rounds, 16)))),
            rounds = least(t.rounds + 1, 1000)
        FROM (SELECT tableoid, ctid FROM {table} WHERE lane = :lane AND due_at <= :now
              ORDER BY due_at LIMIT :limit FOR UPDATE SKIP LOCKED) k
        WHERE t.tableoid = k.tableoid AND t.ctid = k.ctid
        RETURNING t.user_id, t.id, t.lane
        """
    )


_DUE_REQUESTS = due_statement("requests", "state = 'pending',")


def take_due_requests(
    conn: Connection, *, lane: str, now: datetime, again: float, cap: float, limit: int
) -> list[DueRequest]:
    """One lane's requests whose routing is due (never published, stray, or deferred until now).

    Each is pushed `again` seconds on (doubling each time it comes round unrouted, up to `cap`), so
    a crashed publisher's work comes round once more, two sweepers do not both take it, and a
    backlog is not republished in full every few seconds."""
    params = {"now": now, "again": again, "cap": cap, "lane": lane, "limit": limit}
    return [DueRequest.from_row(r) for r in conn.execute(_DUE_REQUESTS, params).all()]


# --- deliveries -------------------------------------------------------------------------------

# A row is inserted claimed, under :token, when the caller sends it itself (the route task) and it
# is not held back: one write instead of a pending row and a claim's update of it. Its lease runs
# from here, on PostgreSQL's clock, as a claim's does.
_INSERT_DELIVERIES = text(
    """
    INSERT INTO deliveries (user_id, request_id, type_key, occurrence_key, channel, one_platform,
                            lane, state, not_before, due_at, created_at, updated_at, claim_token,
                            lease_until, attempts)
    SELECT u, r, t, o, c, p, l, CASE WHEN mine THEN 'claimed' ELSE 'pending' END,
           coalesce(nb, :now), CASE WHEN mine THEN lease_end ELSE greatest(nb, :due_at) END,
           :now, :now, CASE WHEN mine THEN CAST(:token AS uuid) END,
           CASE WHEN mine THEN lease_end END, CAST(mine AS int)
    FROM (
        SELECT *, CAST(:token AS uuid) IS NOT NULL AND (nb IS NULL OR nb <= :now) AS mine,
               clock_timestamp() + make_interval(secs => :lease) AS lease_end
        FROM unnest(CAST(:users AS text[]), CAST(:requests AS bigint[]), CAST(:types AS text[]),
                    CAST(:occs AS text[]), CAST(:channels AS text[]), CAST(:platforms AS boolean[]),
                    CAST(:lanes AS text[]), CAST(:not_before AS timestamptz[]))
             AS x(u, r, t, o, c, p, l, nb)
    ) x
    ON CONFLICT (user_id, request_id, channel) DO NOTHING
    RETURNING user_id, id, request_id, channel, lane, not_before > :now AS held,
              extract(epoch FROM lease_until - clock_timestamp())::float8 AS lease_left
    """
)


@dataclass(frozen=True)
class NewDelivery:
    user_id: str
    request_id: int
    type_key: str
    occurrence_key: str
    channel: str
    one_platform: bool
    lane: str
    not_before: datetime | None = None  # held back (e.g. marketing SMS hours) until then


def insert_deliveries(
    conn: Connection,
    rows: Sequence[NewDelivery],
    *,
    now: datetime,
    due_at: datetime,
    claim: tuple[str, float] | None = None,
) -> list[CreatedDelivery]:
    """Create deliveries; returns those created (one already there for its request and channel
    is left as it is).

    Pending, or, with `claim` = (token, lease seconds), claimed by the caller under that token
    when not held: the caller sends those itself. A pending row not held is published by the
    caller, or again by the tick once `due_at` passes; a held one by the tick when its time comes."""
    if not rows:
        return []
    token, lease = claim or (None, 0.0)
    result = conn.execute(
        _INSERT_DELIVERIES,
        {
            "users": [r.user_id for r in rows],
            "requests": [r.request_id for r in rows],
            "types": [r.type_key for r in rows],
            "occs": [r.occurrence_key for r in rows],
            "channels": [r.channel for r in rows],
            "platforms": [r.one_platform for r in rows],
            "lanes": [r.lane for r in rows],
            "not_before": [r.not_before for r in rows],
            "now": now,
            "due_at": due_at,
            "token": token,
            "lease": lease,
        },
    )
    return [CreatedDelivery.from_row(row) for row in result.all()]


# --- decisions and incidents ------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    user_id: str
    request_id: int
    gate: str
    outcome: str
    reason: str
    detail: str = ""
    channel: str | None = None
    delivery_id: int | None = None


_INSERT_DECISIONS = text(
    """
    INSERT INTO decisions (user_id, request_id, delivery_id, channel, gate, outcome, reason, detail,
                           decided_at)
    SELECT * , CAST(:now AS timestamptz) FROM unnest(
        CAST(:users AS text[]), CAST(:requests AS bigint[]), CAST(:deliveries AS bigint[]),
        CAST(:channels AS text[]), CAST(:gates AS text[]), CAST(:outcomes AS text[]),
        CAST(:reasons AS text[]), CAST(:details AS text[]))
    """
)


def insert_decisions(conn: Connection, rows: Sequence[Decision], *, now: datetime) -> None:
    """Record why requests (or one channel of them) were not delivered."""
    if not rows:
        return
    conn.execute(
        _INSERT_DECISIONS,
        {
            "users": [d.user_id for d in rows],
            "requests": [d.request_id for d in rows],
            "deliveries": [d.delivery_id for d in rows],
            "channels": [d.channel for d in rows],
            "gates": [d.gate for d in rows],
            "outcomes": [d.outcome for d in rows],
            "reasons": [d.reason for d in rows],
            "details": [d.detail for d in rows],
            "now": now,
        },
    )


_INSERT_INCIDENT = text(
    "INSERT INTO incidents (user_id, delivery_id, kind, detail, created_at) "
    "VALUES (:user_id, :delivery_id, :kind, :detail, :now)"
)


def record_incident(conn: Connection, key: Key, *, kind: str, detail: str, now: datetime) -> None:
    """Record something an operator must look at (e.g. a possible duplicate send)."""
    conn.execute(
        _INSERT_INCIDENT,
        {"user_id": key[0], "delivery_id": key[1], "kind": kind, "detail": detail, "now": now},
    )
