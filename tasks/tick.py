"""The beat tick (control queue): fire due series, then republish work whose time has come.

Requests never published (outbox rows written in a caller's transaction), published but never
routed (a lost message), or deferred until now; deliveries never picked up, due for a retry, or
whose claim lease lapsed; broadcasts whose fan-out is due (a wave's time came, or a fan-out
stopped); then receipts that arrived before their send was recorded. Two beat processes, or overlapping ticks, only publish wake-ups twice:
route and deliver are idempotent by construction.

Each lane has its own republish budget per tick, transactional first, so an activation backlog (or
a wave of quiet-hours deferrals) never starves transactional retries, takeovers or outbox rows;
a row that keeps coming round waits twice as long each time (up to CLARION_REPUBLISH_CAP).
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from celery import shared_task

from clarion import clock, metrics, settings
from clarion.db import claims, ledger
from clarion.db.due import what_is_due
from clarion.db.engine import engine
from clarion.tasks import broadcasts, escalation, refresh
from clarion.tasks.publish import DELIVER, ROUTE, publish
from clarion.tasks.receipts import replay_early
from clarion.tasks.series import tick_series

LANE_LIMIT = 5000  # rows of each kind per lane per tick
LANES = ("transactional", "activation")  # in the order they are served


class _Budget(TypedDict):
    """The keyword arguments of ledger.take_due_requests and claims.take_due_deliveries."""

    lane: str
    now: datetime
    again: float
    cap: float
    limit: int


# No task events: 86,400 ticks a day would push every route and deliver task out of Flower's list
# (it keeps the last 10,000); the tick's work shows in `clarion stats` and its result in the log.
@shared_task(name="clarion.tick", send_events=False)
def tick() -> dict[str, int]:
    with metrics.TICK_SECONDS.time():
        taken = _tick()
    for kind, n in taken.items():
        metrics.TICK_TAKEN.labels(kind).inc(n)
    return taken


def _tick() -> dict[str, int]:
    s = settings.get()
    now = clock.now()
    with engine().connect() as conn:  # one read; an idle tick does nothing more
        due = what_is_due(conn, now=now, lanes=LANES)
    taken = {"series": tick_series(now=now) if due.series else 0, "requests": 0, "deliveries": 0}
    for lane in LANES:
        if lane in due.requests or lane in due.deliveries:
            requests, deliveries = _republish(lane, now, s)
            taken["requests"] += requests
            taken["deliveries"] += deliveries
    taken["receipts"] = replay_early() if due.early_receipts else 0
    taken["escalations"] = escalation.tick() if due.escalations else 0
    expires = max(1.0, s.tick_interval * 5)
    taken["refreshes"] = refresh.publish_if_due(now, expires=expires) if due.refreshes else 0
    taken["broadcasts"] = broadcasts.publish_due(now) if due.broadcasts else 0
    return taken


def _republish(lane: str, now: datetime, s: settings.Settings) -> tuple[int, int]:
    """Publish one lane's due requests and deliveries again, within the lane's budget."""
    budget: _Budget = {
        "lane": lane,
        "now": now,
        "again": s.stray_after,
        "cap": max(s.stray_after, s.republish_cap),
        "limit": LANE_LIMIT,
    }
    with engine().begin() as conn:
        requests = ledger.take_due_requests(conn, **budget)
        deliveries = claims.take_due_deliveries(conn, **budget)
    publish(ROUTE, [(r.user_id, r.id, r.lane) for r in requests])
    publish(DELIVER, deliveries)
    return len(requests), len(deliveries)
