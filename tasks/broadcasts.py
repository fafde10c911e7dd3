"""Broadcasts: one notification type to an audience, one request per recipient.

    broadcast("spring_sale", {"topic": "newsletter"}, {"code": "SPRING"}, at="09:00",
              idempotency_key="spring-2027")

Each recipient gets an ordinary request whose occurrence key is the broadcast's
(`broadcast:<id>`): it goes through the route task and every gate like any notify(), and the
requests' unique key means no recipient is ever requested twice. The fan-out task (`clarion.fan_out`,
on the type's lane) writes the requests chunk by chunk (db/broadcasts.py); the beat tick publishes
it when a broadcast's fan-out is due — at the start, when a local-time wave comes round, and again
if a fan-out stopped (a worker killed, a deploy) — and it resumes after the last chunk committed.
"""

from __future__ import annotations

import logging
import os
import time as monotonic
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta
from typing import Any

from celery import shared_task
from sqlalchemy import Connection

from clarion import clock, faults, settings
from clarion import validation as check
from clarion.catalog.model import NotificationType
from clarion.db import broadcasts as db
from clarion.db.engine import engine
from clarion.errors import InvalidField, UnknownBroadcast
from clarion.rows import DraftRequest
from clarion.scheduling.broadcasts import PASSED, local_waves
from clarion.scheduling.zones import zone_names
from clarion.tasks.audiences import checked_audience, require_known
from clarion.tasks.lanes import give_way
from clarion.tasks.planning import plan_many
from clarion.tasks.producer import (
    checked_type,
    checked_type_variables,
    publish_in_background,
    publishing_settled,
)
from clarion.tasks.publish import publish

log = logging.getLogger(__name__)

FAN_OUT = "clarion.fan_out"
RUN_SECONDS = 10.0  # a fan-out task hands over (publishes itself again) after this long
KEY_BYTES = 256


@dataclass(frozen=True)
class Started:
    id: int
    new: bool  # False: the idempotency key named a broadcast made before; nothing was written
    planned: int  # recipients in the audience when it was made (to be requested)
    skipped: int  # recipients whose local time had passed today (passed="skip")
    first_at: datetime | None  # when its first planned recipients are requested


@dataclass(frozen=True)
class _Asked:
    """A broadcast() call, checked."""

    ntype: NotificationType
    variables: dict[str, Any]
    audience: db.Audience
    at: datetime | time
    passed: str


def _asked(
    type_key: object, audience: object, variables: object, at: object, passed: object
) -> _Asked:
    ntype = checked_type(type_key)
    plain = checked_type_variables(ntype, variables)
    who = checked_audience(audience)
    if passed not in PASSED:
        raise InvalidField(
            "passed", f"must be one of {', '.join(PASSED)}, not {check.show(passed)}"
        )
    return _Asked(ntype, plain, who, _when(at), str(passed))


def _when(at: object) -> datetime | time:
    """None (now), an aware datetime or ISO 8601 text with an offset (that instant), or a local
    wall time ("09:00" or a naive time)."""
    if at is None:
        return clock.now()
    if isinstance(at, datetime):
        return check.aware_datetime("at", at)
    if isinstance(at, str) and check.HH_MM.fullmatch(at):
        return check.clock_time("at", at)
    if isinstance(at, str) and len(at) <= 64:
        try:
            return check.aware_datetime("at", datetime.fromisoformat(at))
        except ValueError:
            pass
    if isinstance(at, time) and at.tzinfo is None:
        return at
    raise InvalidField(
        "at",
        f"must be now (None), an instant with its offset or a local time HH:MM, not "
        f"{check.show(at)}",
    )


def _waves(asked: _Asked, conn: Connection, now: datetime) -> tuple[list, int]:
    """([(wave, planned)], skipped): one wave at an instant, or one per local-time wave with the
    audience counted by zone."""
    if isinstance(asked.at, datetime):
        return [(db.NewWave(max(asked.at, now), None), db.member_count(conn, asked.audience))], 0
    counts = db.zone_counts(conn, asked.audience)
    plan = local_waves(now, asked.at, asked.passed, zone_names())  # type: ignore[arg-type]
    waves = [
        (db.NewWave(at, zones), sum(counts.get(z, 0) for z in zones)) for at, zones in plan.waves
    ]
    return waves, sum(counts.get(z, 0) for z in plan.skipped)


