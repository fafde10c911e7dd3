"""Named statements for broadcasts: one occurrence (`broadcast:<id>`) per recipient of an audience.

The fan-out walks the audience in user_id order (keyset pagination) in chunks. One chunk is one
transaction: lock the broadcast's row, insert the chunk's requests with one INSERT ... SELECT, move
the wave's cursor past the chunk and add to the counters. A fan-out that dies before the commit
leaves nothing; after it, the cursor says where to go on. The requests' unique occurrence key makes
a recipient requested twice (a second fan-out, a recipient who changed zone between waves)
impossible rather than unlikely.

An audience is a topic, a segment (a filter over recipient columns, from a fixed list), or both.
Membership is read when a chunk is written: see docs/guides/broadcasts.md for the rule.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any

from sqlalchemy import Connection, TextClause, text

from clarion.db.schema import SENT_STATES

# segment field -> recipients column (the only names ever put into SQL from a segment)
SEGMENT_FIELDS = {
    "country": "country",
    "locale": "locale",
    "org": "org_id",
    "timezone": "timezone",
    "subdivision": "subdivision",
}
# a segment field `attributes.<name>`: a recipient's custom attribute (recipients.attributes),
# compared as text (`->>`: 'true', '12'); the name travels as a parameter, never as SQL
ATTRIBUTE_PREFIX = "attributes."


@dataclass(frozen=True)
class Audience:
    """Who a broadcast is for: members of `topic` (if any) matching every `segment` filter (a field
    of SEGMENT_FIELDS or `attributes.<name>`, and the values it may take). Neither: every
    registered recipient."""

    topic: str | None = None
    segment: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "segment": {f: list(v) for f, v in self.segment}}

    def sql(self) -> tuple[str, str, dict[str, Any]]:
        """(FROM clause, WHERE clause, parameters) over recipients `r`, without the cursor."""
        source = "recipients r"
        params: dict[str, Any] = {}
        where = ["r.erased_at IS NULL"]
        if self.topic is not None:
            source = (
                "topic_members m JOIN recipients r ON r.user_id = m.user_id "
                "AND m.topic_key = :topic"
            )
            params["topic"] = self.topic
        for n, (field, values) in enumerate(self.segment):
            if field.startswith(ATTRIBUTE_PREFIX):
                where.append(f"r.attributes ->> :name{n} = ANY(CAST(:seg{n} AS text[]))")
                params[f"name{n}"] = field.removeprefix(ATTRIBUTE_PREFIX)
            else:
                where.append(f"r.{SEGMENT_FIELDS[field]} = ANY(CAST(:seg{n} AS text[]))")
            params[f"seg{n}"] = list(values)
        return source, " AND ".join(where), params

    def key_column(self) -> str:
        """The column the walk orders by: the topic's index when there is a topic."""
        return "m.user_id" if self.topic is not None else "r.user_id"


def audience_from_json(value: Mapping[str, Any]) -> Audience:
    segment = tuple((f, tuple(v)) for f, v in (value.get("segment") or {}).items())
    return Audience(value.get("topic"), segment)


@dataclass(frozen=True)
class Broadcast:
    id: int
    type_key: str
    lane: str
    template_version: int
    variables: dict[str, Any]
    audience: Audience
    at_local: time | None
    passed: str | None
    state: str
    planned: int
    skipped: int
    requested: int
    due_at: datetime | None
    created_at: datetime
    finished_at: datetime | None
    started_at: datetime | None  # its first chunk's commit

    @property
    def occurrence_key(self) -> str:
        return occurrence_key(self.id)


def occurrence_key(broadcast_id: int) -> str:
    return f"broadcast:{broadcast_id}"


_COLUMNS = (
    "id, type_key, lane, template_version, variables, audience, at_local, passed, state, planned, "
    "skipped, requested, due_at, created_at, finished_at, started_at"
)


def _broadcast(row: Any) -> Broadcast:
    values = list(row)
    values[5] = audience_from_json(values[5])
    return Broadcast(*values)


