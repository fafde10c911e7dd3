"""The route task: resolve each request once, plan it through the gates, apply the plan."""

from __future__ import annotations

import logging
import random
import time
from datetime import timedelta

from celery import shared_task
from psycopg.errors import DeadlockDetected
from sqlalchemy.exc import OperationalError

from clarion import clock, faults, metrics, settings
from db import ledger
from db.engine import engine
from gates.apply import apply, needs_address, snapshots
from gates.pipeline import Snapshot, plan
from tasks import escalation, runtime
from tasks.deliver import deliver_now
from tasks.flush import close_windows
from tasks.lanes import rate, slices, wait_turn
from tasks.publish import DELIVER, publish

log = logging.getLogger(__name__)


DEADLOCK_RETRIES = 3


@shared_task(name="clarion.route")
def route(users: list[str], ids: list[int]) -> int:
    """Route a batch of requests. A request already routed is skipped: re-publishing changes nothing.

    A lane with a budget (tasks.lanes: the queue the message came from) is routed in slices, each
    slice's deliveries published when the budget allows."""
    keys = sorted(zip(users, ids, strict=True))  # one lock order for every batch
    lane = (route.request.delivery_info or {}).get("routing_key")
    return sum(_route_slice(part, lane) for part in slices(lane, keys))


def _route_slice(keys: list[tuple[str, int]], lane: str | None) -> int:
    for attempt in range(DEADLOCK_RETRIES + 1):
        try:
            return _route([u for u, _ in keys], [i for _, i in keys], lane=lane)
        except OperationalError as exc:
            # Two batches claiming shared rows (an organisation's cap counter) in opposite orders:
            # PostgreSQL aborts one; its transaction left nothing behind, so run it again.
            if not isinstance(exc.orig, DeadlockDetected) or attempt == DEADLOCK_RETRIES:
                raise
            log.info("route batch deadlocked; retrying", extra={"action": "route_deadlock_retry"})
            time.sleep(random.uniform(0.01, 0.1) * (attempt + 1))
    raise AssertionError("unreachable")


SKEW_RETRY = 10.0  # seconds before a request of a type this worker lacks is routed again


def _known_types(conn, requests: list[dict], catalog, now) -> list[dict]:
    """Requests whose type this worker's catalog lacks, if recent, go back to wait for a worker
    that has it (a rolling deploy: the producer runs a newer catalog); older than
    CLARION_CATALOG_SKEW_GRACE, they are planned, and the planner records `unknown_type`."""
    grace = timedelta(seconds=settings.get().catalog_skew_grace)
    waiting = [
        r for r in requests if catalog.get(r["type_key"]) is None and now - r["created_at"] < grace
    ]
    if not waiting:
        return requests
    ledger.unresolve_requests(
        conn, [(r["user_id"], r["id"]) for r in waiting], due_at=now + timedelta(seconds=SKEW_RETRY)
    )
    log.info(
        "types not in this catalog yet",
        extra={
            "action": "route_type_unknown_here",
            "types": sorted({r["type_key"] for r in waiting}),
        },
    )
    skipped = {id(r) for r in waiting}
    return [r for r in requests if id(r) not in skipped]


def _route(users: list[str], ids: list[int], *, lane: str | None = None) -> int:
    now = clock.now()
    catalog = runtime.catalog()
    reachable = needs_address(runtime.adapters().values())
    deliveries: list[ledger.NewDelivery] = []
    decisions: list[ledger.Decision] = []
    with engine().begin() as conn:
        resolved = ledger.resolve_requests(conn, zip(users, ids, strict=True), now=now)
        close_windows(conn, resolved, catalog, now=now)  # a digest request's items, if any
        requests = _known_types(conn, resolved, catalog, now)
        recipients = ledger.recipients(conn, (r["user_id"] for r in requests))
        snaps = snapshots(conn, recipients, now=now)
        for request in requests:
            ntype = catalog.get(request["type_key"])
            snapshot = snaps.get(request["user_id"]) or Snapshot(None)
            planned = plan(
                request, ntype, snapshot, now=now, policy=catalog.policy, needs_address=reachable
            )
            final = apply(
                conn, request, ntype, planned, snapshot=snapshot, catalog=catalog, now=now
            )
            escalation.routed(conn, request, ntype, final, snapshot.recipient, catalog, now)
            decisions += [
                ledger.Decision(
                    request["user_id"],
                    request["id"],
                    s.gate,
                    s.outcome,
                    s.reason,
                    s.detail,
                    s.channel,
                )
                for s in final.decisions
            ]
            if ntype is None:  # planned as `unknown_type`: decisions only, never a channel
                continue
            deliveries += [
                ledger.NewDelivery(
                    request["user_id"],
                    request["id"],
                    request["type_key"],
                    request["occurrence_key"],
                    channel,
                    ntype.one_platform,
                    request["lane"],
                    not_before,
                )
                for channel, not_before in final.channels
            ]
        faults.hit("route.before_commit")
        created = ledger.insert_deliveries(
            conn, deliveries, now=now, due_at=now + timedelta(seconds=settings.get().stray_after)
        )
        ledger.insert_decisions(conn, decisions, now=now)
    faults.hit("route.after_commit")
    metrics.count_decisions((d.gate, d.outcome, d.reason) for d in decisions)
    ready = [(user, id_, of_lane) for user, id_, of_lane, held in created if not held]
    if rate(lane) is None:
        publish(DELIVER, ready)
    else:
        # A budgeted lane sends its slice here, once the budget allows: published, the deliveries
        # would queue behind the rest of the lane's route backlog. Committed: a process that dies
        # waiting or sending leaves them to the tick (due at stray_after) and the claim leases.
        wait_turn(lane, len(requests))
        deliver_now(ready)
    runtime.count("route_skipped_already_resolved", len(ids) - len(requests))
    log.debug(
        "routed",
        extra={
            "action": "requests_routed",
            "routed": len(requests),
            "deliveries": len(created),
            "decisions": len(decisions),
        },
    )
    return len(requests)