def broadcast(
    type_key: str,
    audience: Mapping[str, Any],
    variables: Mapping[str, Any] | None = None,
    *,
    at: datetime | time | str | None = None,
    passed: str = "tomorrow",
    idempotency_key: str | None = None,
) -> Started:
    """Send `type_key` to everyone in `audience`, once each.

    `audience`: {"topic": key} and/or {"segment": {field: value(s)}} (tasks/audiences.py).
    `at`: None (now), an aware datetime, or a local wall time "HH:MM" reached in each recipient's
    own zone; `passed` says what happens to recipients whose wall time already passed today:
    "tomorrow" (theirs tomorrow) or "skip". `idempotency_key`: a repeated call with the same key
    returns the first call's broadcast and starts nothing. Bad input raises an InvalidRequest
    naming the field and writes nothing."""
    asked = _asked(type_key, audience, variables, at, passed)
    key = None
    if idempotency_key is not None:
        key = check.text("idempotency_key", idempotency_key, max_bytes=KEY_BYTES)
    now = clock.now()
    with engine().begin() as conn:
        require_known(conn, asked.audience)
        waves, skipped = _waves(asked, conn, now)
        made, new = db.create(
            conn,
            idempotency_key=key,
            type_key=asked.ntype.key,
            lane=asked.ntype.lane,
            template_version=asked.ntype.version,
            variables=asked.variables,
            audience=asked.audience,
            at_local=asked.at if isinstance(asked.at, time) else None,
            passed=asked.passed if isinstance(asked.at, time) else None,
            waves=waves,
            skipped=skipped,
            now=now,
        )
    if new and made.due_at is not None and made.due_at <= now:
        publish_fan_out([(made.id, made.lane)])
    log.info(
        "broadcast %s of %s: %d planned",
        made.id,
        made.type_key,
        made.planned,
        extra={"action": "broadcast_created" if new else "broadcast_repeated", "id": made.id},
    )
    first = min((w.due_at for w, n in waves if n), default=None) if new else made.due_at
    return Started(made.id, new, made.planned, made.skipped, first)


def cancel_broadcast(broadcast_id: int) -> db.Broadcast:
    """Stop requesting the rest of a broadcast. Returns it as it stands: `requested` is how many
    recipients were requested before the cancel (those still go out; nobody else will)."""
    with engine().begin() as conn:
        stopped = db.cancel(conn, broadcast_id, now=clock.now())
        found = stopped or db.get(conn, broadcast_id)
    if found is None:
        raise UnknownBroadcast(broadcast_id)
    return found


@dataclass(frozen=True)
class Progress:
    broadcast: db.Broadcast
    outcomes: db.Outcomes

    def as_json(self) -> dict[str, Any]:
        b, o = self.broadcast, self.outcomes
        return {
            "id": b.id,
            "type": b.type_key,
            "state": b.state,
            "audience": b.audience.as_json(),
            "at_local": b.at_local.strftime("%H:%M") if b.at_local else None,
            "created_at": b.created_at.isoformat(),
            "started_at": b.started_at.isoformat() if b.started_at else None,
            "finished_at": b.finished_at.isoformat() if b.finished_at else None,
            "next_at": b.due_at.isoformat() if b.due_at else None,
            "planned": b.planned,
            "skipped": b.skipped,
            "requested": b.requested,
            "sent": o.sent,
            "waiting": o.waiting,
            "suppressed": o.suppressed,
        }


def broadcast_progress(broadcast_id: int) -> Progress:
    """Planned, requested, sent, waiting and suppressed (by reason) of one broadcast."""
    with engine().connect() as conn:
        found = db.get(conn, broadcast_id)
        if found is None:
            raise UnknownBroadcast(broadcast_id)
        return Progress(found, db.outcomes(conn, found))


# --- fan-out -------------------------------------------------------------------------------------


def publish_fan_out(due: list[tuple[int, str]]) -> int:
    """Publish the fan-out task of each (broadcast id, lane); the tick does it again if lost."""
    return publish(FAN_OUT, [(f"broadcast:{i}", i, lane) for i, lane in due])


def publish_due(now: datetime) -> int:
    """The tick's step: publish the fan-out of every broadcast whose fan-out is due."""
    with engine().begin() as conn:
        due = db.take_due(conn, now=now, lease=_lease())
    return publish_fan_out(due)


def _lease() -> float:
    """How long a fan-out holds its broadcast between chunks: each chunk renews it, so it need
    only outlast one chunk; a fan-out that stops is published again when it runs out."""
    return settings.get().stray_after


@shared_task(name=FAN_OUT, send_events=False)
def fan_out_task(users: list[str], ids: list[int]) -> int:
    """The Celery face of fan_out (published as a batch of broadcast keys, like route)."""
    return sum(fan_out(i) for i in ids)