@dataclass(frozen=True)
class NewWave:
    due_at: datetime
    zones: tuple[str, ...] | None  # None: every zone


@dataclass(frozen=True)
class Wave:
    wave: int
    due_at: datetime
    zones: list[str] | None
    cursor: str | None


@dataclass(frozen=True)
class Chunk:
    """What one fan-out step did: `seen` audience members read, `keys` of the requests it created
    (fewer when some already had theirs), the wave it worked on (None: nothing was due)."""

    wave: int | None
    seen: int
    keys: list[tuple[str, int]]
    lane: str
    finished: bool  # the broadcast has nothing left to request


# --- audience ------------------------------------------------------------------------------------


def zone_counts(conn: Connection, audience: Audience) -> dict[str, int]:
    """The audience's members now, counted by time zone (planning a local-time broadcast)."""
    source, where, params = audience.sql()
    rows = conn.execute(
        text(f"SELECT r.timezone, count(*) FROM {source} WHERE {where} GROUP BY r.timezone"),
        params,
    ).all()
    return {zone: int(n) for zone, n in rows}


def member_count(conn: Connection, audience: Audience) -> int:
    """The audience's members now (planning a broadcast at one instant: no zones to count by)."""
    source, where, params = audience.sql()
    return int(
        conn.execute(text(f"SELECT count(*) FROM {source} WHERE {where}"), params).scalar_one()
    )


def members(
    conn: Connection,
    audience: Audience,
    *,
    after: str | None,
    limit: int,
    zones: Sequence[str] | None = None,
) -> list[str]:
    """Up to `limit` members' user ids after `after`, in user_id order (a dry run's walk)."""
    statement, params = _walk(audience, zones)
    found = conn.execute(
        text(f"SELECT user_id FROM ({statement}) walk"),
        {**params, "cursor": after or "", "limit": limit},
    )
    return [row[0] for row in found]


def _walk(
    audience: Audience, zones: Sequence[str] | None, *, numbered: bool = False
) -> tuple[str, dict[str, Any]]:
    """The audience's members after :cursor in user_id order, :limit of them; `numbered` adds
    their place `n` (1, 2, …) in that order."""
    source, where, params = audience.sql()
    key = audience.key_column()
    if zones is not None:
        where += " AND r.timezone = ANY(CAST(:zones AS text[]))"
        params["zones"] = list(zones)
    # the cursor on both sides of a topic's join: a merge join then starts each index there,
    # instead of reading the recipients before it (half the table, half-way through)
    place = f", row_number() OVER (ORDER BY {key}) AS n" if numbered else ""
    statement = (
        f"SELECT {key} AS user_id, r.locale{place} FROM {source} WHERE {where} "
        f"AND r.user_id > :cursor "
        + (f"AND {key} > :cursor " if key != "r.user_id" else "")
        + f"ORDER BY {key} LIMIT :limit"
    )
    return statement, params


# --- broadcasts ----------------------------------------------------------------------------------

_INSERT = text(
    f"""
    INSERT INTO broadcasts (idempotency_key, type_key, lane, template_version, variables, audience,
                            at_local, passed, planned, skipped, due_at, created_at)
    VALUES (:idem, :type_key, :lane, :version, CAST(:variables AS jsonb), CAST(:audience AS jsonb),
            :at_local, :passed, :planned, :skipped, :due_at, :now)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING {_COLUMNS}
    """
)
_BY_KEY = text(f"SELECT {_COLUMNS} FROM broadcasts WHERE idempotency_key = :idem")
_INSERT_WAVES = text(
    """
    INSERT INTO broadcast_waves (broadcast_id, wave, due_at, zones, planned)
    SELECT :id, n, d, CASE WHEN z = '' THEN NULL ELSE string_to_array(z, ' ') END, p
    FROM unnest(CAST(:due AS timestamptz[]), CAST(:zones AS text[]), CAST(:planned AS bigint[]))
         WITH ORDINALITY AS x(d, z, p, n)
    """
)


