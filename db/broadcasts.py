"""Named statements for broadcasts: one occurrence (`broadcast:<id>`) per recipient of an audience.

The fan-out walks the audience in user_id order (keyset pagination), a step at a time: the plan
finds where the step's chunks start, each chunk is written by one INSERT ... SELECT in a transaction
of its own (on its own connection, the chunks of a step at once), and then the wave's cursor moves
past what they covered. A fan-out that dies before a chunk's commit leaves nothing of it; one that
dies before the cursor moved walks those chunks again. The requests' unique occurrence key makes a
recipient requested twice (a chunk walked again, a second fan-out, a recipient who changed zone
between waves) impossible rather than unlikely.

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
    audience: Audience,
    zones: Sequence[str] | None,
    *,
    numbered: bool = False,
    bounded: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The audience's members after :cursor (up to :hi when `bounded`) in user_id order, :limit
    of them; `numbered` adds their place `n` (1, 2, …) in that order."""
    source, where, params = audience.sql()
    key = audience.key_column()
    if zones is not None:
        where += " AND r.timezone = ANY(CAST(:zones AS text[]))"
        params["zones"] = list(zones)
    # the cursor on both sides of a topic's join: a merge join then starts each index there,
    # instead of reading the recipients before it (half the table, half-way through)
    place = f", row_number() OVER (ORDER BY {key}) AS n" if numbered else ""
    keys = [key, "r.user_id"] if key != "r.user_id" else [key]
    statement = (
        f"SELECT {key} AS user_id, r.locale{place} FROM {source} WHERE {where} "
        + "".join(f"AND {k} > :cursor " for k in keys)
        + ("".join(f"AND {k} <= :hi " for k in keys) if bounded else "")
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
#
# A step of the fan-out: plan (where its fills start), fill (each on its own connection, at once),
# advance (the wave's cursor past what the fills covered, together). A fill writes its requests and
# adds them to the counters in its own commit; the cursor moves only once every fill before it
# committed, so a fan-out killed between a fill and the advance walks that stretch again, where the
# requests' once-only key finds every recipient already requested (nobody twice, nobody skipped).

_RUNNING = text(f"SELECT {_COLUMNS} FROM broadcasts WHERE id = :id AND state = 'running'")
_NEXT_WAVE = text(
    """
    SELECT wave, due_at, zones, cursor FROM broadcast_waves
    WHERE broadcast_id = :id AND NOT done AND due_at <= :now ORDER BY due_at, wave LIMIT 1
    """
)
_COUNT_WAVE = text(
    "UPDATE broadcast_waves SET requested = requested + :n WHERE broadcast_id = :id AND wave = :wave"
)
# the fill's last statement: the row lock a cancel also takes (so cancel waits for a fill in
# flight and counts it, and a fill after a cancel finds it stopped and writes nothing)
_COUNT = text(
    """
    UPDATE broadcasts SET requested = requested + :n, started_at = coalesce(started_at, :now)
    WHERE id = :id AND state = 'running'
    RETURNING id
    """
)
_ADVANCE = text(
    """
    UPDATE broadcast_waves SET cursor = coalesce(:reach, cursor), done = :done
    WHERE broadcast_id = :id AND wave = :wave AND cursor IS NOT DISTINCT FROM :was
    """
)
_AFTER = text(
    """
    UPDATE broadcasts b SET
        due_at = CASE WHEN w.next IS NULL THEN NULL
                      WHEN w.next <= :now THEN CAST(:now AS timestamptz)
                                                 + make_interval(secs => :lease)
                      ELSE w.next END,
        state = CASE WHEN w.next IS NULL THEN 'done' ELSE state END,
        finished_at = CASE WHEN w.next IS NULL THEN :now END
    FROM (SELECT min(due_at) AS next FROM broadcast_waves WHERE broadcast_id = :id AND NOT done) w
    WHERE b.id = :id AND b.state = 'running'
    RETURNING b.state
    """
)


@dataclass(frozen=True)
class Step:
    """One step of a running broadcast's fan-out: its due wave (None: none is due now) and where
    each fill starts (the wave's cursor, then a member every `chunk` after it, found by the plan);
    fill i takes the members after starts[i] up to starts[i + 1], the last fill up to `chunk`."""

    broadcast: Broadcast
    wave: Wave | None
    starts: list[str]


@dataclass(frozen=True)
class Filled:
    """What one fill wrote: `keys` of the requests it created (fewer than it walked when some had
    theirs already) and how far it covered its stretch: `last` is the member after which its
    stretch is not covered yet, None when it covered all of it (a bounded fill to its end, the
    last fill to the end of the audience)."""

    keys: list[tuple[str, int]]
    last: str | None


def plan_step(
    conn: Connection, broadcast_id: int, *, now: datetime, chunk: int, fills: int
) -> Step | None:
    """Where the next step's `fills` fills start (fewer near the end of a wave). None: the
    broadcast is not running (cancelled, done or unknown)."""
    row = conn.execute(_RUNNING, {"id": broadcast_id}).one_or_none()
    if row is None:
        return None
    b = _broadcast(row)
    found = conn.execute(_NEXT_WAVE, {"id": b.id, "now": now}).one_or_none()
    if found is None:
        return Step(b, None, [])
    wave = Wave(*found)
    starts = [wave.cursor or ""]
    if fills > 1:
        walk, params = _walk(b.audience, wave.zones, numbered=True)
        starts += conn.execute(
            text(f"SELECT user_id FROM ({walk}) walk WHERE n % :every = 0 ORDER BY n"),
            {**params, "cursor": starts[0], "limit": chunk * (fills - 1), "every": chunk},
        ).scalars()
    return Step(b, wave, starts)


def _fill_statement(
    audience: Audience, zones: list[str] | None, *, bounded: bool
) -> tuple[TextClause, dict[str, Any]]:
    """A fill's one statement: walk the audience after :cursor (up to :hi when `bounded`), one
    member past :take, insert the first :take it found, say what was done."""
    walk, params = _walk(audience, zones, numbered=True, bounded=bounded)
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


def fill(
    conn: Connection, step: Step, at: int, *, chunk: int, now: datetime, due_at: datetime
) -> Filled | None:
    """Fill `at` of a step, in the caller's transaction: request the members of its stretch and
    add them to the counters. None: the broadcast stopped running (the caller rolls back).

    A bounded fill takes every member of its stretch up to 2 x `chunk` (more joined the audience
    since the plan: it covers up to its last); the last fill takes `chunk` and walks one more, so
    a wave of exactly a chunk ends with it. `due_at` is the new requests' (the tick publishes them
    then if the caller's publish is lost)."""
    assert step.wave is not None
    b, bounded = step.broadcast, at + 1 < len(step.starts)
    take = 2 * chunk if bounded else chunk
    statement, params = _fill_statement(b.audience, step.wave.zones, bounded=bounded)
    seen, last, users, ids = conn.execute(
        statement,
        {
            **params,
            "cursor": step.starts[at],
            "hi": step.starts[at + 1] if bounded else None,
            "limit": take + 1,
            "take": take,
            "type_key": b.type_key,
            "occ": b.occurrence_key,
            "lane": b.lane,
            "version": b.template_version,
            "variables": json.dumps(b.variables),
            "due_at": due_at,
            "now": now,
        },
    ).one()
    n = len(ids)
    conn.execute(_COUNT_WAVE, {"id": b.id, "wave": step.wave.wave, "n": n})
    # the trigger of migration 0026 writes the broadcast.started/progress events of this change
    if conn.execute(_COUNT, {"id": b.id, "n": n, "now": now}).one_or_none() is None:
        return None
    return Filled(list(zip(users, ids, strict=True)), last if seen > take else None)


def advance(
    conn: Connection, step: Step, filled: Sequence[Filled], *, now: datetime, lease: float
) -> bool | None:
    """Move the wave's cursor past what the step's fills covered together (to the first stretch
    not covered), in the caller's transaction; the wave is done when they covered it to its end,
    the broadcast when every wave is. True: the broadcast is done; None: it stopped running.

    `lease`: while waves are due, the broadcast's own due_at is pushed this far on, so the tick
    publishes a fan-out again only if this one stops. A cursor another fan-out moved meanwhile
    (two ran at once after a lease ran out) is left where it is."""
    b, wave = step.broadcast, step.wave
    if wave is not None:
        reach: str | None = None
        for at, f in enumerate(filled):
            if f.last is not None:  # this fill's stretch is covered only up to f.last
                reach = f.last
                break
            reach = step.starts[at + 1] if at + 1 < len(step.starts) else None
        conn.execute(
            _ADVANCE,
            {
                "id": b.id,
                "wave": wave.wave,
                "reach": reach,
                "done": reach is None,
                "was": wave.cursor,
            },
        )
    # the trigger of migration 0026 writes the broadcast.done event of this change
    state = conn.execute(_AFTER, {"id": b.id, "now": now, "lease": lease}).scalar_one_or_none()
    return None if state is None else state == "done"


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
