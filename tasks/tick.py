"""The beat tick (control queue): fire due series, then republish work whose time has come.

Requests never published (outbox rows written in a caller's transaction), published but never
routed (a lost message), or deferred until now; deliveries never picked up, due for a retry, or
whose claim lease lapsed. Two beat processes, or overlapping ticks, only publish wake-ups twice:
route and deliver are idempotent by construction.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task

from clarion import clock, settings
from db import ledger
from db.engine import engine
from tasks.publish import DELIVER, ROUTE, publish
from tasks.series import fire_due_series

LIMIT = 5000


@shared_task(name="clarion.tick")
def tick() -> dict[str, int]:
    now = clock.now()
    again = now + timedelta(seconds=settings.get().stray_after)
    with engine().begin() as conn:
        series = fire_due_series(conn, now=now)
    with engine().begin() as conn:
        requests = ledger.take_due_requests(conn, now=now, again=again, limit=LIMIT)
        deliveries = ledger.take_due_deliveries(conn, now=now, again=again, limit=LIMIT)
    publish(ROUTE, requests)
    publish(DELIVER, deliveries)
    return {"series": series, "requests": len(requests), "deliveries": len(deliveries)}