def create(
    conn: Connection,
    *,
    idempotency_key: str | None,
    type_key: str,
    lane: str,
    template_version: int,
    variables: Mapping[str, Any],
    audience: Audience,
    at_local: time | None,
    passed: str | None,
    waves: Sequence[tuple[NewWave, int]],
    skipped: int,
    now: datetime,
) -> tuple[Broadcast, bool]:
    """Record a broadcast and its waves (each with its planned count); (broadcast, created).
    A repeated idempotency key returns the broadcast it created first, and writes nothing."""
    params = {
        "idem": idempotency_key,
        "type_key": type_key,
        "lane": lane,
        "version": template_version,
        "variables": json.dumps(variables),
        "audience": json.dumps(audience.as_json()),
        "at_local": at_local,
        "passed": passed,
        "planned": sum(n for _, n in waves),
        "skipped": skipped,
        "due_at": min((w.due_at for w, _ in waves), default=None),
        "now": now,
    }
    row = conn.execute(_INSERT, params).one_or_none()
    if row is None:
        return _broadcast(conn.execute(_BY_KEY, {"idem": idempotency_key}).one()), False
    made = _broadcast(row)
    conn.execute(
        _INSERT_WAVES,
        {
            "id": made.id,
            "due": [w.due_at for w, _ in waves],
            "zones": [" ".join(w.zones) if w.zones is not None else "" for w, _ in waves],
            "planned": [n for _, n in waves],
        },
    )
    return made, True


_GET = text(f"SELECT {_COLUMNS} FROM broadcasts WHERE id = :id")
_LIST = text(f"SELECT {_COLUMNS} FROM broadcasts ORDER BY id DESC LIMIT :limit")


def get(conn: Connection, broadcast_id: int) -> Broadcast | None:
    row = conn.execute(_GET, {"id": broadcast_id}).one_or_none()
    return None if row is None else _broadcast(row)


def recent(conn: Connection, limit: int = 20) -> list[Broadcast]:
    return [_broadcast(r) for r in conn.execute(_LIST, {"limit": limit})]


_CANCEL = text(
    f"""
    UPDATE broadcasts SET state = 'cancelled', due_at = NULL, finished_at = :now
    WHERE id = :id AND state = 'running' RETURNING {_COLUMNS}
    """
)


def cancel(conn: Connection, broadcast_id: int, *, now: datetime) -> Broadcast | None:
    """Stop a running broadcast's fan-out. Waits for a chunk being written to commit (its row
    lock), so the `requested` it returns is final. None: not running (see get())."""
    row = conn.execute(_CANCEL, {"id": broadcast_id, "now": now}).one_or_none()
    return None if row is None else _broadcast(row)


# The tick's take of broadcasts whose fan-out is due: each is pushed :lease seconds on, so two
# ticks do not both publish it while its fan-out runs; a fan-out that dies is published again then.
_TAKE_DUE = text(
    """
    UPDATE broadcasts b SET due_at = CAST(:now AS timestamptz) + make_interval(secs => :lease)
    FROM (SELECT id FROM broadcasts WHERE due_at <= :now ORDER BY due_at LIMIT :limit
          FOR UPDATE SKIP LOCKED) k
    WHERE b.id = k.id
    RETURNING b.id, b.lane
    """
)


def take_due(
    conn: Connection, *, now: datetime, lease: float, limit: int = 100
) -> list[tuple[int, str]]:
    """(id, lane) of broadcasts whose fan-out has work now, each held for `lease` seconds."""
    params = {"now": now, "lease": lease, "limit": limit}
    return [(int(i), lane) for i, lane in conn.execute(_TAKE_DUE, params)]


# --- fan-out -------------------------------------------------------------------------------------