def fan_out(broadcast_id: int, *, chunk: int | None = None, seconds: float = RUN_SECONDS) -> int:
    """Request the due recipients of a broadcast, a step at a time for up to `seconds` (then hand
    over to a new task); returns how many were requested. A step writes up to
    CLARION_BROADCAST_FILLS chunks of CLARION_BROADCAST_CHUNK recipients at once, each in its own
    transaction on its own connection, then moves the wave's cursor past them (db/broadcasts.py)."""
    s = settings.get()
    chunk = chunk or s.broadcast_chunk
    total, stop, lane = 0, monotonic.monotonic() + seconds, None
    while True:
        give_way(lane)  # a marketing fan-out's step waits for receipts in flight (tasks.lanes)
        now = clock.now()
        with engine().connect() as conn:
            step = db.plan_step(conn, broadcast_id, now=now, chunk=chunk, fills=s.broadcast_fills)
        if step is None:  # cancelled, finished, or unknown
            publishing_settled()
            return total
        lane = step.broadcast.lane
        due_at = now + timedelta(seconds=s.stray_after)
        filled = _fill_all(step, chunk=chunk, now=now, due_at=due_at) if step.wave else []
        written = [f for f in filled if f is not None]
        total += sum(len(f.keys) for f in written)
        finished = None
        if len(written) == len(filled):  # else the broadcast stopped running during the step
            with engine().begin() as conn:
                finished = db.advance(conn, step, written, now=now, lease=_lease())
        if finished is None or step.wave is None or finished or monotonic.monotonic() > stop:
            if finished is False and step.wave is not None:
                publish_fan_out([(broadcast_id, lane)])  # hand over to a new task
            publishing_settled()
            return total


def _fill_all(step: db.Step, **kw: Any) -> list[db.Filled | None]:
    """Every fill of a step, the first on this thread and the others at once on their own; the
    exception of one that failed is raised once all have ended."""
    others = [_fillers().submit(_fill, step, at, **kw) for at in range(1, len(step.starts))]
    try:
        first = _fill(step, 0, **kw)
    finally:
        wait(others)
    return [first, *(f.result() for f in others)]


def _fill(step: db.Step, at: int, **kw: Any) -> db.Filled | None:
    """One fill in its own transaction; its requests are published once it committed."""
    with engine().connect() as conn, conn.begin() as transaction:
        filled = db.fill(conn, step, at, **kw)
        if filled is None:  # stopped (a cancel came first): none of this fill is written
            transaction.rollback()
            return None
        faults.hit("broadcast.before_commit")
    faults.hit("broadcast.after_chunk")
    # on the publishing thread, while the rest of the step is written; lost with the process,
    # the requests are published by the tick at their due_at
    lane = step.broadcast.lane
    publish_in_background([(u, i, lane) for u, i in filled.keys])
    return filled


_FILLERS: tuple[int, ThreadPoolExecutor] | None = None


def _fillers() -> ThreadPoolExecutor:
    """This process's threads for a step's fills (made anew in a forked worker process)."""
    global _FILLERS
    if _FILLERS is None or _FILLERS[0] != os.getpid():
        _FILLERS = (os.getpid(), ThreadPoolExecutor(8, thread_name_prefix="clarion-fill"))
    return _FILLERS[1]


# --- dry run -------------------------------------------------------------------------------------


@dataclass
class DryRun:
    """What a broadcast would do if it were made now: recipients planned, those it would reach by
    channel, and those it would not by the reason recorded first (planned at each wave's time)."""

    planned: int = 0
    skipped: int = 0
    deliver: int = 0
    channels: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "skipped": self.skipped,
            "deliver": self.deliver,
            "by_channel": dict(sorted(self.channels.items())),
            "by_reason": dict(sorted(self.reasons.items())),
        }


def dry_run_broadcast(
    type_key: str,
    audience: Mapping[str, Any],
    variables: Mapping[str, Any] | None = None,
    *,
    at: datetime | time | str | None = None,
    passed: str = "tomorrow",
    chunk: int = 500,
) -> DryRun:
    """broadcast()'s plan for every recipient, through the route task's own planner and gates,
    writing nothing. Validates exactly as broadcast() does."""
    asked = _asked(type_key, audience, variables, at, passed)
    now = clock.now()
    result = DryRun()
    with engine().connect() as conn:
        require_known(conn, asked.audience)
        waves, result.skipped = _waves(asked, conn, now)
        for wave, _ in waves:
            after: str | None = None
            while users := db.members(
                conn, asked.audience, after=after, limit=chunk, zones=wave.zones
            ):
                drafts = [
                    DraftRequest(u, None, asked.ntype.key, "broadcast:dry-run", asked.variables)
                    for u in users
                ]
                for plan in plan_many(conn, drafts, now=wave.due_at).values():
                    result.planned += 1
                    _count(result, plan)
                after = users[-1]
    return result


def _count(result: DryRun, plan: Any) -> None:
    if plan.channels:
        result.deliver += 1
        result.channels.update(channel for channel, _ in plan.channels)
        return
    reasons = [s.reason for s in plan.decisions if s.reason != "no_channel"]
    result.reasons[reasons[0] if reasons else "no_channel"] += 1


__all__ = [
    "DryRun",
    "Progress",
    "Started",
    "broadcast",
    "cancel_broadcast",
    "dry_run_broadcast",
    "fan_out",
    "broadcast_progress",
]
