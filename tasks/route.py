"""The route task: resolve each request once, run the planner, create deliveries, record decisions."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task

from clarion import clock, faults, settings
from db import ledger
from db.engine import engine
from gates.pipeline import plan
from tasks import runtime
from tasks.publish import DELIVER, publish

log = logging.getLogger(__name__)


@shared_task(name="clarion.route")
def route(users: list[str], ids: list[int]) -> int:
    """Route a batch of requests. A request already routed is skipped: re-publishing changes nothing."""
    now = clock.now()
    catalog = runtime.catalog()
    needs_address = {c: a.needs_address for c, a in runtime.adapters().items()}
    deliveries: list[ledger.NewDelivery] = []
    decisions: list[ledger.Decision] = []
    with engine().begin() as conn:
        requests = ledger.resolve_requests(conn, zip(users, ids, strict=True), now=now)
        recipients = ledger.recipients(conn, (r["user_id"] for r in requests))
        for request in requests:
            ntype = catalog.get(request["type_key"])
            outcome = plan(request, ntype, recipients.get(request["user_id"]), now=now,
                           needs_address=needs_address)
            decisions += [ledger.Decision(request["user_id"], request["id"], v.gate, v.outcome,
                                          v.reason, v.detail, v.channel) for v in outcome.verdicts]
            deliveries += [ledger.NewDelivery(request["user_id"], request["id"], request["type_key"],
                                              request["occurrence_key"], channel, ntype.one_platform,
                                              request["lane"])
                           for channel in outcome.channels]
        faults.hit("route.before_commit")
        created = ledger.insert_deliveries(
            conn, deliveries, now=now, due_at=now + timedelta(seconds=settings.get().stray_after))
        ledger.insert_decisions(conn, decisions, now=now)
    faults.hit("route.after_commit")
    publish(DELIVER, created)
    runtime.count("route_skipped_already_resolved", len(ids) - len(requests))
    log.debug("routed", extra={"action": "requests_routed", "routed": len(requests),
                               "deliveries": len(created), "decisions": len(decisions)})
    return len(requests)