_LOCK = text(f"SELECT {_COLUMNS} FROM broadcasts WHERE id = :id AND state = 'running' FOR UPDATE")
_NEXT_WAVE = text(
    """
    SELECT wave, due_at, zones, cursor FROM broadcast_waves
    WHERE broadcast_id = :id AND NOT done AND due_at <= :now ORDER BY due_at, wave LIMIT 1
    """
)
_ADVANCE = text(
    """
    UPDATE broadcast_waves SET cursor = coalesce(:last, cursor), requested = requested + :n,
                               done = :done
    WHERE broadcast_id = :id AND wave = :wave
    """
)
_AFTER = text(
    """
    UPDATE broadcasts b SET requested = requested + :n,
        due_at = CASE WHEN w.next IS NULL THEN NULL
                      WHEN w.next <= :now THEN CAST(:now AS timestamptz)
                                                 + make_interval(secs => :lease)
                      ELSE w.next END,
        state = CASE WHEN w.next IS NULL THEN 'done' ELSE state END,
        finished_at = CASE WHEN w.next IS NULL THEN :now END,
        started_at = CASE WHEN :worked THEN coalesce(started_at, :now) ELSE started_at END
    FROM (SELECT min(due_at) AS next FROM broadcast_waves WHERE broadcast_id = :id AND NOT done) w
    WHERE b.id = :id
    RETURNING b.state
    """
)


def _chunk_statement(
    audience: Audience, zones: list[str] | None
) -> tuple[TextClause, dict[str, Any]]:
    """The chunk's one statement: walk the audience one member past :take (whether the wave has
    more), insert the first :take it found, say what was done."""
    walk, params = _walk(audience, zones, numbered=True)
    statement = text(
        f"""
            WITH walked AS ({walk}),
            chunk AS (SELECT user_id, locale FROM walked WHERE n <= :take),
            made AS (
                INSERT INTO requests (user_id, type_key, occurrence_key, lane, template_version,
                                      variables, locale, state, due_at, created_at)
                SELECT user_id, :type_key, :occ, :lane, :version, CAST(:variables AS jsonb),
                       locale, 'pending', :due_at, :now
                FROM chunk
                ON CONFLICT (user_id, type_key, occurrence_key) DO NOTHING
                RETURNING user_id, id
            )
            SELECT (SELECT count(*) FROM walked), (SELECT max(user_id) FROM chunk),
                   coalesce((SELECT array_agg(user_id) FROM made), '{{}}'),
               coalesce((SELECT array_agg(id) FROM made), '{{}}')
        """
    )
    return statement, params


def fan_out_chunk(
    conn: Connection,
    broadcast_id: int,
    *,
    limit: int,
    now: datetime,
    due_at: datetime,
    lease: float,
) -> Chunk | None:
    """Request the next chunk of a running broadcast's due wave, in the caller's transaction.

    None: the broadcast is not running (cancelled or done). A wave is done with the chunk after
    which its walk found no member (the walk reads one past the chunk, so a wave of exactly a
    chunk ends with it, not with an empty chunk after); the broadcast is done when every wave is.
    `due_at` is the new requests' (the tick publishes them then if the caller's publish is lost);
    `lease`: while waves are due, the broadcast's own due_at is pushed this far on, so the tick
    publishes a fan-out again only if this one stops."""
    locked = conn.execute(_LOCK, {"id": broadcast_id}).one_or_none()
    if locked is None:
        return None
    b = _broadcast(locked)
    row = conn.execute(_NEXT_WAVE, {"id": b.id, "now": now}).one_or_none()
    seen, last, users, ids, wave = 0, None, [], [], None
    if row is not None:
        wave = Wave(*row)
        statement, params = _chunk_statement(b.audience, wave.zones)
        seen, last, users, ids = conn.execute(
            statement,
            {
                **params,
                "cursor": wave.cursor or "",
                "limit": limit + 1,  # one more than it takes: a wave that has no more is done now
                "take": limit,
                "type_key": b.type_key,
                "occ": b.occurrence_key,
                "lane": b.lane,
                "version": b.template_version,
                "variables": json.dumps(b.variables),
                "due_at": due_at,
                "now": now,
            },
        ).one()
        conn.execute(
            _ADVANCE,
            {"id": b.id, "wave": wave.wave, "last": last, "n": len(ids), "done": seen <= limit},
        )
    # the trigger of migration 0026 writes the broadcast.* outbound events of this change
    after = {"id": b.id, "n": len(ids), "now": now, "lease": lease, "worked": wave is not None}
    state = conn.execute(_AFTER, after).scalar_one()
    return Chunk(
        wave.wave if wave else None,
        min(int(seen), limit),
        list(zip(users, ids, strict=True)),
        b.lane,
        state == "done",
    )


# --- progress ------------------------------------------------------------------------------------

_SENT_IN = ", ".join(repr(s) for s in SENT_STATES)
_PROGRESS = text(
    f"""
    SELECT count(*) FILTER (WHERE EXISTS (
               SELECT 1 FROM deliveries d WHERE d.user_id = r.user_id AND d.request_id = r.id
                 AND d.state IN ({_SENT_IN}))) AS sent,
           count(*) FILTER (WHERE r.state <> 'routed') AS waiting
    FROM requests r WHERE r.occurrence_key = :occ AND r.type_key = :type_key
    """
)
# Each request not sent counts once, under the first reason recorded for it ("no_channel" only
# when nothing else was: it follows a reason given per channel).
_REASONS = text(
    f"""
    SELECT reason, count(*) FROM (
        SELECT DISTINCT ON (r.user_id, r.id) x.reason FROM requests r
        JOIN decisions x ON x.user_id = r.user_id AND x.request_id = r.id
        WHERE r.occurrence_key = :occ AND r.type_key = :type_key AND x.outcome <> 'allow'
          AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.user_id = r.user_id
                          AND d.request_id = r.id AND d.state IN ({_SENT_IN}))
        ORDER BY r.user_id, r.id, x.reason = 'no_channel', x.id
    ) first GROUP BY reason ORDER BY reason
    """
)


@dataclass(frozen=True)
class Outcomes:
    sent: int  # requests with a delivery the provider took
    waiting: int  # requests not routed yet (pending, or deferred by a gate)
    suppressed: dict[str, int]  # requests not sent, by each reason recorded for them


def outcomes(conn: Connection, b: Broadcast) -> Outcomes:
    """What became of a broadcast's requests so far (through the requests_occurrence index)."""
    params = {"occ": b.occurrence_key, "type_key": b.type_key}
    sent, waiting = conn.execute(_PROGRESS, params).one()
    reasons = {reason: int(n) for reason, n in conn.execute(_REASONS, params)}
    return Outcomes(int(sent), int(waiting), reasons)


# A broadcast stays in /metrics while its fan-out runs and for SHOWN_AFTER_FINISH after it
# ends: its requests are still being routed and sent then, and the gauges should show them land.
SHOWN_AFTER_FINISH = timedelta(hours=1)
_SHOWN = text(
    f"""
    SELECT {_COLUMNS} FROM broadcasts
    WHERE state = 'running' OR finished_at >= :since ORDER BY id
    """
)


@dataclass(frozen=True)
class Shown:
    """One broadcast's progress as /metrics shows it."""

    id: int
    type_key: str
    state: str
    planned: int
    requested: int
    sent: int
    waiting: int
    suppressed: dict[str, int]


def shown_in_metrics(conn: Connection, *, now: datetime) -> list[Shown]:
    """Progress of every running broadcast and of those finished in the last
    SHOWN_AFTER_FINISH, for /metrics (read at scrape time, like the ledger's other gauges)."""
    found = [_broadcast(r) for r in conn.execute(_SHOWN, {"since": now - SHOWN_AFTER_FINISH})]
    shown = []
    for b in found:
        o = outcomes(conn, b)
        shown.append(
            Shown(
                b.id, b.type_key, b.state, b.planned, b.requested, o.sent, o.waiting, o.suppressed
            )
        )
    return shown
